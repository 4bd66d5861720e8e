"""An attacker's side knowledge as a file it holds: a few samples' labels, or the active party's features of a few.

Why a file: deployed, the attacking party's process holds no truth, so what an attack declares it knows (Fu et al.'s
40 labelled samples, an inversion's public records) must reach that process the way it would reach a real attacker,
as data in its own hands. In simulation the same file replaces the seeded draw from the truth, and a simulated attack
that drew its side knowledge writes what it drew in this format beside its metrics (`attacks/<name>.known.csv`), so a
deployed rerun can be handed exactly the simulated attacker's knowledge.

Format, CSV with a header row:

- labels: ``id,label``, one row per known sample: its sample ID and its class index (0 .. K-1);
- features: ``id,x0,x1,...``, one row per known sample: its ID and the active party's features, flattened in the
  order the active party's model reads them (as scaled for training).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import torch

from lvfl.text_files import read_csv_rows

__all__ = ["known_path", "read_known_features", "read_known_labels", "write_known"]


def known_path(log_dir: str | Path, name: str) -> Path:
    """Where a simulated attack named `name` writes the side knowledge it drew, in the run folder `log_dir`."""
    return Path(log_dir) / "attacks" / f"{name}.known.csv"


def write_known(path: Path, known: dict[int, int] | dict[int, torch.Tensor]) -> None:
    """Write known labels (ID -> class) or known features (ID -> tensor) in the side-knowledge format."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        items = sorted(known.items())
        if items and isinstance(items[0][1], torch.Tensor):
            width = items[0][1].numel()
            out.writerow(["id", *(f"x{j}" for j in range(width))])
            for sample, x in items:
                out.writerow([sample, *(repr(float(v)) for v in x.reshape(-1).tolist())])
        else:
            out.writerow(["id", "label"])
            out.writerows([sample, int(label)] for sample, label in items)


def _rows(path: Path, option: str, first: list[str] | None) -> tuple[list[str], list[list[str]]]:
    if not path.is_file():
        raise FileNotFoundError(f"{option}={str(path)!r}: no such file (the attacker's side knowledge, a CSV)")
    rows = read_csv_rows(path, f"{option}={str(path)!r}")
    if not rows or rows[0][:1] != ["id"] or (first is not None and rows[0] != first):
        expected = ",".join(first) if first is not None else "id,x0,x1,..."
        got = ",".join(rows[0]) if rows else "none"
        raise ValueError(f"{option}={str(path)!r}: the header must be {expected}, got {got}")
    if len(rows) == 1:
        raise ValueError(f"{option}={str(path)!r}: no known samples (a header and no rows)")
    return rows[0], rows[1:]


def _sample(value: str, path: Path, option: str, line: int) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{option}={str(path)!r}, line {line}: sample ID {value!r} is not an integer") from None


def read_known_labels(path: Path, num_classes: int, option: str = "side_knowledge") -> dict[int, int]:
    """Known labels from an ``id,label`` file; refuses a repeated ID or a class outside 0 .. num_classes - 1."""
    _, rows = _rows(path, option, ["id", "label"])
    known: dict[int, int] = {}
    for line, row in enumerate(rows, start=2):
        if len(row) != 2:
            raise ValueError(f"{option}={str(path)!r}, line {line}: {len(row)} fields, expected id,label")
        sample = _sample(row[0], path, option, line)
        try:
            label = int(row[1])
        except ValueError:
            label = -1
        if not 0 <= label < num_classes:
            raise ValueError(f"{option}={str(path)!r}, line {line}: label {row[1]!r} is not a class index of this "
                             f"task (0 .. {num_classes - 1})")  # fmt: skip
        if sample in known:
            raise ValueError(f"{option}={str(path)!r}, line {line}: sample {sample} is listed twice")
        known[sample] = label
    return known


def read_known_features(path: Path, option: str = "side_knowledge") -> dict[int, torch.Tensor]:
    """Known feature rows from an ``id,x0,...`` file (flat float32 tensors); refuses ragged rows and repeated IDs."""
    header, rows = _rows(path, option, None)
    width = len(header) - 1
    if width < 1 or header[1:] != [f"x{j}" for j in range(width)]:
        raise ValueError(f"{option}={str(path)!r}: the header must be id,x0,x1,... (known features), got "
                         f"{','.join(header)}")  # fmt: skip
    known: dict[int, torch.Tensor] = {}
    for line, row in enumerate(rows, start=2):
        if len(row) != width + 1:
            raise ValueError(f"{option}={str(path)!r}, line {line}: {len(row)} fields, expected id and {width} values")
        sample = _sample(row[0], path, option, line)
        try:
            values = [float(v) for v in row[1:]]
        except ValueError:
            raise ValueError(f"{option}={str(path)!r}, line {line}: a feature value is not a number") from None
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"{option}={str(path)!r}, line {line}: a feature value is not finite")
        if sample in known:
            raise ValueError(f"{option}={str(path)!r}, line {line}: sample {sample} is listed twice")
        known[sample] = torch.tensor(values, dtype=torch.float32)
    return known
