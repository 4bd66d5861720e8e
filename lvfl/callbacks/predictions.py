"""`PredictionWriter`: `lvfl predict` writes its predictions to a file, one row per sample, keyed by its ID.

A Lightning `BasePredictionWriter`: at the end of the predict epoch it gathers every batch's `predict_step` output
(sample IDs and each predicting party's class probabilities) and writes one row per sample, in the columns of
`lvfl.prediction_rows` (`id`, `prediction`, `prob_<class>`, `path`, `reason`), the rows `lvfl serve` answers too.
A row nobody answers carries its reason: only the active party holds it and the run saved no student, or the ID is
not the active party's (`lvfl.commands.predict`). Every requested row is written.

Answers computed outside the predict loop (the student's, the reasons, or every answer of `lvfl predict
--oblivious`, which the `Router` computes from oblivious lookups) are handed over with `request` and written with
the loop's own, in the order requested.

The file's format follows its extension: `.csv` (the `csv` module) or `.parquet` (pyarrow). Which model answers:
`party: active` (the active party's model, the default: it holds the labels and serves the predictions; for
split learning the active party's is the only one), `mean` (the mean of every predicting party's probabilities),
or a party's name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from lvfl.prediction_rows import FORMATS, prediction_row, write_predictions

__all__ = ["PredictionWriter"]


class PredictionWriter(BasePredictionWriter):
    """Write `lvfl predict`'s predictions to `path` (see the module docstring).

    Args:
        path: the output file, `.csv` or `.parquet`; its folder is created.
        party: the answering model: "active", "mean" or a party name.
    """

    def __init__(self, path: str, party: str = "active") -> None:
        super().__init__(write_interval="epoch")
        if Path(path).suffix.lower() not in FORMATS:
            raise ValueError(f"PredictionWriter: path {path!r} must end in one of {list(FORMATS)} (the file's format)")
        self.path = Path(path)
        self.party = party
        self.rows: list[dict[str, Any]] = []
        self._order: list[str] | None = None
        self._given: dict[str, tuple[torch.Tensor | None, str, str]] = {}

    @property
    def pending_answers(self) -> bool:
        """Whether answers given by `request` are not yet written (every ID was answered outside the loop)."""
        return bool(self._given) and not self.rows

    def request(self, keys: list[str], answers: dict[str, tuple[torch.Tensor | None, str, str]]) -> None:
        """Write the rows in the order of `keys`, with `answers` given already.

        `answers`: {ID: (probabilities or value, path, "")}, or (None, "", reason) for a row nobody answers. The
        predict loop answers the other IDs (path `vfl`); an ID of `keys` that ends up with no answer and no reason is
        an error, never a dropped row.
        """
        self._order = list(keys)
        self._given = dict(answers)

    def write_on_epoch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, predictions: Any, batch_indices: Any
    ) -> None:
        """Gather the batches' outputs, answer each sample and write the file (rank 0 only under DDP)."""
        batches = (predictions[0] if predictions and isinstance(predictions[0], list) else predictions) or []
        if not batches and not self._given:
            raise ValueError("lvfl predict produced no predictions (an empty predict split?)")
        answers = dict(self._given)
        datamodule = trainer.datamodule
        task = getattr(datamodule, "task", None)
        regression = task.is_regression if task is not None else bool(batches) and "values" in batches[0]
        if batches:
            ids = torch.cat([b["ids"] for b in batches]).cpu()
            outputs = self._answer(pl_module, [b["values" if regression else "probs"] for b in batches]).cpu()
            keys = datamodule.business_ids(ids) if hasattr(datamodule, "business_ids") else [str(int(i)) for i in ids]
            answers |= {k: (p, "vfl", "") for k, p in zip(keys, outputs, strict=True)}
        order = self._order if self._order is not None else list(answers)
        missing = [key for key in order if key not in answers]
        if missing:  # cannot happen: every requested row is answered or given a reason
            raise RuntimeError(f"lvfl predict: no answer and no reason for IDs {missing[:10]}")
        names: list[str] = []
        if not regression:
            width = (
                task.num_classes if task is not None else len(next(a for a, _, _ in answers.values() if a is not None))
            )
            names = list(getattr(datamodule, "label_names", []) or [str(c) for c in range(width)])
        self.rows = [prediction_row(key, *answers[key], names) for key in order]
        if trainer.is_global_zero:
            self._write()

    def _answer(self, pl_module: pl.LightningModule, batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        available = list(batches[0])
        if self.party == "mean":
            return torch.cat([torch.stack([b[p] for p in available]).mean(0) for b in batches])
        party = pl_module.active if self.party == "active" else self.party
        if party not in available:
            if self.party == "active" and len(available) == 1:
                party = available[0]
            else:
                raise ValueError(
                    f"PredictionWriter: party={self.party!r}: no predictions of {party!r}; this protocol's predicting "
                    f"parties are {available}"
                )
        return torch.cat([b[party] for b in batches])

    def _write(self) -> None:
        write_predictions(self.path, self.rows)
