"""`CKKS`: passive embeddings encrypted under a coordinator's CKKS key (TenSEAL), summed under encryption.

Protocol (semi-honest parties; the coordinator and the active party do not collude):

1. Setup. The coordinator creates a CKKS context (secret key, public key, relinearization keys) and sends its
   *public* view to the active party and to every passive party (`tag="keys"`): a copy with the secret key dropped
   (`make_context_public()`), serialized without Galois keys (no rotations are ever needed) and without
   relinearization keys (no ciphertext-ciphertext product is ever computed), one message per receiving party.
   Each party deserializes its own copy (`ts.context_from`); the secret key never leaves the coordinator's object.
2. Protect. Passive party k flattens its embedding E_k to float64 and encrypts it with the public key, packed into
   `ceil(numel / (N / 2))` ciphertexts of N/2 slots each (a 128 x 128 batch at N=8192: 4 ciphertexts).
3. Combine. The active party adds the K ciphertexts slot-wise, adds a fresh real mask R drawn uniformly from
   [-M, M] per value (`mask_bound=M`), and sends the masked aggregate to the coordinator (`tag="he_aggregate"`).
   The coordinator decrypts it and returns `sum_k E_k + R` as float64 (`tag="he_decrypted"`, 8 bytes per value:
   float32 would round at |R| * 2**-24, about 64 for M = 2**30). The active party subtracts R and adds its own
   embedding: `E_active + sum_k E_k`, differentiable with respect to `E_active` only.

The parameter maths (security table, prime-chain rules, headroom, error bound, masking advantage) and every TenSEAL
call live in `lvfl.crypto.ckks`; this class holds the keys, runs the three steps and applies the policy below.

What each party learns:
    * A passive party: only the public key; it never receives a ciphertext or a decryption.
    * The active party: the sum of the passive embeddings (which the protocol needs), never an individual one: it
      holds the ciphertexts but no secret key.
    * The coordinator: one masked aggregate per combine, never a passive party's share (it receives nothing from a
      passive party). The mask hides the aggregate only *statistically, not perfectly* (unlike Paillier's mask,
      uniform mod n); see "Statistical hiding" below for the stated bound, which `combine` enforces.
    * Caveat (Li & Micciancio, EUROCRYPT 2021): CKKS decryptions carry the encryption noise, so a party that knows a
      plaintext and sees its decryption learns a linear equation in the secret key. Here only the active party sees
      decryptions, of sums of plaintexts it does not know; if it colluded with all passive parties it could mount
      that attack (and would learn nothing it could not already compute). Noise flooding is not implemented.

Statistical hiding. The coordinator decrypts `v_i = S_i + R_i` per value, R_i uniform in [-M, M], where the sum
S_i of the K passive values lies in [-B, B] with `B = K * max_abs`. For two aggregates S, S' the distributions of
S + R and S' + R are uniform on intervals of length 2M shifted by |S - S'| <= 2B, so their statistical distance
(the best advantage of any distinguisher) is exactly `|S - S'| / (2M) <= B / M` per value. A combine of n values
draws n independent masks; the two views are uniform on boxes of equal volume, so the distance is exactly
`1 - prod_i (1 - |S_i - S'_i| / (2M)) <= 1 - (1 - B / M)**n` (about n * B / M when that is small):
`advantage_bound(numel)`. Over T combines that tell the same two hypotheses apart the advantage is at most T times
the per-combine figure. At the defaults (M = 2**30, max_abs = 2**7) with 3
passive parties the bound is 3.6e-7 per value, 1.8e-4 for a 64 x 8 batch and 5.8e-3 for a 128 x 128 batch (16,384
values). `combine` refuses a batch whose bound exceeds `max_advantage` (0.01 by default), and the constructor and
`setup` refuse `max_abs >= mask_bound` and `K * max_abs >= mask_bound` (a bound of 1: no hiding guaranteed at all),
each naming the options, unless `allow_insecure=True`, which warns instead. The mask costs precision only through
float64 rounding of the decrypted value (`M * 2**-50` per value, ~1e-6 at M = 2**30; see the error bound below).

Security parameters. `CKKSParameters` (see `lvfl.crypto.ckks` for the HomomorphicEncryption.org table) refuses a
total coefficient-modulus size above the standard bound for `security_bits`. Defaults: N=8192, primes (60, 40, 60)
= 160 bits <= 218, scale 2**40. Headroom: a decrypted value must stay below `2**(L - scale_bits - 1)` in magnitude,
L the bits of the primes left at decryption (all but the special prime). The sum is decrypted at the top level
(L = 100: `headroom` 2**59), which bounds `K * max_abs + M`, ample for the default mask M = 2**30. `combine` takes
no weights (see `lvfl.privacy.aggregation.base`: a weighted sum, as in PraVFed, is weighted by each party before
`protect`), so no rescale is ever needed and a longer chain only adds headroom: the often-quoted (60, 40, 40, 60)
(headroom 2**99) costs more time and bytes for headroom lvfl does not need (docs/results.md, section 8;
`benchmarks/perf/backends.py --ckks-moduli 60 40 40 60`).

Precision: decryption error per value is bounded (with overwhelming probability) by `error_bound()`, the bound of
`lvfl.crypto.ckks.error_bound` for K passive summands, values up to `max_abs` and the mask up to `mask_bound`:
`(K * B_clean + (K + 2) * B_scale) / 2**scale_bits + 2**-50 * magnitude` (Cheon, Kim, Kim, Song, ASIACRYPT 2017).
At the defaults the noise term is about 6e-7 per passive party (observed ~1e-8). The last term is the float64
rounding of the masked value (magnitude up to `K * max_abs + M`), ~1e-6 at M = 2**30, which dominates what is
observed at the defaults (~8e-7 for 3 passive parties and a 128 x 128 batch, within the bound 2.8e-6). A decrypted
sum beyond `K * max_abs` plus that bound is refused as corrupted (wrong key or tampered ciphertexts).

Cost: one 128 x 128 float batch per passive party costs 4 ciphertexts, and protect + combine for 3 passive parties
is dominated by the 12 public-key encryptions (unit costs in docs/results.md, section 8; protect + combine in the
backend table of docs/costs.md). `n_threads` does not help:
TenSEAL encrypts a vector on one thread and holds the GIL. `poly_modulus_degree=4096, coeff_mod_bit_sizes=(54, 55)`
meets the same 128-bit bound (109 bits) faster and in fewer bytes, but its headroom 2**13 only fits a mask_bound
below 2**13 - K * max_abs, i.e. far weaker hiding (`combine` refuses it unless max_abs shrinks too or
`allow_insecure=True`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lvfl.checks import check_int, check_positive, check_real
from lvfl.crypto import ckks
from lvfl.crypto.ckks import CKKSParameters
from lvfl.federation.codec import register_record
from lvfl.parties import PartySpec
from lvfl.privacy.aggregation.base import AggregationBackend
from lvfl.wire import Absent, Wire, shadow

if TYPE_CHECKING:
    import tenseal as ts

#: the largest statistical distance per combine (a distinguisher's advantage) accepted without allow_insecure
DEFAULT_MAX_ADVANTAGE = 0.01


class CKKSShare:
    """Ciphertexts of one flattened tensor (one CKKS vector per packed chunk) and the tensor's shape.

    `vectors` are TenSEAL vectors where the share was made, or their serialized bytes where it arrived from another
    process (a ciphertext is bound to a context, which does not travel with it): `vectors_in(context)` gives live
    vectors either way. `wire_nbytes()` is the sum of the ciphertexts' real serialized lengths (TenSEAL protobuf,
    SEAL-compressed), computed on first use and cached; on the wire the share is the record "lvfl.CKKSShare".
    """

    __slots__ = ("_blobs", "key_id", "num_ciphertexts", "shape", "vectors")

    def __init__(
        self, vectors: Sequence[ts.CKKSVector | bytes], shape: torch.Size, key_id: bytes, num_ciphertexts: int
    ) -> None:
        self.vectors = tuple(vectors)
        self.shape = torch.Size(shape)
        self.key_id = key_id
        self.num_ciphertexts = num_ciphertexts
        self._blobs: tuple[bytes, ...] | None = None

    def blobs(self) -> tuple[bytes, ...]:
        """The ciphertexts serialized (`vec.serialize()`), as they cross between processes."""
        if self._blobs is None:
            self._blobs = tuple(v if isinstance(v, bytes) else v.serialize() for v in self.vectors)
        return self._blobs

    def vectors_in(self, context: ts.Context) -> list[ts.CKKSVector]:
        """The ciphertexts as TenSEAL vectors of `context` (those that arrived as bytes deserialized).

        Raises:
            ValueError: a ciphertext that is not a serialized CKKS vector.
        """
        return [ckks.load_vector(context, v) if isinstance(v, bytes) else v for v in self.vectors]

    def wire_nbytes(self) -> int:
        """Bytes on the wire: the summed lengths of `vec.serialize()` over the vectors."""
        return sum(len(blob) for blob in self.blobs())

    def __repr__(self) -> str:
        return f"CKKSShare(shape={tuple(self.shape)}, ciphertexts={self.num_ciphertexts})"


def _share_to_wire(share: CKKSShare) -> dict[str, Any]:
    return {"vectors": list(share.blobs()), "shape": list(share.shape), "key_id": share.key_id,
            "num_ciphertexts": share.num_ciphertexts}  # fmt: skip


def _share_from_wire(fields: dict[str, Any]) -> CKKSShare:
    """A `CKKSShare` from a peer's fields, its ciphertexts still bytes (the receiver binds them to its context)."""
    vectors, shape, key, count = fields["vectors"], fields["shape"], fields["key_id"], fields["num_ciphertexts"]
    if not isinstance(vectors, list) or not all(isinstance(v, bytes) and v for v in vectors):
        raise ValueError("vectors must be a list of serialized ciphertexts (bytes)")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError("shape must be non-negative integers")
    if not isinstance(key, bytes) or len(key) != 16:
        raise ValueError("key_id must be 16 bytes")
    if type(count) is not int or count != len(vectors):
        raise ValueError(f"num_ciphertexts must be the number of vectors ({len(vectors)})")
    return CKKSShare(vectors, torch.Size(shape), key, count)


