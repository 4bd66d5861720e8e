"""`LabelRelease`: the protected training labels of one run, drawn once, looked up by sample ID, checkpointed.

A label mechanism spends epsilon each time it is applied, so a run draws its release once for the training set
and every later use (each epoch's passive losses, PraVFed's upload of Y') reads the same draw. The release and its
`PrivacyLedger` are checkpointed together, so a resumed run reuses the release instead of drawing (and spending)
again, and a release for other samples is refused rather than silently redrawn.

Under DDP every rank holds all parties: rank 0 draws and the others receive its draw through `broadcast` (the
mechanism's generator is OS-seeded per process by default, so ranks could not derive the same draw); every rank
records the one release on its ledger.

Copies of the protocol trained inside the same run on subsets of its training samples (the fold teachers of
`lvfl.inference.cross_fit`) read the run's release through `restrict`: the same draw for their samples and the
run's own ledger, so they neither draw again nor could draw without it showing on the run's ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from lvfl.privacy.labels.mechanisms import LabelMechanism, PrivacyLedger


class LabelRelease:
    """The protected labels of the training samples, for a mechanism (or none: nothing is ever drawn).

    Example:
        >>> from lvfl.privacy import RandomizedResponse
        >>> release = LabelRelease(RandomizedResponse(epsilon=50.0, seed=0))
        >>> release.draw(torch.tensor([7, 3]), torch.tensor([1, 0]), num_classes=2)
        >>> release.lookup(torch.tensor([3, 7])).tolist(), release.ledger.total_epsilon
        ([0, 1], 50.0)
    """

    def __init__(self, mechanism: LabelMechanism | None) -> None:
        self.mechanism = mechanism
        self.ledger = PrivacyLedger()
        self.ids: torch.Tensor | None = None  # sorted training sample IDs
        self.labels: torch.Tensor | None = None  # their protected labels, same order

    @property
    def drawn(self) -> bool:
        """Whether the release exists (drawn in this run or restored from a checkpoint)."""
        return self.labels is not None

    def draw(
        self,
        ids: torch.Tensor,
        labels: torch.Tensor,
        num_classes: int,
        rank: int = 0,
        broadcast: Callable[[Any], Any] | None = None,
    ) -> None:
        """Draw the release for training samples `ids` once; a release for the same samples is kept as it is.

        Args:
            ids: the training samples' IDs (any order).
            labels: their true labels, aligned with `ids`.
            num_classes: the task's class count.
            rank: this process's global rank; only rank 0 draws.
            broadcast: `obj -> rank 0's obj` under DDP (e.g. `trainer.strategy.broadcast`); None in one process.

        Raises:
            ValueError: if a release exists for other samples (a new one would spend epsilon again).
        """
        if self.mechanism is None:
            return
        ids = ids.detach().long().cpu()
        order = torch.argsort(ids)
        ids, labels = ids[order], labels.detach().long().cpu()[order]
        if self.ids is not None:
            if not torch.equal(self.ids.cpu(), ids):
                raise ValueError(
                    "the existing label release (drawn earlier or checkpointed) covers other training samples than "
                    f"this datamodule's ({self.ids.numel()} vs {ids.numel()} IDs); use the same data split and seed, "
                    "since a new release would spend the label privacy budget again"
                )
            return
        if rank == 0:
            protected = self.ledger.release(self.mechanism, labels, num_classes, tag="train")
        else:  # rank 0's draw arrives by broadcast; this rank's ledger records the one release
            self.ledger.record(self.mechanism, int(labels.shape[0]), tag="train")
            protected = None
        if broadcast is not None:
            protected = broadcast(protected)
        self.ids, self.labels = ids, protected.cpu()

    def restrict(self, ids: torch.Tensor) -> LabelRelease:
        """This release for a subset `ids` of its samples, sharing this ledger: no new draw, no new ledger entry.

        A fold copy of the protocol (cross-fitting) trains on a subset of the run's training samples; it must read the
        run's one release, since a fold that drew its own would release every label once more per fold. The result
        holds this release's labels for `ids` (so the fold's `draw` for those samples keeps them) and *this*
        `ledger` object, so any release ever recorded through it shows on the run's ledger. When nothing has been
        drawn (no mechanism, or no passive party to protect labels from), the result is undrawn and shares the ledger
        likewise.

        Raises:
            ValueError: if some of `ids` are outside the release.
        """
        out = LabelRelease(self.mechanism)
        out.ledger = self.ledger
        if self.ids is None or self.labels is None:
            return out
        ids = torch.unique(ids.detach().long().cpu())  # sorted, as `draw` keeps them
        parent_ids, parent_labels = self.ids.cpu(), self.labels.cpu()
        pos = torch.searchsorted(parent_ids, ids).clamp(max=max(parent_ids.numel() - 1, 0))
        if parent_ids.numel() == 0 or not torch.equal(parent_ids[pos], ids):
            raise ValueError("restrict: some sample IDs are outside the label release (only training samples have one)")
        out.ids, out.labels = ids, parent_labels[pos].clone()
        return out

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """The released labels of training samples `ids`, on their device (raises for IDs outside the release)."""
        if self.ids is None or self.labels is None:
            raise RuntimeError(
                "a passive party's loss needs the protected labels, which are drawn at fit start (release_labels)"
            )
        if self.ids.device != ids.device:  # move the lookup once, not every step
            self.ids, self.labels = self.ids.to(ids.device), self.labels.to(ids.device)
        ids = ids.long()
        pos = torch.searchsorted(self.ids, ids).clamp(max=self.ids.numel() - 1)
        if not torch.equal(self.ids[pos], ids):
            raise ValueError("protected labels exist only for training samples; the batch has IDs outside the release")
        return self.labels[pos]

    def state_dict(self) -> dict[str, Any]:
        """The release and its ledger (the labels are already DP: checkpointing them spends nothing).

        In a passive party's own process the labels are a shadow of the active party's draw: saved as they are.
        """
        labels = self.labels
        if labels is not None and not labels.is_meta:
            labels = labels.cpu()
        return {
            "ledger": self.ledger.state_dict(),
            "ids": None if self.ids is None else self.ids.cpu(),
            "labels": labels,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        self.ledger.load_state_dict(state["ledger"])
        self.ids, self.labels = state["ids"], state["labels"]
