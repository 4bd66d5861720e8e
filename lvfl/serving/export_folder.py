"""`ExportedParty`: one party's `lvfl export` folder as a serving process loads it, and the checks it must pass.

A serving process holds its own party's folder and nothing of another's: party.json (its role, encoders, scaling,
the export's identity) and the TorchScript files of its step (`contribution.pt` at a passive party; `completion.pt`
and, when the run saved one, `student.pt` at the active party). What each file computes is `lvfl.export`'s.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lvfl.datamodules.scaling import apply_scaling
from lvfl.datamodules.table_encoding import ColumnEncoder
from lvfl.export import SERVING_FORMAT, export_id

__all__ = ["ExportedParty", "load_script"]


def load_script(path: Path) -> torch.jit.ScriptModule:
    """A TorchScript file of an export, in eval mode; one line naming the file if it is absent or unreadable."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (an `lvfl export` folder holds it)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch 2.9+ prefers torch.export; TorchScript still loads
            return torch.jit.load(str(path), map_location="cpu").eval()
    except RuntimeError as err:
        raise ValueError(f"{path} is not a TorchScript file lvfl export wrote: {str(err).splitlines()[0]}") from None


class ExportedParty:
    """A party's export folder: its party.json, the encoders and scaling of its rows, and its TorchScript step.

    Args:
        folder: the party's folder (`lvfl export --out DIR` wrote `DIR/<party>/`).
        party: the party this process serves; the folder must be its own.

    Raises:
        ValueError: the folder is another party's, not a PartyTables export (no encoders: serving reads raw
            tables), of another serving format, or its identity does not match its digest.
    """

    def __init__(self, folder: str | Path, party: str) -> None:
        self.folder = Path(folder)
        path = self.folder / "party.json"
        try:
            info = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"--model {self.folder}: no party.json (give the party's `lvfl export` folder, e.g. exported/{party})"
            ) from None
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not JSON: {err}") from None
        self.info: dict[str, Any] = info
        if info.get("party") != party:
            raise ValueError(f"--model {self.folder} is party {info.get('party')!r}'s folder, not --party {party}'s")
        self.party, self.role = party, info["role"]
        if "encoders" not in info:
            raise ValueError(
                f"--model {self.folder}: its party.json has no column encoders; lvfl serve answers from a party's raw "
                "table, so it serves runs on the parties' own tables (PartyTables)"
            )
        identity = info.get("export")
        if not isinstance(identity, dict) or identity.get("id") != export_id(identity):
            raise ValueError(
                f"--model {self.folder}: its party.json names no export identity (an older lvfl export?) or one that "
                "does not match its digest; export the run again with lvfl export"
            )
        self.identity: dict[str, Any] = identity
        self.encoders = [ColumnEncoder(**e) for e in info["encoders"]]
        self.id_column: str = info["id_column"]
        self.input_shape = tuple(info["input_shape"])
        self.scaling: dict[str, Any] | None = info.get("scaling")
        if self.role == "active":
            serving = info["serving"]
            if serving.get("format") != SERVING_FORMAT:
                raise ValueError(f"{path}: serving format {serving.get('format')}, this lvfl reads {SERVING_FORMAT}")
            self.serving: dict[str, Any] = serving
            self.completion = load_script(self.folder / serving["completion"]["file"])
            student = serving.get("student")
            self.student = load_script(self.folder / student["file"]) if student else None
        else:
            self.contribution = load_script(self.folder / info["contribution"]["file"])
            self.active_party: str = info["contribution"]["to"]
            self.output_shape = tuple(info["contribution"]["output_shape"])

    def warm_up(self, calls: int = 3) -> None:
        """Run each TorchScript file a few times on one zero row.

        TorchScript profiles and optimizes a graph on its first calls, which would otherwise cost the first requests
        tens of milliseconds.
        """
        x = torch.zeros(1, *self.input_shape)
        with torch.no_grad():
            for _ in range(calls):
                if self.role != "active":
                    self.contribution(x)
                    continue
                shapes = [self.serving["contributions"][k]["output_shape"] for k in self.serving["contribution_order"]]
                self.completion(x, *(torch.zeros(1, *s) for s in shapes))
                if self.student is not None:
                    self.student(x)

    @property
    def export_id(self) -> str:
        """The export's identity digest, equal at every party of one export."""
        return str(self.identity["id"])

    def describe(self, identity: dict[str, Any] | None = None) -> str:
        """The export in words (run, epoch, step): this party's, or `identity`'s."""
        identity = self.identity if identity is None else identity
        run = str(identity.get("run"))
        where = f"run {run[:16]}, step {identity.get('step')}"
        return f"export {identity.get('id')} ({where})"

    @property
    def columns(self) -> list[str]:
        """The raw columns the party's model reads, in order."""
        return [e.name for e in self.encoders]

    def encode(self, rows: Sequence[Sequence[str]], origins: Sequence[str]) -> torch.Tensor:
        """Rows of raw texts (one per column, `columns`' order) as the model reads them: encoded, scaled, float32.

        The same rules as the party's training rows (`lvfl.datamodules.tables.PartyTables`): each column's encoder,
        then the standardization fitted on its training rows.

        Raises:
            ValueError: a value the encoders refuse, naming its origin and column.
        """
        count = len(rows)
        if count == 0:
            return torch.zeros(0, *self.input_shape)
        parts = [e.encode([row[j] for row in rows], list(origins)) for j, e in enumerate(self.encoders)]
        x = apply_scaling(np.concatenate(parts, axis=1), self.scaling)
        return torch.from_numpy(x).reshape(count, *self.input_shape)
