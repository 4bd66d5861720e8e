"""Checkpoints per run: `ExperimentCheckpoint` keeps the last and the best epoch, `ExactResume` resumes exactly.

Every fit writes its own version folder, `<save_dir>/<name>/version_N/` (the logger's: `metrics.csv`, the run's
`config.yaml`, and `checkpoints/`), so a second fit never touches the first's files. `ExperimentCheckpoint` keeps
`checkpoints/last.ckpt` after every epoch and `checkpoints/best.ckpt`, the epoch with the best value of the task's main
validation metric (`val/acc/mean` for a multiclass task, `val/auroc/mean` for a binary one, `val/r2/mean` for a
regression; all maximised). `lvfl.checkpoints.resolve_ckpt_path` finds both from disk within one run (the newest
version holding a checkpoint), so `--ckpt_path last` and `--ckpt_path best` work
in a new process; asking for either when there is none is an error naming the folder (Lightning only warns, then
trains from scratch or tests an untrained model, and resolves "best" only in the process that fitted). A resumed
fit writes a version folder of its own too, and carries the run's best epoch over into it.

A resumed fit equals the uninterrupted one (bit-identical parameters, the same validation metrics) when every source of
randomness in epoch e is a function of the run's seed and e alone: the training order
(`lvfl.datamodules.samplers.EpochShuffle`) and torch's global RNG (dropout, ...), which `ExactResume` reseeds at the
start of every training epoch. Lightning's checkpoints do not hold the RNG state, and restoring a saved state would not
be enough: whatever runs between the save and the next epoch (a resume's own set-up) draws from it differently.
`ExactResume` also skips the sanity check of a resumed fit: the run ran it before its first epoch, and running it again
would put validation traffic on the wire and use mask steps that the uninterrupted run does not.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lvfl.checkpoints import best_file, resolve_ckpt_path
from lvfl.parties import TaskInfo, party_name
from lvfl.protocols.task_metrics import BEST_EPOCHS_METRIC, main_validation_metric
from lvfl.runs import derive_seed

#: the file name (without .ckpt) of the best epoch that `ExperimentCheckpoint` keeps beside last.ckpt
BEST_NAME = "best"


class ExperimentCheckpoint(ModelCheckpoint):
    """A `ModelCheckpoint` in the run's version folder that keeps `last.ckpt` and the best epoch, `best.ckpt`.

    Defaults differ from Lightning's where resuming and a later `--ckpt_path best` need it: `save_last=True`,
    written after every epoch (Lightning writes it only with a top-k file), `enable_version_counter=False` so that
    `last.ckpt` and `best.ckpt` keep their names (a version folder holds one run); without a `monitor`, the monitor
    is the task's main validation metric (`main_validation_metric`, read from the datamodule at set-up) with
    `mode="max"`, and the one best file is `best.ckpt` (`filename` when given). A run that validates no epoch (or
    whose datamodule has no task) keeps no best file. A fresh fit into a folder that holds an earlier run's best
    file (a `dirpath` given) removes it first, so that `--ckpt_path best` never finds another run's (`lvfl.commands.fit`
    refuses a logger version whose folder holds a run). A resumed fit, in a version folder of its own, copies the best
    epoch of the run it resumes there, so that its folder holds the whole run's best. Every lvfl checkpoint records
    the run that wrote it (`lvfl.runs.run_fingerprint`), and loading it into a run that differs is refused.

    Args:
        dirpath: the folder; default `<save_dir>/<name>/version_N/checkpoints` of the trainer's first logger (the
            run's version folder).
        filename: the best file's name without .ckpt; default `best` (Lightning's `epoch=..` names when
            `save_top_k` is not 1).
        monitor: the metric the best epoch is selected by; default: the task's main validation metric.
        mode: "max" or "min" for `monitor`; default "max" for the task's metric, Lightning's "min" for a given one.
        save_top_k, save_last, enable_version_counter, **kwargs: as `ModelCheckpoint`'s.
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        mode: str | None = None,
        save_top_k: int = 1,
        save_last: bool | None = True,
        enable_version_counter: bool = False,
        **kwargs: Any,
    ) -> None:
        self.auto_monitor = monitor is None
        if filename is None and save_top_k == 1:
            filename = BEST_NAME
        if mode is None:
            mode = "max" if self.auto_monitor else "min"
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            monitor=monitor or "<the task's main validation metric>",  # Lightning refuses top-k > 1 without one
            mode=mode,
            save_top_k=save_top_k,
            save_last=save_last,
            enable_version_counter=enable_version_counter,
            **kwargs,
        )
        self.monitor = monitor  # None: chosen in `setup`
        #: the folder is the run's version folder (not one given): `--ckpt_path last|best` looks in the run's
        self.dirpath_is_run_folder = dirpath is None
        self._inherited_best: tuple[str, Any] | None = None  # a resume's best epoch, copied at train start

    def _use_run_folder(self, trainer: Trainer) -> None:
        """`<save_dir>/<name>/<version>/checkpoints` of this run's logger (the version it picks, or was given)."""
        if self.dirpath is None and trainer.loggers:
            logger = trainer.loggers[0]
            save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
            version = logger.version
            version = version if isinstance(version, str) else f"version_{version}"
            self.dirpath = os.path.join(save_dir, str(logger.name), version, "checkpoints")

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Resolve the experiment directory and the monitor (the datamodule's task) before Lightning's set-up.

        The monitor is part of the callback's `state_key`: set here, before a resume restores the callback's state,
        it is the same when a checkpoint is written and when it is read.
        """
        self._use_run_folder(trainer)
        if self.auto_monitor and self.monitor is None:
            datamodule = getattr(trainer, "datamodule", None)
            task = getattr(datamodule, "task", None)
            if isinstance(task, TaskInfo):
                self.monitor = main_validation_metric(task)
            wire = getattr(pl_module, "wire", None)
            if wire is not None and getattr(datamodule, "active_party", None) is not None:
                if not wire.holds(party_name(datamodule.active_party)):  # a passive party's own process
                    self.monitor = BEST_EPOCHS_METRIC
                participants = getattr(datamodule, "participants", None) or []
                if wire.here is not None and wire.here not in {party_name(i) for i in participants}:
                    # an HE backend's coordinator: no party's data, no validation byte; it keeps `last.ckpt` only
                    self.monitor, self.save_top_k = None, 0
        super().setup(trainer, pl_module, stage)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Make the folder's `best.ckpt` this run's: a fresh fit removes an earlier run's, a resume copies its own.

        (Here rather than in `on_fit_start`: with some strategies Lightning restores the checkpoint, and sets
        `trainer.ckpt_path`, only after `on_fit_start`.)
        """
        super().on_train_start(trainer, pl_module)
        best = best_file(self)
        if trainer.ckpt_path is None and best is not None and best.is_file():
            trainer.strategy.remove_checkpoint(best)
        inherited, self._inherited_best = self._inherited_best, None
        if inherited is not None and best is not None and trainer.ckpt_path is not None:
            source, score = inherited
            if trainer.is_global_zero:
                best.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, best)
            trainer.strategy.barrier("lvfl-inherit-best")
            self.best_model_path, self.best_model_score = str(best), score
            self.best_k_models = {str(best): score}
            self.kth_best_model_path, self.kth_value = str(best), score

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Lightning's restore; a resume into another folder (its own version) keeps the run's best epoch too.

        Lightning restores only the best file's path when the folder changed, and would then keep the first resumed
        epoch as "best" whatever the earlier epochs scored: the resumed run's best file is copied into this run's
        folder at train start, with its score, so that `best.ckpt` stays the best epoch of the whole run.
        """
        saved = state_dict.get("dirpath", self.dirpath)
        if self.dirpath is not None and saved != self.dirpath:
            state_dict = {**state_dict, "dirpath": self.dirpath}  # restore the counters without Lightning's warning
            path, score = state_dict.get("best_model_path"), state_dict.get("best_model_score")
            state_dict.update(best_k_models={}, kth_best_model_path="", last_model_path="")
            super().load_state_dict(state_dict)
            self.best_model_score, self.best_model_path = None, ""
            if path and score is not None and os.path.isfile(path):
                self._inherited_best = (str(path), score)
            return
        super().load_state_dict(state_dict)

    def _save_topk_checkpoint(self, trainer: Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        """Keep the best epoch; with the task's metric as monitor, an epoch without validation keeps none.

        (Lightning would warn that the metric is missing, or, with no monitor, keep the latest epoch as "best".)
        """
        if self.auto_monitor and (self.monitor is None or self.monitor not in monitor_candidates):
            return
        super()._save_topk_checkpoint(trainer, monitor_candidates)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Lightning's saves, then `last.ckpt` if they wrote none (an epoch that did not improve the best)."""
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_every_epoch(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Lightning's saves, then `last.ckpt` if they wrote none (an epoch that did not improve the best)."""
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_every_epoch(trainer)

    def _save_last_every_epoch(self, trainer: Trainer) -> None:
        """Write `last.ckpt` at a save point where no top-k file was written (Lightning writes it only with one).

        A resume, and the line an interrupted `lvfl fit` prints, need the last completed epoch's checkpoint.
        """
        if not self.save_last or self._should_skip_saving_checkpoint(trainer):  # skipped: saved at this step
            return
        if self._every_n_epochs >= 1 and (trainer.current_epoch + 1) % self._every_n_epochs == 0:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def _find_last_checkpoints(self, trainer: Trainer) -> set[str]:
        """The run's last checkpoint (Lightning calls this for `ckpt_path="last"` only): `resolve_ckpt_path`'s.

        Raises:
            FileNotFoundError: when there is none, naming the folder looked in.
        """
        return {str(resolve_ckpt_path(trainer, "last"))}


class ExactResume(Callback):
    """Makes a resumed fit continue its run exactly: per-epoch seeds for torch's global RNG, no second sanity check.

    At the start of each training epoch, torch's global RNG (CPU and every GPU) is reseeded from (seed, epoch,
    rank), so whatever draws from it during training (dropout, random augmentation) does the same in epoch e of
    every run with the same seed, however many epochs this process ran before: a run resumed at epoch r continues
    the uninterrupted run instead of drawing from wherever its own set-up left the RNG. The rank is mixed
    in so that DDP ranks draw independent dropout masks for their shards. A fit that starts from a checkpoint runs
    no sanity check (the interrupted run did, before its first epoch), so that the wire carries and the mask
    counter counts exactly what the uninterrupted run's did.

    Args:
        seed: the base seed; None takes the run's `seed_everything` seed (`PL_GLOBAL_SEED`), or, without one, a seed
            drawn once from the global RNG at the start of the first fit (on rank 0, broadcast to every rank).
            The base seed is checkpointed, so a resume keeps it whatever the resumed process was seeded with.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self.base_seed: int | None = None
        self._sanity_steps: int | float | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Fix the base seed (a resume has restored it from the checkpoint already); a resume skips the sanity check."""
        if trainer is not None and trainer.ckpt_path is not None and trainer.num_sanity_val_steps:
            self._sanity_steps, trainer.num_sanity_val_steps = trainer.num_sanity_val_steps, 0
        if self.base_seed is not None:
            return
        seed = self.seed
        if seed is None and os.environ.get("PL_GLOBAL_SEED") is not None:
            seed = int(os.environ["PL_GLOBAL_SEED"])
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())
            if trainer.world_size > 1:
                seed = int(trainer.strategy.broadcast(seed, src=0))
        self.base_seed = int(seed)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Give the trainer its sanity-check setting back (for a later fit with it)."""
        if self._sanity_steps is not None:
            trainer.num_sanity_val_steps, self._sanity_steps = self._sanity_steps, None

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Reseed for this epoch."""
        if self.base_seed is None:  # fit started without on_fit_start (not through the Trainer)
            self.on_fit_start(trainer, pl_module)
        torch.manual_seed(derive_seed(self.base_seed, "global_rng", trainer.current_epoch, trainer.global_rank))

    def state_dict(self) -> dict[str, Any]:
        """The base seed, so that a resume reseeds its epochs as the interrupted run would have."""
        return {"base_seed": self.base_seed}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the base seed."""
        if state_dict.get("base_seed") is not None:
            self.base_seed = int(state_dict["base_seed"])