register_record("lvfl.CKKSShare", CKKSShare, to_fields=_share_to_wire, from_fields=_share_from_wire)


class CKKS(AggregationBackend):
    """Aggregation of passive embeddings under CKKS public-key encryption, decrypted only by a coordinator.

    See the module docstring for the protocol, what each party learns, the security table and the error bound.
    The coordinator is a party of its own (it may appear in `parties` with role "coordinator", or not at all); it
    must be neither the active party nor a passive one, since it could decrypt every share.

    Secrets: the secret key lives only in the coordinator's context, which never enters `state_dict`, pickles,
    `copy.copy` or `copy.deepcopy` (see `__getstate__`); neither do the parties' public contexts. A restored or
    copied backend must be `setup` again, which creates fresh keys.

    Args:
        coordinator: name of the party that holds the secret key.
        poly_modulus_degree: ring dimension N, a power of two in [1024, 32768]; N/2 slots per ciphertext.
        coeff_mod_bit_sizes: bit sizes of the coefficient-modulus primes: first (precision headroom), middle ones
            (one per rescale, equal to `scale_bits`), last (special prime, at least as large as every other).
        scale_bits: log2 of the CKKS scale (fractional precision).
        security_bits: classical security level, 128, 192 or 256 (HomomorphicEncryption.org table).
        mask_bound: M, the active party's mask is uniform in [-M, M] per value (statistical hiding: see the module
            docstring for the bound).
        max_abs: largest magnitude a passive party may encrypt; larger values are refused.
        max_advantage: the largest statistical distance per combine (`advantage_bound`) accepted.
        allow_insecure: run with weaker hiding (max_abs >= mask_bound, or a combine whose bound exceeds
            `max_advantage`), with a warning instead of an error.
        packing: "slots" packs N/2 values per ciphertext; "row" one ciphertext per row (comparison only: far
            slower and larger for a batch of short rows).
        n_threads: TenSEAL thread-pool size of every context (vector encryption is sequential either way).

    Example:
        >>> import torch
        >>> from lvfl.parties import PartySpec
        >>> from lvfl.wire import Wire
        >>> parties = [PartySpec("a", "active", (4,)), PartySpec("p1", "passive", (4,), 1),
        ...            PartySpec("p2", "passive", (4,), 2)]
        >>> backend, wire = CKKS(), Wire()
        >>> backend.setup(parties, "a", wire)
        >>> x = torch.tensor([0.5, -1.25], dtype=torch.float64)
        >>> shares = {p: backend.protect(p, x, step=0) for p in ("p1", "p2")}
        >>> out = backend.combine(torch.zeros(2, dtype=torch.float64), shares)
        >>> bool(((out - 2 * x).abs() <= backend.error_bound(2)).all())
        True
    """

    reveals_shares = False
    refuses_nonfinite = True
    refuses_reused_step = False  # every encryption and every mask draws fresh randomness

    def __init__(
        self,
        coordinator: str = "coordinator",
        poly_modulus_degree: int = 8192,
        coeff_mod_bit_sizes: Sequence[int] = (60, 40, 60),
        scale_bits: int = 40,
        security_bits: int = 128,
        mask_bound: float = 2.0**30,
        max_abs: float = 2.0**7,
        packing: str = "slots",
        n_threads: int = 1,
        max_advantage: float = DEFAULT_MAX_ADVANTAGE,
        allow_insecure: bool = False,
    ) -> None:
        self.n_threads = check_int(n_threads, "CKKS(n_threads=...)", low=1)
        self.allow_insecure = bool(allow_insecure)
        self.max_advantage = check_real(max_advantage, "CKKS(max_advantage=...)", 0.0, 1.0, open_low=True)
        self._warned: set[tuple] = set()
        self._configure(
            coordinator,
            poly_modulus_degree,
            coeff_mod_bit_sizes,
            scale_bits,
            security_bits,
            mask_bound,
            max_abs,
            packing,
        )

    def _configure(
        self,
        coordinator: str,
        poly_modulus_degree: int,
        coeff_mod_bit_sizes: Sequence[int],
        scale_bits: int,
        security_bits: int,
        mask_bound: float,
        max_abs: float,
        packing: str,
    ) -> None:
        """Validate and set every parameter, and forget any key (a new configuration needs a new setup)."""
        if not isinstance(coordinator, str) or not coordinator:
            raise TypeError(f"CKKS(coordinator=...) must be a non-empty party name, got {coordinator!r}")
        parameters = CKKSParameters(poly_modulus_degree, coeff_mod_bit_sizes, scale_bits, security_bits)
        mask_bound = check_positive(mask_bound, "CKKS(mask_bound=...)")
        max_abs = check_positive(max_abs, "CKKS(max_abs=...)")
        if packing not in ckks.PACKINGS:
            raise ValueError(f"CKKS(packing=...) must be one of {ckks.PACKINGS}, got {packing!r}")
        if max_abs >= mask_bound:
            self._insecure(
                ("max_abs", "mask_bound"),
                f"CKKS: max_abs={max_abs:g} >= mask_bound={mask_bound:g}: the mask no longer hides the aggregate (a "
                "statistical distance up to 1 per value); raise mask_bound or lower max_abs",
            )
        self.coordinator = coordinator
        self.parameters = parameters
        self.mask_bound, self.max_abs, self.packing = mask_bound, max_abs, packing
        self._forget_keys()

    def _insecure(self, key: tuple, why: str) -> None:
        """Refuse weaker hiding unless `allow_insecure`, which warns (once per `key`)."""
        if not self.allow_insecure:
            raise ValueError(why + "; pass allow_insecure=True to run with this weaker hiding on purpose")
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(why + "; running anyway because allow_insecure=True", UserWarning, stacklevel=3)

    # -- the parameter set and what it guarantees (lvfl.crypto.ckks) -----------------------------------------------
    @property
    def poly_modulus_degree(self) -> int:
        """Ring dimension N."""
        return self.parameters.poly_modulus_degree

    @property
    def coeff_mod_bit_sizes(self) -> tuple[int, ...]:
        """Bit sizes of the coefficient-modulus primes (first, middle..., special)."""
        return self.parameters.coeff_mod_bit_sizes

    @property
    def scale_bits(self) -> int:
        """log2 of the CKKS scale."""
        return self.parameters.scale_bits

    @property
    def security_bits(self) -> int:
        """Classical security level of the parameter set."""
        return self.parameters.security_bits

    @property
    def slots(self) -> int:
        """Values per ciphertext: N / 2."""
        return ckks.slots(self.parameters)

    @property
    def public_context_bytes(self) -> bytes:
        """The serialized public context the coordinator sent to every party at setup (no secret key)."""
        self._require_setup()
        return self._public_blob

    @property
    def headroom(self) -> float:
        """The sum plus mask must stay below this: 2**(bits of all but the special prime - scale - 1)."""
        return ckks.headroom(self.parameters)

    def advantage_bound(self, numel: int, num_parties: int | None = None) -> float:
        """The most statistical distance between the coordinator's views of two aggregates of one combine.

        `1 - (1 - B / M)**numel` for `numel` values, B = K * max_abs (see the module docstring). Defaults to this
        backend's passive parties; a distinguisher's advantage per combine is at most this.
        """
        k = len(self._passive) if num_parties is None else int(num_parties)
        return ckks.masking_advantage(int(numel), 2.0 * k * self.max_abs, self.mask_bound)

    def num_ciphertexts(self, shape: Sequence[int]) -> int:
        """How many ciphertexts a tensor of `shape` is packed into."""
        return ckks.num_ciphertexts(self.parameters, shape, self.packing)

    def error_bound(self, num_parties: int | None = None) -> float:
        """Bound on |decoded passive sum - exact sum| per value, for `num_parties` passive parties.

        Holds with overwhelming probability (see the module docstring). Defaults to this backend's passive parties.
        """
        k = len(self._passive) if num_parties is None else int(num_parties)
        return ckks.error_bound(self.parameters, k, self.max_abs, self.mask_bound)

    # -- keys ----------------------------------------------------------------------------------------------------
    def _forget_keys(self) -> None:
        self._secret_context: ts.Context | None = None  # the coordinator's: never pickled, never checkpointed
        self._secret_key: Any = None
        self._contexts: dict[str, ts.Context] | None = None  # each party's deserialized public context
        self._passive: tuple[str, ...] = ()
        self._public_blob = b""  # the serialized public context, as sent to every party
        self._key_id = b""

    def _require_setup(self) -> None:
        if self._contexts is None:
            raise RuntimeError(
                "CKKS has no keys: call setup(parties, active, wire, rank) first "
                "(keys are never checkpointed or pickled, so a restored backend must be set up again)"
            )

    # -- 1. setup: the coordinator's key, the public view to every party, every byte on the wire ------------------
    def setup(self, parties: Sequence[PartySpec], active: str, wire: Wire, rank: int = 0) -> None:
        """Create a fresh key pair at the coordinator and send the public context to every other party.

        Raises:
            ValueError: on duplicate party names, an `active` that is not the active party, or a coordinator that
                is also the active or a passive party, or that is in `parties` with another role.
        """
        passive = self.check_roles(parties, active)
        if len(passive) * self.max_abs >= self.mask_bound:
            self._insecure(
                ("parties", len(passive)),
                f"CKKS: {len(passive)} passive parties x max_abs={self.max_abs:g} >= mask_bound={self.mask_bound:g}: "
                "the mask no longer hides the aggregate (a statistical distance up to 1 per value); raise mask_bound "
                "or lower max_abs",
            )
        if self.headroom <= len(passive) * self.max_abs + self.mask_bound:
            raise ValueError(
                f"CKKS: {len(passive)} passive parties x max_abs={self.max_abs} + mask_bound={self.mask_bound} "
                f"exceeds the headroom 2**{int(math.log2(self.headroom))} of coeff_mod_bit_sizes="
                f"{self.coeff_mod_bit_sizes} with scale_bits={self.scale_bits}; lower max_abs or mask_bound, or use "
                "a larger first prime"
            )

        super().setup(parties, active, wire, rank)
        self._forget_keys()
        # at the coordinator (only in its process): the secret context, and its public view without rotation or
        # relinearization keys
        secret, blob = None, Absent("the coordinator's public CKKS context")
        if wire.holds(self.coordinator):
            secret = ckks.secret_context(self.parameters, self.n_threads)
            blob = ckks.public_context_bytes(secret)
        contexts, known = {}, blob
        for party in (active, *passive):  # coordinator -> every party: the public context, one message each
            received = wire.send(self.coordinator, party, blob, tag="keys")
            if wire.holds(party):
                if not isinstance(received, bytes):
                    raise TypeError(f"CKKS setup: {party} received a {type(received).__name__} as the context")
                try:
                    contexts[party] = ckks.load_public_context(received, self.n_threads)
                except (ValueError, RuntimeError, TypeError) as err:
                    raise ValueError(f"CKKS setup: {party} received a context it cannot load ({err})") from None
                known = received
        self._secret_context = secret
        self._secret_key = secret.secret_key() if secret is not None else None
        self._contexts = contexts
        self._passive = passive
        self._public_blob = known if isinstance(known, bytes) else b""
        self._key_id = ckks.key_id(self._public_blob) if self._public_blob else b""

    # -- 2. protect: at passive party k, public key only ------------------------------------------------------------
    def protect(self, party: str, tensor: torch.Tensor, step: int, index: int = 0) -> CKKSShare:
        """The CKKS encryption of `tensor` under the coordinator's public key, packed N/2 values per ciphertext.

        CKKS encryption is randomized afresh on every call, so `step` and `index` are not needed for freshness.

        Raises:
            ValueError: if `party` is not a passive party, or `tensor` holds NaN/inf or values beyond `max_abs`
                (the message names the party).
        """
        self._require_setup()
        if party not in self._passive:
            raise ValueError(f"party {party!r} is not a passive party of this backend; passive: {list(self._passive)}")
        if not isinstance(tensor, torch.Tensor) or tensor.is_complex():
            raise TypeError(f"party {party!r}: protect expects a real tensor, got {type(tensor).__name__}")
        values = tensor.detach().to("cpu", torch.float64).reshape(-1).numpy()
        if not np.isfinite(values).all():
            raise ValueError(f"party {party!r}: the tensor holds NaN or inf, which CKKS cannot encrypt")
        peak = float(np.abs(values).max()) if values.size else 0.0
        if peak > self.max_abs:
            raise ValueError(
                f"party {party!r}: |value| up to {peak:.6g} exceeds max_abs={self.max_abs:g}; the decrypted sum "
                f"would lose precision or overflow the headroom 2**{int(math.log2(self.headroom))} (raise max_abs "
                "within the headroom, or scale the embedding)"
            )
        context = self._contexts[party]
        vectors = [ckks.encrypt(context, chunk) for chunk in self._chunks(values, tensor.shape)]
        return CKKSShare(vectors, tensor.shape, self._key_id, self.num_ciphertexts(tensor.shape))

    def _chunks(self, values: np.ndarray, shape: Sequence[int]) -> list[np.ndarray]:
        return ckks.chunks(self.parameters, values, shape, self.packing)

    # -- 3. combine: at the active party, decryption at the coordinator ---------------------------------------------
    def combine(self, active_tensor: torch.Tensor, shares: Mapping[str, Any]) -> torch.Tensor:
        """`active_tensor + sum_k E_k`, in `active_tensor`'s dtype and device.

        The active party adds the ciphertexts, masks the sum, and has the coordinator decrypt it; the result is
        within `error_bound()` of the exact sum. Gradients flow to `active_tensor` only. There are no weights (see
        `lvfl.privacy.aggregation.base`): a party that must contribute `w_k E_k` protects `w_k E_k`.

        Raises:
            ValueError: if a passive party's share is missing or unknown, has the wrong shape, or was encrypted
                under another key. TypeError: if a share is not a `CKKSShare`. RuntimeError: if the decrypted sum
                is corrupted.
        """
        self._require_setup()
        if not isinstance(active_tensor, torch.Tensor) or not active_tensor.is_floating_point():
            raise TypeError("combine: active_tensor must be a floating-point tensor")
        if not self.wire.holds(self.active):  # the coordinator's own process: it decrypts, and holds no sum
            return self._combine_at_coordinator(active_tensor)
        self.check_one_per_party(shares, self._passive, "share")
        if not self._passive:
            return active_tensor
        for name in self._passive:
            share = shares[name]
            if not isinstance(share, CKKSShare):
                raise TypeError(f"combine: share of party {name!r} must be a CKKSShare from CKKS.protect")
            if share.shape != active_tensor.shape:
                raise ValueError(
                    f"combine: share of party {name!r} has shape {tuple(share.shape)}, "
                    f"the active tensor {tuple(active_tensor.shape)}"
                )
            if share.key_id != self._key_id:
                raise ValueError(f"combine: share of party {name!r} was encrypted under another key (an earlier setup)")
            if len(share.vectors) != self.num_ciphertexts(active_tensor.shape):
                raise ValueError(
                    f"combine: share of party {name!r} has {len(share.vectors)} ciphertexts, expected "
                    f"{self.num_ciphertexts(active_tensor.shape)} for shape {tuple(active_tensor.shape)}"
                )
        numel = active_tensor.numel()
        if numel == 0:
            return active_tensor + torch.zeros_like(active_tensor)
        advantage = self.advantage_bound(numel)
        if advantage > self.max_advantage:
            self._insecure(
                ("advantage", numel),
                f"combine: the coordinator's view of these {numel} values is within statistical distance "
                f"{advantage:.3g} of another aggregate's, above max_advantage={self.max_advantage:g} (mask_bound="
                f"{self.mask_bound:g}, max_abs={self.max_abs:g}, {len(self._passive)} passive parties); raise "
                "mask_bound, lower max_abs, or combine fewer values at a time",
            )

        # at the active party: homomorphic sum, then the mask
        mask = ckks.uniform_mask(numel, self.mask_bound)
        aggregate = self._masked_sum(shares, self._chunks(mask, active_tensor.shape))
        payload = CKKSShare(aggregate, active_tensor.shape, self._key_id, len(aggregate))
        at_coordinator = self.wire.send(self.active, self.coordinator, payload, tag="he_aggregate")

        # at the coordinator: decrypt with the secret key; float64 because the mask dominates the range
        decrypted = self._decrypt(at_coordinator) if self.wire.holds(self.coordinator) else Absent("the decryption")
        received = self.wire.send(self.coordinator, self.active, decrypted, tag="he_decrypted")
        if not isinstance(received, torch.Tensor) or received.dtype != torch.float64 or received.numel() != numel:
            raise ValueError(f"combine: the coordinator {self.coordinator!r} answered {received!r:.80}; expected "
                             f"{numel} float64 values")  # fmt: skip

        # at the active party: remove the mask, check, add its own embedding
        passive_sum = received.numpy() - mask
        self._check_decrypted(passive_sum)
        decoded = torch.from_numpy(passive_sum).reshape(active_tensor.shape)
        return active_tensor + decoded.to(active_tensor)

    def _combine_at_coordinator(self, active_tensor: torch.Tensor) -> torch.Tensor:
        """The coordinator's part of `combine` in its own process: receive the masked aggregate, decrypt, answer."""
        message = self.wire.send(self.active, self.coordinator, Absent("the masked aggregate"), tag="he_aggregate")
        expected = self.num_ciphertexts(active_tensor.shape)
        if not isinstance(message, CKKSShare) or tuple(message.shape) != tuple(active_tensor.shape):
            raise ValueError(f"combine: the coordinator got {message!r:.80}, not the aggregate of shape "
                             f"{tuple(active_tensor.shape)}")  # fmt: skip
        if message.key_id != self._key_id or len(message.vectors) != expected:
            raise ValueError(f"combine: the aggregate the coordinator got is under another key or holds "
                             f"{len(message.vectors)} ciphertexts, not {expected}")  # fmt: skip
        self.wire.send(self.coordinator, self.active, self._decrypt(message), tag="he_decrypted")
        return shadow(active_tensor).requires_grad_(active_tensor.requires_grad)

    def _masked_sum(self, shares: Mapping[str, CKKSShare], mask: list[np.ndarray]) -> list[ts.CKKSVector]:
        context = self._contexts[self.active]
        return ckks.masked_sum([shares[name].vectors_in(context) for name in self._passive], mask)

    def _decrypt(self, payload: CKKSShare) -> torch.Tensor:
        """At the coordinator: the decrypted values of the aggregate, float64."""
        return torch.from_numpy(ckks.decrypt(payload.vectors_in(self._secret_context), self._secret_key))

    def _check_decrypted(self, passive_sum: np.ndarray) -> None:
        limit = len(self._passive) * self.max_abs + self.error_bound()
        if not np.isfinite(passive_sum).all() or float(np.abs(passive_sum).max()) > limit:
            raise RuntimeError(
                f"combine: the aggregate decrypted by coordinator {self.coordinator!r} is corrupted (values beyond "
                f"{limit:.6g} = K x max_abs + error bound): wrong key, tampered ciphertexts, or overflow"
            )

    # -- checkpoints and pickling: never any key material --------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Non-secret configuration only; keys are created afresh by `setup` after a restore."""
        return {
            "coordinator": self.coordinator,
            "poly_modulus_degree": self.poly_modulus_degree,
            "coeff_mod_bit_sizes": list(self.coeff_mod_bit_sizes),
            "scale_bits": self.scale_bits,
            "security_bits": self.security_bits,
            "mask_bound": self.mask_bound,
            "max_abs": self.max_abs,
            "packing": self.packing,
        }

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the secret context, the secret key or the parties' contexts (TenSEAL objects)."""
        state = self.__dict__.copy()
        state.update(
            _secret_context=None,
            _secret_key=None,
            _contexts=None,
            _passive=(),
            _public_blob=b"",
            _key_id=b"",
        )
        return state

    def __repr__(self) -> str:
        ready = "set up" if self._contexts is not None else "not set up"
        return (
            f"CKKS(coordinator={self.coordinator!r}, poly_modulus_degree={self.poly_modulus_degree}, "
            f"coeff_mod_bit_sizes={self.coeff_mod_bit_sizes}, scale_bits={self.scale_bits}, "
            f"security_bits={self.security_bits}, mask_bound={self.mask_bound:g}, max_abs={self.max_abs:g}, "
            f"packing={self.packing!r}) [{ready}]"
        )
