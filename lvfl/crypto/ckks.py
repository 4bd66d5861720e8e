"""CKKS in one place: the parameter set, what it guarantees, and the TenSEAL calls, as pure functions.

`CKKSParameters` is a frozen, self-validating parameter set; every function below takes it (or TenSEAL objects
made from it) explicitly. `lvfl.privacy.aggregation.ckks.CKKS` (the recipe) holds the keys and runs the protocol on
top.

Security parameters. The total coefficient-modulus size must respect the HomomorphicEncryption.org standard bound
for uniform ternary secrets and classical security (the same table SEAL enforces for 128 bits):

    =============  =====  =====  =====  =====  =====  =====
    N              1024   2048   4096   8192   16384  32768
    =============  =====  =====  =====  =====  =====  =====
    128-bit        27     54     109    218    438    881
    192-bit        19     37     75     152    305    611
    256-bit        14     29     58     118    237    476
    =============  =====  =====  =====  =====  =====  =====

The primes: the first leaves integer headroom above the scale, each middle one equals the scale (a rescale divides
out exactly one scale factor), the last (special) one is at least as large as every other. Defaults: N=8192, primes
(60, 40, 60) = 160 bits <= 218, scale 2**40.

Headroom. A decrypted value must stay below `2**(L - scale_bits - 1)` in magnitude, L the bits of the primes left
at decryption (all but the special prime): `headroom`. A sum decrypted at the top level (no rescale, as in lvfl)
has L = 100 at the defaults: headroom 2**59.

Precision. The decryption error per value of a sum of K fresh encryptions plus a plaintext mask is bounded (with
overwhelming probability) by `error_bound = (K * B_clean + (K + 2) * B_scale) / 2**scale_bits + 2**-50 * magnitude`,
where `B_clean = 8 sqrt(2) sigma N + 6 sigma sqrt(N) + 16 sigma sqrt(h N)` is the fresh-encryption noise bound
(`fresh_noise_bound`) and `B_scale = sqrt(N / 3) (3 + 8 sqrt(h))` the rounding bound of an encoding or a rescale
(`rounding_bound`) (Cheon, Kim, Kim, Song, ASIACRYPT 2017, Lemmas 1-3; sigma = 3.2, h = 2N/3 for SEAL's uniform
ternary secret). At the defaults the noise term is about 6e-7 per summand. The last term is the float64 rounding of
the decoded value (magnitude up to `K * max_abs + mask_bound`), ~1e-6 at a mask bound of 2**30.

Statistical hiding by a uniform mask. For sums S, S' with |S_i - S'_i| <= d per value and a mask R uniform in
[-M, M]^n, the laws of S + R and S' + R are uniform on boxes of equal volume, so their statistical distance (the
best advantage of any distinguisher) is exactly one minus their overlap, `1 - (1 - d / (2M))**n` at the worst case
(`masking_advantage`).

Packing. "slots" fills every ciphertext with N/2 values; "row" encrypts each leading-dim row separately.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tenseal as ts

__all__ = [
    "FLOAT64_ROUNDING",
    "MAX_COEFF_MODULUS_BITS",
    "MAX_PRIME_BITS",
    "NOISE_SIGMA",
    "PACKINGS",
    "CKKSParameters",
    "chunks",
    "decrypt",
    "encrypt",
    "error_bound",
    "fresh_noise_bound",
    "headroom",
    "key_id",
    "load_public_context",
    "masked_sum",
    "masking_advantage",
    "num_ciphertexts",
    "public_context_bytes",
    "rounding_bound",
    "secret_context",
    "slots",
    "uniform_mask",
]

#: HomomorphicEncryption.org standard: max total coefficient-modulus bits per N, by classical security level
MAX_COEFF_MODULUS_BITS: dict[int, dict[int, int]] = {
    128: {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881},
    192: {1024: 19, 2048: 37, 4096: 75, 8192: 152, 16384: 305, 32768: 611},
    256: {1024: 14, 2048: 29, 4096: 58, 8192: 118, 16384: 237, 32768: 476},
}
#: SEAL's limit on one prime of the coefficient modulus
MAX_PRIME_BITS = 60
#: standard deviation of SEAL's error distribution
NOISE_SIGMA = 3.2
#: relative error of a decoded float64 value (53-bit significand, a few roundings, with margin)
FLOAT64_ROUNDING = 2.0**-50
#: packing layouts: "slots" fills every ciphertext (the default); "row" encrypts each leading-dim row separately
PACKINGS = ("slots", "row")


def _is_int(value: object) -> bool:
    # lvfl.crypto imports nothing else from lvfl, so not lvfl.checks.is_int
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class CKKSParameters:
    """A CKKS parameter set that meets the security table and the prime-chain rules (checked on construction).

    Refusals are ValueErrors naming the option as `CKKS(option=...)`, the backend's constructor argument.

    Args:
        poly_modulus_degree: ring dimension N, a power of two in [1024, 32768]; N/2 slots per ciphertext.
        coeff_mod_bit_sizes: bit sizes of the coefficient-modulus primes: first (precision headroom), middle ones
            (one per rescale, equal to `scale_bits`), last (special prime, at least as large as every other).
            Any sequence; stored as a tuple of ints.
        scale_bits: log2 of the CKKS scale (fractional precision), in [1, 60).
        security_bits: classical security level, 128, 192 or 256 (HomomorphicEncryption.org table).

    Example:
        >>> params = CKKSParameters()
        >>> slots(params), headroom(params) == 2.0**59
        (4096, True)
        >>> CKKSParameters(coeff_mod_bit_sizes=[60, 60, 60, 60])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: CKKS(coeff_mod_bit_sizes=(60, 60, 60, 60)): total 240 bits exceeds the 218-bit bound ...
    """

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 40, 60)
    scale_bits: int = 40
    security_bits: int = 128

    def __post_init__(self) -> None:
        n, sizes, scale_bits, security_bits = _validate(
            self.poly_modulus_degree, self.coeff_mod_bit_sizes, self.scale_bits, self.security_bits
        )
        object.__setattr__(self, "poly_modulus_degree", n)
        object.__setattr__(self, "coeff_mod_bit_sizes", sizes)
        object.__setattr__(self, "scale_bits", scale_bits)
        object.__setattr__(self, "security_bits", security_bits)


def _validate(
    poly_modulus_degree: object, coeff_mod_bit_sizes: Sequence[int], scale_bits: object, security_bits: object
) -> tuple[int, tuple[int, ...], int, int]:
    if not _is_int(security_bits) or int(security_bits) not in MAX_COEFF_MODULUS_BITS:
        raise ValueError(
            f"CKKS(security_bits=...) must be one of {sorted(MAX_COEFF_MODULUS_BITS)}, got {security_bits!r}"
        )
    table = MAX_COEFF_MODULUS_BITS[int(security_bits)]
    if not _is_int(poly_modulus_degree) or int(poly_modulus_degree) not in table:
        raise ValueError(
            f"CKKS(poly_modulus_degree=...) must be a power of two in {sorted(table)}, got {poly_modulus_degree!r}"
        )
    if not _is_int(scale_bits) or not 1 <= scale_bits < MAX_PRIME_BITS:
        raise ValueError(f"CKKS(scale_bits=...) must be an int in [1, {MAX_PRIME_BITS}), got {scale_bits!r}")
    sizes = tuple(coeff_mod_bit_sizes)
    if len(sizes) < 2 or not all(_is_int(b) and 2 <= b <= MAX_PRIME_BITS for b in sizes):
        raise ValueError(
            f"CKKS(coeff_mod_bit_sizes=...) needs at least 2 primes of 2..{MAX_PRIME_BITS} bits "
            f"(first, middle..., special), got {sizes}"
        )
    n, sizes, scale_bits = int(poly_modulus_degree), tuple(int(b) for b in sizes), int(scale_bits)
    total, bound = sum(sizes), table[n]
    if total > bound:
        raise ValueError(
            f"CKKS(coeff_mod_bit_sizes={sizes}): total {total} bits exceeds the {bound}-bit bound for "
            f"{security_bits}-bit security at poly_modulus_degree={n} (HomomorphicEncryption.org standard); "
            "use fewer or smaller primes, or a larger poly_modulus_degree"
        )
    first, middle, special = sizes[0], sizes[1:-1], sizes[-1]
    if any(b != scale_bits for b in middle):
        raise ValueError(
            f"CKKS(coeff_mod_bit_sizes={sizes}): the middle primes must equal scale_bits={scale_bits}, so that "
            "each rescale divides out exactly one scale factor"
        )
    if first <= scale_bits:
        raise ValueError(
            f"CKKS(coeff_mod_bit_sizes={sizes}): the first prime ({first} bits) must exceed scale_bits="
            f"{scale_bits} to leave integer headroom for the decrypted values"
        )
    if special < max(sizes[:-1]):
        raise ValueError(
            f"CKKS(coeff_mod_bit_sizes={sizes}): the last (special) prime ({special} bits) must be at least as "
            "large as every other prime"
        )
    return n, sizes, scale_bits, int(security_bits)


# -- what a parameter set guarantees -----------------------------------------------------------------------------
def slots(params: CKKSParameters) -> int:
    """Values per ciphertext: N / 2."""
    return params.poly_modulus_degree // 2


def headroom(params: CKKSParameters) -> float:
    """A value decrypted at the top level must stay below this: 2**(bits of all but the special prime - scale - 1)."""
    return 2.0 ** (sum(params.coeff_mod_bit_sizes[:-1]) - params.scale_bits - 1)


def fresh_noise_bound(params: CKKSParameters) -> float:
    """B_clean: the canonical-embedding bound on a fresh public-key encryption's noise (Cheon et al. 2017)."""
    n = params.poly_modulus_degree
    h = 2 * n / 3  # expected Hamming weight of a uniform ternary secret
    return 8 * math.sqrt(2) * NOISE_SIGMA * n + 6 * NOISE_SIGMA * math.sqrt(n) + 16 * NOISE_SIGMA * math.sqrt(h * n)


