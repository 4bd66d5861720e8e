"""PraVFed: one-shot weighted upload of passive embeddings, learned from label-DP labels (PraVFed Alg. 1-2).

Parties: one active party (features + labels) and K >= 1 passive parties (features only). Every party owns a model
split into an encoder h_k and a head p_k with its own optimizer. Unlike split learning, no gradient ever goes
down to a passive party: passive parties learn once, before the federated phase, from the active party's
label-DP release, and then upload their (blinded, weighted) embeddings once. The protocol (PraVFed Sec. IV-D/E,
Algorithm 1 lines 1-9 and Algorithm 2), every cross-party move on the wire:

1. at fit start the active party draws the protected labels Y' of the training samples once (Eq. 8; a
   `LabelMechanism`, by default `LaplaceLabels(epsilon=1.0)`) and sends them once to every passive party
   (tag "labels"): float32 noisy one-hot rows (N x M x 4 bytes) or int64 randomized-response labels (N x 8 bytes),
   in ascending sample-ID order, which every party knows after sample alignment, so no IDs are sent;
2. each passive party k pre-trains its own model for `local_epochs` (T_k) epochs on Y' with `task_loss` (MSE on
   Laplace rows, Eq. 4; cross-entropy on randomized-response labels), computes its accuracy acc_k on Y' (argmax of
   the Y' rows as the target) and sends it to the active party (tag "weights", a float32 scalar); the active party
   returns w_k = acc_k / sum_j acc_j (Eq. 8/9; `weighting="average"`: w_k = 1 / K, Fig. 3) (tag "weights");
3. each passive party uploads w_k E_k of every training sample once, and of every evaluation sample once, when an
   evaluation stage first needs it, through the aggregation backend (tag "embeddings"); the active party combines
   the shares into E_p = sum_k w_k E_k (Eq. 7, 9) and keeps it by sample ID;
4. for Lightning's epochs (T) the active party trains its own model on E = E_a + E_p, with E_a = h_a(x_a) and
   E_p looked up by sample ID, against its TRUE labels (cross-entropy); only its optimizer steps.

Weighting before masking (step 3) equals the paper's weighted masks (Eq. 7, 9): the masks r_k are built to sum to zero
in the backend's ring (Z_2^32 by default), so sum_k (w_k E_k + r_k) = sum_k w_k E_k exactly in the ring; the only error
is the fixed-point rounding of each w_k E_k (at most 2^-(f+1) per entry and party, f = `frac_bits`). Weighting the masks
instead (w_k (E_k + r_k)) would need the weighted masks to cancel, sum_k w_k r_k = 0, which pairwise masks do not
satisfy for unequal real-valued weights in a ring; multiplying ring elements by a real w_k is not even defined exactly.
Weighting first keeps the backend unchanged (any backend that sums works: Plain, DHMasking, HE).

What each message reveals: Y' is the epsilon-label-DP release (everything a passive party computes from it is
post-processing); acc_k reveals how well party k's features predict Y'; w_k reveals the normalised accuracies of
all parties (K numbers, per party); under DHMasking a share is uniformly random in the ring and the active party
learns only the weighted sum E_p, never an individual E_k (under `Plain` it sees each w_k E_k). Passive parties
receive nothing during training: no embeddings, predictions or gradients, so the only thing derived from labels they
ever see is Y' (and w_k). The epsilon is spent once (one release, on the `PrivacyLedger`).

Known limits: pre-training runs inside `on_fit_start` on every rank, each over the whole training set (under DDP
ranks hold all parties, start from the same weights and see the same data order, so they pre-train alike, but the
work is not sharded, and each rank uploads E_p for the whole training set, so a DDP run's ledger (summed over
ranks) counts the one-shot upload once per rank). A resumed
run restores the passive models, weights and E_p from the checkpoint and does not pre-train or upload again.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, Literal, get_args

import torch

from lvfl import messages
from lvfl.checks import check_int
from lvfl.parties import VFLBatch
from lvfl.privacy.aggregation.base import AggregationBackend
from lvfl.privacy.labels.mechanisms import LabelMechanism, LaplaceLabels
from lvfl.protocols.base import VFLModule
from lvfl.protocols.party_config import PartyConfig
from lvfl.wire import is_shadow

Weighting = Literal["accuracy", "average"]

#: rows embedded per forward pass when a passive party embeds a whole split (bounds memory, not the wire)
EMBED_CHUNK = 4096


def lookup_rows(sorted_ids: torch.Tensor, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows of `table` (aligned with ascending `sorted_ids`) for sample `ids`; raises for IDs not in the table."""
    ids = ids.long().to(sorted_ids.device)
    pos = torch.searchsorted(sorted_ids, ids).clamp(max=max(sorted_ids.numel() - 1, 0))
    if sorted_ids.numel() == 0 or not torch.equal(sorted_ids[pos], ids):
        raise KeyError("sample IDs outside the table")
    return table[pos]


