"""ID-oblivious inference lookup: the passive party answers for an ID without learning which ID (Sec. 4.3-4.6).

The passive party holds a result per sample ID (an inference output, as bytes or a tensor row); the active party
wants the result for one ID x without revealing x. IDs are hashed into buckets of N = 2**B entries,
bucket = floor(x / N), offset = x mod N; the passive party learns the bucket, never the offset.

Offline preparation (Sec. 4.5; `prepare`):

1. passive: draws N * B * 2 fresh 16-byte AES keys key(i, j, k), i in [0, N) (the key set), j in [0, B), k in {0,1};
2. active: draws a uniformly random permutation R of [0, N);
3. both: N * B 1-out-of-2 OTs (`lvfl.crypto.ot`, one batch, 3 messages tagged "ot_prepare"): for key set i and bit
   j the active party chooses bit j of R[i] and receives key(i, j, bit_j(R[i])), learning nothing of the other key;
   the passive party learns nothing of R;
4. passive: encrypts every entry x_u of every bucket N times, once per key set i, in layers (Algorithm 3):
   c_{i,u} = Enc(key(i, B-1, b_{B-1}(u)), ... Enc(key(i, 0, b_0(u)), x_u)) with AES-128-GCM, b_j(u) bit j of u.
   Copy i of a bucket is the concatenation c_{i,0} | ... | c_{i,N-1}, N * l bytes.

Online query (Sec. 4.6; `query`), one round trip:

5. active: for ID x finds t with R[t] = offset and sends (bucket, t) (12 bytes, "ot_query");
6. passive: returns copy t of that bucket (N * l bytes, "ot_answer");
7. active: holds key(t, j, bit_j(R[t])) = key(t, j, b_j(offset)) for every j, so exactly entry `offset` decrypts;
   every other entry differs from `offset` in some bit j and fails authentication at layer j.

What each message reveals: the OT messages nothing (semi-honest, see `lvfl.crypto.ot`); (bucket, t) reveals the
bucket, and t is uniform given the offset because R is a uniform permutation and each key set is used once; the
answer gives the active party one entry of one bucket and nothing about the others.

Single use: key set t may serve one query only. A second query with the same t would tell the passive party that
the two IDs share an offset; so both parties refuse it (`KeySetSpentError`), and after that a fresh `prepare` is
needed (fresh keys and a fresh R). Note that since key set t is bound to offset R[t], one preparation serves at most
one query per offset; asking for a fresh preparation early (because an offset came up again) tells the passive
party that some offset repeated. A caller that must hide that too should prepare on a fixed, data-independent
schedule (e.g. before every query, or every N queries while padding with dummy queries).

Padding and FAIL: every plaintext is `flag (1 byte) | length (4 bytes) | value | zero padding` of one fixed width,
so all ciphertexts have the same size l = 5 + value_bytes + 16 * B. Empty slots hold flag 0 and random bytes (the
paper's FAIL marker), indistinguishable from real entries until decrypted. An ID whose slot is FAIL comes back as
`None`, so a router can fall back to the active party's own (student) model.

Misses cost a query too: an ID outside the table's buckets (beyond the passive party's last bucket, or negative)
also comes back as `None`, but the active party still sends a request, for a *dummy* address (a uniformly random
bucket and offset, drawn from the OS CSPRNG), spends that offset's key set and decrypts the returned entry, then
discards it. So from the passive party's side a miss is a query like any other: the same messages (one "ot_query"
of 12 bytes, one "ot_answer" of N * l bytes), a bucket in range, a t drawn exactly as for a real ID (a fresh key set
of a uniform R), and re-preparations on the same rule. Sending nothing would tell it the ID lies beyond its table.
The one difference left is the bucket's distribution: uniform for a miss, the ID's own for a hit; the bucket is
what the scheme reveals in any case (see above).
"""

from __future__ import annotations

import operator
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from lvfl.crypto.layered import ENTRY_KEY_BYTES, LAYER_TAG_BYTES, decrypt_entry, encrypt_entry, entry_nonce
from lvfl.crypto.ot import OTReceiver, OTSender, bits_of, log2_exact
from lvfl.wire import Absent, Wire

#: (bucket: 8 bytes, t: 4 bytes), big-endian: the active party's online request
REQUEST_BYTES = 12
#: flag byte + 4-byte value length in front of every padded value
HEADER_BYTES = 5
_REAL, _FAIL = 1, 0
PREPARE_SESSION = b"lvfl/oblivious-inference/prepare/v1"