def rounding_bound(params: CKKSParameters) -> float:
    """B_scale: the canonical-embedding bound on the rounding error of an encoding or a rescale."""
    n = params.poly_modulus_degree
    return math.sqrt(n / 3) * (3 + 8 * math.sqrt(2 * n / 3))


def error_bound(params: CKKSParameters, num_summands: int, max_abs: float, mask_bound: float = 0.0) -> float:
    """Bound on |decrypted - exact| per value for a sum of `num_summands` fresh ciphertexts plus a plaintext mask.

    Each summand holds values of magnitude at most `max_abs`, the mask at most `mask_bound`. Holds with
    overwhelming probability (see the module docstring): the encryption noise of every summand, the rounding of
    every encoding (the summands, the mask) and of the decoding, and the float64 rounding of the decoded value.

    Raises:
        ValueError: if `num_summands` is not an int >= 0.
    """
    if not _is_int(num_summands) or num_summands < 0:
        raise ValueError(f"num_summands must be an int >= 0, got {num_summands!r}")
    k = int(num_summands)
    magnitude = k * max_abs + mask_bound
    noise = k * fresh_noise_bound(params) + (k + 2) * rounding_bound(params)
    return noise * 2.0**-params.scale_bits + magnitude * FLOAT64_ROUNDING


