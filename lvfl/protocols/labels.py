"""`LabelHandling`: which labels each loss of a protocol trains on, and the run's label release.

The protocol's side of label privacy (the rule is in `VFLModule`'s docstring): `labels_for` gives the release to
every model whose outputs, gradients or parameters leave the active party, `private_labels` the true labels to the
`private_head` alone, and `release_labels` draws the release once per run. The release itself (the draw, the lookup
by sample ID, the ledger, the broadcast under DDP) is `lvfl.privacy.labels.release.LabelRelease`: that one is the
mechanism's bookkeeping, this one the protocol's plumbing that routes labels to losses.
"""

from __future__ import annotations

import torch
from torch import nn

from lvfl.parties import VFLBatch
from lvfl.privacy.labels.mechanisms import PrivacyLedger


class LabelHandling:
    """Label plumbing a `VFLModule` inherits: the two label accessors, the private head's loss, the release.

    A plain mixin: it relies on these of `VFLModule` (`lvfl.protocols.base`), which sets them up: `label_mechanism`,
    `label_release` (a `LabelRelease`), `private_head`, `task`, `wire`, `active`, `passive`, `task_loss`, and
    Lightning's `_trainer`.
    """

    @property
    def protects_labels(self) -> bool:
        """Whether a label mechanism is on and there is a passive party whose view it must cover."""
        return self.label_mechanism is not None and bool(self.passive)

    def labels_for(self, party: str, batch: VFLBatch) -> torch.Tensor:
        """The labels of a loss whose outputs, gradients or parameters may leave the active party (any `party`).

        With a label mechanism this is the release for every party, the active one included (its encoder's output
        or its top model's parameters go down, so they must not learn from the true labels); without one, the true
        labels. True labels are only for models nothing leaves: see `private_labels`.
        """
        if not self.protects_labels:
            return batch.labels
        return self.protected_labels(batch.ids).to(batch.labels.device)

    def private_labels(self, batch: VFLBatch) -> torch.Tensor:
        """The true labels, for the `private_head` (via `private_loss`) and models no message ever depends on."""
        return batch.labels

    def private_loss(self, inputs: torch.Tensor, batch: VFLBatch) -> torch.Tensor:
        """The private head's true-label loss on a *detached* input, so it trains the private head and nothing else."""
        if self.private_head is None:
            raise RuntimeError("private_loss needs a private head: protocols build one when protects_labels")
        return self.task_loss(self.private_head(inputs.detach()), self.private_labels(batch))

    def active_prediction(self, shared_head: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        """The active party's reported prediction on `inputs`: its private head if it has one, else `shared_head`."""
        return (shared_head if self.private_head is None else self.private_head)(inputs)

    @property
    def privacy_ledger(self) -> PrivacyLedger:
        """The epsilon spent by this run's label releases (basic composition)."""
        return self.label_release.ledger

    def release_labels(self, ids: torch.Tensor, labels: torch.Tensor) -> None:
        """Draw the protected labels for training samples `ids` once (see `LabelRelease.draw`).

        No-op when there is nothing to protect (no mechanism or no passive party) or when a release for the same
        samples exists (a resume: redrawing would spend epsilon again); a release for other samples raises.
        """
        if self.label_mechanism is None or not self.passive:
            return
        if self.task is None:
            raise RuntimeError("release_labels needs the task: call it after setup/build")
        if not self.wire.holds(self.active):  # a passive party's process: the release is the active party's draw
            release = self.label_release
            if release.ids is None:
                release.ids = torch.sort(ids.detach().long().cpu()).values
                release.labels = self.label_mechanism.release_shadow(len(ids), self.task.num_classes)
            return
        trainer = self._trainer
        distributed = trainer is not None and trainer.world_size > 1
        self.label_release.draw(
            ids,
            labels,
            self.task.num_classes,
            rank=trainer.global_rank if trainer is not None else 0,
            broadcast=(lambda obj: trainer.strategy.broadcast(obj, src=0)) if distributed else None,
        )

    def protected_labels(self, ids: torch.Tensor) -> torch.Tensor:
        """The released labels of training samples `ids` (raises for IDs outside the release)."""
        return self.label_release.lookup(ids)
