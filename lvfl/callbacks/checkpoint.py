"""`ExperimentCheckpoint`: checkpoints kept per experiment, so `--ckpt_path last` resumes the previous run.

Lightning's `ModelCheckpoint` writes under the logger's *version* folder, and every new run gets a new version, so
`--ckpt_path last` from a fresh command finds nothing. This subclass writes to `<save_dir>/<name>/checkpoints`
(the experiment, not the version) unless `dirpath` is given.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint


class ExperimentCheckpoint(ModelCheckpoint):
    """A `ModelCheckpoint` with a per-experiment directory.

    Defaults differ from Lightning's where resuming needs it: `save_last=True`, and `enable_version_counter=False`
    so that `last.ckpt` is overwritten by each run instead of piling up `last-v1.ckpt`, `last-v2.ckpt`, ...
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
        self._use_experiment_dir(trainer)
        return super()._find_last_checkpoints(trainer)
