"""The overhead benchmark on two revisions of lvfl, interleaved in one run: did a change make lvfl slower?

.venv/bin/python -m benchmarks.perf.revisions BEFORE [AFTER] [--rounds 5] [-- overhead.py options]

BEFORE and AFTER are git revisions (AFTER defaults to the working tree). Each revision is checked out into a
temporary git worktree (the working tree is used as it is), and *this* checkout's `benchmarks.perf.overhead` runs
against each in turn, from that revision's source, whose `lvfl` comes first on the import path: the same script, the
same models, the same seeds, only the package under test differs (a revision whose benchmarks are flat scripts, such
as 333e000, is measured the same way). A round runs BEFORE then AFTER, one repetition each, so that slow phases of a
shared machine hit both; the table gives, per workload, each revision's median ratios (Plain / bare, DHMasking /
Plain) over rounds, and the median over rounds of the paired AFTER / BEFORE epoch time per variant.

Needs the BEFORE revision to accept the overhead script's API (the script has not changed since issue 12).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OVERHEAD = "benchmarks.perf.overhead"
VARIANTS = ("bare", "plain", "dh")
GIT = shutil.which("git") or "git"


def worktree(revision: str, where: Path) -> Path:
    """A detached checkout of `revision` under `where` (removed by the caller's temporary directory).

    Its own `benchmarks` folder is removed, so that the benchmark imported there is this checkout's.
    """
    path = where / revision.replace("/", "_")
    command = [GIT, "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(path), revision]
    subprocess.run(command, check=True)  # noqa: S603 (our own git, a revision the user named)
    shutil.rmtree(path / "benchmarks", ignore_errors=True)
    return path


def one_repetition(source: Path, options: list[str], out: Path) -> dict[str, dict[str, list[float]]]:
    """One overhead.py repetition with `source` first on the import path (this checkout after it, for the
    `benchmarks` package); its per-variant epoch times."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(source), str(ROOT)]))
    command = [sys.executable, "-m", OVERHEAD, "--repeats", "1", "--json", str(out)]
    subprocess.run(command + options, check=True, env=env, cwd=source, stdout=subprocess.DEVNULL)  # noqa: S603
    return json.loads(out.read_text())


def median_ratio(num: list[float], den: list[float]) -> str:
    ratios = [a / b for a, b in zip(num, den, strict=True)]
    return f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", help="git revision to compare against")
    parser.add_argument("after", nargs="?", help="git revision (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, options = parser.parse_args(argv[:split]), argv[split + 1 :]  # after "--": overhead.py's options
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        trees = {"before": worktree(args.before, tmp_path)}
        trees["after"] = worktree(args.after, tmp_path) if args.after else ROOT
        times: dict[str, dict[str, dict[str, list[float]]]] = {"before": {}, "after": {}}
        try:
            for round_ in range(args.rounds):
                for label, source in trees.items():
                    result = one_repetition(source, options, tmp_path / f"{label}.json")
                    for workload, per_variant in result.items():
                        slot = times[label].setdefault(workload, {v: [] for v in VARIANTS})
                        for v in VARIANTS:
                            slot[v].extend(per_variant[v])
                print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        finally:
            for source in trees.values():
                if source != ROOT:
                    remove = [GIT, "-C", str(ROOT), "worktree", "remove", "--force", str(source)]
                    subprocess.run(remove, check=False)  # noqa: S603
    after_name = args.after or "working tree"
    print(f"\noverhead.py, {args.rounds} interleaved rounds: before = {args.before}, after = {after_name}\n")
    print(
        "| workload | Plain / bare before | Plain / bare after | DH / Plain before | DH / Plain after "
        "| after / before: bare | Plain | DH |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for workload in times["after"]:
        b, a = times["before"][workload], times["after"][workload]
        print(
            f"| {workload} | {median_ratio(b['plain'], b['bare'])} | {median_ratio(a['plain'], a['bare'])} "
            f"| {median_ratio(b['dh'], b['plain'])} | {median_ratio(a['dh'], a['plain'])} "
            f"| {median_ratio(a['bare'], b['bare'])} | {median_ratio(a['plain'], b['plain'])} "
            f"| {median_ratio(a['dh'], b['dh'])} |"
        )
    print("\n- ratios: median over rounds of the paired epoch-time ratio (min-max in brackets)")


if __name__ == "__main__":
    main()