def masking_advantage(numel: int, spread: float, mask_bound: float) -> float:
    """Statistical distance between `S + R` and `S' + R`, R uniform in [-M, M]^numel, for |S_i - S'_i| <= spread.

    Exactly `1 - (1 - spread / (2M))**numel` at the worst case |S_i - S'_i| = spread (uniform laws on boxes of equal
    volume: one minus the overlap), and 1 when spread >= 2M. This is the best advantage any distinguisher has.
    """
    if numel <= 0 or spread <= 0:
        return 0.0
    per_value = spread / (2.0 * mask_bound)
    if per_value >= 1.0:
        return 1.0
    return -math.expm1(numel * math.log1p(-per_value))


# -- packing ---------------------------------------------------------------------------------------------------
def num_ciphertexts(params: CKKSParameters, shape: Sequence[int], packing: str = "slots") -> int:
    """How many ciphertexts a tensor of `shape` is packed into under `packing`."""
    numel = math.prod(shape)
    if packing == "row" and len(shape) > 1 and numel:
        return shape[0] * math.ceil(numel // shape[0] / slots(params))
    return math.ceil(numel / slots(params))


def chunks(
    params: CKKSParameters, values: np.ndarray, shape: Sequence[int], packing: str = "slots"
) -> list[np.ndarray]:
    """The flat `values` of a tensor of `shape`, cut into the plaintext chunks that `packing` encrypts one by one."""
    if packing == "row" and len(shape) > 1 and values.size:
        return list(values.reshape(shape[0], -1))
    n = slots(params)
    return [values[i : i + n] for i in range(0, values.size, n)]


# -- randomness ------------------------------------------------------------------------------------------------
def uniform_mask(numel: int, bound: float) -> np.ndarray:
    """`numel` float64 values uniform in [-bound, bound), from the OS CSPRNG (53 random bits each)."""
    words = np.frombuffer(os.urandom(8 * numel), dtype=np.uint64)
    unit = (words >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return (2.0 * unit - 1.0) * bound


# -- TenSEAL: contexts, encryption, homomorphic sum, decryption --------------------------------------------------
def secret_context(params: CKKSParameters, n_threads: int = 1) -> ts.Context:
    """A fresh CKKS context for `params` with a new secret key, public key and relinearization keys."""
    context = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=params.poly_modulus_degree,
        coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
        n_threads=n_threads,
    )
    context.global_scale = 2.0**params.scale_bits
    return context


def public_context_bytes(secret: ts.Context) -> bytes:
    """The public view of `secret`, serialized; `secret` is left as it was.

    No secret key, no Galois keys (no rotations are ever needed), no relinearization keys (no ciphertext-ciphertext
    product is ever computed).
    """
    public = secret.copy()
    public.make_context_public()
    return public.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False)


