r"""Serve the folders `lvfl export` wrote, without lvfl: each party's raw table in, `lvfl predict`'s file out.

    python examples/serve_exported.py parties/ --table party0=examples/bank_retailer/bank.csv \
        --table party1=examples/bank_retailer/retailer.csv [--ids ids.txt] --output predictions.csv

`parties/<party>/` holds the party's `party.json` and its part of a prediction as TorchScript (see `lvfl/export.py`).
This script plays every party in one process, as a demo or a test does; in a deployment each step runs at the party
that owns the folder, and only the contributions move (passive parties -> the active party):

1. which IDs every party holds: here the intersection of the tables' ID columns, computed in the clear. In a
   deployment that is a private set intersection (PSI, as `lvfl.datamodules.PartyTables` runs at training time),
   so that no party learns another's IDs outside the intersection;
2. each party encodes its own rows with its own column encoders and standardization (party.json: `encoders`,
   `encoding`, `scaling`), fitted on its training rows;
3. each passive party runs its `contribution.pt` on its rows and sends the output to the active party;
4. the active party runs `completion.pt` on its own rows and the contributions (in `serving.contribution_order`),
   and decodes the logits as `serving.output` says (softmax and label names, or `value * target_scale +
   target_mean`);
5. an ID only the active party holds is answered by its `student.pt` when the export has one (the student reads the
   active party's encoded, scaled features), else written with an empty prediction and a `reason`, as is an ID
   that is not in the active party's table.

The file has `lvfl predict`'s columns (`id`, `prediction`, `prob_<label>`..., `path`: `vfl`, `student` or empty,
`reason`: why a row has no answer; see `lvfl/prediction_rows.py`), one row per ID in the order asked for
(`--ids`: one per line, or a .csv's first column below its header), by default every ID of the active party's
table. Rows go through the TorchScript files `--rows-per-call` at a time; where a protocol's contributions depend on
the other rows of their message (C-VFL with lossy compression: `serving.combination.batch_dependent`), answers equal
lvfl's only for the same batches. Only the standard library, numpy and torch are imported.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: the reasons written for a row nobody answers (as `lvfl predict` writes them)
NO_STUDENT = "held by the active party only, and the export has no student to answer it"
UNKNOWN_ID = "not an ID of the active party"


def read_table(path: Path, id_column: str, columns: Sequence[str]) -> dict[str, list[str]]:
    """{ID: the texts of `columns`, stripped} of a CSV file with a header line, in file order; blank lines skipped."""
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in [id_column, *columns] if c not in header]
        if missing:
            raise SystemExit(f"{path}: no column {missing[0]!r} (the file's columns: {header})")
        where = [header.index(c) for c in columns]
        at = header.index(id_column)
        rows: dict[str, list[str]] = {}
        for line, fields in enumerate(reader, start=2):
            if not any(v.strip() for v in fields):
                continue
            if len(fields) != len(header):
                raise SystemExit(f"{path}, line {line}: {len(fields)} fields, the header has {len(header)}")
            key = fields[at].strip()
            if key in rows:
                raise SystemExit(f"{path}, line {line}: the ID {key!r} appears twice")
            rows[key] = [fields[j].strip() for j in where]
    return rows


def number(text: str) -> float | None:
    """The finite number a field holds, None if it holds none."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def encode_column(encoder: dict[str, Any], texts: list[str], rules: dict[str, Any]) -> np.ndarray:
    """One raw column's encoded columns (rows, width), float32, by the rules in party.json's `encoding`."""
    missing = set(rules["missing_values"])
    name, absent = encoder["name"], [t.lower() in missing for t in texts]
    if encoder["kind"] == "numeric":
        out = np.zeros((len(texts), 2 if encoder["indicator"] else 1), dtype=np.float32)
        for i, text in enumerate(texts):
            if absent[i]:
                if encoder["fill"] is None:
                    raise SystemExit(f"column {name!r}: a missing value, and the column was trained without any")
                out[i, 0] = encoder["fill"]
                if encoder["indicator"]:
                    out[i, 1] = 1.0
                continue
            value = number(text)
            if value is None:
                raise SystemExit(f"column {name!r}: {text!r} is not a number (the column is numeric)")
            out[i, 0] = value
        return out
    levels = encoder["levels"]
    index = {level: j for j, level in enumerate(levels)}
    codes = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        level = (encoder["fill_level"] or rules["missing_level"]) if absent[i] else text
        if absent[i] and level not in index:
            raise SystemExit(f"column {name!r}: a missing value, and the column has no level for one")
        codes[i] = index.get(level, len(levels) - 1)  # a value unseen in training: the last level, <unseen>
    if encoder["onehot"]:
        out = np.zeros((len(texts), len(levels)), dtype=np.float32)
        out[np.arange(len(texts)), codes] = 1.0
    else:
        out = codes[:, None].astype(np.float32)
    if encoder["indicator"]:
        out = np.concatenate([out, np.asarray(absent, dtype=np.float32)[:, None]], axis=1)
    return out


def encode(info: dict[str, Any], rows: list[list[str]]) -> torch.Tensor:
    """A party's rows of raw texts as its model reads them: encoded, then standardized, float32."""
    if "encoders" not in info:
        raise SystemExit(f"{info['party']}: its party.json has no column encoders (not a PartyTables export)")
    columns = [[row[j] for row in rows] for j in range(len(info["encoders"]))]
    parts = [encode_column(e, texts, info["encoding"]) for e, texts in zip(info["encoders"], columns, strict=True)]
    x = np.concatenate(parts, axis=1).astype(np.float64) if rows else np.zeros((0, len(info["feature_names"])))
    scaling = info.get("scaling")
    if scaling:
        at = list(range(x.shape[1])) if scaling["columns"] == "all" else scaling["columns"]
        x[:, at] = (x[:, at] - np.asarray(scaling["mean"])) / np.asarray(scaling["scale"])
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).reshape(len(rows), *info["input_shape"])