class KeySetSpentError(RuntimeError):
    """A key set was asked for a second time (or none is prepared): run a fresh `prepare`."""


@dataclass(frozen=True)
class TableLayout:
    """The public shape of an oblivious table, agreed by both parties before preparation.

    Attributes:
        bucket_size: N, entries per bucket (a power of two).
        num_buckets: M, buckets covering IDs [0, M * N).
        value_bytes: the padded width of every value.
        row_dtype: the dtype of tensor rows, or None when values are raw bytes.
        row_shape: the shape of tensor rows, or None when values are raw bytes.
    """

    bucket_size: int
    num_buckets: int
    value_bytes: int
    row_dtype: torch.dtype | None = None
    row_shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        log2_exact(self.bucket_size, "bucket_size")
        if self.num_buckets < 1:
            raise ValueError(f"num_buckets must be >= 1, got {self.num_buckets}")
        if self.value_bytes < 0 or self.value_bytes >= 2**32:
            raise ValueError(f"value_bytes must be in [0, 2**32), got {self.value_bytes}")

    @property
    def num_bits(self) -> int:
        """B = log2 N: OTs per key set and encryption layers per entry."""
        return self.bucket_size.bit_length() - 1

    @property
    def plaintext_bytes(self) -> int:
        """Header plus padded value."""
        return HEADER_BYTES + self.value_bytes

    @property
    def entry_bytes(self) -> int:
        """l: the size of one encrypted entry (each of the B layers adds a 16-byte GCM tag; nonces are implicit)."""
        return self.plaintext_bytes + LAYER_TAG_BYTES * self.num_bits

    @property
    def answer_bytes(self) -> int:
        """N * l: the size of one encrypted bucket copy, what the passive party returns per query."""
        return self.bucket_size * self.entry_bytes

    def address(self, sample_id: int) -> tuple[int, int] | None:
        """(bucket, offset) = (floor(x / N), x mod N), or None for an ID outside [0, M * N) (negative ones too)."""
        x = _check_id(sample_id)
        bucket, offset = divmod(x, self.bucket_size)
        return (bucket, offset) if 0 <= bucket < self.num_buckets else None


def _check_id(sample_id: object) -> int:
    if isinstance(sample_id, bool):
        raise TypeError("a sample ID must be an int, got bool")
    try:
        return operator.index(sample_id)
    except TypeError:
        raise TypeError(f"a sample ID must be an int, got {type(sample_id).__name__}") from None


def _request_bytes(bucket: int, t: int) -> bytes:
    return bucket.to_bytes(8, "big") + t.to_bytes(4, "big")


def _random_permutation(n: int) -> list[int]:
    """A uniformly random permutation of range(n) from the OS CSPRNG (Fisher-Yates via SystemRandom)."""
    perm = list(range(n))
    secrets.SystemRandom().shuffle(perm)
    return perm


def pack_entry(value: bytes, layout: TableLayout) -> bytes:
    """A real entry's plaintext: flag 1, the value's length, the value, zero padding to the layout's width."""
    if len(value) > layout.value_bytes:
        raise ValueError(f"a value has {len(value)} bytes, more than the layout's {layout.value_bytes}")
    return bytes([_REAL]) + len(value).to_bytes(4, "big") + value + bytes(layout.value_bytes - len(value))


def fail_entry(layout: TableLayout) -> bytes:
    """An empty slot's plaintext: flag 0 (FAIL) and fresh random bytes, as wide as a real entry."""
    return bytes([_FAIL]) + secrets.token_bytes(layout.plaintext_bytes - 1)


def unpack_entry(plaintext: bytes, layout: TableLayout) -> bytes | torch.Tensor | None:
    """The value an opened entry holds (bytes, or a tensor row where the layout says so); None for FAIL."""
    if plaintext[0] != _REAL:
        return None
    value = plaintext[HEADER_BYTES : HEADER_BYTES + int.from_bytes(plaintext[1:HEADER_BYTES], "big")]
    if layout.row_dtype is None:
        return value
    flat = torch.frombuffer(bytearray(value), dtype=layout.row_dtype) if value else torch.empty(0)
    return flat.reshape(layout.row_shape)


