"""Writing lvfl's own figures to every configured Lightning logger, cheaply.

`LightningModule.log` is costly per call (Lightning's result collection moves and walks every value; the cost
beside a direct logger write is measured by `benchmarks/perf/costs.py`, docs/results.md section 8), and lvfl writes
dozens of figures a step on datasets whose whole epoch takes milliseconds. Figures that nothing monitors (per-step
losses, epoch losses, communication bytes) are therefore written straight to `trainer.loggers`, as Lightning's own
`LearningRateMonitor` does, at Lightning's step counter and cadence. Validation and test metrics still go through
`self.log`, so `ModelCheckpoint` and `EarlyStopping` can monitor them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def is_logging_step(trainer: Any) -> bool:
    """Whether Lightning writes step-level metrics at this batch (its `log_every_n_steps` cadence).

    Under manual optimization `global_step` counts optimizer steps (one per party), hence Lightning's own test.
    """
    if trainer is None:
        return False
    return bool(trainer._logger_connector.should_update_logs)


def log_to_loggers(trainer: Any, metrics: Mapping[str, float], epoch: bool = False) -> None:
    """Write `metrics` to every logger of `trainer` at Lightning's current logging step (rank zero only).

    Values must already be reduced across ranks when that matters. With `epoch=True` the epoch number is added,
    as Lightning does for epoch-level metrics.
    """
    if trainer is None or not trainer.is_global_zero or not trainer.loggers:
        return
    values = {k: float(v) for k, v in metrics.items()}
    if epoch:
        values["epoch"] = trainer.current_epoch
    step = trainer.fit_loop.epoch_loop._batches_that_stepped
    for logger in trainer.loggers:
        logger.log_metrics(values, step=step)
