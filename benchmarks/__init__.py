"""The scripts that print the tables of docs/results.md, by kind, each run as a module from the repository root.

- `benchmarks.paper`: what a protocol learns or leaks, in the shape of a paper's table or figure (accuracy, ablations,
  privacy budgets, attacks);
- `benchmarks.perf`: what lvfl costs (time, memory, bytes, latency), whichever paper's table a result is shaped as;
- `benchmarks.data`: what fetches a data set or takes a data path end to end, as a user runs it;
- `benchmarks.common`: the helpers the scripts share (the machine line, quiet logs, a config or grid run in-process).

    .venv/bin/python -m benchmarks.perf.overhead --help

From the repository root, so that `benchmarks` is this folder (Opacus installs an unrelated top-level `benchmarks`).
"""