class ObliviousTable:
    """The passive party: the result table, the N * B * 2 keys and the encrypted bucket copies (the OT sender).

    Args:
        values: result per sample ID: bytes, or tensor rows of one shape and dtype (sent as their raw bytes).
        bucket_size: N, a power of two; the passive party learns each query's bucket, so a larger N hides more and
            costs N * l bytes per query and N**2 * M * log2 N encryptions per preparation.
        num_buckets: M; default: enough buckets for the largest ID. IDs must lie in [0, M * N).
        value_bytes: padded value width; default: the longest value.
        precompute: encrypt all N copies of every bucket in `prepare` (the paper's offline phase; memory M * N**2 * l)
            rather than the requested copy per query (same messages, less memory, slower answers).

    Raises:
        ValueError: if `bucket_size` is not a power of two, an ID is negative or outside the buckets, or a value is
            longer than `value_bytes`.
    """

    def __init__(
        self,
        values: Mapping[int, bytes | torch.Tensor],
        bucket_size: int,
        *,
        num_buckets: int | None = None,
        value_bytes: int | None = None,
        precompute: bool = True,
    ) -> None:
        log2_exact(bucket_size, "bucket_size")
        items = [(_check_id(k), v) for k, v in values.items()]
        if any(x < 0 for x, _ in items):
            raise ValueError("sample IDs must be non-negative")
        row_dtype = row_shape = None
        if items and all(isinstance(v, torch.Tensor) for _, v in items):
            first = items[0][1]
            row_dtype, row_shape = first.dtype, tuple(first.shape)
            if any(v.dtype != row_dtype or tuple(v.shape) != row_shape for _, v in items):
                raise ValueError("all tensor rows must have the same shape and dtype")
            raw = [(x, v.detach().cpu().contiguous().numpy().tobytes()) for x, v in items]
        elif all(isinstance(v, bytes | bytearray) for _, v in items):
            raw = [(x, bytes(v)) for x, v in items]
        else:
            raise TypeError("values must be all bytes or all tensors")
        longest = max((len(v) for _, v in raw), default=0)
        if value_bytes is None:
            value_bytes = longest
        elif longest > value_bytes:
            raise ValueError(f"a value has {longest} bytes, more than value_bytes={value_bytes}")
        max_id = max((x for x, _ in raw), default=0)
        if num_buckets is None:
            num_buckets = max_id // bucket_size + 1
        elif max_id >= num_buckets * bucket_size:
            raise ValueError(f"ID {max_id} lies outside the {num_buckets} buckets of size {bucket_size}")
        self.layout = TableLayout(bucket_size, num_buckets, value_bytes, row_dtype, row_shape)
        self.precompute = precompute
        # the hash table (Fig. 7): FAIL entries are random bytes behind a FAIL flag, all padded to one width
        self._plain = [[fail_entry(self.layout) for _ in range(bucket_size)] for _ in range(num_buckets)]
        for x, v in raw:
            bucket, offset = divmod(x, bucket_size)
            self._plain[bucket][offset] = pack_entry(v, self.layout)
        self._ciphers: list[list[list[AESGCM]]] | None = None  # [i][j][k]
        self._keys: list[list[tuple[bytes, bytes]]] | None = None
        self._copies: list[list[bytes]] | None = None  # [bucket][i]
        self._ot: OTSender | None = None
        self._answered: set[int] = set()

    # -- offline -------------------------------------------------------------------------------------------------
    def prepare_start(self, session: bytes = PREPARE_SESSION) -> bytes:
        """Step 1: fresh keys (forgetting every earlier key set and copy); returns the OT sender's point A."""
        n, nbits = self.layout.bucket_size, self.layout.num_bits
        self._keys = [
            [(secrets.token_bytes(ENTRY_KEY_BYTES), secrets.token_bytes(ENTRY_KEY_BYTES)) for _ in range(nbits)]
            for _ in range(n)
        ]
        self._ciphers = [[[AESGCM(k0), AESGCM(k1)] for k0, k1 in row] for row in self._keys]
        self._copies = None
        self._answered = set()
        self._ot = OTSender(session)
        return self._ot.public_point()

    def prepare_respond(self, receiver_points: list[bytes]) -> list[tuple[bytes, bytes]]:
        """Step 3 (sender side) and step 4: the OT ciphertexts of all key pairs, then (if `precompute`) all copies."""
        if self._ot is None or self._keys is None:
            raise KeySetSpentError("prepare_start must come before prepare_respond")
        pairs = [pair for row in self._keys for pair in row]  # OT number i * B + j carries key(i, j, .)
        reply = self._ot.respond(receiver_points, pairs)
        self._ot = None
        if self.precompute:
            self._copies = [
                [self._encrypt_copy(bucket, i) for i in range(self.layout.bucket_size)]
                for bucket in range(self.layout.num_buckets)
            ]
        return reply

    def _encrypt_copy(self, bucket: int, i: int) -> bytes:
        """Copy i of `bucket`: every entry u under key set i, layers picked by the bits of u (Algorithm 3)."""
        ciphers, nbits = self._ciphers[i], self.layout.num_bits
        return b"".join(
            encrypt_entry([ciphers[j][(u >> j) & 1] for j in range(nbits)], entry_nonce(bucket, u), plaintext)
            for u, plaintext in enumerate(self._plain[bucket])
        )

    # -- online --------------------------------------------------------------------------------------------------
    def answer(self, request: bytes) -> bytes:
        """Step 6: copy t of the requested bucket, N * l bytes; each t is answered once per preparation.

        Raises:
            KeySetSpentError: if t was already answered since the last preparation, or nothing is prepared.
            ValueError: for a malformed request or a bucket/t out of range.
        """
        if self._ciphers is None or self._ot is not None:
            raise KeySetSpentError("no prepared key sets: run prepare() first")
        if len(request) != REQUEST_BYTES:
            raise ValueError(f"a request is {REQUEST_BYTES} bytes, got {len(request)}")
        bucket, t = int.from_bytes(request[:8], "big"), int.from_bytes(request[8:], "big")
        if bucket >= self.layout.num_buckets or t >= self.layout.bucket_size:
            raise ValueError(f"request (bucket={bucket}, t={t}) is outside the table")
        if t in self._answered:
            raise KeySetSpentError(f"key set {t} was already used in this preparation: run prepare() again")
        self._answered.add(t)
        return self._copies[bucket][t] if self._copies is not None else self._encrypt_copy(bucket, t)

    def key_sets_left(self) -> int:
        """Key sets not yet answered in this preparation."""
        return 0 if self._ciphers is None else self.layout.bucket_size - len(self._answered)


