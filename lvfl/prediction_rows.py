"""The rows of a predictions file: one per requested ID, as `lvfl predict`, `lvfl score` and `lvfl serve` answer.

A row's columns:

- `id`: the business ID where the datamodule keeps them (`PartyTables.business_ids`), else lvfl's sample ID;
- `prediction`: the predicted class, decoded to its label where the datamodule has names (`label_names`);
- `prob_<class>`: the answering model's class probabilities (a regression writes the predicted value, in the
  target's units, as `prediction` and no probabilities);
- `path`: which model answered: `vfl` (every party holds the sample and the federation's model answers) or
  `student` (only the active party holds it: the student model saved with the run answers); empty where nobody did;
- `reason`: why a row has no answer (empty `prediction` and probabilities), or why the student answered in the VFL
  model's place. Every requested row is written.

The format lives here, below the Lightning callback that writes `lvfl predict`'s file
(`lvfl.callbacks.PredictionWriter`) and the serving processes that answer one request at a time (`lvfl.serving`),
so the two write the same columns and the same reasons. The file's format follows its extension: `.csv` (the `csv`
module) or `.parquet` (pyarrow).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch

__all__ = ["BY_THE_STUDENT", "FORMATS", "NO_STUDENT", "NO_STUDENT_IN_PLACE", "UNKNOWN_ID", "prediction_row",
           "write_predictions"]  # fmt: skip

#: the predictions file's formats, by extension
FORMATS = (".csv", ".parquet")
#: the reason written for a row only the active party holds when the run saved no student
NO_STUDENT = (
    "held by the active party only, and the run saved no student to answer it (fit with "
    "lvfl.callbacks.StudentDistillation)"
)
#: the reason written for an ID that is not the active party's
UNKNOWN_ID = "not an ID of the active party"
#: how a served row's reason ends when a passive party's fault sent it to the student (the fault comes first)
BY_THE_STUDENT = ": answered by the student"
#: how it ends when that row stays unanswered, the export having no student
NO_STUDENT_IN_PLACE = "; the export has no student to answer in the VFL model's place"


def prediction_row(key: str, output: torch.Tensor | None, path: str, reason: str, names: list[str]) -> dict[str, Any]:
    """One file row: a regression's value, or the class and its probabilities (`names`); empty without an answer."""
    if not names:  # regression
        return {"id": key, "prediction": None if output is None else float(output), "path": path, "reason": reason}
    probs = [None] * len(names) if output is None else [float(p) for p in output.tolist()]
    return {
        "id": key,
        "prediction": None if output is None else names[int(output.argmax())],
        **{f"prob_{name}": p for name, p in zip(names, probs, strict=True)},
        "path": path,
        "reason": reason,
    }


def write_predictions(path: str | Path, rows: list[dict[str, Any]]) -> None:
    """`rows` (of `prediction_row`) to `path`: `.csv` (the `csv` module) or `.parquet` (pyarrow); its folder made."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"{path}: the predictions file must end in one of {list(FORMATS)} (the file's format)")
    path.parent.mkdir(parents=True, exist_ok=True)
    header = list(rows[0]) if rows else ["id", "prediction", "path", "reason"]
    if path.suffix.lower() == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({k: [r[k] for r in rows] for k in header}), path)
        return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
