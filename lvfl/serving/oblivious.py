"""Serving's oblivious lookups: a passive party returns its contribution for a row without learning which row.

The lookup is the layered 1-out-of-N scheme of `lvfl.inference.oblivious` (buckets of N = 2**B entries, each entry
under B AES-GCM layers whose keys the bits of its offset pick), with its OTs precomputed per query instead of per
offset (Beaver, "Precomputing Oblivious Transfer", CRYPTO 1995):

offline, in batches ahead of the requests (`KeySets` at the passive party, `KeySetPool` at the active party):

1. for key set t the passive party draws B key pairs key(t, j, k), k in {0, 1}; the active party draws r_t uniformly
   in [0, N) from the OS's CSPRNG, one per key set, each independent of the others;
2. B 1-out-of-2 OTs (`lvfl.crypto.ot`): the active party receives key(t, j, bit_j(r_t)) for every j and nothing of
   the other keys; the passive party learns nothing of r_t;

online, one query per row (`query`, `ObliviousRows.answer`, `open_answer`):

3. for the row at position p (bucket p // N, offset p mod N) the active party takes an unused key set t and sends
   (bucket, t, d) with d = offset XOR r_t: 20 bytes;
4. the passive party encrypts entry u of that bucket under key(t, j, bit_j(u XOR d)) for j = 0..B-1, returns the N
   entries, and forgets key set t;
5. entry `offset` lies under the keys of the bits of offset XOR d = r_t, which the active party holds; every other
   entry differs from it in some bit and fails authentication at that layer.

What each message reveals, semi-honest: the OTs nothing; t is the next unused key set, whatever row is asked; d is
uniform whatever the offset and independent of every other query's, since r_t is uniform and used once; so the
passive party learns the bucket (the row is one of the N rows there) and nothing more. Unlike the paper's schedule
(N key sets bound to a permutation of the offsets, prepared again when an offset repeats), nothing is prepared on
account of which rows are asked: only the number of queries drives preparation. A key set serves one query: the
passive party refuses a second, the active party never sends one.

Positions: a row's position is its place in the passive party's shuffled blinded table (`BlindedTable.order`), which
the active party learns in a request's membership round for the IDs the passive party holds. For an ID it does not
hold, the active party asks for a uniformly random bucket and offset (a dummy query: the same messages).
"""

from __future__ import annotations

import math
import secrets
import threading
from collections import deque
from dataclasses import dataclass

import torch
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from lvfl.crypto.layered import ENTRY_KEY_BYTES, decrypt_entry, encrypt_entry, entry_nonce
from lvfl.crypto.ot import POINT_BYTES, TAG_BYTES, OTReceiver, OTSender, bits_of, log2_exact
from lvfl.inference.oblivious import KeySetSpentError, TableLayout, fail_entry, pack_entry, unpack_entry

__all__ = [
    "DEFAULT_BUCKET_SIZE",
    "MAX_BATCH",
    "MAX_BUCKET_SIZE",
    "MAX_KEY_SETS",
    "QUERY_BYTES",
    "BucketSizeError",
    "KeySetPool",
    "KeySetSpentError",
    "KeySets",
    "ObliviousRows",
    "open_answer",
    "parse_queries",
    "query",
    "serving_layout",
    "split_answers",
]

KEY_SET_SESSION = b"lvfl/serving/key-sets/v1/"
#: (bucket: 8 bytes, key set t: 8 bytes, shift d: 4 bytes), big-endian: one query
QUERY_BYTES = 20
#: an OT message's ciphertext: a 16-byte key under AES-GCM
_OT_CIPHERTEXT_BYTES = ENTRY_KEY_BYTES + TAG_BYTES
DEFAULT_BUCKET_SIZE = 64  #: N: the passive party learns each query's bucket of N rows
MAX_BUCKET_SIZE = 4096  #: the largest N a serving party uses or accepts (an answer is N entries)
MAX_BATCH = 4096  #: key sets one preparation holds
MAX_KEY_SETS = 65_536  #: prepared key sets a passive party keeps for its active party (beyond: the oldest dropped)
MAX_OFFERS = 16  #: preparations a passive party has offered and not yet seen completed