class ObliviousClient:
    """The active party: the permutation R and, per key set i, the keys for the bits of R[i] (the OT receiver).

    Args:
        layout: the table's public layout (`ObliviousTable.layout`).
    """

    def __init__(self, layout: TableLayout) -> None:
        self.layout = layout
        self._ot: OTReceiver | None = None
        self._perm: list[int] | None = None  # R
        self._slot_of: list[int] | None = None  # R^{-1}: offset -> t
        self._keys: list[list[AESGCM]] | None = None  # [t][j]: key(t, j, bit_j(R[t]))
        self._used: set[int] = set()
        self._pending: tuple[int, int, int, bool] | None = None  # bucket, offset, t, dummy
        self._dummy: tuple[int, tuple[int, int]] | None = None  # (ID outside the table, the address standing in)

    # -- offline -------------------------------------------------------------------------------------------------
    def prepare_choose(self, sender_point: bytes, session: bytes = PREPARE_SESSION) -> list[bytes]:
        """Step 2 and step 3 (receiver side): draw R, then the OT points choosing key(i, j, bit_j(R[i]))."""
        n, nbits = self.layout.bucket_size, self.layout.num_bits
        self._perm = _random_permutation(n)
        self._slot_of = [0] * n
        for t, offset in enumerate(self._perm):
            self._slot_of[offset] = t
        self._keys, self._used, self._pending = None, set(), None
        self._ot = OTReceiver(sender_point, session)
        return self._ot.choose([bit for r in self._perm for bit in bits_of(r, nbits)])

    def prepare_finish(self, ot_ciphertexts: list[tuple[bytes, bytes]]) -> None:
        """Open the OT ciphertexts: the key arrays used online."""
        if self._ot is None:
            raise KeySetSpentError("prepare_choose must come before prepare_finish")
        keys = self._ot.receive(ot_ciphertexts)
        nbits = self.layout.num_bits
        self._keys = [[AESGCM(k) for k in keys[t * nbits : (t + 1) * nbits]] for t in range(self.layout.bucket_size)]
        self._ot = None

    # -- online --------------------------------------------------------------------------------------------------
    def _address(self, sample_id: int) -> tuple[int, int, bool]:
        """(bucket, offset, dummy): the ID's own address, or for an ID outside the table a uniformly random one.

        The dummy address is drawn once per outside ID and kept until its request is made, so that `can_query` and
        `request` agree on it (and a preparation in between does not redraw it, just as it keeps a real ID's).
        """
        address = self.layout.address(sample_id)
        if address is not None:
            return (*address, False)
        x = operator.index(sample_id)
        if self._dummy is None or self._dummy[0] != x:
            bucket = secrets.randbelow(self.layout.num_buckets)
            self._dummy = (x, (bucket, secrets.randbelow(self.layout.bucket_size)))
        return (*self._dummy[1], True)

    def can_query(self, sample_id: int) -> bool:
        """Whether `sample_id` is answerable now without a fresh preparation (an outside ID too: it costs a query)."""
        _, offset, _ = self._address(sample_id)
        return self._keys is not None and self._slot_of[offset] not in self._used

    def key_sets_left(self) -> int:
        """Key sets not yet used in this preparation."""
        return 0 if self._keys is None else self.layout.bucket_size - len(self._used)

    def request(self, sample_id: int) -> bytes:
        """Step 5: the 12-byte request (bucket, t) for `sample_id`.

        For an ID outside every bucket the request is for a dummy address (see the module docstring), so that a miss
        sends what a hit sends.

        Raises:
            KeySetSpentError: if the key set for this ID's offset was already used (or none is prepared).
        """
        bucket, offset, dummy = self._address(sample_id)
        if self._keys is None:
            raise KeySetSpentError("no prepared key sets: run prepare() first")
        t = self._slot_of[offset]
        if t in self._used:
            raise KeySetSpentError(
                f"the key set for offset {offset} (t={t}) was already used in this preparation: run prepare() again"
            )
        self._used.add(t)  # spent as soon as it is requested, whatever happens to the answer
        self._pending = (bucket, offset, t, dummy)
        if dummy:
            self._dummy = None  # the next miss draws a fresh address
        return _request_bytes(bucket, t)

    def decrypt(self, answer: bytes) -> bytes | torch.Tensor | None:
        """Step 7: open entry `offset` of the returned copy; None if it is a FAIL entry or the query was a dummy.

        Raises:
            ValueError: if the answer is not N * l bytes or no request is pending.
            cryptography.exceptions.InvalidTag: if the entry does not open (a corrupted or wrong answer).
        """
        if self._pending is None:
            raise ValueError("no pending request")
        bucket, offset, t, dummy = self._pending
        self._pending = None
        if len(answer) != self.layout.answer_bytes:
            raise ValueError(f"an answer is N * l = {self.layout.answer_bytes} bytes, got {len(answer)}")
        l = self.layout.entry_bytes  # noqa: E741 - the paper's name for the ciphertext size
        plaintext = self.decrypt_entry(bucket, t, offset, answer[offset * l : (offset + 1) * l])  # a dummy's too
        return None if dummy else self._decode(plaintext)

    def decrypt_entry(self, bucket: int, t: int, u: int, ciphertext: bytes) -> bytes:
        """Try to open entry u of copy t of `bucket` with key set t: succeeds only for u = R[t].

        Raises:
            cryptography.exceptions.InvalidTag: for every other entry.
        """
        if self._keys is None:
            raise KeySetSpentError("no prepared key sets: run prepare() first")
        return decrypt_entry(self._keys[t], entry_nonce(bucket, u), ciphertext)

    def _decode(self, plaintext: bytes) -> bytes | torch.Tensor | None:
        return unpack_entry(plaintext, self.layout)


