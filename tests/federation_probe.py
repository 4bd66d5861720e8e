"""A callback a party process loads (by class_path, tests/ on PYTHONPATH) to write down what that process holds.

At the end of fit it writes `<LVFL_PROBE_DIR>/<party>.json`: every parameter and buffer of the protocol that holds
data, which party slices and labels of every split hold data, whose scaling statistics it has, and with which peers
it shares DH pair keys, whose tables it read (`PartyTables`) and its ledger (after the callbacks before it, e.g. a
student's messages); `lvfl fit` writes `fit.json`. `tests/test_federation_launch.py` reads it to check a party
holds only its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lightning.pytorch import Callback

from lvfl.wire import is_shadow


class StateProbe(Callback):
    def on_fit_end(self, trainer, pl_module) -> None:
        dm = trainer.datamodule
        prepared = dm._prepare()
        splits = {}
        for kind, table in (("vfl", prepared.splits), ("active", prepared.active_splits)):
            for split, data in table.items():
                splits[f"{kind}/{split}"] = {
                    "features": sorted(k for k, x in data.stored.items() if not is_shadow(x)),
                    "labels": not is_shadow(data.labels),
                }
        items = list(pl_module.named_parameters()) + list(pl_module.named_buffers())
        peers = getattr(pl_module.aggregation, "_peers", None)
        state = {
            "tensors": sorted(name for name, t in items if not is_shadow(t)),
            "shadows": sorted(name for name, t in items if is_shadow(t)),
            "splits": splits,
            "scaling": sorted(dm.scaling),
            "key_peers": None if peers is None else sorted(peers),
            "tables": sorted(getattr(dm, "encoders", {})),  # `PartyTables`: whose tables this process read
            "ledger": [[*key, n] for key, n in pl_module.wire.bytes.items()],  # after every earlier on_fit_end
        }
        out = Path(os.environ["LVFL_PROBE_DIR"]) / f"{pl_module.wire.here or 'fit'}.json"
        out.write_text(json.dumps(state))
