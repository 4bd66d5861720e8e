"""Oblivious transfer: Chou-Orlandi "simplest OT" over secp256k1, batched, and 1-out-of-N OT built from it.

1-out-of-2 OT (Chou & Orlandi, "The Simplest Protocol for Oblivious Transfer", LATINCRYPT 2015), with G the
secp256k1 generator (point arithmetic from libsecp256k1 through `coincurve`):

1. sender: a random scalar a, sends A = aG (one A serves a whole batch, see below);
2. receiver with choice c: a random scalar b, sends B = bG if c = 0, B = A + bG if c = 1;
3. sender: k0 = H(aB), k1 = H(a(B - A)), sends Enc(k0, m0), Enc(k1, m1);
4. receiver: k_c = H(bA) = H(abG) opens the chosen ciphertext; the other key is H(ab'G) for a point the receiver
   cannot compute without solving CDH.

H is SHA-256 over a domain tag, a length-prefixed session tag, A, B, the OT's index in the batch and the compressed
shared point; Enc is AES-256-GCM under the 32-byte H output with a zero nonce (each key encrypts exactly one
message), so opening the other ciphertext with the receiver's key fails authentication (`InvalidTag`).

Batching: simplest OT lets one sender message A serve many OTs (the paper's own batched variant): each OT of a batch
has its own receiver scalar b_i and point B_i, and i is hashed into the keys, so keys of different OTs are
independent. A batch of n OTs costs the sender 1 + n scalar multiplications (aA is computed once) and 3 messages.

Assumptions and caveats:
    * semi-honest sender and receiver, which is lvfl's threat model (`lvfl.privacy` backends assume the same);
    * CDH in secp256k1 (~128-bit security) and H modelled as a random oracle;
    * simplest OT's original UC-security proof was found to have gaps (Genç, Iovino, Rial, "The simplest protocol
      for oblivious transfer revisited", IPL 2020; Hauck & Loss 2017): do not rely on it against malicious parties
      or in arbitrary composition. Against semi-honest parties, receiver privacy is perfect (B is uniform whatever
      c is) and sender privacy reduces to CDH in the random-oracle model.

Party roles: `OTSender` and `OTReceiver` hold the secrets and produce/consume explicit messages; this module moves
nothing between parties (it imports nothing from the rest of lvfl). Drivers that run both roles with every message
on a `Wire` live above it: `lvfl.privacy.oblivious_transfer` (batched 1-out-of-2 OT) and the oblivious lookup
(`lvfl.inference.oblivious`); the naive 1-out-of-N OT baseline of the OT benchmark is `benchmarks/perf/naive_ot.py`.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

from coincurve import PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: compressed secp256k1 point: 1 prefix byte (02/03) + 32-byte x coordinate
POINT_BYTES = 33
SCALAR_BYTES = 32
#: AES-GCM authentication tag added to every OT ciphertext
TAG_BYTES = 16
#: key size of the 1-out-of-N OT's per-bit keys (AES-128-level, matching secp256k1's ~128-bit security)
KEY_BYTES = 16
#: order of the secp256k1 group
CURVE_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
OT_CONTEXT = b"lvfl/simplest-ot/secp256k1/v1"
_ZERO_NONCE = bytes(12)


# -- the functional core --------------------------------------------------------------------------------------------
def random_scalar() -> bytes:
    """A uniformly random secp256k1 scalar in [1, n) as 32 big-endian bytes, from the OS CSPRNG."""
    while True:
        raw = secrets.token_bytes(SCALAR_BYTES)
        if 0 < int.from_bytes(raw, "big") < CURVE_ORDER:
            return raw


def _point(raw: bytes, name: str) -> PublicKey:
    if not isinstance(raw, bytes | bytearray) or len(raw) != POINT_BYTES:
        raise ValueError(f"{name} must be a {POINT_BYTES}-byte compressed secp256k1 point")
    try:
        return PublicKey(bytes(raw))
    except ValueError as err:
        raise ValueError(f"{name} is not a point on secp256k1 ({err})") from None


def _negate(point: PublicKey) -> PublicKey:
    """-P: the compressed encoding with the parity byte flipped (y -> p - y flips the parity since p is odd)."""
    raw = point.format(compressed=True)
    return PublicKey(bytes([raw[0] ^ 1]) + raw[1:])


def ot_key(session: bytes, sender_point: bytes, receiver_point: bytes, index: int, shared: PublicKey) -> bytes:
    """H(session, A, B, index, shared point): the 32-byte AES-GCM key of one OT message (the random oracle)."""
    h = hashlib.sha256(OT_CONTEXT)
    h.update(len(session).to_bytes(4, "big") + session)
    h.update(sender_point + receiver_point + index.to_bytes(8, "big"))
    h.update(shared.format(compressed=True))
    return h.digest()


def encrypt_message(key: bytes, message: bytes) -> bytes:
    """AES-256-GCM with a zero nonce: only safe because every OT key encrypts exactly one message."""
    return AESGCM(key).encrypt(_ZERO_NONCE, message, None)


def decrypt_message(key: bytes, ciphertext: bytes) -> bytes:
    """Open `encrypt_message`; raises `cryptography.exceptions.InvalidTag` under any other key."""
    return AESGCM(key).decrypt(_ZERO_NONCE, ciphertext, None)


def receiver_point(sender_point: PublicKey, choice: int, b: bytes) -> PublicKey:
    """B = bG for choice 0, A + bG for choice 1 (step 2)."""
    bg = PublicKey.from_valid_secret(b)
    return bg if choice == 0 else PublicKey.combine_keys([sender_point, bg])


# -- the two parties --------------------------------------------------------------------------------------------------
class OTSender:
    """The sender of a batch of 1-out-of-2 OTs: holds a, publishes A = aG once, answers receiver points.

    Args:
        session: a transcript tag hashed into every key (e.g. protocol name and run id), for domain separation.

    Example:
        >>> sender = OTSender()
        >>> receiver = OTReceiver(sender.public_point())
        >>> points = receiver.choose([1])
        >>> receiver.receive(sender.respond(points, [(b"zero", b"one!")]))
        [b'one!']
    """

    def __init__(self, session: bytes = b"") -> None:
        self.session = bytes(session)
        self._a = random_scalar()
        self._A = PublicKey.from_valid_secret(self._a)
        self._A_bytes = self._A.format(compressed=True)
        self._neg_aA = _negate(self._A.multiply(self._a))  # -aA, so a(B - A) = aB - aA costs one addition
        self._next_index = 0

    def public_point(self) -> bytes:
        """A = aG, compressed: the sender's first message (33 bytes)."""
        return self._A_bytes

    def respond(
        self, receiver_points: Sequence[bytes], messages: Sequence[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        """Encrypt `messages[i] = (m0, m1)` under (H(aB_i), H(a(B_i - A))) for each received point B_i (step 3).

        Raises:
            ValueError: on a count mismatch, unequal message lengths within a pair (they would leak through the
                ciphertext sizes), or an invalid receiver point.
        """
        if len(receiver_points) != len(messages):
            raise ValueError(f"got {len(receiver_points)} receiver points for {len(messages)} message pairs")
        out = []
        for point, (m0, m1) in zip(receiver_points, messages, strict=True):
            if len(m0) != len(m1):
                raise ValueError(f"the two messages of an OT must have the same length, got {len(m0)} and {len(m1)}")
            b_point = _point(point, "receiver point B")
            index = self._next_index
            self._next_index += 1
            ab = b_point.multiply(self._a)
            try:
                ab_minus_aa = PublicKey.combine_keys([ab, self._neg_aA])
            except ValueError:  # B = A: the point at infinity; never happens for an honest receiver
                raise ValueError("receiver point B equals A; refusing the OT") from None
            point = bytes(point)
            k0 = ot_key(self.session, self._A_bytes, point, index, ab)
            k1 = ot_key(self.session, self._A_bytes, point, index, ab_minus_aa)
            out.append((encrypt_message(k0, bytes(m0)), encrypt_message(k1, bytes(m1))))
        return out


class OTReceiver:
    """The receiver of a batch of 1-out-of-2 OTs: given A, picks choice bits, then opens the chosen messages.

    Args:
        sender_point: the sender's A, as received.
        session: the same transcript tag as the sender's.
    """

    def __init__(self, sender_point: bytes, session: bytes = b"") -> None:
        self.session = bytes(session)
        self._A_bytes = bytes(sender_point)
        self._A = _point(sender_point, "sender point A")
        self._pending: list[tuple[int, bytes, bytes, int]] = []  # (index, b, B, choice)
        self._next_index = 0

    def choose(self, choices: Sequence[int]) -> list[bytes]:
        """The receiver points B_i for `choices` (each 0 or 1), in order: the receiver's message (step 2)."""
        points = []
        for choice in choices:
            if choice not in (0, 1) or isinstance(choice, bool):
                raise ValueError(f"an OT choice must be 0 or 1, got {choice!r}")
            b = random_scalar()
            point = receiver_point(self._A, int(choice), b).format(compressed=True)
            self._pending.append((self._next_index, b, point, int(choice)))
            self._next_index += 1
            points.append(point)
        return points

    def receive(self, ciphertexts: Sequence[tuple[bytes, bytes]]) -> list[bytes]:
        """Open the chosen ciphertext of each pair with H(bA) (step 4); consumes the pending choices in order.

        Raises:
            ValueError: if the number of pairs differs from the number of pending choices.
            cryptography.exceptions.InvalidTag: if a ciphertext does not open (a corrupted or foreign message).
        """
        if len(ciphertexts) != len(self._pending):
            raise ValueError(f"got {len(ciphertexts)} ciphertext pairs for {len(self._pending)} pending choices")
        out = []
        for (index, b, point, choice), pair in zip(self._pending, ciphertexts, strict=True):
            key = ot_key(self.session, self._A_bytes, point, index, self._A.multiply(b))
            out.append(decrypt_message(key, pair[choice]))
        self._pending = []
        return out

    def chosen_keys(self) -> list[bytes]:
        """The keys H(bA) of the pending OTs (for tests: they must open the chosen ciphertext and no other)."""
        return [ot_key(self.session, self._A_bytes, p, i, self._A.multiply(b)) for i, b, p, _ in self._pending]


# -- indices as choice bits (1-out-of-N from log2 N OTs) ------------------------------------------------------------
def bits_of(value: int, nbits: int) -> list[int]:
    """The `nbits` low bits of `value`, least significant first (bit j of the index is the j-th OT's choice)."""
    return [(value >> j) & 1 for j in range(nbits)]


def log2_exact(n: int, name: str) -> int:
    """log2(n) for a power of two n >= 2; ValueError naming `name` otherwise."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2 or n & (n - 1):
        raise ValueError(f"{name} must be a power of two >= 2, got {n!r}")
    return n.bit_length() - 1
