"""`lvfl fit|validate|test|predict --config ...`: LightningCLI over every lvfl protocol and datamodule.

Protocols (`model:`) and datamodules (`data:`) are chosen by `class_path`; aggregation backends swap with
`--model.aggregation=lvfl.privacy.DHMasking` (or `Plain`). Several `--config` files compose, later ones overriding
earlier ones (configs/README.md: the data, protocol and parties pieces). By default runs log to `runs/` with a
CSVLogger, meter the wire with `CommunicationMeter`, and keep a `last.ckpt` (so `--ckpt_path last` resumes) and the
best epoch by the task's main validation metric, `best.ckpt` (`--ckpt_path best` in test, predict or export).

Every checkpoint is loaded with ``weights_only=True`` (`lvfl.checkpoints`): tensors and plain data, never pickled
objects, which could run code; `--weights_only=false` is refused. A checkpoint that cannot be loaded is a one-line
error naming the file. A fit stopped by SIGINT or SIGTERM exits with 130 or 143 and one line naming the checkpoint to
resume from.
"""

from __future__ import annotations

import difflib
import json
import os
import signal
import sys
import tempfile
import time
from argparse import ArgumentError
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

import torch.distributed as dist
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from lvfl.callbacks import CommunicationMeter, ExperimentCheckpoint
from lvfl.callbacks.checkpoint import ExactResume
from lvfl.checkpoints import (
    SPECIAL_CKPT_PATHS,
    describe_checkpoint,
    drop_an_empty_run_folder,
    load_checkpoint,
    refuse_a_used_version,
    resolve_ckpt_path,
)
from lvfl.commands import predict
from lvfl.commands.argument_errors import check_party_optimizers
from lvfl.commands.config_files import check_public_seeds, resolve_table_paths, with_saved_config
from lvfl.commands.console import EpochLines, fit_summary
from lvfl.commands.errors import debug_requested, reported_errors
from lvfl.commands.interrupts import SIGNALS, Interrupted, reporting_interrupts
from lvfl.commands.lead_help import asks_lead_help, lead_help
from lvfl.commands.twin import PLAIN, Measured, StepTimer, cost_rows, format_table, twin_args
from lvfl.datamodules import VerticalDataModule
from lvfl.federation import FederationError
from lvfl.protocols import VFLModule

DEBUG_HELP = "A refused input prints one line, 'lvfl: error: ...'; add --debug (or set LVFL_DEBUG=1) for tracebacks."


