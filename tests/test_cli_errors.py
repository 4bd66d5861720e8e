"""Refused inputs on the command line: one `lvfl: error:` line naming the option, party or value, exit status 2.

Every case runs `lvfl.commands.fit.main` in-process and checks stderr: the key phrases of the message are there, and no
traceback, usage dump or model Namespace is. `--debug` / LVFL_DEBUG=1 bring the traceback back; bugs keep theirs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import REPO

from lvfl.commands import entry
from lvfl.commands.argument_errors import summarize_argument_error
from lvfl.commands.errors import debug_requested
from lvfl.commands.fit import main
from lvfl.datamodules import VerticalDataModule

DIGITS = "configs/easter/digits.yaml"
MLP = "{class_path: lvfl.models.MLP, init_args: {hidden: [4]}}"


class ArrayFile(VerticalDataModule):
    """Features `x` and labels `y` from an .npz file: how these tests hand the CLI bad data."""

    def __init__(self, path: str, **kwargs: Any) -> None:
        self.path = path
        super().__init__(**kwargs)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        with np.load(self.path) as arrays:
            return arrays["x"], arrays["y"]


class BuggyData(VerticalDataModule):
    """A datamodule with a bug in `load`: a TypeError that no `raise` statement made, so it keeps its traceback."""

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        rows = None
        return np.zeros((len(rows), 4)), np.zeros(len(rows))  # TypeError: object of type 'NoneType' has no len()


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("LVFL_DEBUG", raising=False)


def quick(tmp_path: Path) -> list[str]:
    return [
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=1",
        "--trainer.limit_val_batches=1",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
    ]


def tiny(
    tmp_path: Path,
    parties: list[str] | None = None,
    data: str = "lvfl.datamodules.Wine",
    data_args: str = "num_parties: 2, batch_size: 32",
) -> str:
    """A small, fast EASTER config (Wine over 2 parties, MLPs, Plain); `parties` are YAML flow mappings."""
    entries = "\n".join(f"      - {entry}" for entry in (parties or [f"{{model: {MLP}}}"]))
    path = tmp_path / "tiny.yaml"
    path.write_text(
        "model:\n"
        "  class_path: lvfl.protocols.EASTER\n"
        "  init_args:\n"
        "    embedding_dim: 4\n"
        f"    parties:\n{entries}\n"
        f"data:\n  class_path: {data}\n  init_args: {{{data_args}}}\n"
    )
    return str(path)


def sgd_parties(*settings: str) -> list[str]:
    """One MLP party per entry of `settings`, each with SGD and those init args (e.g. "lr: 0.1")."""
    return [f"{{model: {MLP}, optimizer: {{class_path: torch.optim.SGD, init_args: {{{s}}}}}}}" for s in settings]


def array_config(tmp_path: Path, x: np.ndarray, y: np.ndarray) -> str:
    """A 2-party EASTER config over `x`, `y` (written to an .npz file) with the `ArrayFile` datamodule."""
    np.savez(tmp_path / "data.npz", x=x, y=y)
    data_args = f"path: '{tmp_path / 'data.npz'}', num_parties: 2, batch_size: 16"
    return tiny(tmp_path, data="test_cli_errors.ArrayFile", data_args=data_args)


def good_arrays(n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 4)).astype(np.float32), np.arange(n) % 2


def nan_features(tmp_path):
    x, y = good_arrays()
    x[[3, 7, 9], 3] = np.nan  # column 3 belongs to party1 (columns 2..3)
    return array_config(tmp_path, x, y)


def inf_features(tmp_path):
    x, y = good_arrays()
    x[5, 0] = np.inf
    return array_config(tmp_path, x, y)


def string_labels(tmp_path):
    x, y = good_arrays()
    return array_config(tmp_path, x, np.where(y == 1, "yes", "no"))


def string_features(tmp_path):
    x, y = good_arrays()
    text = x.astype(str)
    text[4, 2] = "n/a"
    return array_config(tmp_path, text, y)


def empty_data(tmp_path):
    return array_config(tmp_path, np.zeros((0, 4), np.float32), np.zeros(0, np.int64))


def fractional_labels(tmp_path):
    x, y = good_arrays()
    return array_config(tmp_path, x, y + 0.5)


def out_of_range_labels(tmp_path):
    x, y = good_arrays()
    y[[1, 2]] = 5  # 3 distinct labels {0, 1, 5}: num_classes 3, so 5 is out of range
    return array_config(tmp_path, x, y)


def one_class(tmp_path):
    x, _ = good_arrays()
    return array_config(tmp_path, x, np.zeros(len(x), np.int64))


def short_labels(tmp_path):
    x, y = good_arrays()
    return array_config(tmp_path, x, y[:-3])


def bad_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model: {class_path: lvfl.protocols.EASTER\n  init_args: [\n")
    return str(path)


# (id, config: a path or a function of tmp_path, extra arguments, phrases the one-line message must hold)
CASES = [
    # ---- command line and config file: typos, wrong class paths, wrong types
    ("typo-model-option", tiny, ["--model.init_args.embedding_dimm=8"], ["embedding_dimm", "did you mean"]),
    ("unknown-flag", tiny, ["--no_such_flag=1"], ["unrecognized arguments", "--no_such_flag"]),
    ("typo-backend-class", tiny, ["--model.aggregation=lvfl.privacy.Pailier"], ["Pailier", "lvfl.privacy.Paillier"]),
    ("typo-protocol-class", tiny, ["--model=lvfl.protocols.EASTR"], ["model", "EASTR", "EASTER"]),
    ("typo-data-class", tiny, ["--data=lvfl.datamodules.Wines"], ["data", "Wines", "lvfl.datamodules.Wine?"]),
    (
        "typo-party-model-class",
        lambda tmp: tiny(tmp, ["{model: lvfl.models.MLPP}"]),
        [],
        ["model.parties", "MLPP", "lvfl.models.MLP?"],
    ),
    (
        "typo-model-hyperparameter",
        lambda tmp: tiny(tmp, ["{model: {class_path: lvfl.models.MLP, init_args: {hiden: [4]}}}"]),
        [],
        ["model.parties.model", "lvfl.models.MLP", "'hiden'", "did you mean hidden?"],
    ),
    (
        "typo-optimizer-class",
        lambda tmp: tiny(tmp, [f"{{model: {MLP}, optimizer: torch.optim.SDG}}"]),
        [],
        ["model.parties.optimizer", "SDG", "torch.optim.SGD?"],
    ),
    (
        "typo-optimizer-option",
        lambda tmp: tiny(tmp, sgd_parties("lrr: 0.1")),
        [],
        ["model.parties.optimizer", "torch.optim.SGD", "'lrr'", "did you mean lr?"],
    ),
    (
        "option-of-another-backend",
        tiny,
        ["--model.aggregation=lvfl.privacy.DHMasking", "--model.aggregation.key_size=2048"],
        ["model.aggregation", "DHMasking", "key_size"],
    ),
    ("party-option-typo", tiny, ["--model.init_args.parties.lr=0.1"], ["model.parties", "PartyConfig", "'lr'"]),
    ("not-an-int", tiny, ["--trainer.max_epochs=abc"], ["trainer.max_epochs", "'abc'"]),
    ("data-not-an-int", tiny, ["--data.init_args.batch_size=many"], ["data.batch_size", "'many'"]),
    ("bad-choice", tiny, ["--trainer.precision=13"], ["trainer.precision", "'13'", "bf16-mixed"]),
    ("missing-config", "configs/easter/no_such.yaml", [], ["config", "no_such.yaml", "does not exist"]),
    ("broken-yaml", bad_yaml, [], ["line 2"]),
    # ---- values that the configured class refuses
    (
        "weak-paillier-key",
        tiny,
        ["--model.aggregation=lvfl.privacy.Paillier", "--model.aggregation.key_size=1024"],
        ["model.aggregation", "key_size", "1024", "2048"],
    ),
    ("negative-embedding-dim", tiny, ["--model.init_args.embedding_dim=-1"], ["embedding_dim", "-1"]),
    ("empty-parties", tiny, ["--model.parties=[]"], ["model.parties is empty"]),
    ("zero-batch-size", tiny, ["--data.init_args.batch_size=0"], ["data (lvfl.datamodules.Wine)", "batch_size"]),
    ("fraction-out-of-range", tiny, ["--data.init_args.val_fraction=1.5"], ["val_fraction", "1.5"]),
    (
        "no-training-rows-left",
        tiny,
        ["--data.init_args.val_fraction=0.5", "--data.init_args.test_fraction=0.5"],
        ["val_fraction + test_fraction", "< 1"],
    ),
    ("active-party-out-of-range", tiny, ["--data.init_args.active_party=7"], ["active_party=7", "num_parties=2"]),
    ("participants-without-active", tiny, ["--data.init_args.participants=[1]"], ["participants [1]", "active"]),
    ("zero-overlap", tiny, ["--data.init_args.overlap=0"], ["overlap", "(0, 1]"]),
    (
        "negative-epsilon",
        tiny,
        ["--model.label_mechanism=lvfl.privacy.RandomizedResponse", "--model.label_mechanism.epsilon=-1"],
        ["model.label_mechanism", "epsilon", "-1"],
    ),
    (
        "negative-lr-names-party",
        lambda tmp: tiny(tmp, sgd_parties("lr: 0.1", "lr: -0.1")),
        [],
        ["model.parties[1] (party1)", "torch.optim.SGD", "-0.1"],
    ),
    (
        "negative-momentum-names-party",
        lambda tmp: tiny(tmp, sgd_parties("lr: 0.1", "lr: 0.1", "lr: 0.1, momentum: -1"), data_args="num_parties: 3"),
        [],
        ["model.parties[2] (party2)", "momentum", "-1"],
    ),
    (
        "nan-lr-names-party",
        lambda tmp: tiny(tmp, sgd_parties("lr: .nan", "lr: 0.1")),
        [],
        ["model.parties[0] (party0)", "nan"],
    ),
    (
        "negative-lr-for-every-party",
        lambda tmp: tiny(tmp, sgd_parties("lr: -1")),
        [],
        ["model.parties[0] (every party)", "-1"],
    ),
    ("synthetic-no-samples", tiny, ["--data=lvfl.datamodules.Synthetic", "--data.num_samples=0"], ["num_samples"]),
    # ---- refused at set-up: party counts, backends, models, data
    ("more-parties-than-columns", tiny, ["--data.init_args.num_parties=14"], ["num_parties=14", "13 feature columns"]),
    (
        "party-count-mismatch",
        lambda tmp: tiny(tmp, sgd_parties("lr: 0.1", "lr: 0.1")),
        ["--data.init_args.num_parties=3"],
        ["model.parties has 2 entries", "3 parties"],
    ),
    (
        "masking-one-passive-party",
        tiny,
        ["--model.aggregation=lvfl.privacy.DHMasking"],
        ["DHMasking", "two passive parties", "allow_insecure"],
    ),
    (
        "bad-hidden-width",
        lambda tmp: tiny(tmp, ["{model: {class_path: lvfl.models.MLP, init_args: {hidden: [-4]}}}"]),
        [],
        ["hidden", "-4"],
    ),
    (
        "unknown-activation",
        lambda tmp: tiny(tmp, ["{model: {class_path: lvfl.models.MLP, init_args: {activation: relux}}}"]),
        [],
        ["activation", "relux"],
    ),
    (
        "too-few-samples-to-split",
        tiny,
        ["--data=lvfl.datamodules.Synthetic", "--data.num_samples=5"],
        ["5 samples", "val_fraction"],
    ),
    ("nan-features", nan_features, [], ["party1", "3 non-finite feature values"]),
    ("inf-features", inf_features, [], ["party0", "1 non-finite"]),
    ("string-labels", string_labels, [], ["labels must be integer", "'no'"]),
    ("string-features", string_features, [], ["party1", "not numbers", "n/a"]),
    ("empty-data", empty_data, [], ["no samples"]),
    ("fractional-labels", fractional_labels, [], ["non-integer", "0.5"]),
    ("out-of-range-labels", out_of_range_labels, [], ["out-of-range label values [5]"]),
    ("single-class", one_class, [], ["at least 2 classes"]),
    ("labels-do-not-match-rows", short_labels, [], ["targets must have shape (60,)"]),
    ("missing-checkpoint", tiny, ["--ckpt_path=no_such_run.ckpt"], ["no_such_run.ckpt"]),
    # ---- refused during training (the protocols' own check): a party's loss diverges
    (
        "diverging-party",
        lambda tmp: tiny(tmp, sgd_parties("lr: 0.01", "lr: 1.0e+30")),
        ["--trainer.limit_train_batches=4"],
        ["party", "non-finite", "training step"],
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("config", "extra", "phrases"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refusal_is_one_line_naming_the_input(config, extra, phrases, tmp_path, capsys):
    config = config(tmp_path) if callable(config) else config
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", config, *quick(tmp_path), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("lvfl: error:")]
    assert len(lines) == 1, err
    for phrase in phrases:
        assert phrase in lines[0], f"{phrase!r} not in {lines[0]!r}"
    for noise in ("Traceback", "usage:", "Namespace(", "Given value", "Does not validate"):
        assert noise not in err, err


@pytest.mark.parametrize(
    ("argv", "phrase"),
    [
        (["fitt", "--config", DIGITS], "invalid choice: 'fitt'"),
        ([], "subcommand"),
    ],
    ids=["typo-subcommand", "no-subcommand"],
)
def test_bad_subcommand(argv, phrase, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("lvfl: error:")
    assert phrase in err
    assert "Traceback" not in err
    assert "usage:" not in err


def test_debug_flag_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="embedding_dim"):
        main(["fit", "--debug", "--config", tiny(tmp_path), *quick(tmp_path), "--model.init_args.embedding_dim=-1"])


def test_debug_environment_variable_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("LVFL_DEBUG", "1")
    with pytest.raises(Exception, match="Pailier"):
        main(["fit", "--config", tiny(tmp_path), "--model.aggregation=lvfl.privacy.Pailier"])


def test_a_bug_keeps_its_traceback(tmp_path):
    with pytest.raises(TypeError, match="NoneType"):
        main(["fit", "--config", tiny(tmp_path), *quick(tmp_path), "--data=test_cli_errors.BuggyData"])


def test_help_mentions_the_debug_switch(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--help"])
    assert exit_info.value.code == 0
    assert "--debug" in capsys.readouterr().out


def test_debug_switch_is_stripped_from_argv():
    assert debug_requested(["fit", "--debug", "-c", "x.yaml"], environ={}) == (True, ["fit", "-c", "x.yaml"])
    assert debug_requested(["fit"], environ={"LVFL_DEBUG": "1"}) == (True, ["fit"])
    assert debug_requested(["fit"], environ={"LVFL_DEBUG": "0"}) == (False, ["fit"])


def test_summary_keeps_the_option_and_drops_the_union_dump():
    message = (
        'Parser key "model":\n'
        "  Does not validate against any of the Union subtypes\n"
        "  Subtypes: [<class 'lvfl.protocols.base.VFLModule'>, <class 'NoneType'>]\n"
        "  Errors:\n"
        "    - Problem with given class_path 'lvfl.protocols.EASTER':\n"
        '        Parser key "aggregation":\n'
        "          Expected a <class 'int'>. Got value: abc\n"
        "    - Expected a <class 'NoneType'>\n"
        "  Given value type: <class 'jsonargparse._util.NestedArg'>\n"
        "  Given value: NestedArg(key='aggregation', val='abc')\n"
    )
    assert summarize_argument_error(message) == "model.aggregation: expected int, got 'abc'"


def test_a_good_run_prints_no_warnings(tmp_path, capfd):
    main(["fit", "--config", tiny(tmp_path), *quick(tmp_path)])  # 1 batch < log_every_n_steps, num_workers=0
    err = capfd.readouterr().err
    for noise in ("Warning", "warn(", "args parameter", "Tip:", "does not have many workers", "logging interval"):
        assert noise not in err, err


@pytest.mark.slow
def test_console_script_prints_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "LVFL_DEBUG"}
    result = subprocess.run(
        [sys.executable, "-m", "lvfl", "fit", "--config", tiny(tmp_path), "--model.init_args.embedding_dim=0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("lvfl: error:")
    assert "embedding_dim" in result.stderr
    assert "Traceback" not in result.stderr
    assert "Warning" not in result.stderr


@pytest.mark.slow
def test_the_command_leaves_with_its_status_and_all_its_output_and_a_caller_in_process_keeps_its_own_exit():
    """The `lvfl` command skips the interpreter's teardown once its exit handlers ran (`_leave_without_teardown`):
    its status, its buffered output and what its exit handlers print still come out; main() called with arguments
    (a test) never ends the process."""
    code = (
        "import atexit, sys\n"
        "from lvfl.commands import entry\n"
        "def dispatch(argv):\n"
        "    atexit.register(lambda: print('an exit handler ran'))\n"
        "    print('working on', argv)  # buffered: stdout is a pipe\n"
        "    raise SystemExit(3)\n"
        "entry._dispatch = dispatch\n"
        "sys.argv = ['lvfl', 'fit']\n"
        "entry.main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 3
    assert done.stdout == "working on ['fit']\nan exit handler ran\n"
    entry.main(["--help"])  # in-process, with arguments: nothing recorded, so pytest exits as it would
    assert entry._EXIT_STATUS == []
