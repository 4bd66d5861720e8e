"""Resuming: `ExperimentCheckpoint` keeps checkpoints per experiment, `ExactResume` makes a resume continue its run.

Lightning's `ModelCheckpoint` writes under the logger's *version* folder, and every new run gets a new version, so
`--ckpt_path last` from a fresh command finds nothing. `ExperimentCheckpoint` writes to
`<save_dir>/<name>/checkpoints` (the experiment, not the version) unless `dirpath` is given, and asking for
`ckpt_path="last"` when that folder holds no last checkpoint is an error naming the folder (Lightning only warns,
then trains from scratch or tests an untrained model).

A resumed fit equals the uninterrupted one (bit-identical parameters, the same validation metrics) when every
source of randomness in epoch e is a function of the run's seed and e alone: the training order
(`lvfl.datamodules.EpochShuffle`) and torch's global RNG (dropout, ...), which `ExactResume` reseeds at the start of
every training epoch. Lightning's checkpoints do not hold the RNG state, and restoring a saved state would not be
enough: whatever runs between the save and the next epoch (a resume's own set-up) draws from it differently.
`ExactResume` also skips the sanity check of a resumed fit: the run ran it before its first epoch, and running it
again would put validation traffic on the wire and use mask steps that the uninterrupted run does not.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint

from lvfl.runs import derive_seed


class ExperimentCheckpoint(ModelCheckpoint):
    """A `ModelCheckpoint` with a per-experiment directory.

    Defaults differ from Lightning's where resuming needs it: `save_last=True`, and `enable_version_counter=False`
    so that `last.ckpt` is overwritten by each run instead of piling up `last-v1.ckpt`, `last-v2.ckpt`, ...
    Runs that share the directory (the same logger name) share `last.ckpt`; every lvfl checkpoint records the run
    that wrote it (`lvfl.runs.run_fingerprint`), and loading it into a run that differs is refused.
    """

    def __init__(
        self, *args: Any, save_last: bool | None = True, enable_version_counter: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(*args, save_last=save_last, enable_version_counter=enable_version_counter, **kwargs)

    def _use_experiment_dir(self, trainer: Trainer) -> None:
        if self.dirpath is None and trainer.loggers:
            logger = trainer.loggers[0]
            save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
            self.dirpath = os.path.join(save_dir, str(logger.name), "checkpoints")

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Resolve the experiment directory before Lightning's own set-up."""
        self._use_experiment_dir(trainer)
        super().setup(trainer, pl_module, stage)

    def _find_last_checkpoints(self, trainer: Trainer) -> set[str]:
        """The last checkpoints in the experiment directory (Lightning calls this for `ckpt_path="last"` only).

        Raises:
            FileNotFoundError: when there is none and no other checkpoint callback could supply one, naming the
                directory looked in.
        """
        self._use_experiment_dir(trainer)
        found = super()._find_last_checkpoints(trainer)
        others = [
            cb for cb in trainer.callbacks if cb is not self and isinstance(cb, ModelCheckpoint | OnExceptionCheckpoint)
        ]
        if not found and not others:
            where = self.dirpath if self.dirpath is not None else os.path.join(trainer.default_root_dir, "checkpoints")
            raise FileNotFoundError(
                f'ckpt_path="last": there is no last checkpoint in {os.path.abspath(where)} (nothing was fitted '
                "with this experiment's logger save_dir and name yet); fit first, or pass the path of a checkpoint"
            )
        return found


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
