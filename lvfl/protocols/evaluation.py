"""`Evaluation`: what a protocol scores and logs, and its validation, test and predict steps.

Per-party training losses (per step on the logging cadence, and per epoch), the validation and test metrics of every
predicting party's model and their mean, the best-epoch byte the active party sends after each validation epoch,
and the predictions `lvfl predict` writes. All of it runs on `party_logits`, the protocol's inference; where a
passive party's own prediction goes (`predictions_delivered_to`) is decided here too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from lvfl.loggers import is_logging_step, log_to_loggers
from lvfl.parties import VFLBatch
from lvfl.protocols.task_metrics import BEST_EPOCHS_METRIC, main_validation_metric, metric_names, update_metric
from lvfl.wire import is_shadow, shadow


class Evaluation:
    """Scoring, logging and the evaluation steps a `VFLModule` inherits.

    A plain mixin: it relies on these of `VFLModule` (`lvfl.protocols.base`), which sets them up: `party_logits`,
    `task`, `task_loss`, `check_finite`, `metrics` (the trackers `build` makes), `wire`, `active`, `passive`,
    `party_names`, `predicting_parties`, `label_mechanism`, `privacy_ledger`, the state `_train_loss_sum`,
    `_train_loss_count`, `_train_loss_names`, `_best_epoch` and `_prediction_recipient`, and Lightning's `log`,
    `trainer` and `_trainer`.
    """

    def record_train_losses(self, losses: Mapping[str, torch.Tensor]) -> None:
        """Accumulate the step's losses and write them on the logging cadence (see `lvfl.loggers`).

        Keyed by the party that owns each loss: EASTER every party, split learning one joint loss under the active.
        """
        losses = {k: v for k, v in losses.items() if not is_shadow(v)}  # a party's view records its own
        if not losses:
            return
        self.check_finite(losses, "training loss")
        self._train_loss_names = list(losses)
        stacked = torch.stack([losses[k].detach() for k in self._train_loss_names])
        self._train_loss_sum = stacked if self._train_loss_sum is None else self._train_loss_sum + stacked
        self._train_loss_count += 1
        if is_logging_step(self._trainer):
            names = [f"train/loss/{n}" for n in self._train_loss_names]
            log_to_loggers(self._trainer, dict(zip(names, stacked.tolist(), strict=True)))

    def log_train_epoch(self) -> None:
        """Log the epoch's mean training losses (and the label epsilon spent so far), then reset the sums.

        `VFLModule.on_train_epoch_end` calls it after stepping the schedulers.
        """
        metrics: dict[str, float] = {}
        if self._train_loss_sum is not None and self._train_loss_count:
            means = self._train_loss_sum / self._train_loss_count
            if self.trainer.world_size > 1:
                means = self.trainer.strategy.reduce(means, reduce_op="mean")
            names = [f"train/loss_epoch/{n}" for n in self._train_loss_names]
            metrics.update(zip(names, means.tolist(), strict=True))
        if (self.label_mechanism is not None or len(self.privacy_ledger)) and self.wire.holds(self.active):
            metrics["privacy/label_epsilon"] = self.privacy_ledger.total_epsilon  # basic composition, all releases
        if metrics:
            log_to_loggers(self.trainer, metrics, epoch=True)
        self._train_loss_sum, self._train_loss_count = None, 0

    @property
    def prediction_recipient(self) -> str:
        """Who receives a passive party's own prediction in `party_logits`: the active party unless redirected."""
        return self._prediction_recipient or self.active

    @contextmanager
    def predictions_delivered_to(self, party: str) -> Iterator[None]:
        """Inside the block, `party_logits` delivers the passive parties' own predictions to `party`.

        The teacher's inference (`lvfl.inference.teacher`) sends them to the producer, who sums them, so that the
        active party never sees one passive party's prediction; a party's own prediction then stays where it is.
        """
        if party not in self.party_names:
            raise ValueError(f"there is no party {party!r} to deliver predictions to (parties: {self.party_names})")
        before, self._prediction_recipient = self._prediction_recipient, party
        try:
            yield
        finally:
            self._prediction_recipient = before

    def _eval_step(self, batch: VFLBatch, stage: str) -> None:
        logits = self.party_logits(batch)
        if not self.wire.holds(self.active):  # a passive party's process: it sent its part; scores need the labels
            return
        for name, out in logits.items():
            self.log(f"{stage}/loss/{name}", self.task_loss(out, batch.labels), sync_dist=True)
            for metric in metric_names(self.task):
                tracker = self.metrics[f"{stage}_{metric}_{name}"]
                update_metric(tracker, metric, self.task, out, batch.labels)
                self.log(f"{stage}/{metric}/{name}", tracker, on_step=False, on_epoch=True)

    def validation_step(self, batch: VFLBatch, batch_idx: int) -> None:
        """Every party's model on the validation batch."""
        self._eval_step(batch, "val")

    def test_step(self, batch: VFLBatch, batch_idx: int) -> None:
        """Every party's model on the test batch."""
        self._eval_step(batch, "test")

    def _log_mean(self, stage: str) -> None:
        if not self.wire.holds(self.active):  # the metrics are the active party's (it holds the labels)
            return
        self._epoch_means = {}
        for metric in metric_names(self.task) if self.task is not None else ():
            keys = [f"{stage}_{metric}_{n}" for n in self.predicting_parties]
            if keys and all(k in self.metrics for k in keys):
                values = torch.stack([self.metrics[k].compute() for k in keys])
                self._epoch_means[f"{stage}/{metric}/mean"] = float(values.mean())
                # compute() already synced the metric states across ranks; sync_dist only silences Lightning's hint
                self.log(f"{stage}/{metric}/mean", values.mean(), on_epoch=True, sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        """Log the mean over party models; tell the passive parties whether this epoch is the best so far."""
        self._log_mean("val")
        self.share_best_epoch()

    def share_best_epoch(self) -> None:
        """One byte to each passive party after a validation epoch: 1 if it is the best so far, else 0.

        Where the run keeps a best checkpoint (`ExperimentCheckpoint`, selecting by the task's main validation
        metric), every party must keep the same epoch, but only the active party holds the labels that score it.
        So the active party sends each passive party whether this epoch beat every earlier one (strictly, as the
        checkpoint compares), and a passive party's own process selects its best epoch by the running count of
        such epochs (`lvfl.protocols.task_metrics.BEST_EPOCHS_METRIC`). The byte is a function of the validation
        labels; it is metered (tag `best_epoch`) in simulation too, since a deployment sends it.
        """
        trainer = self._trainer
        if trainer is None or trainer.sanity_checking or not self.passive:
            return
        keeps_best = any(  # an `ExperimentCheckpoint` (lvfl.callbacks) choosing its own monitor, keeping a best file
            getattr(cb, "auto_monitor", False) and getattr(cb, "save_top_k", 0) != 0
            for cb in trainer.checkpoint_callbacks
        )
        if not keeps_best:
            return
        flag = torch.zeros(1, dtype=torch.uint8)
        if self.wire.holds(self.active):
            value = getattr(self, "_epoch_means", {}).get(main_validation_metric(self.task))
            best = self._best_epoch["value"]
            improved = value is not None and value == value and (best is None or value > best)  # NaN never wins
            if improved:
                self._best_epoch["value"] = value
            flag[0] = int(improved)
        else:
            flag = shadow(flag)
        for party in self.passive:
            received = self.wire.send(self.active, party, flag, "best_epoch")
            if party == self.wire.here:  # a passive party's own process: what it selects its best epoch by
                self._best_epoch["count"] += int(received.item())
                # the same count at every rank (the active party's means are synced before it compares them);
                # sync_dist only silences Lightning's hint where a party runs several ranks
                self.log(BEST_EPOCHS_METRIC, float(self._best_epoch["count"]), on_epoch=True, sync_dist=True)

    def on_test_epoch_end(self) -> None:
        """Log the mean over party models."""
        self._log_mean("test")

    def predict_step(self, batch: VFLBatch, batch_idx: int) -> dict[str, Any]:
        """Every predicting party's class probabilities ("probs"), keyed by party, with the sample IDs.

        A regression gives the predicted values in the target's units ("values") instead. In a party's own process,
        the predictions it holds only (a passive party's: none; it served its part of the batch).
        """
        logits = {k: v for k, v in self.party_logits(batch).items() if not is_shadow(v)}
        if self.task is not None and self.task.is_regression:
            return {"ids": batch.ids, "values": {k: self.task.to_target(v.reshape(-1)) for k, v in logits.items()}}
        return {"ids": batch.ids, "probs": {k: v.softmax(-1) for k, v in logits.items()}}
