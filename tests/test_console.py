"""What `lvfl` prints: the fit summary, a line per epoch without a terminal, and refusals in exactly one line.

The summary's figures are checked against what the run wrote independently of it: the CSV logger's metrics, the
checkpoint's ledger, and the shared IDs counted from the two example tables themselves.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, checkpoints_of

from lvfl.checkpoints import load_checkpoint
from lvfl.commands.fit import main

CONFIG = str(REPO / "examples/bank_retailer/config.yaml")


def table_ids(path: Path, column: str) -> set[str]:
    with path.open(newline="") as f:
        return {row[column] for row in csv.DictReader(f)}


@pytest.fixture(scope="module")
def summary(tmp_path_factory) -> tuple[Path, list[str]]:
    """The bank/retailer example fitted for 4 epochs in this process: (its experiment folder, what it printed)."""
    tmp = tmp_path_factory.mktemp("summary")
    with pytest.MonkeyPatch.context() as patch, _Capture() as out:
        patch.chdir(tmp)  # the config's tables are found from another folder: relative to the config file
        main(["fit", "--config", CONFIG, "--trainer.max_epochs=4", f"--trainer.logger.init_args.save_dir={tmp}"])
    return tmp / "bank_retailer", out.lines


class _Capture:
    """Standard output of the block, as lines (a module-scoped stand-in for capsys)."""

    def __enter__(self) -> _Capture:
        import io

        self._saved, self._buffer = sys.stdout, io.StringIO()
        sys.stdout = self._buffer
        return self

    def __exit__(self, *exc) -> None:
        sys.stdout = self._saved
        self.lines = self._buffer.getvalue().splitlines()


def metrics_rows(experiment: Path) -> list[dict[str, str]]:
    (path,) = experiment.glob("version_0/metrics.csv")
    with path.open() as f:
        return [row for row in csv.DictReader(f) if row.get("val/auroc/mean")]


@pytest.mark.slow
def test_fit_ends_with_a_summary_of_the_run(summary):
    experiment, lines = summary
    start = max(i for i, line in enumerate(lines) if line.startswith("lvfl fit: 4 epochs"))
    block = lines[start:]
    assert re.match(r"lvfl fit: 4 epochs in [\d.]+ s \(EASTER, cpu\)$", block[0]), block[0]
    with (REPO / "examples/bank_retailer/bank.csv").open(newline="") as f:
        classes = sorted({row["status"] for row in csv.DictReader(f)})
    assert block[1] == f"  task: 2 classes (binary): {', '.join(classes)}"  # the label column's own values
    (unanswered,) = [line for line in block if line.startswith("  unanswered: ")]  # no student in this run
    alone, total = re.match(
        r"  unanswered: (\d+) of party0's (\d+) test samples are held by party0 alone", unanswered
    ).groups()
    assert int(total) == 180  # the bank's test customers, as lvfl predict answers them (README)
    assert 0 < int(alone) < int(total)
    rows = metrics_rows(experiment)
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2, 3]
    for who in ("party0", "party1", "mean"):
        values = [float(r[f"val/auroc/{who}"]) for r in rows]
        best = max(values)
        epoch = values.index(best) + 1
        (row,) = [line for line in block if line.split()[:1] == [who]]
        assert row.split() == [who, f"{best:.4f}", f"({epoch})", f"{values[-1]:.4f}"], row
    folder = checkpoints_of(experiment)
    ledger = load_checkpoint(folder / "last.ckpt")["lvfl"]["wire"]["bytes"]
    total = sum(row[3] for row in ledger)
    assert f"  wire: {total / 1e6:.3f} MB ({total:,} bytes) in " in "\n".join(block)
    bank = table_ids(REPO / "examples/bank_retailer/bank.csv", "customer_id")
    retailer = table_ids(REPO / "examples/bank_retailer/retailer.csv", "client")
    assert (
        f"  PSI: {len(bank & retailer):,} IDs every party holds (of party0 {len(bank):,}, party1 {len(retailer):,})"
        in (block)
    )
    (memory,) = [line for line in block if line.startswith("  memory: ")]
    peak, before, features, params = re.match(
        r"  memory: peak ([\d,]+) MB in this process \(([\d,]+) MB before the data's set-up\); "
        r"it holds ([\d.]+) kB of features and ([\d.]+) kB of model parameters$",
        memory,
    ).groups()
    assert float(peak.replace(",", "")) >= float(before.replace(",", "")) > 0
    assert float(peak.replace(",", "")) * 1e3 > float(features) > 0
    assert float(params) > 0
    means = [float(r["val/auroc/mean"]) for r in rows]
    best_epoch = means.index(max(means)) + 1
    assert f"  best: {folder / 'best.ckpt'} (epoch {best_epoch}, val/auroc/mean {max(means):.4f})" in block
    assert f"  last: {folder / 'last.ckpt'}" in block
    assert f"  logs: {folder.parent}" in block
    assert load_checkpoint(folder / "best.ckpt")["epoch"] + 1 == best_epoch


def test_without_a_terminal_each_epoch_is_one_line(summary):
    experiment, lines = summary
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert [line.split()[1] for line in epochs] == ["1/4", "2/4", "3/4", "4/4"]
    rows = metrics_rows(experiment)
    for line, row in zip(epochs, rows, strict=True):
        assert f"mean {float(row['val/auroc/mean']):.4f}" in line, line
    assert not any("\r" in line or "it/s" in line for line in lines), "no progress bar off a terminal"
    means = [float(r["val/auroc/mean"]) for r in rows]  # "(best)": a strict improvement, as best.ckpt keeps it
    improved = [e + 1 for e in range(1, len(means)) if means[e] > max(means[:e])]
    marked = [int(line.split()[1].split("/")[0]) for line in epochs if "(best)" in line]
    assert marked == improved


def lvfl(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LVFL_DEBUG"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(  # noqa: S603 - lvfl's own command
        [sys.executable, "-m", "lvfl", *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
    )


ONE_LINE = {
    "negative batch size": (
        ["fit", "--config", "configs/easter/wine.yaml", "--data.init_args.batch_size=-1"],
        "lvfl: error: data (lvfl.datamodules.Wine): batch_size must be at least 1, got -1",
    ),
    "abbreviated option": (
        ["fit", "--config", "configs/easter/wine.yaml", "--trainer.max_epoch=3"],
        "lvfl: error: unrecognized arguments: --trainer.max_epoch=3 (--trainer.max_epoch: did you mean "
        "--trainer.max_epochs?)",
    ),
    "misspelt subcommand": (
        ["fitt", "--config", "configs/easter/wine.yaml"],
        "lvfl: error: no subcommand 'fitt'; did you mean 'fit'? the subcommands are fit, validate, test, predict, "
        "bench, export, party, launch, pki, serve, score, attack-score (lvfl --help)",
    ),
    "missing config": (
        ["fit", "--config", "configs/easter/no_such.yaml"],
        None,
    ),
    "misspelt class": (
        ["fit", "--config", "configs/easter/wine.yaml", "--model.aggregation=lvfl.privacy.DHMasklng"],
        None,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(ONE_LINE))
def test_a_refused_input_is_exactly_one_line(case, tmp_path):
    """Nothing before it (no seed, accelerator or tip lines), nothing after it, exit status 2."""
    args, expected = ONE_LINE[case]
    done = lvfl(*args, f"--trainer.logger.init_args.save_dir={tmp_path}")
    output = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 2, done
    assert len(output) == 1, output
    assert output[0].startswith("lvfl: error: "), output
    if expected is not None:
        assert output[0] == expected


@pytest.mark.slow
def test_an_abbreviation_is_refused_not_taken_for_the_option(tmp_path):
    """`--trainer.max_epoch=1` must not run a fit of one epoch (argparse would take any unique prefix)."""
    done = lvfl("fit", "--config", "configs/easter/wine.yaml", "--trainer.max_epoch=1",
                f"--trainer.logger.init_args.save_dir={tmp_path}")  # fmt: skip
    assert done.returncode == 2
    assert not list(tmp_path.rglob("*.ckpt")), "nothing was fitted"


def documented_errors() -> list[tuple[str, str]]:
    """The (command, output) pairs of the ``$ lvfl ...`` examples in the getting-started page's error section."""
    text = (REPO / "docs/getting-started.md").read_text()
    section = text.split("## When something is wrong", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    return [(line[2:], lines[i + 1]) for i, line in enumerate(lines) if line.startswith("$ lvfl ")]


@pytest.mark.slow
def test_the_documented_errors_are_what_lvfl_prints(tmp_path):
    """Each example of the docs, run as written (`my.yaml`: digits with party1's learning rate negative)."""
    examples = documented_errors()
    assert len(examples) >= 2
    digits = (REPO / "configs/easter/digits.yaml").read_text()
    first, second = digits.split("lr: 0.1", 2)[:2], digits.split("lr: 0.1", 2)[2]
    (tmp_path / "my.yaml").write_text(first[0] + "lr: 0.1" + first[1] + "lr: -0.1" + second)
    (tmp_path / "configs").symlink_to(REPO / "configs")
    for command, expected in examples:
        args = command.split()[1:]
        done = lvfl(*args, f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}", cwd=tmp_path)
        assert done.returncode == 2, (command, done.stderr)
        assert (done.stdout + done.stderr).splitlines() == [expected], command


@pytest.mark.slow
def test_the_summary_names_the_students_figures_and_file_and_one_byte_total(tmp_path):
    """With a student, the summary gives its test AUROC on the bank's test customers, on those both parties hold and
    on those only the bank holds (what the VFL model cannot answer), as the CSV logger recorded them, and its file."""
    student = '{"class_path": "lvfl.callbacks.StudentDistillation", "init_args": {"epochs": 5}}'
    done = lvfl("fit", "--config", CONFIG, "--trainer.max_epochs=2", f"--trainer.callbacks+={student}",
                f"--trainer.logger.init_args.save_dir={tmp_path}", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.splitlines() + done.stderr.splitlines()  # what the person who ran it sees, stream by stream
    (metrics,) = (tmp_path / "bank_retailer").glob("version_0/metrics.csv")
    with metrics.open(newline="") as f:
        logged = {k: float(v) for row in csv.DictReader(f) for k, v in row.items() if k.startswith("student/") and v}
    (line,) = [line for line in printed if line.startswith("  student: ")]
    assert not [line for line in printed if line.startswith("  unanswered: ")]  # the student answers them
    folder = checkpoints_of(tmp_path / "bank_retailer")
    shown = re.fullmatch(
        r"  student: test auroc ([\d.]+) on party0's (\d+) test samples \(([\d.]+) on the (\d+) every party holds, "
        r"([\d.]+) on the (\d+) only it holds\); saved: (.+)",
        line,
    )
    assert shown is not None, line
    auroc, total, shared_auroc, shared, only_auroc, only, saved = shown.groups()
    assert float(auroc) == pytest.approx(logged["student/test/auroc"], abs=5e-5)
    assert float(shared_auroc) == pytest.approx(logged["student/test/auroc/overlap"], abs=5e-5)
    assert float(only_auroc) == pytest.approx(logged["student/test/auroc/active_only"], abs=5e-5)
    assert int(shared) + int(only) == int(total) == 180  # the bank's test customers, as lvfl predict answers them
    assert int(only) > 0
    assert Path(saved) == folder / "student.pt"
    assert Path(saved).is_file()
    # one byte total: the ledger printed at the end of fit holds the student's teacher traffic, each byte under a tag
    (head,) = [i for i, line in enumerate(printed) if line.startswith("== communication during fit")]
    total_mb, messages = re.search(r": ([\d.]+) MB in (\d+) messages ==", printed[head]).groups()
    (wire,) = [line for line in printed if line.startswith("  wire: ")]
    assert wire.startswith(f"  wire: {total_mb} MB (")
    assert wire.endswith(f" in {int(messages):,} messages")
    tags = {}
    for line in printed[head + 1 :]:
        if not line.startswith("  tag  "):
            break
        name, _, _, count, _ = line.split()[1:]
        tags[name] = int(count.replace(",", ""))
    assert any(name.startswith("teacher/") for name in tags)
    assert sum(tags.values()) == int(wire.split("(")[1].split()[0].replace(",", ""))
    assert len({line.index(" MB ") for line in printed[head + 1 :] if line.startswith(("  tag  ", "  link "))}) == 1


@pytest.mark.slow
def test_lvfl_test_prints_what_the_test_moved_and_the_cumulative_figure_in_one_line(summary, tmp_path):
    """The test's own traffic tag by tag (aligned), then one line: the checkpoint's history plus the test's."""
    experiment, _ = summary
    last = checkpoints_of(experiment) / "last.ckpt"
    done = lvfl("test", "--config", CONFIG, f"--ckpt_path={last}", f"--trainer.logger.init_args.save_dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.splitlines() + done.stderr.splitlines()
    (head,) = [i for i, line in enumerate(printed) if line.startswith("== communication during test: ")]
    rows = []
    for line in printed[head + 1 :]:
        if not line.startswith(("  tag  ", "  link ")):
            break
        rows.append(line)
    tags = {line.split()[1]: int(line.split()[4].replace(",", "")) for line in rows if line.startswith("  tag  ")}
    moved = sum(tags.values())
    messages = int(re.search(r"MB in (\d+) messages ==", printed[head]).group(1))
    assert len({line.index(" MB ") for line in rows}) == 1  # one column, whatever the tags' lengths
    history = load_checkpoint(last)["lvfl"]["wire"]
    before = sum(row[3] for row in history["bytes"])
    sent_before = sum(row[3] for row in history["messages"])
    (cumulative,) = [line for line in printed if line.startswith("== cumulative, the run's earlier traffic included:")]
    assert cumulative.endswith(f": {(before + moved) / 1e6:.3f} MB in {sent_before + messages} messages ==")
    assert len([line for line in printed if line.startswith("  tag  ")]) == len(tags)  # no second, cumulative table