class VFLCLI(LightningCLI):
    """LightningCLI with lvfl's defaults (CSV logs under runs/, a communication meter, last and best checkpoints).

    Checkpoints: `--ckpt_path last` and `best` are resolved from disk (`lvfl.checkpoints.resolve_ckpt_path`), so they
    work in a new process; the file is checked and loaded with ``weights_only=True`` before Lightning reads it, and
    Lightning is passed ``weights_only=True``. `ckpt_file` is the checkpoint the subcommand loads (None: none).
    """

    ckpt_file: Path | None = None

    def __init__(self, *args: Any, party: Any = None, **kwargs: Any) -> None:
        #: with `lvfl party`, this process's party (`lvfl.commands.party.PartySession`): fit runs as that party
        self.party_session = party
        # the command line as given: `lvfl fit --twin` runs it again with the Plain backend (`lvfl.commands.twin`)
        given = kwargs.get("args")
        self._argv = [str(a) for a in given] if isinstance(given, list | tuple) else sys.argv[1:]
        super().__init__(*args, **kwargs)

    def before_instantiate_classes(self) -> None:
        """Refuse `--weights_only=false`; check every party's optimizer, so that a refused setting names the party."""
        config = self.config.get(str(self.subcommand), self.config)
        if config.get("weights_only") is False:
            raise ValueError(
                "--weights_only=false: lvfl loads checkpoints with weights_only=True only (tensors and plain data), "
                "because unpickling other objects can run arbitrary code, and lvfl's own checkpoints need nothing "
                "else; leave --weights_only out"
            )
        check_party_optimizers(config)

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """LightningCLI's parse, with config-relative table paths (`config_files`) and a close match named.

        An unrecognised option (abbreviations are refused: `--trainer.max_epoch` is not `--trainer.max_epochs`) is
        reported with the closest option the subcommand has.
        """
        if isinstance(args, list | tuple):
            args = resolve_table_paths(args)
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as err:
            raise ArgumentError(None, _with_close_option(str(err), parser, args)) from err

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> Any:
        """The subcommand's parser, with lvfl's help for `--ckpt_path` and `--weights_only` (default True)."""
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        helps = {"ckpt_path": CKPT_PATH_HELP.get(subcommand), "weights_only": WEIGHTS_ONLY_HELP}
        for action in parser._actions:
            if helps.get(action.dest):
                action.help = helps[action.dest]
        if any(action.dest == "weights_only" for action in parser._actions):
            parser.set_defaults({"weights_only": True})
        return parser

    def _parse_ckpt_path(self) -> None:
        """Check a `--ckpt_path` file (`lvfl.checkpoints.load_checkpoint`) before LightningCLI reads it.

        LightningCLI loads the file here for its hyperparameters (with weights_only=True), and a file that is not a
        checkpoint would end in a traceback; `last` and `best` are resolved and checked once the trainer exists.
        """
        subcommand = self.config.get("subcommand")
        given = self.config[subcommand].get("ckpt_path") if subcommand else None
        if given is None or str(given) in SPECIAL_CKPT_PATHS:
            return
        load_checkpoint(given, what=f"--ckpt_path {given}")
        super()._parse_ckpt_path()

    def _run_subcommand(self, subcommand: str) -> None:
        """Check the options, resolve and check the checkpoint, run the subcommand; name where to resume if stopped."""
        self._check_options(subcommand)  # an option conflict is named before any checkpoint is looked for
        self.ckpt_file = self._checkpoint_file(subcommand)
        try:
            super()._run_subcommand(subcommand)
            if self.party_session is not None:
                self.party_session.finish()  # every message this party sent is delivered before it exits
        except (KeyboardInterrupt, SystemExit) as stop:
            if self.party_session is not None:
                self.party_session.abort(f"stopped by {stop!r}")
            signum = SIGNALS.received
            if signum is None:
                raise
            raise Interrupted(signum, self._interrupted_message(subcommand, signum)) from stop
        except Exception as err:
            drop_an_empty_run_folder(getattr(self, "trainer", None))  # a refused run leaves no version_N behind
            if self.party_session is None:
                raise
            self.party_session.abort(" ".join(str(err).split()) or type(err).__name__)
            joined = getattr(self.party_session, "transport", None) is not None  # else: refused before it talked
            if isinstance(err, FederationError) and joined:  # a peer is missing, refused or stopped: where to resume
                raise FederationError(f"{err}; {self._resume_hint(subcommand)}") from err
            raise
        finally:
            if self.party_session is not None:
                self.party_session.close()

    def _resume_hint(self, subcommand: str = "fit") -> str:
        """What helps a stopped party, in words (`lvfl party`): resuming only where training stopped part-way."""
        if subcommand != "fit":
            return f"run every party's lvfl {subcommand} again"
        path = self._resume_file()
        if path is not None and getattr(self.trainer.fit_loop, "done", False):  # it failed after the last epoch
            return f"training itself had ended, so resuming would not redo it (this party's last checkpoint: {path})"
        if path is None:
            return "no checkpoint was written yet: start every party again"
        return f"resume every party with --ckpt_path last (this party's: {path})"

    def _checkpoint_file(self, subcommand: str) -> Path | None:
        """The file `--ckpt_path` names (`last` and `best` found on disk), loaded once to check it; says which."""
        given = self.config[subcommand].get("ckpt_path")
        session = self.party_session
        if str(given) == "best" and session is not None and session.holds_no_party(self.datamodule):
            # an HE backend's coordinator keeps no best epoch (its checkpoint holds the loop's counters, no party's
            # tensor, and it never learns which epoch was best): its last checkpoint stands for every epoch's
            print(f"lvfl {subcommand}: --ckpt_path best at {session.party}, which holds no party: its last")
            given = "last"
        path = resolve_ckpt_path(self.trainer, given)
        if path is None:
            return None
        special = str(given) in SPECIAL_CKPT_PATHS
        checkpoint = load_checkpoint(path, what=f"--ckpt_path {given} ({path})" if special else f"--ckpt_path {path}")
        if self.trainer.is_global_zero:  # said once it loaded: a refused checkpoint is one line, the refusal
            about = describe_checkpoint(path, checkpoint)
            line = f"lvfl {subcommand}: --ckpt_path {given}: loaded {path}" + (f" ({about})" if about else "")
            self.trainer.callbacks.append(_SayOnce(line))
        return path

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        """Lightning's arguments, with the resolved checkpoint file and ``weights_only=True``."""
        kwargs = super()._prepare_subcommand_kwargs(subcommand)
        if "ckpt_path" in kwargs:
            kwargs["ckpt_path"] = None if self.ckpt_file is None else str(self.ckpt_file)
        if "weights_only" in self._subcommand_method_arguments[subcommand]:  # Lightning >= 2.6
            kwargs["weights_only"] = True
        return kwargs

    def _interrupted_message(self, subcommand: str, signum: int) -> str:
        """What `main` prints for a subcommand stopped by `signum`: for fit, the checkpoint to resume from."""
        name = signal.Signals(signum).name
        if subcommand != "fit":
            return f"lvfl {subcommand}: stopped by {name}"
        path = self._resume_file()
        if path is None:
            written = (
                "checkpointing is off in this run"
                if not self.trainer.checkpoint_callbacks
                else "no checkpoint was written yet (the first is written when the first epoch ends)"
            )
            return f"lvfl fit: stopped by {name}; {written}, so there is nothing to resume from: fit again"
        try:
            epochs = f" (written after epoch {load_checkpoint(path)['epoch'] + 1}, the last completed)"
        except (OSError, ValueError, KeyError, TypeError):
            epochs = ""
        return f"lvfl fit: stopped by {name}; resume with --ckpt_path {path}{epochs}"

    def _resume_file(self) -> Path | None:
        """The last checkpoint this fit wrote (or restored from), else the one it started from, if any."""
        for keeper in self.trainer.checkpoint_callbacks:
            last = getattr(keeper, "last_model_path", "")
            if last and os.path.isfile(last):
                return Path(last).resolve()
        started = self.trainer.ckpt_path
        return Path(started).resolve() if started and os.path.isfile(started) else None

    def add_arguments_to_parser(self, parser: Any) -> None:
        """Lvfl's defaults: seeded runs, CSV logs under runs/, and the `default_callbacks` switch.

        Trainer settings are parser defaults (not LightningCLI's `trainer_defaults`) so that a config can replace
        each of them. lvfl's callbacks are not a default of `trainer.callbacks`, which a config's own list would
        replace (losing the checkpoint that `--ckpt_path last` needs): `instantiate_trainer` adds them to whatever
        the config lists (`with_default_callbacks`), unless the config sets `default_callbacks: false`.
        """
        parser.set_defaults({"seed_everything": 0, **{f"trainer.{k}": v for k, v in trainer_defaults().items()}})
        parser.add_argument(
            "--default_callbacks",
            type=bool,
            default=True,
            help="Add lvfl's callbacks (CommunicationMeter, ExactResume, EpochLines, ExperimentCheckpoint) to "
            "trainer.callbacks, "
            "each unless the config lists one of its kind; false: only the config's own callbacks.",
        )
        for option, (kind, text) in {**PREDICT_OPTIONS, **FIT_OPTIONS}.items():
            # Optional[...], not `... | None`: jsonargparse reads the annotation object
            parser.add_argument(f"--{option}", type=Optional[kind], default=None, help=text)  # noqa: UP045

    def _refuse_output(self) -> None:
        config = self.config.get(str(self.subcommand), self.config)
        for option in PREDICT_OPTIONS:
            if config.get(option) is not None:
                raise ValueError(f"--{option} is an option of lvfl predict; lvfl {self.subcommand} refuses it")
        for option in FIT_OPTIONS:
            if self.subcommand != "fit" and config.get(option) is not None:
                raise ValueError(f"--{option} is an option of lvfl fit; lvfl {self.subcommand} refuses it")

    def _check_options(self, subcommand: str) -> None:
        """Refuse another subcommand's options, and `--twin` where it cannot run."""
        if subcommand != "predict":
            self._refuse_output()
        config = self.config.get(subcommand, self.config)
        if subcommand == "fit" and config.get("twin"):
            if config.get("ckpt_path") is not None:
                raise ValueError("--twin compares a whole fit with its Plain twin; it does not resume (--ckpt_path)")
            if self.trainer.world_size > 1:
                raise ValueError("--twin runs the Plain twin in this process: use it without DDP (one device)")

    def before_fit(self) -> None:
        """With `--twin`, start the clock the twin's is compared with."""
        config = self.config.get("fit", self.config)
        if self.party_session is not None:
            if config.get("twin"):
                raise ValueError("--twin runs the Plain twin in this process: lvfl party refuses it")
            self.party_session.join(self)
        elif self.trainer.is_global_zero:
            why = "(a simulation: every party is in this process; lvfl party and lvfl launch refuse it)"
            check_public_seeds(self.model, True, "lvfl fit", why)
        self._fit_started = time.perf_counter()
        if config.get("twin"):
            self._step_timer = StepTimer()
            self.trainer.callbacks.append(self._step_timer)

    def after_fit(self) -> None:
        """The fit's summary (`console.fit_summary`); with `--twin`, the Plain twin and what privacy cost."""
        config = self.config.get("fit", self.config)
        if self.trainer.is_global_zero:
            seconds = time.perf_counter() - self._fit_started
            print(fit_summary(self.trainer, self.model, self.datamodule, seconds), flush=True)
        if not config.get("twin"):
            return
        run = Measured.of(time.perf_counter() - self._fit_started, self._step_timer, self.model.wire.bytes_by_tag())
        backend = type(self.model.aggregation).__name__
        psi = getattr(self.datamodule, "psi_seconds", None)
        twin, note = None, ""
        if f"lvfl.privacy.{backend}" == PLAIN:
            note = "The run's aggregation is Plain already: it is its own twin."
        else:
            with tempfile.TemporaryDirectory() as tmp:
                twin_cli = build_cli(twin_args(self._argv, tmp), run=False)
                timer = StepTimer()
                twin_cli.trainer.callbacks.append(timer)
                started = time.perf_counter()
                twin_cli.trainer.fit(twin_cli.model, datamodule=twin_cli.datamodule)
                twin = Measured.of(time.perf_counter() - started, timer, twin_cli.model.wire.bytes_by_tag())
        if self.trainer.is_global_zero:
            print(format_table(cost_rows(backend, run, twin, psi), note))

    def before_validate(self) -> None:
        """With `lvfl party`: join the federation (validate runs every party's part, scored at the active party)."""
        if self.party_session is not None:
            self.party_session.join(self)

    def before_test(self) -> None:
        """With `lvfl party`: join the federation (test runs every party's part, scored at the active party)."""
        if self.party_session is not None:
            self.party_session.join(self)

    def before_predict(self) -> None:
        """`lvfl predict` writes its predictions to a file (`lvfl.commands.predict`, `lvfl.callbacks.PredictionWriter`).

        With `lvfl party`: join the federation first; the active party decides the rows and writes the file.
        """
        if self.party_session is not None:
            self.party_session.join(self)
        predict.before_predict(self)

    def after_predict(self) -> None:
        """Answer what the predict loop did not (`lvfl.commands.predict`) and say where the predictions went."""
        predict.after_predict(self)
        drop_an_empty_run_folder(self.trainer)  # the predictions went elsewhere (--output): no folder of config only

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        """The trainer, with lvfl's default callbacks added to the configured ones (see `with_default_callbacks`).

        A progress bar only where standard output is a terminal, unless the config says (`enable_progress_bar`):
        redirected to a file it is carriage returns, and `console.EpochLines` prints a line per epoch instead.
        """
        config = self.config_init.get(str(self.subcommand), self.config_init)
        trainer = config.get("trainer") or {}
        if config.get("default_callbacks", True) and "callbacks" not in kwargs:
            kwargs["callbacks"] = with_default_callbacks(
                trainer.get("callbacks"), checkpointing=trainer.get("enable_checkpointing") is not False
            )
        if trainer.get("enable_progress_bar") is None and "enable_progress_bar" not in kwargs:
            kwargs["enable_progress_bar"] = sys.stdout.isatty()
        built = super().instantiate_trainer(**kwargs)
        refuse_a_used_version(built)  # every command writes a version folder of its own
        return built


