"""Paillier arithmetic with g = n + 1, in one place: key sizes, encryption, homomorphic operations, blinding, bytes.

Pure functions on Python / gmpy2 integers; the key pair comes from `phe` (its prime generation and CRT decryption),
every other operation is the textbook scheme:

- [[m]] = (1 + m n) rho**n mod n**2 with rho uniform in Z_n^* (`encrypt`, or `obfuscators` + `finish_encryption`
  when the exponentiations run elsewhere: they need only n and rho, never the secret key or m);
- [[a]] [[b]] = [[a + b]] (`add`); [[a]] (1 + b n) = [[a + b]] (`add_plain`); [[a]]**e = [[e a]] with a negative e
  through the ciphertext's inverse (`power`);
- a uniform mask r mod n hides a plaintext perfectly from the decrypting party (`blind`, `unblind`);
- fixed-width big-endian bytes (`to_bytes`, `from_bytes`; `ciphertext_nbytes`, `plaintext_nbytes`).

Security: semantic security under the decisional composite residuosity assumption; `check_key_size` refuses moduli
below 2048 bits (112-bit security, NIST SP 800-57), with no override.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import gmpy2
from phe import paillier as phe_paillier

__all__ = [
    "KEY_SIZE_STEP",
    "MIN_KEY_SIZE",
    "add",
    "add_plain",
    "blind",
    "check_key_size",
    "ciphertext_nbytes",
    "decrypt",
    "encrypt",
    "finish_encryption",
    "from_bytes",
    "generate_keypair",
    "inverse",
    "obfuscator_task",
    "obfuscators",
    "plaintext_nbytes",
    "power",
    "random_units",
    "signed",
    "to_bytes",
    "unblind",
]

#: the smallest modulus accepted (112-bit security); there is no override
MIN_KEY_SIZE = 2048
#: key sizes are multiples of this (phe draws two primes of key_size / 2 bits)
KEY_SIZE_STEP = 256


def check_key_size(key_size: Any, option: str = "key_size") -> int:
    """`key_size` if it is an int >= 2048 and a multiple of 256; a ValueError naming `option` otherwise."""
    if isinstance(key_size, bool) or not isinstance(key_size, int):
        raise ValueError(f"{option} must be an int (bits of the Paillier modulus), got {key_size!r}")
    if key_size < MIN_KEY_SIZE or key_size % KEY_SIZE_STEP:
        raise ValueError(
            f"{option} must be at least {MIN_KEY_SIZE} bits (112-bit security) and a multiple of {KEY_SIZE_STEP}, "
            f"got {key_size}"
        )
    return key_size


def generate_keypair(key_size: int) -> tuple[int, phe_paillier.PaillierPrivateKey]:
    """A fresh key pair: the public modulus n and the secret key (phe's, for its CRT decryption)."""
    public, secret = phe_paillier.generate_paillier_keypair(n_length=check_key_size(key_size))
    return int(public.n), secret


def decrypt(secret: phe_paillier.PaillierPrivateKey, ciphertext: int) -> int:
    """M in [0, n) from [[m]] (CRT decryption)."""
    return int(secret.raw_decrypt(int(ciphertext)))


def signed(value: int, n: int) -> int:
    """A plaintext in [0, n) read as a signed integer: values above n / 2 are negative."""
    return value - n if value > n // 2 else value


# -- encryption ---------------------------------------------------------------------------------------------------
def random_units(n: int, count: int) -> list[int]:
    """`count` uniform rho in [1, n) from the OS CSPRNG (units with overwhelming probability)."""
    return [secrets.randbelow(n - 1) + 1 for _ in range(count)]


def obfuscators(n: int, rhos: Sequence[int]) -> list[Any]:
    """rho**n mod n**2 for each rho: the expensive half of an encryption, from public values only."""
    modulus = gmpy2.mpz(n)
    return gmpy2.powmod_base_list([gmpy2.mpz(r) for r in rhos], modulus, modulus * modulus)


def obfuscator_task(n: int) -> tuple[Callable[..., list[Any]], Any, Any]:
    """`(function, n, n**2)` to compute rho**n mod n**2 in another process as `function(rhos, n, n**2)`.

    The function is gmpy2's own, so a worker process imports gmpy2 and nothing of lvfl (cheap to start), and it
    receives only public values: n and the random rhos, never the secret key or a plaintext.
    """
    modulus = gmpy2.mpz(n)
    return gmpy2.powmod_base_list, modulus, modulus * modulus


def finish_encryption(n: int, plaintexts: Iterable[int], obfs: Iterable[Any]) -> list[int]:
    """[[m]] = (1 + m n) * obfuscator mod n**2 for each (m, obfuscator)."""
    modulus = gmpy2.mpz(n)
    n2 = modulus * modulus
    return [int((1 + gmpy2.mpz(m) * modulus) * obf % n2) for m, obf in zip(plaintexts, obfs, strict=True)]


def encrypt(n: int, plaintexts: Sequence[int]) -> list[int]:
    """[[m]] for each m in [0, n), each with a fresh rho (serial; callers parallelize `obfuscators` themselves)."""
    return finish_encryption(n, plaintexts, obfuscators(n, random_units(n, len(plaintexts))))


# -- homomorphic operations ---------------------------------------------------------------------------------------
def add(n: int, ciphertexts: Iterable[int]) -> int:
    """[[sum m_i]] = prod [[m_i]] mod n**2."""
    n2 = gmpy2.mpz(n) ** 2
    acc = gmpy2.mpz(1)
    for c in ciphertexts:
        acc = acc * gmpy2.mpz(c) % n2
    return int(acc)


def add_plain(n: int, ciphertext: int, m: int) -> int:
    """[[a + m]] = [[a]] (1 + m n) mod n**2 (m taken mod n, so a negative m subtracts)."""
    modulus = gmpy2.mpz(n)
    return int(gmpy2.mpz(ciphertext) * (1 + (m % n) * modulus) % (modulus * modulus))


def inverse(n: int, ciphertext: int) -> int:
    """[[a]]**-1 = [[-a]] mod n**2 (for `power` with many negative exponents of one ciphertext)."""
    return int(gmpy2.invert(gmpy2.mpz(ciphertext), gmpy2.mpz(n) ** 2))


def power(n: int, ciphertext: int, e: int, inverse: int | None = None) -> int:
    """[[e a]] = [[a]]**e mod n**2; a negative e uses the ciphertext's inverse (a short exponent, not n - |e|).

    `inverse` may pass [[a]]**-1 mod n**2 when the caller reuses it for many exponents.
    """
    n2 = gmpy2.mpz(n) ** 2
    base = gmpy2.mpz(ciphertext)
    if e < 0:
        base = gmpy2.invert(base, n2) if inverse is None else gmpy2.mpz(inverse)
        e = -e
    return int(gmpy2.powmod(base, e, n2))


def blind(n: int, ciphertexts: Sequence[int]) -> tuple[list[int], list[int]]:
    """Each [[m]] as [[m + r]] with r uniform mod n, and the masks r: the decrypting party sees m + r only."""
    masks = [secrets.randbelow(n) for _ in ciphertexts]
    return [add_plain(n, c, r) for c, r in zip(ciphertexts, masks, strict=True)], masks


def unblind(n: int, plaintexts: Sequence[int], masks: Sequence[int], as_signed: bool = True) -> list[int]:
    """(m + r) - r mod n, read as signed integers (or left in [0, n), e.g. for packed non-negative slots)."""
    values = [(int(v) - int(r)) % n for v, r in zip(plaintexts, masks, strict=True)]
    return [signed(v, n) for v in values] if as_signed else values


# -- bytes on the wire --------------------------------------------------------------------------------------------
def ciphertext_nbytes(n: int) -> int:
    """Fixed wire width of a ciphertext (an integer mod n**2)."""
    return -(-2 * int(n).bit_length() // 8)


def plaintext_nbytes(n: int) -> int:
    """Fixed wire width of a plaintext (an integer mod n)."""
    return -(-int(n).bit_length() // 8)


def to_bytes(values: Iterable[int], width: int) -> bytes:
    """Integers as concatenated `width`-byte big-endian words."""
    return b"".join(int(v).to_bytes(width, "big") for v in values)


def from_bytes(data: bytes, width: int) -> list[int]:
    """The integers of `to_bytes`."""
    return [int.from_bytes(data[i : i + width], "big") for i in range(0, len(data), width)]