def load(path: Path) -> torch.jit.ScriptModule:
    """A TorchScript file of the export, in eval mode."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch 2.9+ prefers torch.export; TorchScript still loads
        return torch.jit.load(str(path)).eval()


def run(model: torch.jit.ScriptModule, inputs: Sequence[torch.Tensor], rows_per_call: int) -> torch.Tensor:
    """`model` on `inputs` (aligned by row), `rows_per_call` rows at a time."""
    with torch.no_grad():
        chunks = [
            model(*(x[start : start + rows_per_call] for x in inputs))
            for start in range(0, len(inputs[0]), rows_per_call)
        ]
    return torch.cat(chunks) if chunks else torch.zeros(0)


def decode(output: dict[str, Any], logits: torch.Tensor) -> list[dict[str, Any]]:
    """Each row's `prediction` (and `prob_<label>` columns), as `serving.output` says and `lvfl predict` writes."""
    if output["kind"] == "regression":
        values = logits.reshape(-1) * output["target_scale"] + output["target_mean"]  # float32, as lvfl computes it
        return [{"prediction": float(v)} for v in values]
    names = output["label_names"]
    probs = logits.softmax(-1)
    return [
        {
            "prediction": names[int(p.argmax())],
            **{f"prob_{n}": float(q) for n, q in zip(names, p.tolist(), strict=True)},
        }
        for p in probs
    ]


def serve(
    export: Path, tables: dict[str, Path], ids: list[str] | None = None, rows_per_call: int = 1024
) -> list[dict[str, Any]]:
    """The prediction rows (`lvfl predict`'s columns) of `ids` (default: every ID of the active party's table)."""
    infos = {p.parent.name: json.loads(p.read_text()) for p in sorted(export.glob("*/party.json"))}
    actives = [name for name, info in infos.items() if info["role"] == "active"]
    if len(actives) != 1:
        raise SystemExit(f"{export}: expected one active party's folder, found {actives or 'none'}")
    active = actives[0]
    serving = infos[active]["serving"]
    order = serving["contribution_order"]
    absent = [p for p in [active, *order] if p not in tables]
    if absent:
        raise SystemExit(f"no --table for {absent} (the export's parties: {[active, *order]})")
    limit = serving.get("max_rows_per_call")
    rows_per_call = min(rows_per_call, limit) if limit else rows_per_call
    raw = {
        p: read_table(tables[p], infos[p]["id_column"], [e["name"] for e in infos[p]["encoders"]])
        for p in [active, *order]
    }
    ids = list(raw[active]) if ids is None else ids
    wanted = [k for k in dict.fromkeys(ids) if k in raw[active]]
    shared = [k for k in wanted if all(k in raw[p] for p in order)]  # in a deployment, the PSI's intersection
    only = [k for k in wanted if not all(k in raw[p] for p in order)]
    answers: dict[str, dict[str, Any]] = {}
    folder = export / active
    if shared:
        contributions = [
            run(
                load(export / p / "contribution.pt"),
                [encode(infos[p], [raw[p][k] for k in shared])],
                rows_per_call,
            )
            for p in order
        ]
        own = encode(infos[active], [raw[active][k] for k in shared])
        logits = run(load(folder / serving["completion"]["file"]), [own, *contributions], rows_per_call)
        answers |= {k: {**row, "path": "vfl"} for k, row in zip(shared, decode(serving["output"], logits), strict=True)}
    if only and serving.get("student"):
        own = encode(infos[active], [raw[active][k] for k in only])
        logits = run(load(folder / serving["student"]["file"]), [own], rows_per_call)
        answers |= {
            k: {**row, "path": "student"} for k, row in zip(only, decode(serving["output"], logits), strict=True)
        }
    output = serving["output"]
    probs = [] if output["kind"] == "regression" else [f"prob_{n}" for n in output["label_names"]]
    empty = dict.fromkeys(["prediction", *probs, "path"], "")
    reason = {k: NO_STUDENT if k in raw[active] else UNKNOWN_ID for k in ids if k not in answers}
    return [{"id": k, **answers.get(k, empty), "reason": reason.get(k, "")} for k in ids]


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path, help="the folder `lvfl export --out` wrote (one sub-folder per party)")
    parser.add_argument("--table", action="append", default=[], metavar="PARTY=CSV", help="a party's raw table")
    parser.add_argument("--ids", type=Path, help="the IDs to answer (default: every ID of the active party's table)")
    parser.add_argument("--output", type=Path, required=True, help="the CSV file to write")
    parser.add_argument("--rows-per-call", type=int, default=1024, help="rows per TorchScript call")
    args = parser.parse_args(argv)
    tables = {}
    for entry in args.table:
        party, sep, path = entry.partition("=")
        if not sep:
            raise SystemExit(f"--table {entry!r}: write it as PARTY=PATH, e.g. party0=bank.csv")
        tables[party] = Path(path)
    ids = None
    if args.ids is not None:
        with args.ids.open(newline="") as f:  # as `lvfl predict --ids` reads them
            if args.ids.suffix.lower() == ".csv":
                lines = [r[0] if r else "" for r in list(csv.reader(f))[1:]]
            else:
                lines = list(f)
        ids = [k.strip() for k in lines if k.strip()]
    rows = serve(args.export, tables, ids, args.rows_per_call)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["id", "prediction", "path", "reason"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"serve_exported: {len(rows)} predictions written to {args.output}")


if __name__ == "__main__":
    main(sys.argv[1:])
