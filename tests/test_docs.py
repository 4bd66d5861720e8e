"""The README and the documentation site: short README, nothing outside the repo, and every documented command real.

Every command in a fenced ```bash block of README.md and docs/*.md is checked against the real parser, without
training:

- `lvfl fit|validate|test|predict ...` parses with `--print_config` appended (every option parsed, every config file
  loaded); `--help` commands print their help;
- `lvfl launch [sub] ...` and `lvfl party [sub] ...`: their own flags are in their `--help`, and the rest parses as
  `lvfl <sub> ... --print_config`; `lvfl export ...`: its flags are in its `--help`, the rest parses as `lvfl test`;
- `lvfl bench GRID ...`: the grid loads (`lvfl.commands.bench.load_grid`) and the flags are in `lvfl bench --help`;
- `lvfl pki ...` runs, into a temporary folder;
- `python SCRIPT --flag ...`: the script exists, and each flag is an option of its `--help` (a script given no flag
  is not run); `python -m benchmarks.KIND.NAME --flag ...` the same for a benchmark module;
- `make TARGET`: the Makefile has the target.

All of them run in one Python process (imports paid once), from the repository root. A documented placeholder
(`C.yaml`, `NAME`, ...) stands for a file or name of the reader's; a command holding one is checked as far as it can
be: its flags, and the files it names that are not placeholders. A command that names a checkpoint of a fitted run
(`runs/<name>/version_N/...`) without `--config` is parsed with the config that run comes from.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
MAX_README_LINES = 200

#: stand-ins for the reader's own files and names, as the pages say
PLACEHOLDERS = {"C.yaml", "F.yaml", "NAME", "my.yaml", "REV", "GRID.yaml", "DIR"}
#: files a documented command writes or that another command writes first (never checked to exist)
PRODUCTS = {"federation.yaml", "pki/federation.yaml"}
#: the run folder a checkpoint path names -> the config of that run
RUN_CONFIGS = {
    "runs/bank_retailer/": "examples/bank_retailer/config.yaml",
    "runs/easter_digits/": "configs/easter/digits.yaml",
}
#: each command's own flags (the rest of its arguments are `lvfl fit`'s), and whether the flag takes a value
LAUNCH_FLAGS = {"--pki": True, "--timeout": True, "--run_id": True, "--threads": True, "--network": True}
PARTY_FLAGS = {
    "--party": True,
    "--federation": True,
    "--run_id": True,
    "--timeout": True,
    "--key": True,
    "--listen": True,
}
ATTACK_SCORE_FLAGS = {"--inferences": True, "--output": True}
EXPORT_FLAGS = {
    "--ckpt_path": True,
    "--out": True,
    "--party": True,
    "--federation": True,
    "--timeout": True,
    "--run_id": True,
}
LIGHTNING_SUBCOMMANDS = ("fit", "validate", "test", "predict")


# -- the commands the pages document ------------------------------------------------------------------------------
@dataclass
class Command:
    """One command of a ```bash block: where it is, and its words (comments dropped, `\\` lines joined)."""

    source: str
    line: int
    words: list[str]
    jobs: list[tuple] = field(default_factory=list)  # what the runner executes for it
    checks: list[str] = field(default_factory=list)  # what was checked here, without the runner
    problems: list[str] = field(default_factory=list)  # what is wrong, found without the runner

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}"


def documented_commands() -> list[Command]:
    commands = []
    for path in [README, *DOCS]:
        text = path.read_text(encoding="utf-8")
        for block in re.finditer(r"^```(bash|sh|shell)[^\n]*\n(.*?)^```", text, re.S | re.M):
            first = text[: block.start(2)].count("\n") + 1
            lines = block.group(2).split("\n")
            pending, start = "", first
            for offset, line in enumerate(lines):
                if not pending:
                    start = first + offset
                if line.rstrip().endswith("\\"):
                    pending += line.rstrip()[:-1] + " "
                    continue
                words = shlex.split(pending + line, comments=True)
                pending = ""
                if words:
                    commands.append(Command(str(path.relative_to(REPO)), start, words))
    return commands


def _split_own_flags(args: list[str], own: dict[str, bool]) -> tuple[list[str], list[str]]:
    """(the command's own flags as given, the remaining arguments)."""
    mine, rest, i = [], [], 0
    while i < len(args):
        name = args[i].split("=", 1)[0]
        if name in own:
            mine.append(name)
            i += 1 if "=" in args[i] or not own[name] else 2
        else:
            rest.append(args[i])
            i += 1
    return mine, rest


def _flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def _has_placeholder(words: list[str]) -> bool:
    return any(w in PLACEHOLDERS or w.split("=", 1)[-1] in PLACEHOLDERS for w in words)


def _config_files(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"] + [
        a.split("=", 1)[1] for a in args if a.startswith("--config=")
    ]


def _with_run_config(args: list[str]) -> list[str]:
    """A checkpoint of a fitted run named without `--config`: the config that run comes from, in front."""
    if _config_files(args) or "--ckpt_path" not in args:
        return args
    ckpt = args[args.index("--ckpt_path") + 1]
    for run, config in RUN_CONFIGS.items():
        if ckpt.startswith(run):
            return ["--config", config, *args]
    return args


def _lightning_parse(cmd: Command, subcommand: str, args: list[str]) -> None:
    """`lvfl <subcommand> args --print_config`, or only the config files' existence where a placeholder stands."""
    if _has_placeholder(args):
        for config in _config_files(args):
            if config not in PLACEHOLDERS and not (REPO / config).is_file():
                cmd.problems.append(f"{config} does not exist")
        cmd.checks.append("placeholder: the flags and the named files only")
        return
    cmd.jobs.append(("lvfl", [subcommand, *_with_run_config(args), "--print_config"]))


#: the pytest options a documented test command may give: pytest's own that the docs use, and the suite's `--stress`
PYTEST_OPTIONS = {"--durations", "--stress", "-m", "-k", "-q", "-x"}


def plan(cmd: Command) -> None:
    """Fill `cmd.jobs` (run by the runner) and `cmd.checks` / `cmd.problems` (checked here)."""
    words = cmd.words
    if words[0] in ("make",):
        makefile = (REPO / "Makefile").read_text(encoding="utf-8")
        for target in words[1:]:
            if not re.search(rf"^{re.escape(target)}:", makefile, re.M):
                cmd.problems.append(f"the Makefile has no target {target!r}")
        cmd.checks.append("make target")
        return
    if words[0] in ("lvfl", ".venv/bin/lvfl"):
        args = words[1:]
    elif words[:3] in (["python", "-m", "lvfl"], [".venv/bin/python", "-m", "lvfl"]):
        args = words[3:]
    elif words[0] in ("python", "python3", ".venv/bin/python") and len(words) > 1 and words[1].endswith(".py"):
        script, flags = REPO / words[1], _flags(words[2:])
        if not script.is_file():
            cmd.problems.append(f"{words[1]} does not exist")
        elif flags:
            if "argparse" not in script.read_text(encoding="utf-8"):
                cmd.problems.append(f"{words[1]} is given flags but parses none")
            else:
                cmd.jobs.append(("script_help", words[1], flags))
        cmd.checks.append("script")
        return
    elif (
        words[0] in ("python", "python3", ".venv/bin/python")
        and len(words) > 2
        and words[1] == "-m"
        and words[2].startswith("benchmarks.")
    ):
        module, flags = words[2], _flags(words[3:])
        source = REPO / (module.replace(".", "/") + ".py")
        if not source.is_file():
            cmd.problems.append(f"the module {module} does not exist")
        elif flags:
            if "argparse" not in source.read_text(encoding="utf-8"):
                cmd.problems.append(f"{module} is given flags but parses none")
            else:
                cmd.jobs.append(("module_help", module, flags))
        cmd.checks.append("benchmark module")
        return
    elif words[0] == "curl":
        _check_curl(cmd)
        return
    elif words[1:3] == ["-m", "pytest"] and words[0] in ("python", "python3", ".venv/bin/python"):
        for word in words[3:]:  # the test files named exist; the options are pytest's, or the suite's own
            name = word.split("=", 1)[0]
            if word.startswith("-"):
                if name not in PYTEST_OPTIONS:
                    cmd.problems.append(f"{name} is not an option the suite's pytest takes here")
            elif not (REPO / word.split("::", 1)[0]).exists():
                cmd.problems.append(f"{word} does not exist")
        cmd.checks.append("pytest: the named test files and options")
        return
    elif words[0] == "source" and words[1:] == [".venv/bin/activate"]:
        if not re.search(r"^\t.*-m venv \$\(VENV\)", (REPO / "Makefile").read_text(encoding="utf-8"), re.M):
            cmd.problems.append("the Makefile does not create the .venv this activates")
        cmd.checks.append("activates the environment make demo creates")
        return
    elif words[0] == "kill" and all(w.startswith("%") for w in words[1:]):
        cmd.checks.append("shell job control: stops the servers the block started with &")
        return
    else:
        cmd.problems.append(f"no check for a command starting {words[0]!r}: teach tests/test_docs.py")
        return

    if not args or args[0] in ("-h", "--help"):
        cmd.jobs.append(("lvfl", ["--help"]))
        return
    sub, rest = args[0], args[1:]
    if sub in LIGHTNING_SUBCOMMANDS:
        if "--help" in rest or "-h" in rest or any(a.endswith(".help") for a in rest):  # --help all, --model.help X
            cmd.jobs.append(("lvfl", [sub, *rest]))
        else:
            _lightning_parse(cmd, sub, rest)
    elif sub in ("launch", "party"):
        inner = rest[0] if rest and rest[0] in LIGHTNING_SUBCOMMANDS else "fit"
        rest = rest[1:] if rest and rest[0] in LIGHTNING_SUBCOMMANDS else rest
        own, rest = _split_own_flags(rest, LAUNCH_FLAGS if sub == "launch" else PARTY_FLAGS)
        if own:
            cmd.jobs.append(("help_has", [sub, "--help"], own))
        _lightning_parse(cmd, inner, rest)
    elif sub == "export":
        own, rest = _split_own_flags(rest, EXPORT_FLAGS)
        cmd.jobs.append(("help_has", ["export", "--help"], own))
        if "--ckpt_path" in rest or "--ckpt_path" in own:
            ckpt = args[args.index("--ckpt_path") + 1]
            rest = [*rest, "--ckpt_path", ckpt]
        _lightning_parse(cmd, "test", rest)
    elif sub == "bench":
        positional = [a for a in rest if not a.startswith("-")]
        flags = _flags(rest)
        if flags:
            cmd.jobs.append(("help_has", ["bench", "--help"], [f for f in flags if f not in ("--help", "-h")]))
        if positional:
            grid = positional[0]
            if not (REPO / grid).is_file():
                cmd.problems.append(f"{grid} does not exist")
            else:
                cmd.jobs.append(("grid", grid))
    elif sub == "pki":
        cmd.jobs.append(("pki", rest))
    elif sub == "attack-score":  # its own flags, then the run's config as lvfl fit reads it
        own, rest = _split_own_flags(rest, ATTACK_SCORE_FLAGS)
        cmd.jobs.append(("help_has", [sub, "--help"], own))
        _lightning_parse(cmd, "fit", rest)
    elif sub in ("serve", "score"):
        cmd.jobs.append(("help_has", [sub, "--help"], [f for f in _flags(rest) if f not in ("--help", "-h")]))
    else:
        cmd.problems.append(f"lvfl has no subcommand {sub!r}")


def _check_curl(cmd: Command) -> None:
    """A request to `lvfl serve --http`: a POST of JSON to /score on this machine that the endpoint would accept."""
    from lvfl.serving.http_endpoint import parse_json_request

    words = cmd.words
    urls = [w for w in words if "/score" in w or "/health" in w]
    data = words[words.index("-d") + 1] if "-d" in words else None
    if len(urls) != 1 or not re.match(r"^(http://)?(127\.0\.0\.1|localhost):\d+/(score|health)$", urls[0]):
        cmd.problems.append(f"not a request to lvfl serve's endpoint on this machine: {urls}")
        return
    if data is not None:
        try:
            parse_json_request(json.loads(data), "customer_id")
        except (ValueError, json.JSONDecodeError) as err:
            cmd.problems.append(f"the endpoint would refuse {data}: {err}")
    cmd.checks.append("the endpoint's URL and a body it accepts")


COMMANDS = documented_commands()
for _cmd in COMMANDS:
    plan(_cmd)

# -- the runner: every job in one process --------------------------------------------------------------------------
RUNNER = r"""
import contextlib, io, json, re, runpy, sys, tempfile, warnings
warnings.simplefilter("ignore")
from lvfl.commands.entry import main

def call(fn):
    out, err, code = io.StringIO(), io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            fn()
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
    except Exception as error:
        code, err = 1, io.StringIO(err.getvalue() + f"{type(error).__name__}: {error}")
    return code, out.getvalue(), err.getvalue()

def script(path):
    def run():
        sys.argv = [path, "--help"]
        runpy.run_path(path, run_name="__main__")
    return run

def module(name):
    def run():
        sys.argv = [name, "--help"]
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    return run

def pki(args):
    def run():
        with tempfile.TemporaryDirectory() as root:  # the CA key goes beside --out: inside this folder too
            rest = list(args)
            if "--out" in rest:
                rest[rest.index("--out") + 1] = root + "/pki"
            main(["pki", *rest])
    return run

def grid(path):
    def run():
        from lvfl.commands.bench import load_grid
        load_grid(path)
    return run

results = []
for job in json.load(sys.stdin):
    kind = job[0]
    if kind == "lvfl":
        code, out, err = call(lambda: main(list(job[1])))
    elif kind == "help_has":
        code, out, err = call(lambda: main(list(job[1])))
        missing = [flag for flag in job[2] if not re.search(re.escape(flag) + r"(?![\w-])", out)]
        if missing:
            code, err = 1, err + f"not in the help: {missing}"
    elif kind in ("script_help", "module_help"):
        code, out, err = call(script(job[1]) if kind == "script_help" else module(job[1]))
        missing = [flag for flag in job[2] if not re.search(re.escape(flag) + r"(?![\w-])", out)]
        if missing:
            code, err = 1, err + f"not in the help: {missing}"
    elif kind == "pki":
        code, out, err = call(pki(job[1]))
    elif kind == "grid":
        code, out, err = call(grid(job[1]))
    else:
        code, out, err = 1, "", f"unknown job {kind}"
    results.append({"code": code, "out": out[-2000:], "err": err[-2000:]})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def outcomes() -> dict[str, list[dict]]:
    """Every command's jobs, run in one process: command id -> one result per job."""
    jobs = [(cmd.id, job) for cmd in COMMANDS for job in cmd.jobs]
    done = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps([job for _, job in jobs]),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    by_command: dict[str, list[dict]] = {}
    for (cid, job), result in zip(jobs, results, strict=True):
        by_command.setdefault(cid, []).append({"job": job, **result})
    return by_command


def test_the_pages_document_commands():
    assert len(COMMANDS) > 40, [c.id for c in COMMANDS]
    kinds = {c.words[1] if c.words[0].endswith("lvfl") and len(c.words) > 1 else c.words[0] for c in COMMANDS}
    assert {"fit", "test", "predict", "export", "launch", "party", "pki", "bench", "make"} <= kinds


@pytest.mark.slow
@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c.id)
def test_documented_command(cmd: Command, outcomes: dict[str, list[dict]]):
    """Each command of a ```bash block parses (see the module docstring for what is run for each kind)."""
    assert not cmd.problems, f"{cmd.id}: {' '.join(cmd.words)}: {cmd.problems}"
    assert cmd.jobs or cmd.checks, f"{cmd.id}: nothing checks {' '.join(cmd.words)}"
    for result in outcomes.get(cmd.id, []):
        assert result["code"] == 0, f"{cmd.id}: {' '.join(cmd.words)}\n{result['job']}\n{result['err']}"


@pytest.mark.slow
def test_a_documented_typo_fails_the_check():
    """The check has teeth: the same jobs, planned for a misspelt class path and a missing config, fail."""
    bad = Command("(test)", 0, ["lvfl", "fit", "--config", "configs/easter/digits.yaml", "--model.aggregation=x.Y"])
    missing = Command("(test)", 1, ["lvfl", "test", "--config", "configs/easter/nothing.yaml"])
    flag = Command("(test)", 2, ["python", "-m", "benchmarks.perf.network", "--epoch", "5"])
    for cmd in (bad, missing, flag):
        plan(cmd)
    done = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps([bad.jobs[0], missing.jobs[0], flag.jobs[0]]),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=False,
    )
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["code"] != 0 for r in results] == [True, True, True], results


# -- the README ---------------------------------------------------------------------------------------------------
def test_readme_is_at_most_200_lines():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines; the limit is {MAX_README_LINES}: move text to docs/"
    )


def test_readme_links_resolve():
    text = README.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (REPO / target).exists(), f"README.md links to {target}, which does not exist"


def test_readme_leads_its_results_with_real_data():
    text = README.read_text(encoding="utf-8")
    results = text.index("## Results")
    assert results < text.index("### Real data") < text.index("### Your own tables") < text.index("### The embedded")


# -- nothing refers to a file outside the repository --------------------------------------------------------------
OUTSIDE = re.compile(r"\.\./shared|shared/(DESIGN|STYLE)\.md|shared/papers|/work/")


def repository_files() -> list[str]:
    """The repository's files as git lists them (tracked and not ignored); in a copy without git, every file but
    the ignored folders' (.venv, site, runs, caches)."""
    if (REPO / ".git").exists():
        return subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=True,
        ).stdout.split()
    skipped = {".venv", "site", "runs", "lightning_logs", ".pytest_cache", "__pycache__", ".ruff_cache"}
    return [str(p.relative_to(REPO)) for p in REPO.rglob("*") if not skipped & set(p.relative_to(REPO).parts)]


@pytest.mark.slow
def test_nothing_refers_to_files_outside_the_repository():
    listed = repository_files()
    offending = []
    for name in listed:
        path = REPO / name
        if name == "tests/test_docs.py" or not path.is_file() or path.suffix in {".png", ".pt", ".ckpt", ".parquet"}:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        offending += [f"{name}: {m.group(0)}" for m in OUTSIDE.finditer(text)]
    assert not offending, offending


# -- the API pages --------------------------------------------------------------------------------------------------
def test_every_star_parameter_is_annotated():
    """`mkdocs build --strict` aborts when griffe meets an `*args` or `**kwargs` with no annotation on a page it
    renders; this finds the same thing in a second, before the docs step of CI does."""
    import ast

    missing = []
    for path in sorted((REPO / "lvfl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for stars, star in (("*", node.args.vararg), ("**", node.args.kwarg)):
                    if star is not None and star.annotation is None:
                        missing.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}({stars}{star.arg})")
    assert not missing, "unannotated star parameters: " + ", ".join(missing)