# -- both parties on a wire: in one process, or each in its own (a party's view holds one side) ---------------------
def _send(wire: Wire | None, src: str, dst: str, payload, tag: str):
    return payload if wire is None else wire.send(src, dst, payload, tag=tag)


def prepare(
    table: ObliviousTable | None,
    client: ObliviousClient | None,
    *,
    wire: Wire | None = None,
    active: str = "active",
    passive: str = "passive",
) -> None:
    """The offline phase (steps 1-4): N * B OTs in one batch, 3 messages tagged "ot_prepare", then encryption.

    `table` is None in the active party's own process, `client` None in the passive party's: each runs its side and
    the wire carries the messages between them.
    """
    if table is not None and client is not None and client.layout != table.layout:
        raise ValueError("the client's layout differs from the table's")
    start = table.prepare_start() if table is not None else Absent("the OT sender's point")
    sender_point = _send(wire, passive, active, start, "ot_prepare")
    choose = client.prepare_choose(sender_point) if client is not None else Absent("the OT receiver's points")
    points = _send(wire, active, passive, choose, "ot_prepare")
    respond = table.prepare_respond(points) if table is not None else Absent("the OT ciphertexts")
    reply = _send(wire, passive, active, respond, "ot_prepare")
    if client is not None:
        client.prepare_finish(reply)