_CKPT_FILES = (
    "'last': the experiment's last.ckpt (<save_dir>/<name>/checkpoints, written after every epoch); 'best': its "
    "best.ckpt, the epoch with the best value of the task's main validation metric (val/acc/mean for multiclass, "
    "val/auroc/mean for binary, val/r2/mean for regression; refused, saying why, for a run that validated no "
    "epoch). Both are found from disk, in a new process too, and the file loaded is printed. Loaded with "
    "weights_only=True: a file holding pickled objects is refused"
)

#: `--ckpt_path` help per subcommand (Lightning's says nothing of lvfl's last/best files)
CKPT_PATH_HELP: dict[str, str] = {
    "fit": f"The checkpoint to resume the fit from: a path, or {_CKPT_FILES}.",
    **{
        subcommand: f"The checkpoint whose weights to {verb}: a path, or {_CKPT_FILES}. Without it the model is "
        "untrained."
        for subcommand, verb in (("validate", "validate"), ("test", "test"), ("predict", "predict with"))
    },
}

WEIGHTS_ONLY_HELP = (
    "lvfl loads every checkpoint with weights_only=True (tensors and plain data only: unpickling other objects can "
    "run arbitrary code) and refuses false."
)

#: the options of `lvfl fit` alone (the other subcommands refuse them), with their help
FIT_OPTIONS: dict[str, tuple[type, str]] = {
    "twin": (
        bool,
        "lvfl fit: after the fit, fit the same config and seed again with the Plain backend and print the time and "
        "bytes the run's privacy mechanisms cost beside it (lvfl.commands.twin); the other subcommands refuse it.",
    ),
}

