"""The ledger: what crossed between parties, in bytes and messages per (src, dst, tag), counted once.

A message is counted at what it would occupy when serialized: a tensor at its wire dtype (numel x element size), a
`bytes` object at its length, and containers as the sum of their parts. The `lvfl.wire.Wire` keeps one ledger and
records every message that crosses to or from its process on it; the socket transport counts only its envelopes
(`lvfl.federation.transport.Transport.envelope_bytes`), the framing a deployment adds on top.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Ledger", "Link", "payload_nbytes"]


def payload_nbytes(payload: Any) -> int:
    """The serialized size of `payload` in bytes.

    Raises:
        TypeError: for objects whose wire size is not defined (a Python float has no fixed wire format here).
    """
    if isinstance(payload, torch.Tensor):
        return payload.numel() * payload.element_size()
    if isinstance(payload, bytes | bytearray | memoryview):
        return len(payload)
    if isinstance(payload, Mapping):
        return sum(payload_nbytes(v) for v in payload.values())
    if isinstance(payload, Sequence) and not isinstance(payload, str):
        return sum(payload_nbytes(v) for v in payload)
    nbytes = getattr(payload, "wire_nbytes", None)
    if callable(nbytes):
        return int(nbytes())
    raise TypeError(
        f"cannot meter a payload of type {type(payload).__name__}: send tensors, bytes, or objects with wire_nbytes()"
    )


@dataclass(frozen=True)
class Link:
    """A directed link between two parties."""

    src: str
    dst: str

    def __str__(self) -> str:
        return f"{self.src}->{self.dst}"


class Ledger:
    """Bytes and messages per (src, dst, tag); `record` is the Wire's meter, called once per message.

    Example:
        >>> ledger = Ledger()
        >>> ledger.record("party1", "party0", "embeddings", torch.zeros(4, 8))
        >>> ledger.total_bytes(), ledger.bytes_by_link()
        (128, {'party1->party0': 128})
    """

    def __init__(self) -> None:
        self.bytes: Counter[tuple[str, str, str]] = Counter()
        self.messages: Counter[tuple[str, str, str]] = Counter()

    def record(self, src: str, dst: str, tag: str, payload: Any) -> None:
        """Count one message of `payload`'s serialized size."""
        key = (src, dst, tag)
        self.bytes[key] += payload_nbytes(payload)
        self.messages[key] += 1

    def total_bytes(self) -> int:
        """All bytes recorded."""
        return sum(self.bytes.values())

    def bytes_by_tag(self) -> dict[str, int]:
        """Bytes per message tag."""
        out: Counter[str] = Counter()
        for (_, _, tag), n in self.bytes.items():
            out[tag] += n
        return dict(out)

    def bytes_by_link(self) -> dict[str, int]:
        """Bytes per directed link, keyed `src->dst`."""
        out: Counter[str] = Counter()
        for (src, dst, _), n in self.bytes.items():
            out[str(Link(src, dst))] += n
        return dict(out)

    def total_messages(self) -> int:
        """All messages recorded."""
        return sum(self.messages.values())

    def reset(self) -> None:
        """Forget everything recorded."""
        self.bytes.clear()
        self.messages.clear()

    # -- checkpointing: the ledger survives a resume so cumulative figures stay right --------------------------------
    def state_dict(self) -> dict[str, list]:
        """The ledger as plain lists."""
        return {
            "bytes": [[*k, v] for k, v in self.bytes.items()],
            "messages": [[*k, v] for k, v in self.messages.items()],
        }

    def load_state_dict(self, state: Mapping[str, list]) -> None:
        """Restore a ledger saved by `state_dict`."""
        self.reset()
        self.merge_state_dict(state)

    def merge_state_dict(self, state: Mapping[str, list]) -> None:
        """Add a saved ledger to this one (a resumed run keeps its own key exchange and the saved history)."""
        for src, dst, tag, n in state.get("bytes", []):
            self.bytes[(src, dst, tag)] += int(n)
        for src, dst, tag, n in state.get("messages", []):
            self.messages[(src, dst, tag)] += int(n)