def load_public_context(blob: bytes, n_threads: int = 1) -> ts.Context:
    """A party's context deserialized from `blob`; a ValueError if `blob` holds a secret key."""
    context = ts.context_from(blob, n_threads=n_threads)
    if context.is_private():
        raise ValueError("a public CKKS context must not hold the secret key")
    return context


def key_id(blob: bytes) -> bytes:
    """A 16-byte fingerprint of a serialized public context: shares under other keys are told apart by it."""
    return hashlib.sha256(blob).digest()[:16]


def load_vector(context: ts.Context, blob: bytes) -> ts.CKKSVector:
    """A ciphertext serialized by another process (`CKKSVector.serialize`), bound to this process's `context`.

    Raises:
        ValueError: `blob` is not a serialized CKKS vector.
    """
    try:
        return ts.ckks_vector_from(context, blob)
    except (ValueError, RuntimeError, TypeError) as err:
        raise ValueError(f"not a serialized CKKS ciphertext ({err})") from None


def encrypt(context: ts.Context, chunk: np.ndarray) -> ts.CKKSVector:
    """The public-key encryption of one plaintext chunk (at most N/2 values for one ciphertext), fresh randomness."""
    # TenSEAL's public constructor; its private native one (ts._ts_cpp.CKKSVector) skips a PlainTensor round trip
    # and measured slightly faster, not worth depending on a private API that a TenSEAL release may change
    return ts.ckks_vector(context, chunk.tolist())


def masked_sum(summands: Sequence[Sequence[ts.CKKSVector]], mask: Sequence[np.ndarray]) -> list[ts.CKKSVector]:
    """Ciphertext-wise `sum_k summands[k] + mask`, as new vectors (the summands are left as they were).

    `summands[k]` holds one party's ciphertexts, `mask` the plaintext chunks laid out the same way.
    """
    first, *rest = summands
    # add(mask) makes the new vector (a C++ copy, far cheaper than CKKSVector.copy())
    out = [vec.add(m.tolist()) for vec, m in zip(first, mask, strict=True)]
    for vectors in rest:
        for acc, vec in zip(out, vectors, strict=True):
            acc.add_(vec)
    return out


def decrypt(vectors: Sequence[ts.CKKSVector], secret_key: ts.enc_context.SecretKey) -> np.ndarray:
    """The decrypted values of `vectors`, concatenated, as float64."""
    return np.concatenate([np.asarray(vec.decrypt(secret_key), dtype=np.float64) for vec in vectors])