#: the options of `lvfl predict` alone (the other subcommands refuse them), with their help
PREDICT_OPTIONS: dict[str, tuple[type, str]] = {
    "output": (
        str,
        "lvfl predict: the predictions file (.csv or .parquet), one row per sample keyed by its ID (default: "
        "predictions.csv in the run's log folder); the other subcommands write none and refuse it.",
    ),
    "ids": (
        str,
        "lvfl predict: a file of the IDs to predict, one per line (a .csv: its first column, below the header), "
        "in the order wanted (default: the test split); the other subcommands refuse it.",
    ),
    "oblivious": (
        bool,
        "lvfl predict: answer the IDs (--ids, or the active party's test split) as a deployment would without "
        "telling the passive parties which: each passive party's contributions for the IDs it holds are computed "
        "from the checkpoint into a table, the active party fetches them by 1-out-of-N oblivious transfer "
        "(lvfl.inference.Router), and the saved student answers where a party has no entry; the other "
        "subcommands refuse it.",
    ),
}


def trainer_defaults() -> dict:
    """Trainer defaults every lvfl run gets unless its config overrides them (callbacks: `with_default_callbacks`)."""
    return {
        "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "runs"}},
        "enable_model_summary": False,
    }


def with_default_callbacks(callbacks: Any, checkpointing: bool = True) -> list:
    """The default callbacks of lvfl, followed by the configured `callbacks` (a list, one callback, or None).

    The defaults are `CommunicationMeter` (the wire's figures; placed after the configured callbacks, so that the
    ledger it prints at the end of fit holds what they sent then), `ExactResume` (a resumed fit continues the run it
    resumes), `console.EpochLines` (a line per epoch where no progress bar draws; the fit summary's figures) and
    `ExperimentCheckpoint` (the `last.ckpt` that `--ckpt_path last` loads, and the best epoch's
    `best.ckpt` that `--ckpt_path best` loads). Each is added unless the configured list already holds a callback of
    its kind, which then takes its place: a configured `CommunicationMeter(print_summary=false)` replaces the
    default one, and any configured `ModelCheckpoint` takes checkpointing over (`lvfl bench` keeps only its
    best-epoch checkpoint). No checkpoint callback is added when `checkpointing` is False
    (`trainer.enable_checkpointing: false`).
    """
    configured = [] if callbacks is None else list(callbacks) if isinstance(callbacks, list | tuple) else [callbacks]
    defaults = [(ExactResume, ExactResume), (EpochLines, EpochLines)]
    if checkpointing:
        defaults.append((ModelCheckpoint, ExperimentCheckpoint))
    added = [make() for kind, make in defaults if not any(isinstance(cb, kind) for cb in configured)]
    # the meter after the configured callbacks: its ledger, printed at the end of fit, holds what they sent there
    # (the student's teacher traffic), so the ledger's total is the summary's
    meter = [] if any(isinstance(cb, CommunicationMeter) for cb in configured) else [CommunicationMeter()]
    return [*added, *configured, *meter]