def query(
    table: ObliviousTable | None,
    client: ObliviousClient | None,
    sample_id: int | None,
    *,
    wire: Wire | None = None,
    active: str = "active",
    passive: str = "passive",
) -> bytes | torch.Tensor | None:
    """The online phase (steps 5-7), one round trip: the value for `sample_id`, or None if absent (FAIL/outside).

    An ID outside the table costs the same round trip as any other (a dummy query; see the module docstring). In
    the passive party's own process (`client` None) `sample_id` is None: it answers the request it receives.

    Raises:
        KeySetSpentError: if this ID's key set is already used; `ObliviousInference.lookup` re-prepares instead.
    """
    ask = client.request(sample_id) if client is not None else Absent("the oblivious query")
    request = _send(wire, active, passive, ask, "ot_query")
    answer = table.answer(request) if table is not None else Absent("the encrypted bucket copy")
    answered = _send(wire, passive, active, answer, "ot_answer")
    return client.decrypt(answered) if client is not None else None


class ObliviousInference:
    """Both parties of the oblivious lookup with a wire: `lookup` prepares again when a key set is spent.

    Before each query the active party tells the passive party whether a preparation comes first (one byte, tag
    "ot_plan"): the passive party's process runs its side in step without the ID (`lookup(None)`). The byte says
    what the re-preparation itself shows it (that an offset repeated, see the module docstring), nothing more.

    Args:
        table: the passive party's table; None in the active party's own process (give `layout` instead).
        wire: where the messages go (a fresh `Wire` by default), for metering.
        active: the active party's name on the wire.
        passive: the passive party's name on the wire.
        layout: the table's public layout, where the table is not held.

    Example:
        >>> lookup = ObliviousInference(ObliviousTable({5: b"five", 9: b"nine"}, bucket_size=4))
        >>> lookup.lookup(9), lookup.lookup(7), lookup.lookup(1000)
        (b'nine', None, None)
    """

    def __init__(
        self,
        table: ObliviousTable | None,
        wire: Wire | None = None,
        active: str = "active",
        passive: str = "passive",
        layout: TableLayout | None = None,
    ) -> None:
        self.wire = wire if wire is not None else Wire()
        self.active, self.passive = active, passive
        self.table = table if self.wire.holds(passive) else None
        layout = table.layout if table is not None else layout
        if layout is None:
            raise ValueError("ObliviousInference needs the table or its layout")
        self.client = ObliviousClient(layout) if self.wire.holds(active) else None
        self.preparations = 0

    def prepare(self) -> None:
        """A fresh preparation: new keys, a new permutation R, N fresh key sets."""
        prepare(self.table, self.client, wire=self.wire, active=self.active, passive=self.passive)
        self.preparations += 1

    def lookup(self, sample_id: int | None) -> bytes | torch.Tensor | None:
        """The value for `sample_id`, or None if absent; prepares first if this ID's key set is spent.

        Preparing on demand shows the passive party when an offset repeats (see the module doc). In the passive
        party's own process `sample_id` is None: it prepares when told to and answers the query.
        """
        mine = bytes([not self.client.can_query(sample_id)]) if self.client is not None else Absent("the plan")
        received = _send(self.wire, self.active, self.passive, mine, "ot_plan")
        plan = mine if self.client is not None else received  # the sender keeps its own (the wire hands it a shadow)
        if not isinstance(plan, bytes) or len(plan) != 1 or plan[0] > 1:
            raise ValueError(f"{self.active} sent an 'ot_plan' that is not one byte 0 or 1")
        if plan[0]:
            self.prepare()
        return query(self.table, self.client, sample_id, wire=self.wire, active=self.active, passive=self.passive)


__all__ = [
    "REQUEST_BYTES",
    "KeySetSpentError",
    "ObliviousClient",
    "ObliviousInference",
    "ObliviousTable",
    "TableLayout",
    "decrypt_entry",
    "encrypt_entry",
    "entry_nonce",
    "fail_entry",
    "pack_entry",
    "prepare",
    "query",
    "unpack_entry",
]
