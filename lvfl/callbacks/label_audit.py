"""`LabelLeakageAudit`: how well a passive party could infer the labels from what it receives.

In EASTER (and SplitNN-style protocols) the active party returns dloss_k/dR_k, the gradient of the loss with
respect to passive party k's prediction. For softmax cross-entropy that row is (softmax(R) - onehot(y)) / B: the
true class is its one negative component, so a passive party reads the label off every gradient it receives
(Fu et al., "Label inference attacks against vertical federated learning", USENIX Security 2022; Li et al.,
"Label leakage and protection in two-party split learning", ICLR 2022). The audit mounts that attack on the
wire's inbox of every passive party (`lvfl.wire.Wire.subscribe`) and scores it against the true labels of the
batch: the attacker never sees the labels, the audit is only the evaluator.

Metrics, per training epoch, to every logger (`lvfl.loggers.log_to_loggers`) and into `history`:
`audit/label_attack_acc/<party>`, the fraction of training samples whose label party `<party>` guessed right
(summed over ranks under DDP). With a label mechanism that releases protected labels (e.g. k-ary randomized
response) the attack recovers the protected label, so its accuracy falls to the mechanism's keep probability.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer

from lvfl.attacks.label import gradient_label_scores, infer_labels_from_gradients
from lvfl.loggers import log_to_loggers
from lvfl.observing import WireObserver

PREFIX = "audit/label_attack_acc"
__all__ = ["LabelLeakageAudit", "gradient_label_scores", "infer_labels_from_gradients"]


# -- the stateful shell -----------------------------------------------------------------------------------------------
class LabelLeakageAudit(WireObserver):
    """Logs each passive party's label-inference attack accuracy on the gradients it receives, per training epoch.

    Only training messages are scored (labels are known only for the current training batch) and only tensors
    sent to a passive party under one of `tags` whose leading dimension equals the batch size, so whole-dataset
    releases or per-party keys never get paired with the wrong labels.

    Args:
        tags: the wire tags to attack; the attack above fits prediction gradients.

    Example:
        >>> audit = LabelLeakageAudit()
        >>> # pl.Trainer(callbacks=[audit]).fit(EASTER(...), datamodule=Digits()); audit.history[-1]["party1"]
    """

    def __init__(self, tags: Iterable[str] = ("gradients",)) -> None:
        super().__init__()
        self.tags = frozenset(tags)
        self.history: list[dict[str, float]] = []  # one entry per training epoch: {"epoch": e, party: accuracy}
        self._correct: dict[str, int] = {}  # this epoch, per passive party (a resumable running count)
        self._total: dict[str, int] = {}
        self._counts_epoch = -1  # the epoch the counts belong to: a resume into a later epoch starts afresh
        self._pending: dict[str, list[torch.Tensor]] = {}  # device counts not yet read back (no sync per step)
        self._labels: torch.Tensor | None = None
        self._passive: frozenset[str] = frozenset()

    # -- the observer: what a passive party receives ----------------------------------------------------------
    def observe(self, src: str, dst: str, tag: str, payload: Any) -> None:  # noqa: D102
        labels = self._labels
        if labels is None or tag not in self.tags or dst not in self._passive:
            return
        if not isinstance(payload, torch.Tensor) or payload.ndim != 2 or payload.shape[0] != labels.shape[0]:
            return
        guesses = infer_labels_from_gradients(payload)
        self._pending.setdefault(dst, []).append((guesses == labels.to(guesses.device)).sum())
        self._total[dst] = self._total.get(dst, 0) + int(labels.shape[0])

    def _flush(self) -> None:
        for party, counts in self._pending.items():
            self._correct[party] = self._correct.get(party, 0) + int(torch.stack(counts).sum().item())
        self._pending = {}

    # -- hooks -----------------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Start listening to the protocol's wire (afresh: a new fit starts with no stale batch)."""
        self.stop_listening()
        self.listen(pl_module)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Know who is passive (parties are built in `setup`) and start this epoch's counts."""
        self._passive = frozenset(pl_module.passive)
        if self._counts_epoch != trainer.current_epoch:  # a mid-epoch resume keeps its counts
            self._correct, self._total, self._pending = {}, {}, {}
            self._counts_epoch = trainer.current_epoch

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Hold the batch's true labels, for scoring only."""
        labels = getattr(batch, "labels", None)
        self._labels = labels.detach() if isinstance(labels, torch.Tensor) else None

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Stop scoring until the next training batch (validation traffic carries no labels to compare with)."""
        self._labels = None

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Log each passive party's attack accuracy over the epoch (summed over ranks)."""
        self._flush()
        parties = sorted(self._passive)
        counts = torch.tensor(
            [[self._correct.get(k, 0), self._total.get(k, 0)] for k in parties], dtype=torch.float64
        ).reshape(-1, 2)
        if trainer.world_size > 1:
            counts = trainer.strategy.reduce(counts.to(pl_module.device), reduce_op="sum").cpu()
        accuracy = {k: c / n for k, (c, n) in zip(parties, counts.tolist(), strict=True) if n > 0}
        self.history.append({"epoch": float(trainer.current_epoch), **accuracy})
        if accuracy:
            log_to_loggers(trainer, {f"{PREFIX}/{k}": v for k, v in accuracy.items()}, epoch=True)

    def stop_listening(self) -> None:
        """Unsubscribe, and forget the batch's labels."""
        super().stop_listening()
        self._labels = None

    # -- checkpointing ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This epoch's running counts and the per-epoch history, so a resume keeps both."""
        self._flush()
        return {
            "epoch": self._counts_epoch,
            "correct": dict(self._correct),
            "total": dict(self._total),
            "history": [dict(h) for h in self.history],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore `state_dict`."""
        self._counts_epoch = int(state_dict.get("epoch", -1))
        self._correct = {k: int(v) for k, v in state_dict.get("correct", {}).items()}
        self._total = {k: int(v) for k, v in state_dict.get("total", {}).items()}
        self._pending = {}
        self.history = [dict(h) for h in state_dict.get("history", [])]