def build_cli(args: list[str], run: bool = True, exit_on_error: bool = True, party: Any = None) -> VFLCLI:
    """The CLI on `args` (with `run=False` the first argument is not a subcommand): for scripts and tests.

    With `exit_on_error=False` a refused argument raises `argparse.ArgumentError` instead of printing the usage and
    exiting, so that `main` can report it in one line.
    """
    return VFLCLI(
        party=party,
        model_class=VFLModule,
        datamodule_class=VerticalDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
        auto_configure_optimizers=False,
        parser_kwargs={  # no abbreviations: `--trainer.max_epoch=3` is a typo, not `--trainer.max_epochs=3`
            "exit_on_error": exit_on_error,
            "epilog": DEBUG_HELP,
            "allow_abbrev": False,
            **{subcommand: {"epilog": DEBUG_HELP, "allow_abbrev": False} for subcommand in VFLCLI.subcommands()},
        },
    )


def run_args(
    configs: str | Sequence[str],
    seed: int,
    save_dir: str,
    overrides: Sequence[str] = (),
    *,
    name: str | None = None,
    callbacks: Sequence[dict] = (),
    default_callbacks: bool = False,
    checkpointing: bool = False,
) -> list[str]:
    """The CLI arguments (no subcommand) of one scripted, seeded run: the one place they are built.

    `configs` go first as several `--config` (later files override earlier ones), then `seed` for the model's
    initialisation and the data split, logs under `save_dir` (as `name` if given), no progress bar, exactly
    `callbacks` (class_path/init_args dicts) plus lvfl's defaults if `default_callbacks`, checkpointing on or off,
    and `overrides` last. `run_experiment` and each `lvfl bench` cell use it.
    """
    configs = [configs] if isinstance(configs, str) else list(configs)
    return [
        *(arg for config in configs for arg in ("--config", config)),
        f"--seed_everything={seed}",
        f"--data.init_args.seed={seed}",
        f"--trainer.logger.init_args.save_dir={save_dir}",
        *([f"--trainer.logger.init_args.name={name}"] if name is not None else []),
        "--trainer.enable_progress_bar=false",
        f"--trainer.enable_checkpointing={str(checkpointing).lower()}",
        "--trainer.callbacks=" + json.dumps(list(callbacks)),
        f"--default_callbacks={str(default_callbacks).lower()}",
        *overrides,
    ]


