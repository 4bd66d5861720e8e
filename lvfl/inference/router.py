"""`Router`: a prediction for every sample ID, through the VFL model where possible and the student elsewhere.

A VFL model can only answer for samples every party holds. The router answers an ID as follows (the paper's online
phase, Sec. 4.6, with the student of Sec. 4.2 as the fallback):

1. offline, each passive party k computes its contribution to the prediction (`VFLModule.passive_contribution`:
   its embedding for EASTER, SplitNN, C_VFL; w_k E_k for PraVFed; its logits for Agg_VFL) for every ID it holds,
   from its own features alone, and puts them in an `ObliviousTable` (hash buckets of `bucket_size` entries);
   the offline OT preparation runs per passive party;
2. online, for an ID the active party fetches every passive party's entry through the 1-out-of-N lookup (one round
   each: the passive party learns the bucket, never the ID), whether or not an earlier party had it, so the
   pattern of misses stays hidden from the parties too;
3. if every passive party returned an entry, the active party completes the VFL prediction from its own features
   (`VFLModule.complete_prediction`); if any returned FAIL (it does not hold the ID), the student model answers from
   the active party's features alone.

What this reveals: the active party receives each passive party's contribution for the IDs it asks about, in the
clear (as in the paper, where the passive party's partial inference result is the OT's payload): a secure
aggregation used during training does not extend to these answers. Passive parties learn the bucket of each query
and nothing else; the student path costs them the same query. That holds for every ID the active party holds,
including IDs beyond a passive party's last bucket (larger than any ID it holds): those are sent as a dummy query
for a random address of its table (`lvfl.inference.oblivious`), the same messages, tags and sizes as a hit.

Besides the lookups, each passive party sends its table's public layout once (`ot_layout`: N, the number of buckets,
the entry width, the row's shape), and the active party tells it how many lookups follow (`ot_count`) and, before
each, whether a preparation comes first (`ot_plan`, one byte): so in a deployment each passive party's own process
runs its side without any ID (`predict(None)`, `lvfl party predict --oblivious`), and the messages are the same as
in one process.

IDs are the datamodule's sample IDs; an ID the active party does not hold is an error (no party can answer it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from lvfl.datamodules.base import VerticalDataModule
from lvfl.inference.oblivious import ObliviousInference, ObliviousTable, TableLayout
from lvfl.protocols.base import VFLModule
from lvfl.wire import Absent, Wire

SPLITS = ("train", "val", "test")


def _layout_bytes(layout: TableLayout) -> bytes:
    """A table's public layout as 8-byte integers: N, M, the value width, the row's number of dimensions, its shape."""
    shape = layout.row_shape or ()
    return np.asarray([layout.bucket_size, layout.num_buckets, layout.value_bytes, len(shape), *shape], ">i8").tobytes()


def _layout_of(payload: object, party: str) -> TableLayout:
    """The layout `party` sent (`_layout_bytes`), checked: float32 rows of the shape it states."""
    if not isinstance(payload, bytes) or len(payload) % 8 or len(payload) < 32:
        raise ValueError(f"{party} sent an 'ot_layout' that is not a table layout")
    n, m, width, ndim, *shape = np.frombuffer(payload, ">i8").tolist()
    if len(shape) != ndim or width != 4 * int(np.prod(shape)) or min(n, m, *shape, 1) < 1:
        raise ValueError(f"{party} sent an 'ot_layout' that does not describe float32 rows: {payload.hex()[:64]}")
    return TableLayout(n, m, width, torch.float32, tuple(shape))


@dataclass(frozen=True)
class RoutedPredictions:
    """The router's answer for a list of IDs, in the order asked."""

    ids: torch.Tensor
    logits: torch.Tensor
    path: tuple[str, ...]  # "vfl", "student", or "none" (no student: NaN logits) per ID

    @property
    def predictions(self) -> torch.Tensor:
        """Predicted class per ID."""
        return self.logits.argmax(-1)