class PraVFed(VFLModule):
    """PraVFed: passive parties pre-train on label-DP labels, upload weighted embeddings once; the active trains.

    Args:
        parties: one `PartyConfig` per party (or one for all); each party's model and optimizer (and scheduler,
            which a passive party steps once per local epoch).
        aggregation: backend for the one-shot uploads (default `Plain`; `DHMasking` needs K >= 2).
        embedding_dim: the width of every party's embedding (E_a and E_p are added).
        label_mechanism: the label-DP mechanism of the release Y' (Eq. 8). None means the paper's
            `LaplaceLabels(epsilon=1.0)` (OS-seeded): PraVFed is defined by its label DP and never runs without.
        local_epochs: T_k, each passive party's pre-training epochs on Y' (>= 1).
        weighting: ``accuracy`` (w_k proportional to acc_k, Eq. 8/9) or ``average`` (w_k = 1/K, Fig. 3).
    """

    passive_inbox = {**VFLModule.passive_inbox, "labels": messages.LABELS, "weights": messages.WEIGHTS}

    def __init__(
        self,
        parties: list[PartyConfig],
        aggregation: AggregationBackend | None = None,
        embedding_dim: int = 64,
        label_mechanism: LabelMechanism | None = None,
        local_epochs: int = 5,
        weighting: Weighting = "accuracy",
    ) -> None:
        if label_mechanism is None:
            label_mechanism = LaplaceLabels(epsilon=1.0)
        if not isinstance(label_mechanism, LabelMechanism):
            raise TypeError(
                "PraVFed needs a label mechanism (model.label_mechanism: lvfl.privacy.LaplaceLabels or "
                f"RandomizedResponse), got {type(label_mechanism).__name__}: its passive parties learn only from the "
                "label-DP release"
            )
        super().__init__(parties, aggregation=aggregation, embedding_dim=embedding_dim, label_mechanism=label_mechanism)
        why = (
            "T_k, the passive parties' pre-training epochs on the label-DP release: without pre-training the passive "
            "embeddings are those of untrained models"
        )
        check_int(local_epochs, "model.local_epochs", 1, why=why)
        if weighting not in get_args(Weighting):
            raise ValueError(f"model.weighting must be one of {list(get_args(Weighting))}, got weighting={weighting!r}")
        self.local_epochs = local_epochs
        self.weighting: Weighting = weighting
        self.passive_accuracy: dict[str, float] = {}  # acc_k, as the active party received it
        self.passive_weights: dict[str, float] = {}  # w_k, as party k received it
        self._labels_at: dict[str, torch.Tensor] = {}  # passive party -> its received Y' (ascending-ID order)
        self._labels_ids: torch.Tensor | None = None  # the training IDs, ascending (known to every party)
        self._ep_ids = torch.empty(0, dtype=torch.long)  # active party: sample IDs with an uploaded E_p, ascending
        self._ep = torch.empty(0, embedding_dim)  # active party: E_p of those samples, same order
        self._pretrained = False  # steps 1-2 done (every party knows: the weights came down)

    # ------------------------------------------------------------------------------------------------ building
    @property
    def predicting_parties(self) -> list[str]:
        """Only the active party predicts (its model on E_a + E_p)."""
        return [self.active]

    @property
    def pretrained(self) -> bool:
        """Whether steps 1-2 are done (or restored from a checkpoint)."""
        return self._pretrained

    def configure_optimizers(self) -> Any:
        """Only the active party's optimizer (and scheduler): passive parties never step during Lightning's epochs.

        Passive parties build their own optimizer from their config for pre-training (`pretrain_passive`).
        """
        if not self.built:
            raise RuntimeError("configure_optimizers was called before the parties were built (setup/build)")
        cfg = self._configs[self.active]
        opt = cfg.make_optimizer(self.party_parameters(self.active))
        if cfg.lr_scheduler is None:
            return [opt], []
        return [opt], [{"scheduler": cfg.lr_scheduler(opt), "interval": "epoch", "name": f"lr/{self.active}"}]

    def party_optimizers(self) -> dict[str, Any]:
        """The active party's optimizer, keyed by its name (the only one Lightning knows)."""
        opts = self.optimizers()
        return {self.active: opts[0] if isinstance(opts, list) else opts}

    # ------------------------------------------------------------------------------------------------ steps 1-3
    def setup(self, stage: str) -> None:
        """Build the parties (base), then freeze the passive models before a strategy wraps the module.

        DDP registers the parameters that require a gradient when it wraps the module (after `setup`, before
        `on_fit_start`); the passive models never take part in a training step, so they must not be registered, or
        DDP stops on parameters that receive no gradient. Pre-training unfreezes them in its own local loop only.
        """
        super().setup(stage)
        self.freeze_passive()

    def on_fit_start(self) -> None:
        """Steps 1-3 once per run: release and send Y', pre-train, exchange weights, upload the training E_p."""
        super().on_fit_start()  # the base draws the release Y' once (or keeps a checkpointed one)
        if not self.pretrained:
            self.send_labels()  # step 1
            for k in self.passive:  # step 2, each at its own party
                if self.wire.holds(k):
                    self.pretrain_passive(k)
            self.exchange_weights()
            self._pretrained = True
        self.freeze_passive()
        self.upload([self.trainer.datamodule.train_set])  # step 3 (a no-op when E_p is cached or restored)

    def send_labels(self) -> None:
        """Step 1: the release Y' goes once to every passive party, rows in ascending sample-ID order (no IDs)."""
        release = self.label_release
        if release.ids is None or release.labels is None:
            raise RuntimeError("PraVFed sends the label release drawn at fit start; release_labels has not run")
        self._labels_ids = release.ids.cpu()
        labels = release.labels if is_shadow(release.labels) else release.labels.cpu()
        for k in self.passive:
            self._labels_at[k] = self.wire.send(self.active, k, labels, "labels")

    def passive_labels(self, party: str, ids: torch.Tensor) -> torch.Tensor:
        """Y' of training samples `ids` as passive `party` holds it (what it received in step 1)."""
        if self._labels_ids is None or party not in self._labels_at:
            raise RuntimeError(f"passive party {party!r} has not received the label release (send_labels)")
        return lookup_rows(self._labels_ids, self._labels_at[party], ids.cpu())

    def pretrain_passive(self, party: str) -> None:
        """Step 2 at passive `party`: T_k local epochs on Y' with its own optimizer, reading only its own features.

        The loss is `task_loss` against Y' (PraVFed Eq. 4: 1/(2N) ||softmax(R_k) - Y'||^2 for Laplace rows).
        """
        model = self.party_models[party]
        cfg = self._configs[party]
        optimizer = cfg.make_optimizer(model.parameters())
        scheduler = cfg.lr_scheduler(optimizer) if cfg.lr_scheduler is not None else None
        was_training = model.training
        model.train()
        model.requires_grad_(True)  # frozen from setup on (see `setup`); only this local loop trains it
        dm = self.trainer.datamodule
        decode = getattr(dm, "model_input", None)  # loaders serve stored slices (uint8 pixels): decode as fit does
        for epoch in range(self.local_epochs):
            for stored in dm.train_dataloader():
                batch = stored.to(self.device)
                if decode is not None:
                    batch = decode(batch, augment=True, epoch=epoch)
                x = batch.features[party]
                target = self.passive_labels(party, batch.ids).to(self.device)
                optimizer.zero_grad(set_to_none=True)
                loss = self.task_loss(model(x), target)
                loss.backward()
                optimizer.step()
            if scheduler is not None:
                scheduler.step()
        model.train(was_training)
        optimizer.zero_grad(set_to_none=True)
        model.requires_grad_(False)

    @torch.no_grad()
    def passive_accuracy_on_release(self, party: str) -> float:
        """acc_k: the share of training samples where party k's prediction is the argmax of its Y' row (Eq. 8/9)."""
        train = self.trainer.datamodule.train_set
        logits = self.embed(party, train.features[party], head=True)
        target = self.passive_labels(party, train.ids)
        if target.dim() == 2:  # Laplace rows: the noisy one-hot's argmax is the class party k can aim for
            target = target.argmax(-1)
        return float((logits.argmax(-1).cpu() == target.long()).float().mean())

    def exchange_weights(self) -> None:
        """Step 2 (end): acc_k up, w_k = acc_k / sum acc (or 1/K) down, each a float32 scalar (tag "weights")."""
        acc_at_active = {}
        for k in self.passive:  # acc_k, computed at party k (elsewhere: its shadow)
            acc = self.passive_accuracy_on_release(k) if self.wire.holds(k) else None
            up = torch.tensor(acc) if acc is not None else torch.empty((), device="meta")
            acc_at_active[k] = self.wire.send(k, self.active, up, "weights")
        if not self.wire.holds(self.active):  # a passive party's process: its own weight comes down
            for k in self.passive:
                w = self.wire.send(self.active, k, torch.empty((), device="meta"), "weights")
                if not is_shadow(w):
                    self.passive_weights[k] = float(w)
            return
        self.passive_accuracy = {k: float(v) for k, v in acc_at_active.items()}
        accs = torch.stack([acc_at_active[k] for k in self.passive]).to(torch.float64)
        if self.weighting == "average" or float(accs.sum()) <= 0.0:
            if self.weighting != "average":
                warnings.warn("every passive accuracy on Y' is 0; PraVFed falls back to average weights", stacklevel=2)
            weights = torch.full_like(accs, 1.0 / len(self.passive))
        else:
            weights = accs / accs.sum()  # Eq. 8/9
        for k, w in zip(self.passive, weights, strict=True):  # as party k receives it (the active party keeps it too)
            received = self.wire.send(self.active, k, w.to(torch.float32), "weights")
            self.passive_weights[k] = float(w.to(torch.float32)) if is_shadow(received) else float(received)

    def freeze_passive(self) -> None:
        """After pre-training nothing may change a passive model: no optimizer holds it, and it needs no gradient."""
        for k in self.passive:
            self.party_models[k].requires_grad_(False)

    @torch.no_grad()
    def embed(self, party: str, features: torch.Tensor, head: bool = False) -> torch.Tensor:
        """Party `party`'s model on its own `features` in eval mode, in chunks: E_k (or its prediction)."""
        model = self.party_models[party]
        was_training = model.training
        model.eval()
        out = []
        for chunk in features.split(EMBED_CHUNK):
            x = chunk.to(self.device)
            out.append(model(x) if head else model.encoder(x))
        model.train(was_training)
        return torch.cat(out).float()

    def upload(self, splits: Iterable[Any]) -> None:
        """Step 3 for samples without an E_p yet: each passive party sends w_k E_k once; the active party combines.

        `splits` hold `ids` and per-party `features` (a `VerticalTensorDataset` or a `VFLBatch`). One mask step per
        upload, so no mask stream is reused; E_p = combine(0, shares) = sum_k w_k E_k (Eq. 7, 9).
        """
        if not self.pretrained:
            raise RuntimeError("PraVFed uploads embeddings only after pre-training (steps 1-2 at fit start)")
        for split in splits:
            ids = split.ids.long().cpu()
            known = torch.isin(ids, self._ep_ids)
            if bool(known.all()):
                continue
            new = (~known).nonzero().squeeze(1)
            step = self.next_mask_step()
            shares = {}
            for k in self.passive:  # at passive party k: weight first, then protect (see the module docstring)
                if not self.wire.holds(k):  # another party's share: its shadow
                    weighted = torch.empty(new.numel(), self.embedding_dim, device="meta")
                elif isinstance(split, VFLBatch):  # a batch is model input already
                    x = split.features[k].index_select(0, new.to(split.features[k].device))
                    weighted = self.passive_weights[k] * self.embed(k, x)
                else:  # a dataset: decode only the new rows (uint8 image slices decode on access)
                    x = split.decode({k: split.stored[k].index_select(0, new)})[k]
                    weighted = self.passive_weights[k] * self.embed(k, x)
                shares[k] = self.wire.send(k, self.active, self.protected(k, weighted, step), "embeddings")
            zeros = torch.zeros(new.numel(), self.embedding_dim, device=self.device)
            e_p = self.combined(zeros, shares).detach()  # at the active party (a shadow elsewhere)
            all_ids = torch.cat([self._ep_ids.cpu(), ids[new]])  # which samples have an E_p: known to every party
            order = torch.argsort(all_ids)
            if is_shadow(e_p):
                self._ep = torch.empty(len(all_ids), self.embedding_dim, device="meta")
            else:
                self._ep = torch.cat([self._ep.cpu(), e_p.cpu()])[order]
            self._ep_ids = all_ids[order]

    def combined_embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """E_p of samples `ids`, as the active party holds it (raises for samples never uploaded)."""
        if is_shadow(self._ep):  # another party's process: E_p is the active party's
            return torch.empty(ids.numel(), self.embedding_dim, device="meta")
        if self._ep_ids.device != ids.device:  # move the table once, not every step
            self._ep_ids, self._ep = self._ep_ids.to(ids.device), self._ep.to(ids.device)
        try:
            return lookup_rows(self._ep_ids, self._ep, ids)
        except KeyError:
            raise KeyError("no combined passive embedding E_p for some sample IDs: they were never uploaded") from None

    # ------------------------------------------------------------------------------------------------ step 4
    def training_step(self, batch: VFLBatch, batch_idx: int) -> None:
        """Step 4: the active party trains its own model on E_a + E_p against its true labels; nothing is sent."""
        (opt,) = self.party_optimizers().values()
        if not self.wire.holds(self.active):  # a passive party's process: nothing of this step is its own
            self.step_optimizer(self.active, opt)  # counted only: the trainer counts the step as everywhere
            return
        opt.zero_grad(set_to_none=True)
        # true labels: the active model's outputs and parameters never leave the active party (the passive parties
        # receive nothing during training), so it is the kind of model `private_labels` is for
        loss = self.task_loss(self.active_logits(batch), self.private_labels(batch))
        self.manual_backward(loss)
        opt.step()
        self.record_train_losses({self.active: loss.detach()})

    def active_logits(self, batch: VFLBatch) -> torch.Tensor:
        """The active party's head on E = E_a + E_p (Algorithm 2)."""
        model = self.party_models[self.active]
        e_a = model.encoder(batch.features[self.active])
        return model.head(e_a + self.combined_embedding(batch.ids).to(e_a.dtype))

    # ------------------------------------------------------------------------------------------------ evaluation
    def on_validation_start(self) -> None:
        """Upload the validation samples' E_p once, when validation first needs it."""
        self._upload_split("val_set")

    def on_test_start(self) -> None:
        """Upload the test samples' E_p once, when testing first needs it."""
        self._upload_split("test_set")

    def on_predict_start(self) -> None:
        """Prediction runs on the test split: upload it once if testing has not."""
        self._upload_split("test_set")

    def _upload_split(self, name: str) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        split = getattr(dm, name, None)
        if split is not None and self.pretrained:
            self.upload([split])

    def party_logits(self, batch: VFLBatch) -> dict[str, torch.Tensor]:
        """The active party's prediction; samples outside the cached E_p (custom loaders) are uploaded first."""
        self.upload([batch])
        return {self.active: self.active_logits(batch)}

    def passive_contribution(self, party: str, features: torch.Tensor) -> torch.Tensor:
        """w_k E_k: what passive `party` uploads for these samples (step 3)."""
        return self.passive_weights[party] * self.embed(party, features)

    def complete_prediction(
        self, active_features: torch.Tensor, contributions: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The active party's head on E_a + sum_k w_k E_k (Algorithm 2) from fetched contributions."""
        model = self.party_models[self.active]
        e_a = model.encoder(active_features)
        e_p = self.plain_sum(torch.zeros_like(e_a), contributions, self.passive)
        return model.head(e_a + e_p)

    def describe_combination(self) -> dict[str, Any]:
        """The weighted passive embeddings added to the active party's own, then its head."""
        return {
            "contribution": "w_k E_k: passive party k's (frozen, pre-trained) encoder on its own features, times "
            "its weight w_k (weights)",
            "combine": "logits = p_a(h_a(x_a) + sum_k w_k E_k): the active party's head on its own embedding plus "
            "the weighted passive ones",
            "weights": dict(self.passive_weights),
            "max_rows_per_call": EMBED_CHUNK,  # `embed` runs in chunks: traced, the chunk count is fixed
        }

    # ------------------------------------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Also save acc_k, w_k and E_p: a resume must not pre-train, upload (or spend epsilon) again."""
        super().on_save_checkpoint(checkpoint)
        checkpoint["pravfed"] = {
            "accuracy": dict(self.passive_accuracy),
            "weights": dict(self.passive_weights),
            "ep_ids": self._ep_ids.cpu(),
            "ep": self._ep if is_shadow(self._ep) else self._ep.cpu(),
            "pretrained": self._pretrained,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore what `on_save_checkpoint` saved (the passive models come back with the state dict)."""
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("pravfed")
        if state is not None:
            self.passive_accuracy = dict(state["accuracy"])
            self.passive_weights = dict(state["weights"])
            self._ep_ids, self._ep = state["ep_ids"], state["ep"]
            self._pretrained = bool(state.get("pretrained", len(self.passive_weights) == len(self.passive)))