def run_experiment(
    config: str | Sequence[str],
    seed: int,
    overrides: list[str] | None = None,
    save_dir: str | None = None,
    test: bool = True,
    before_fit: Callable[[VFLCLI], Any] | None = None,
) -> tuple[dict[str, float], VFLCLI]:
    """Fit `config` with `seed` (model init and data split), then test it; returns the test metrics and the CLI.

    `config` is one config file or several, composed in order (e.g. data, protocol and parties pieces). Progress
    bar, checkpoints and default callbacks are off (the metrics come back directly); the test metrics gain
    `wire_bytes`, the run's total on the wire. `before_fit(cli)` runs on the instantiated, unfitted CLI (e.g. to keep
    an unbuilt copy of the model). Used by the benchmark scripts and the accuracy tests.
    """
    with tempfile.TemporaryDirectory() as tmp:
        cli = build_cli(run_args(config, seed, save_dir or tmp, overrides or []), run=False)
        if before_fit is not None:
            before_fit(cli)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        metrics: dict[str, float] = {}
        if test:
            (raw,) = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
            metrics = {k: float(v) for k, v in raw.items()}
        metrics["wire_bytes"] = float(cli.model.wire.total_bytes())
        return metrics, cli


def _option_strings(parser: Any, args: Any) -> list[str]:
    """Every long option of `parser`, or of the subcommand parser `args` selects."""
    actions = getattr(parser, "_subcommands_action", None)
    if actions is not None and isinstance(args, list | tuple):
        chosen = next((a for a in args if a in actions.choices), None)
        if chosen is not None:
            parser = actions.choices[chosen]
    return [o for o in getattr(parser, "_option_string_actions", {}) if o.startswith("--")]


