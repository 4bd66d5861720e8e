"""A malicious active party, loaded into a real `lvfl party` process by class_path (tests/ on PYTHONPATH).

`KeyReplay` wraps the active party's wire before the protocol's set-up: in ``record`` mode it writes the signed
X25519 public key one passive party (`owner`) sent in this run to `file`; in ``replay`` mode it relays the key
recorded in an earlier run instead of the one `owner` sent now, as the audit's active party did. At every other
party it does nothing. tests/test_federation_hostile.py runs both, with `lvfl launch`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback


class KeyReplay(Callback):
    def __init__(self, file: str, mode: str, owner: str = "party2") -> None:
        self.file, self.mode, self.owner = Path(file), mode, owner

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        wire = pl_module.wire
        active = f"party{trainer.datamodule.active_party}"
        if wire.here != active:
            return
        send, sent_now = wire.send, {}

        def tampered(src: str, dst: str, payload: Any, tag: str) -> Any:
            if tag == "keys" and src == self.owner and dst == active:  # the owner's key arrives at the active party
                sent_now["key"] = received = send(src, dst, payload, tag)
                if self.mode == "record":
                    self.file.write_text(json.dumps({k: v.hex() for k, v in received.items()}))
                return received
            if tag == "keys" and src == active and payload is sent_now.get("key") and self.mode == "replay":
                payload = {k: bytes.fromhex(v) for k, v in json.loads(self.file.read_text()).items()}
            return send(src, dst, payload, tag)

        wire.send = tampered