class Router:
    """Predictions for sample IDs: VFL model via oblivious lookups where every party holds the ID, else the student.

    Args:
        model: a fitted protocol that implements `passive_contribution` and `complete_prediction`.
        datamodule: the datamodule it was fitted on (set up): which IDs each party holds, and their features.
        student: a model on the active party's features (e.g. `StudentDistillation(...).student`); None: an ID
            outside the overlap gets no answer (NaN logits, path "none") instead of falling back.
        bucket_size: N of the oblivious lookup (a power of two).
        wire: where the lookup messages go (a fresh `Wire` by default), for metering.

    Example (after fitting `model` on `dm` with a `StudentDistillation` callback `distill`)::

        router = Router(model, dm, distill.student, bucket_size=64)
        answer = router.predict([3, 17, 512])
        answer.predictions, answer.path   # e.g. tensor([1, 0, 1]), ('vfl', 'student', 'vfl')
    """

    def __init__(
        self,
        model: VFLModule,
        datamodule: VerticalDataModule,
        student: nn.Module | None,
        bucket_size: int = 64,
        wire: Wire | None = None,
    ) -> None:
        self.model, self.datamodule, self.student = model, datamodule, student
        self.wire = wire if wire is not None else Wire()
        self.active = model.active
        self._active_rows = self._active_features() if self.wire.holds(self.active) else {}
        self.lookups = {}
        for k in model.passive:
            table = self._table(k, bucket_size) if self.wire.holds(k) else None
            # the table's public shape, which the active party's client needs (`TableLayout`): its own message
            sent = _layout_bytes(table.layout) if table is not None else Absent(f"{k}'s table layout")
            received = self.wire.send(k, self.active, sent, tag="ot_layout")
            layout = table.layout if table is not None else _layout_of(received, k)
            self.lookups[k] = ObliviousInference(table, wire=self.wire, active=self.active, passive=k, layout=layout)

    # ------------------------------------------------------------------------------------------------ offline
    def _active_features(self) -> dict[int, torch.Tensor]:
        rows: dict[int, torch.Tensor] = {}
        for split in SPLITS:
            held = self.datamodule.active_set(split)
            features = held.features[self.active]  # decoded once per split (uint8 image slices decode on access)
            for i, sample_id in enumerate(held.ids.tolist()):
                rows[int(sample_id)] = features[i]
        return rows

    @torch.no_grad()
    def _table(self, party: str, bucket_size: int) -> ObliviousTable:
        """At passive `party`: its contribution for every ID it holds, from its own features only."""
        values: dict[int, torch.Tensor] = {}
        was_training = self.model.training
        self.model.eval()
        try:
            for split in SPLITS:
                held = getattr(self.datamodule, f"{split}_set")  # the overlap: samples every party holds
                contribution = self.model.passive_contribution(party, held.features[party].to(self.model.device))
                for sample_id, row in zip(held.ids.tolist(), contribution.float().cpu(), strict=True):
                    values[int(sample_id)] = row
        finally:
            self.model.train(was_training)
        return ObliviousTable(values, bucket_size=bucket_size)

    # ------------------------------------------------------------------------------------------------ online
    @torch.no_grad()
    def predict(self, ids: Iterable[int] | None) -> RoutedPredictions | None:
        """Logits and the answering path for every ID in `ids` (one oblivious query per passive party and ID).

        The active party first tells each passive party how many queries follow (8 bytes, tag "ot_count"), so that
        in a passive party's own process (`ids` None there: it holds none of them) its side answers that many and
        returns None.
        """
        holds_active = self.wire.holds(self.active)
        ids = [int(i) for i in ids] if holds_active else []
        unknown = [i for i in ids if i not in self._active_rows]
        if unknown:
            raise ValueError(f"sample IDs {unknown[:10]} are held by no party (not even the active party)")
        counts = {}
        for k in self.lookups:
            mine = len(ids).to_bytes(8, "big") if holds_active else Absent("the number of queries")
            received = self.wire.send(self.active, k, mine, tag="ot_count")
            counts[k] = mine if holds_active else received
        if not holds_active:  # a passive party's own process: answer the active party's queries, in order
            for k, lookup in self.lookups.items():
                if self.wire.holds(k):
                    count = counts[k]
                    if not isinstance(count, bytes) or len(count) != 8:
                        raise ValueError(f"{self.active} sent an 'ot_count' that is not 8 bytes")
                    for _ in range(int.from_bytes(count, "big")):
                        lookup.lookup(None)
            return None
        was_training = self.model.training
        self.model.eval()
        if self.student is not None:
            student_training = self.student.training
            self.student.eval()
        try:
            logits, path = [], []
            for sample_id in ids:
                x = self._active_rows[sample_id].unsqueeze(0)
                fetched = {k: lookup.lookup(sample_id) for k, lookup in self.lookups.items()}
                if all(v is not None for v in fetched.values()):
                    contributions = {k: v.unsqueeze(0).to(self.model.device) for k, v in fetched.items()}
                    out = self.model.complete_prediction(x.to(self.model.device), contributions)
                    path.append("vfl")
                elif self.student is not None:
                    out = self._student(x)
                    path.append("student")
                else:  # no model sees this row: no answer (the caller gives the reason)
                    out = torch.full((1, self.model.task.num_outputs), float("nan"))
                    path.append("none")
                logits.append(out.float().cpu())
        finally:
            self.model.train(was_training)
            if self.student is not None:
                self.student.train(student_training)
        return RoutedPredictions(torch.tensor(ids), torch.cat(logits), tuple(path))

    def _student(self, x: torch.Tensor) -> torch.Tensor:
        device = next(self.student.parameters()).device
        return self.student(x.to(device))

    def overlap_ids(self) -> Sequence[int]:
        """IDs the VFL path can answer (held by every party), for reference; the router never sends this list."""
        return self.datamodule.party_ids(None).tolist()
