"""How a PSI message crosses between parties, whichever PSI: in parts with read receipts, so a list may be any length.

A message of `PART_BYTES` (16 MiB) or more goes in parts of that size, the last one shorter (empty if need be), so
that no envelope is over the transport's `max_message_bytes` however long the lists. Before it sends part i + 2,
the sender waits for `<tag>/read` from the receiver: the number i of the part the receiver has read (4 bytes), sent
once it has read part i + 1. So a receiver holds at most two parts of a peer's messages unread, and the peer's last
`read` of the message before (32 MiB and 4 bytes, about half the transport's default `max_queued_bytes`), while it
is busy with its own work.
"""

from __future__ import annotations

import numpy as np

from lvfl.wire import Absent, Wire

__all__ = ["PART_BYTES", "READ_DTYPE", "reads", "send_in_parts"]

PART_BYTES = 16 * 2**20  #: the longest part of a PSI message: longer messages go in parts
READ_DTYPE = np.dtype(">u4")  #: the wire format of `<tag>/read`: the number of the part read, 4-byte big-endian


def reads(length: int) -> int:
    """How many `<tag>/read` messages a message of `length` bytes brings: one for each part after the first."""
    return length // PART_BYTES  # every full part has one after it (the last may be empty)


def send_in_parts(wire: Wire, src: str, dst: str, payload: object, tag: str) -> object:
    """Move one PSI message from `src` to `dst` in parts (see the module docstring); the whole message at `dst`.

    Where `dst` is held the parts are read until a short one and joined; where only `src` is, what `dst` receives is
    not known here (a shadow); where neither is, one shadow stands for all the parts, which this process never sees.
    """
    if not (wire.holds(src) or wire.holds(dst)):
        return wire.send(src, dst, payload, tag)
    size = PART_BYTES
    if wire.holds(src):
        if not isinstance(payload, bytes | memoryview):
            raise TypeError(f"{src}'s {tag!r} is {type(payload).__name__}; a PSI message is bytes")
        view = memoryview(payload)  # each part is copied out as it goes, never the whole message at once
        parts: list[memoryview] = [view[i : i + size] for i in range(0, len(view), size)]
        if not parts or len(parts[-1]) == size:
            parts.append(view[:0])  # the receiver stops at a short part
    received: list[bytes] = []
    number = 0
    while True:
        got = wire.send(src, dst, bytes(parts[number]) if wire.holds(src) else Absent("PSI points"), tag)
        if wire.holds(dst):
            if not isinstance(got, bytes):
                raise ValueError(f"{src} sent {tag!r} as {type(got).__name__}; a PSI message is bytes")
            if len(got) > size:
                raise ValueError(f"{src} sent a {len(got)}-byte part of {tag!r}; a part is at most {size} bytes")
            received.append(got)
            last = len(got) < size
        else:
            last = number == len(parts) - 1
        if number >= 1:  # part number - 1 is read: the sender may go on to part number + 1
            read = np.array([number - 1], dtype=READ_DTYPE).tobytes() if wire.holds(dst) else Absent("a part number")
            read = wire.send(dst, src, read, f"{tag}/read")
            if wire.holds(src) and read != np.array([number - 1], dtype=READ_DTYPE).tobytes():
                raise ValueError(f"{dst} acknowledged {read!r} of {tag!r}; {src} expected part {number - 1}")
        if last:
            break
        number += 1
    return b"".join(received) if wire.holds(dst) else Absent("PSI points")