#: where the active party's secret draws come from (r_t, and a dummy's address): the OS's CSPRNG
_draw = secrets.randbelow


class BucketSizeError(ValueError):
    """N, the rows of a bucket, is not a power of two in [2, MAX_BUCKET_SIZE] (`lvfl serve` names --bucket_size)."""


def serving_layout(rows: int, bucket_size: int, row_shape: tuple[int, ...]) -> TableLayout:
    """The lookup's public layout for a table of `rows` float32 contributions of `row_shape`, buckets of N.

    Raises:
        BucketSizeError: N is not a power of two in [2, MAX_BUCKET_SIZE].
        ValueError: `rows` is negative.
    """
    try:
        log2_exact(bucket_size, "the bucket size")
    except ValueError as err:
        raise BucketSizeError(str(err)) from None
    if bucket_size > MAX_BUCKET_SIZE:
        raise BucketSizeError(f"the bucket size must be at most {MAX_BUCKET_SIZE}, got {bucket_size}")
    if rows < 0:
        raise ValueError(f"a table has a number of rows >= 0, got {rows}")
    width = 4 * math.prod(row_shape)
    return TableLayout(bucket_size, max(1, -(-rows // bucket_size)), width, torch.float32, tuple(row_shape))


# -- the passive party --------------------------------------------------------------------------------------------
class ObliviousRows:
    """A passive party's contributions by position, as the lookup's padded entries (FAIL past the last row).

    Args:
        values: float32 contributions, one row per position of the blinded table.
        bucket_size: N.
    """

    def __init__(self, values: torch.Tensor, bucket_size: int) -> None:
        values = values.detach().to(torch.float32).contiguous().cpu()
        self.layout = serving_layout(len(values), bucket_size, tuple(values.shape[1:]))
        raw = values.numpy().reshape(len(values), -1)
        plain = [pack_entry(row.tobytes(), self.layout) for row in raw]
        slots = self.layout.num_buckets * bucket_size
        self._plain = plain + [fail_entry(self.layout) for _ in range(slots - len(plain))]
        self.rows = len(values)

    def answer(self, key_set: list[tuple[bytes, bytes]], bucket: int, shift: int) -> bytes:
        """Step 4: the N entries of `bucket`, entry u under key(t, j, bit_j(u XOR shift)) for each layer j."""
        n, nbits = self.layout.bucket_size, self.layout.num_bits
        ciphers = [(AESGCM(k0), AESGCM(k1)) for k0, k1 in key_set]
        base = bucket * n
        return b"".join(
            encrypt_entry(
                [ciphers[j][((u ^ shift) >> j) & 1] for j in range(nbits)],
                entry_nonce(bucket, u),
                self._plain[base + u],
            )  # fmt: skip
            for u in range(n)
        )


def parse_queries(layout: TableLayout, data: bytes) -> list[tuple[int, int, int]]:
    """(bucket, t, d) of each 20-byte query, checked against the layout.

    Raises:
        ValueError: not a whole number of queries, or a bucket or shift outside the table (named).
    """
    if len(data) % QUERY_BYTES:
        raise ValueError(f"a lookup request holds whole {QUERY_BYTES}-byte queries, got {len(data)} bytes")
    out = []
    for at in range(0, len(data), QUERY_BYTES):
        bucket = int.from_bytes(data[at : at + 8], "big")
        t = int.from_bytes(data[at + 8 : at + 16], "big")
        shift = int.from_bytes(data[at + 16 : at + 20], "big")
        if bucket >= layout.num_buckets or shift >= layout.bucket_size:
            raise ValueError(f"query (bucket {bucket}, shift {shift}) lies outside the table's {layout.num_buckets} "
                             f"buckets of {layout.bucket_size}")  # fmt: skip
        out.append((bucket, t, shift))
    return out


class KeySets:
    """A passive party's prepared key sets, by number t (the OT sender's side of the preparation).

    Args:
        num_bits: B = log2 N.
        limit: the most prepared key sets kept; beyond it the oldest are dropped (a query for one is refused).
    """

    def __init__(self, num_bits: int, limit: int = MAX_KEY_SETS) -> None:
        self.num_bits, self.limit = num_bits, limit
        self._offers: dict[str, tuple[OTSender, list[list[tuple[bytes, bytes]]]]] = {}
        self._sets: dict[int, list[tuple[bytes, bytes]]] = {}
        # numbered from a random start, so that a restarted process's key sets never answer to an earlier one's t
        self._next = secrets.randbelow(2**48)
        self._lock = threading.Lock()

    def offer(self, count: int) -> tuple[str, bytes]:
        """Step 1 for `count` key sets: fresh keys and a fresh OT sender; (the batch's name, the sender's point A).

        Raises:
            ValueError: `count` outside [1, MAX_BATCH].
        """
        if not 1 <= count <= MAX_BATCH:
            raise ValueError(f"a preparation holds 1 to {MAX_BATCH} key sets, {count} were asked")
        batch = secrets.token_hex(8)
        keys = [
            [(secrets.token_bytes(ENTRY_KEY_BYTES), secrets.token_bytes(ENTRY_KEY_BYTES)) for _ in range(self.num_bits)]
            for _ in range(count)
        ]
        sender = OTSender(KEY_SET_SESSION + batch.encode())
        with self._lock:
            self._offers[batch] = (sender, keys)
            while len(self._offers) > MAX_OFFERS:
                self._offers.pop(next(iter(self._offers)))
        return batch, sender.public_point()

    def prepare(self, batch: str, points: bytes) -> tuple[int, bytes]:
        """Step 2, the sender's side: the OT ciphertexts of batch `batch`'s keys; (its first key set's t, them).

        Raises:
            ValueError: an unknown batch (never offered, already prepared, or dropped), or another number of points.
        """
        with self._lock:
            offered = self._offers.pop(batch, None)
        if offered is None:
            raise ValueError(f"no preparation {batch[:16]!r} is offered (prepared already, or dropped)")
        sender, keys = offered
        count = len(keys) * self.num_bits
        if len(points) != count * POINT_BYTES:
            raise ValueError(f"preparation {batch} needs {count} OT points, got {len(points)} bytes")
        split = [points[i : i + POINT_BYTES] for i in range(0, len(points), POINT_BYTES)]
        reply = sender.respond(split, [pair for key_set in keys for pair in key_set])
        with self._lock:
            first = self._next
            self._next += len(keys)
            self._sets.update(zip(range(first, first + len(keys)), keys, strict=True))
            while len(self._sets) > self.limit:
                self._sets.pop(next(iter(self._sets)))
        return first, b"".join(c0 + c1 for c0, c1 in reply)

    def take(self, t: int) -> list[tuple[bytes, bytes]]:
        """Key set t's key pairs, forgotten here: each serves one query.

        Raises:
            KeySetSpentError: t was used already, dropped, or never prepared.
        """
        with self._lock:
            key_set = self._sets.pop(t, None)
        if key_set is None:
            raise KeySetSpentError(f"key set {t} is spent, dropped or was never prepared")
        return key_set

    def __len__(self) -> int:
        return len(self._sets)


# -- the active party ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeySet:
    """One prepared key set at the active party: its number t, its secret r_t, and key(t, j, bit_j(r_t)) per j."""

    t: int
    r: int
    ciphers: tuple[AESGCM, ...]


@dataclass
class PendingPreparation:
    """The active party's state between sending its OT points and opening the ciphertexts."""

    receiver: OTReceiver
    rs: list[int]


class KeySetPool:
    """The active party's prepared key sets for one passive party (the OT receiver's side of the preparation).

    Args:
        bucket_size: the passive party's N (its greeting states it).
    """

    def __init__(self, bucket_size: int) -> None:
        self.bucket_size = bucket_size
        self.num_bits = log2_exact(bucket_size, "the bucket size")
        self._ready: deque[KeySet] = deque()
        self._lock = threading.Lock()
        self.prepared = 0

    def choose(self, batch: str, sender_point: bytes, count: int) -> tuple[PendingPreparation, bytes]:
        """Step 1 and 2, the receiver's side: draw r_t for `count` key sets, and the OT points choosing their bits."""
        rs = [_draw(self.bucket_size) for _ in range(count)]
        receiver = OTReceiver(sender_point, KEY_SET_SESSION + batch.encode())
        points = receiver.choose([bit for r in rs for bit in bits_of(r, self.num_bits)])
        return PendingPreparation(receiver, rs), b"".join(points)

    def finish(self, pending: PendingPreparation, first: int, ciphertexts: bytes) -> None:
        """Open the OT ciphertexts: key sets first, first + 1, ... become ready.

        Raises:
            ValueError: another number of ciphertexts than OTs chosen.
            cryptography.exceptions.InvalidTag: a ciphertext that does not open.
        """
        count, nbits, size = len(pending.rs), self.num_bits, _OT_CIPHERTEXT_BYTES
        if len(ciphertexts) != count * nbits * 2 * size:
            raise ValueError(f"the preparation's answer has {len(ciphertexts)} bytes for {count * nbits} OTs")
        pairs = [
            (ciphertexts[at : at + size], ciphertexts[at + size : at + 2 * size])
            for at in range(0, len(ciphertexts), 2 * size)
        ]
        keys = pending.receiver.receive(pairs)
        ready = [
            KeySet(first + i, r, tuple(AESGCM(k) for k in keys[i * nbits : (i + 1) * nbits]))
            for i, r in enumerate(pending.rs)
        ]
        with self._lock:
            self._ready.extend(ready)
            self.prepared += count

    def take(self, count: int) -> list[KeySet] | None:
        """`count` unused key sets, now spent; None (and none taken) if fewer are ready."""
        with self._lock:
            if len(self._ready) < count:
                return None
            return [self._ready.popleft() for _ in range(count)]

    def clear(self) -> None:
        """Forget every ready key set (after the passive party restarted: it no longer holds them)."""
        with self._lock:
            self._ready.clear()

    @property
    def available(self) -> int:
        """Key sets ready to use."""
        return len(self._ready)


@dataclass(frozen=True)
class PendingQuery:
    """What the active party keeps of one query to open its answer."""

    bucket: int
    offset: int
    key_set: KeySet
    dummy: bool


def query(layout: TableLayout, key_set: KeySet, position: int | None) -> tuple[bytes, PendingQuery]:
    """Step 3: the 20-byte query for the row at `position`, or (None) for a random bucket and offset (a dummy)."""
    if position is None:
        bucket, offset = _draw(layout.num_buckets), _draw(layout.bucket_size)
    else:
        bucket, offset = divmod(position, layout.bucket_size)
        if not 0 <= bucket < layout.num_buckets:
            raise ValueError(f"position {position} lies outside the table's {layout.num_buckets} buckets")
    shift = offset ^ key_set.r
    message = bucket.to_bytes(8, "big") + key_set.t.to_bytes(8, "big") + shift.to_bytes(4, "big")
    return message, PendingQuery(bucket, offset, key_set, position is None)


def open_answer(layout: TableLayout, pending: PendingQuery, answer: bytes) -> torch.Tensor | None:
    """Step 5: the row's contribution from the N returned entries; None for a dummy or an empty (FAIL) slot.

    Raises:
        ValueError: the answer is not N entries long.
        cryptography.exceptions.InvalidTag: the entry does not open (a corrupted or wrong answer).
    """
    size = layout.entry_bytes
    if len(answer) != layout.answer_bytes:
        raise ValueError(f"an answer is N entries, {layout.answer_bytes} bytes, got {len(answer)}")
    if pending.dummy:
        return None
    entry = answer[pending.offset * size : (pending.offset + 1) * size]
    value = unpack_entry(decrypt_entry(list(pending.key_set.ciphers), entry_nonce(pending.bucket, pending.offset),
                                       entry), layout)  # fmt: skip
    return None if value is None else value.clone()


def split_answers(layout: TableLayout, data: bytes, count: int) -> list[bytes]:
    """`count` answers of N entries each, from one reply.

    Raises:
        ValueError: another length.
    """
    size = layout.answer_bytes
    if len(data) != count * size:
        raise ValueError(f"{len(data)} bytes for {count} answers of {size}")
    return [data[i * size : (i + 1) * size] for i in range(count)]
