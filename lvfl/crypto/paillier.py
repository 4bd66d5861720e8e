"""Paillier arithmetic with g = n + 1, in one place: key sizes, encryption, homomorphic operations, blinding, bytes.

Pure functions on Python / gmpy2 integers; the key pair comes from `phe` (its prime generation and CRT decryption),
drawn as a Blum modulus (p and q both 3 mod 4, gcd(p - 1, q - 1) = 2: the "admissible" modulus of Damgard, Jurik
and Nielsen and of HEU's ZPaillier), and every other operation is the textbook scheme:

- [[m]] = (1 + m n) rho**n mod n**2 with rho uniform in Z_n^* (`encrypt`, or `obfuscators` + `finish_encryption`
  when the exponentiations run elsewhere: they need only n and rho, never the secret key or m): the textbook
  encryption, one full 2048-bit exponent mod n**2 per ciphertext, kept as the reference;
- ciphertexts of the same form, faster: [[m]] = (1 + m n) h_s**r mod n**2 with a fixed base h_s and a short random r
  (`fixed_base`, `fixed_base_table`, `encrypt_fixed_base`; see below);
- [[a]] [[b]] = [[a + b]] (`add`); [[a]] (1 + b n) = [[a + b]] (`add_plain`); [[a]]**e = [[e a]] with a negative e
  through the ciphertext's inverse (`power`);
- a uniform mask r mod n hides a plaintext perfectly from the decrypting party (`blind`, `unblind`);
- fixed-width big-endian bytes (`to_bytes`, `from_bytes`; `ciphertext_nbytes`, `plaintext_nbytes`).

Fixed-base encryption (Damgard, Jurik, Nielsen, "A generalization of Paillier's public-key system with
applications to electronic voting", IJIS 2010; Jurik's thesis, 2003; HEU's ZPaillier): h = -x**2 mod n for x
uniform in Z_n^* and h_s = h**n mod n**2 (`fixed_base`). h_s is an n-th residue, so (1 + m n) h_s**r is a Paillier
ciphertext of m under the same public key for every r (the existing `decrypt` reads it; `add`, `add_plain` and
`power` apply). On a Blum modulus -1 is a non-residue mod p and mod q with Jacobi symbol +1, so h, and every
ciphertext mod n, has Jacobi symbol +1: the Jacobi symbol, the one character of Z_n^* known to be computable without
the factorization, is constant and shows nothing of r. h_s needs only n and fresh randomness, so the encrypting
party derives its own. With a short r of `short_exponent_bits(n)` bits, h_s**r costs one multiplication mod n**2
per 8-bit window of r with a table of h_s**(j * 2**(8 i)) for every window i and digit j in [0, 256)
(`fixed_base_table`: 56 rows of 256 entries, 7.3 MB, at 2048 bits): 56 multiplications instead of the ~2,400
squarings and multiplications of a 2048-bit exponent.

Security: textbook encryption is semantically secure under the decisional composite residuosity (DCR) assumption.
The fixed-base encryption is semantically secure under DCR together with a short-exponent assumption: that h_s**r
for r uniform in [0, 2**l) cannot be told from h_s**r for r uniform in a range much wider than n, such as
[0, n 2**128) (which makes h_s**r statistically uniform in the group h_s generates). (Under DCR h_s cannot be told
from h_s (1 + n), which would turn the ciphertext into (1 + n)**(m + r) h**(n r); a wide r is close to uniform mod
n and hides m in it statistically, and the assumption says a short r hides it as well.) It is the assumption
behind DJN's and HEU's short randomness, and Ma et al. ("Optimized Paillier's cryptosystem with fast encryption and
decryption", ACSAC 2021) set its length for a security level kappa: l = 4 kappa, 448 bits at 2048 bits (kappa =
112), 512 at 3072 (`short_exponent_bits`). The best known attack on an l-bit exponent in a group of unknown order,
Pollard's kangaroo, takes about 2**(l / 2) = 2**224 multiplications, far beyond 2**112; attacks that use the
factors of the group order (van Oorschot-Wiener) need p and q, that is, factoring the 2048-bit n (112-bit
security, NIST SP 800-57). Ma et al. draw their own key structure; we keep standard Blum keys and take their
exponent length. HEU draws r of n / 2 = 1024 bits, a wider margin under the same assumption, but in gmpy2 a table
of 8-bit windows then encrypts about 1,300 times a second per core, and passing 1,500 would take 10-bit windows
(54 MB per key), so we take the ACSAC length.
`check_key_size` refuses moduli below 2048 bits (112-bit security, NIST SP 800-57), with no override.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gmpy2
from phe import paillier as phe_paillier
from phe.util import getprimeover

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
    "encrypt_fixed_base",
    "finish_encryption",
    "fixed_base",
    "fixed_base_obfuscators",
    "fixed_base_power",
    "fixed_base_table",
    "fixed_base_task",
    "FixedBase",
    "from_bytes",
    "generate_keypair",
    "inverse",
    "obfuscator_task",
    "obfuscators",
    "plaintext_nbytes",
    "power",
    "random_units",
    "security_bits",
    "short_exponent_bits",
    "short_exponents",
    "signed",
    "to_bytes",
    "unblind",
]

#: the smallest modulus accepted (112-bit security); there is no override
MIN_KEY_SIZE = 2048
#: key sizes are multiples of this (phe draws two primes of key_size / 2 bits)
KEY_SIZE_STEP = 256
#: (modulus bits, bits of security) from NIST SP 800-57 Part 1 table 2, largest first: a modulus of at least that
#: many bits has at least that security
SECURITY_BITS = ((15360, 256), (7680, 192), (3072, 128), (2048, 112))
#: bits of the short exponent r per bit of security, Ma et al.'s l = 4 kappa (ACSAC 2021): 448 bits at 2048
SHORT_EXPONENT_FACTOR = 4
#: bits of one window of the fixed-base table: one row of 2**8 powers per byte of the exponent
WINDOW_BITS = 8
#: fixed-base tables a worker process keeps (one per encrypting party's h_s; 7.3 MB each at 2048 bits)
WORKER_TABLES = 16


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
    """A fresh key pair: the public modulus n and the secret key (phe's, for its CRT decryption).

    phe's key generation (two random primes of key_size / 2 bits from its `getprimeover`, redrawn until n has
    exactly key_size bits), restricted to a Blum modulus as in DJN and HEU: p and q both 3 mod 4, gcd(p - 1, q - 1)
    = 2, so that -1 has Jacobi symbol +1 mod n without being a square (`fixed_base` relies on it).
    """
    half = check_key_size(key_size) // 2
    while True:
        p, q = _blum_prime(half), _blum_prime(half)
        if p != q and gmpy2.gcd(p - 1, q - 1) == 2 and (p * q).bit_length() == key_size:
            break
    public = phe_paillier.PaillierPublicKey(p * q)
    return int(public.n), phe_paillier.PaillierPrivateKey(public, p, q)


def _blum_prime(bits: int) -> int:
    """A random prime of `bits` bits that is 3 mod 4 (phe's `getprimeover`, redrawn; half of its primes qualify)."""
    while True:
        prime = getprimeover(bits)
        if prime % 4 == 3:
            return prime


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
    """[[m]] = (1 + m n) * obfuscator mod n**2 for each (m, obfuscator).

    Computed as obfuscator + n * (m * obfuscator mod n) mod n**2, equal since n x mod n**2 = n (x mod n): a
    reduction mod n instead of a product mod n**2.
    """
    modulus = gmpy2.mpz(n)
    n2 = modulus * modulus
    return [int((obf + modulus * (gmpy2.mpz(m) * obf % modulus)) % n2) for m, obf in zip(plaintexts, obfs, strict=True)]


def encrypt(n: int, plaintexts: Sequence[int]) -> list[int]:
    """[[m]] for each m in [0, n), each with a fresh rho (serial; callers parallelize `obfuscators` themselves).

    The textbook encryption, a full-length rho**n per ciphertext (about 110 a second per core at 2048 bits): the
    reference for `encrypt_fixed_base`, and what a party uses when it encrypts too few values to pay for a table.
    """
    return finish_encryption(n, plaintexts, obfuscators(n, random_units(n, len(plaintexts))))


# -- fixed-base encryption (DJN): [[m]] = (1 + m n) h_s**r mod n**2 with a short r -------------------------------
def security_bits(n: int) -> int:
    """Bits of security of a modulus of n's size (NIST SP 800-57 Part 1, table 2); a ValueError below 2048 bits."""
    bits = int(n).bit_length()
    for modulus_bits, security in SECURITY_BITS:
        if bits >= modulus_bits:
            return security
    raise ValueError(f"a Paillier modulus must have at least {MIN_KEY_SIZE} bits (112-bit security), got {bits}")


def short_exponent_bits(n: int) -> int:
    """The bits of the fixed-base exponent r for n, l = 4 kappa (Ma et al., ACSAC 2021): 448 at 2048 bits.

    Pollard's kangaroo finds an l-bit exponent in about 2**(l / 2) = 2**(2 kappa) steps; see the module docstring.
    """
    return SHORT_EXPONENT_FACTOR * security_bits(n)


def check_fixed_base(n: int, h_s: int) -> int:
    """`h_s` if it can be a DJN fixed base for n: a unit mod n**2 whose residue mod n has Jacobi symbol +1.

    Whether it is an n-th residue cannot be checked without the factorization (that is DCR); `fixed_base` makes
    one by construction.

    Raises:
        ValueError: otherwise.
    """
    modulus = gmpy2.mpz(n)
    value = gmpy2.mpz(h_s)
    if not 1 < value < modulus * modulus or gmpy2.gcd(value, modulus) != 1:
        raise ValueError("a fixed base h_s must be a unit mod n**2 other than 1")
    if gmpy2.jacobi(value % modulus, modulus) != 1:
        raise ValueError("a fixed base h_s must have Jacobi symbol +1 mod n (h = -x**2 on a Blum modulus)")
    return int(h_s)


def fixed_base(n: int) -> int:
    """h_s = h**n mod n**2 with h = -x**2 mod n, x uniform in Z_n^* from the OS CSPRNG (DJN, HEU's ZPaillier).

    Public values only: any party holding n derives one (one full exponentiation, once). h_s is an n-th residue, so
    h_s**r encrypts 0 for every r.

    Raises:
        ValueError: if -1 has Jacobi symbol -1 mod n (not a Blum modulus from `generate_keypair`): h would then
            have Jacobi symbol -1, and every ciphertext mod n would show the parity of its r.
    """
    modulus = gmpy2.mpz(n)
    if gmpy2.jacobi(modulus - 1, modulus) != 1:
        raise ValueError("fixed_base needs a modulus with Jacobi(-1, n) = +1, such as generate_keypair's Blum moduli")
    while True:
        x = gmpy2.mpz(secrets.randbelow(int(n) - 1) + 1)
        if gmpy2.gcd(x, modulus) == 1:
            break
    h = -x * x % modulus
    return int(gmpy2.powmod(h, modulus, modulus * modulus))


@dataclass(frozen=True)
class FixedBase:
    """A fixed base h_s for n and, unless `window` is 0, its table `rows[i][j] = h_s**(j * 2**(window i)) mod n**2`.

    j runs over [0, 2**window) and i over ceil(exponent_bits / window) rows, so `fixed_base_power` takes one entry
    per row. Without a table (window 0) every power is one `gmpy2.powmod` with the short exponent: no set-up cost,
    for a party that encrypts too few values to pay for a table. Public values only (n and h_s).
    """

    n: int
    h_s: int
    exponent_bits: int
    window: int
    rows: tuple[tuple[Any, ...], ...] = field(repr=False)
    n2: Any = field(repr=False)  # n**2 as an mpz, the modulus of every entry

    @property
    def nbytes(self) -> int:
        """Memory the table's entries hold, in bytes (about 2 * key_bits / 8 each)."""
        return sum((v.bit_length() + 7) // 8 for row in self.rows for v in row)


def fixed_base_table(n: int, h_s: int, exponent_bits: int | None = None, window: int = WINDOW_BITS) -> FixedBase:
    """`h_s` with its table for exponents of `exponent_bits` bits (`short_exponent_bits(n)` by default).

    ceil(exponent_bits / window) rows of 2**window entries; building it costs one multiplication mod n**2 per entry
    (14,000, about 0.1 s, at 2048 bits with the defaults), then every `fixed_base_power` costs one per row (56).
    `window=0` builds no table.

    Raises:
        ValueError: if `h_s` fails `check_fixed_base`, `window` is outside [0, 16] or `exponent_bits` < 1.
    """
    check_fixed_base(n, h_s)
    if exponent_bits is None:
        exponent_bits = short_exponent_bits(n)
    if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= 16 or exponent_bits < 1:
        raise ValueError(f"window must be in [0, 16] bits and exponent_bits positive, got {window}, {exponent_bits}")
    modulus = gmpy2.mpz(n)
    n2 = modulus * modulus
    rows = []
    base = gmpy2.mpz(h_s)  # h_s**(2**(window * i))
    for _ in range(-(-exponent_bits // window) if window else 0):
        row = [gmpy2.mpz(1), base]
        for _ in range(2, 1 << window):
            row.append(row[-1] * base % n2)
        rows.append(tuple(row))
        base = row[-1] * base % n2
    return FixedBase(int(n), int(h_s), exponent_bits, window, tuple(rows), n2)


def fixed_base_power(base: FixedBase, exponent: int) -> Any:
    """h_s**exponent mod n**2: one multiplication per row of the table (digits low to high), or one powmod.

    Raises:
        ValueError: if `exponent` is outside [0, 2**exponent_bits).
    """
    if not 0 <= exponent < 1 << base.exponent_bits:
        raise ValueError(f"exponent must be in [0, 2**{base.exponent_bits}) for this fixed base")
    if not base.rows:
        return gmpy2.powmod(gmpy2.mpz(base.h_s), exponent, base.n2)
    n2 = base.n2
    window = base.window
    mask = (1 << window) - 1
    e = int(exponent)
    rows = iter(base.rows)
    acc = next(rows)[e & mask]
    for row in rows:
        e >>= window
        acc = acc * row[e & mask] % n2
    return acc


def short_exponents(bits: int, count: int) -> list[int]:
    """`count` exponents r uniform in [0, 2**bits) from the OS CSPRNG."""
    return [secrets.randbits(bits) for _ in range(count)]


def fixed_base_obfuscators(base: FixedBase, exponents: Iterable[int]) -> list[Any]:
    """h_s**r mod n**2 for each r: the expensive half of a fixed-base encryption, from public values only."""
    return [fixed_base_power(base, r) for r in exponents]


def encrypt_fixed_base(base: FixedBase, plaintexts: Sequence[int]) -> list[int]:
    """[[m]] = (1 + m n) h_s**r mod n**2 for each m in [0, n), each with a fresh r of `base.exponent_bits` bits.

    The same ciphertexts with or without a table; `decrypt` reads them like `encrypt`'s.
    """
    exponents = short_exponents(base.exponent_bits, len(plaintexts))
    return finish_encryption(base.n, plaintexts, fixed_base_obfuscators(base, exponents))


_worker_tables: OrderedDict[tuple[int, int, int, int], FixedBase] = OrderedDict()


def _obfuscators_in_worker(n: int, h_s: int, exponent_bits: int, window: int, exponents: Sequence[int]) -> list[Any]:
    key = (int(n), int(h_s), exponent_bits, window)
    base = _worker_tables.get(key)
    if base is None:
        base = _worker_tables[key] = fixed_base_table(n, h_s, exponent_bits, window)
        while len(_worker_tables) > WORKER_TABLES:
            _worker_tables.popitem(last=False)
    _worker_tables.move_to_end(key)
    return fixed_base_obfuscators(base, exponents)


def fixed_base_task(
    n: int, h_s: int, exponent_bits: int, window: int = WINDOW_BITS
) -> tuple[Callable[..., list[Any]], ...]:
    """`(function, n, h_s, exponent_bits, window)` to compute h_s**r mod n**2 in another process.

    `function(n, h_s, exponent_bits, window, exponents)` builds the table once per process and fixed base (and
    keeps the last `WORKER_TABLES`), so a worker receives only public values, n and h_s, and the random exponents:
    never the secret key or a plaintext. Unlike `obfuscator_task`'s gmpy2 function it is lvfl's, so a worker
    imports `lvfl.crypto` (torch included) once.
    """
    return _obfuscators_in_worker, int(n), int(h_s), exponent_bits, window


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