def _with_close_option(message: str, parser: Any, args: Any) -> str:
    """Jsonargparse's "unrecognized arguments: --x=1" with the closest option of the parser named."""
    prefix = "unrecognized arguments:"
    if not message.startswith(prefix):
        return message
    given = [a.split("=", 1)[0] for a in message[len(prefix) :].split() if a.startswith("--")]
    options = _option_strings(parser, args)
    hints = []
    for option in given:
        close = difflib.get_close_matches(option, options, n=1, cutoff=0.8)
        if close:
            hints.append(f"{option}: did you mean {close[0]}?")
    return message + (f" ({'; '.join(hints)})" if hints else "")


def main(args: list[str] | None = None, party: Any = None) -> None:
    """LightningCLI's subcommands with lvfl's error reporting (the `lvfl` command is `lvfl.commands.entry.main`).

    A refused input (bad option or value, class path that does not import, refused backend, bad data, a file that
    is not a checkpoint) prints one line, ``lvfl: error: <message>``, to stderr and exits with status 2; anything else
    (a bug) keeps its traceback. ``--debug`` anywhere on the command line, or ``LVFL_DEBUG=1``, shows every traceback
    and every warning. Known third-party noise (Lightning's tips, jsonargparse deprecations) is silenced; see
    `lvfl.commands.errors` for both lists. A run stopped by SIGINT or SIGTERM exits with 130 or 143 (128 + the signal's
    number, as a shell reports it) after one line on stderr; for `lvfl fit` it names the checkpoint to resume from.
    """
    debug, argv = debug_requested(list(args if args is not None else sys.argv[1:]))
    if asks_lead_help(argv):  # lvfl's options first (lvfl.commands.lead_help)
        print(lead_help(argv[0]))
        raise SystemExit(0)
    if len(argv) == 3 and argv[1:] == ["--help", "all"]:  # LightningCLI's whole help, every Trainer flag
        argv = argv[:2]
    subcommand = argv[0] if argv and argv[0] in VFLCLI.subcommands() else ""
    with reporting_interrupts(subcommand), reported_errors(debug):
        if subcommand in ("validate", "test", "predict"):  # from a checkpoint alone: the run's saved config
            given = argv[1:]
            argv = [subcommand, *with_saved_config(given, f"lvfl {subcommand}")]
            if len(argv) - 1 != len(given):
                print(f"lvfl {subcommand}: the run's config: {argv[2]}")
        _run(argv, party)


def _run(argv: list[str], party: Any = None) -> None:
    try:
        build_cli(argv, exit_on_error=False, party=party)
    finally:
        _close_process_group()


class _SayOnce(Callback):
    """Prints a line when the subcommand's loop starts, after Lightning restored the checkpoint it names."""

    def __init__(self, line: str) -> None:
        self.line: str | None = line

    def _say(self, *args: Any) -> None:
        if self.line is not None:
            print(self.line, flush=True)
            self.line = None

    on_fit_start = on_validation_start = on_test_start = on_predict_start = _say


def _close_process_group() -> None:
    """Destroy the DDP process group before the interpreter exits (Lightning leaves it open).

    Left open, gloo's threads can still be joinable when the interpreter tears down, and the process then aborts
    ("terminate called without an active exception") after a run that finished: a non-zero exit status for a
    successful fit.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
