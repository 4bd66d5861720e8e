"""Hashing byte strings to Curve25519 points: RFC 9380's `curve25519_XMD:SHA-512_ELL2_RO_` suite.

`hash_to_curve(msg, dst)` is the RFC's random-oracle construction: `expand_message_xmd` with SHA-512 gives two
field elements, each is mapped by Elligator 2 (`map_to_curve_elligator2`, Z = 2), the two points are added and the
cofactor 8 is cleared. It matches the RFC's test vectors (Appendix J.4.1; `tests/test_psi.py`).

The private set intersection (`lvfl.crypto.ecdh_blinding`) needs only the u-coordinate of the sum *before* the
cofactor is cleared (`hash_to_u`): it is fed straight into X25519, whose clamped scalars are multiples of 8, so
X25519(k, u(R)) = (k/8)·(8R) is the same group element as the RFC's output raised to k/8, and the three doublings
are saved. `hash_to_u` also takes the RFC's straight-line map (Appendix G.2.1: one exponentiation per map, which
yields the square root and the branch together, in place of a Legendre symbol, an inversion and a root) and adds the
two points with one inversion: the same u-coordinate as the affine reference (`map_to_curve_elligator2`, `_add`) in
about four fifths of the time (`benchmarks/perf/psi.py` prints both). The PSI hashes every ID of every party: about half
of its work.

Field arithmetic on Python integers with gmpy2 (a dependency already). Not constant-time: fine for the simulated,
semi-honest parties lvfl runs (no party observes another's timing); a deployment hashing secret IDs on a shared
host should use a constant-time implementation.
"""

from __future__ import annotations

import hashlib

import gmpy2

__all__ = ["P", "expand_message_xmd", "hash_to_curve", "hash_to_field", "hash_to_u", "map_to_curve_elligator2"]

P = 2**255 - 19  #: the field prime
J = 486662  #: Curve25519's Montgomery coefficient A (K = 1): v^2 = u^3 + J u^2 + u
Z = 2  #: Elligator 2's non-square (RFC 9380, Sec. 8.5)
_SQRT_M1 = int(gmpy2.powmod(2, (P - 1) // 4, P))  #: a square root of -1
_C1 = (P + 3) // 8  #: exponent of the square-root candidate (p = 5 mod 8)
_L = 48  #: bytes per field element: ceil((ceil(log2(p)) + 128) / 8)
_Z_PAD = hashlib.sha512(bytes(128))  #: SHA-512 after expand_message_xmd's Z_pad (128 zero bytes)
# the straight-line map's constants (RFC 9380 Appendix G.2.1), as gmpy2 integers: their arithmetic is faster
_PM, _JM = gmpy2.mpz(P), gmpy2.mpz(J)
_C2 = gmpy2.powmod(2, _C1, P)  #: 2^c1
_C3 = gmpy2.mpz(_SQRT_M1)  #: sqrt(-1)
_C4 = gmpy2.mpz((P - 5) // 8)


def expand_message_xmd(msg: bytes, dst: bytes, length: int) -> bytes:
    """RFC 9380 Sec. 5.3.1 with SHA-512: `length` uniform bytes from `msg` under domain separation tag `dst`."""
    if len(dst) > 255:
        raise ValueError(f"the domain separation tag must be at most 255 bytes, got {len(dst)}")
    ell = -(-length // 64)
    if ell > 255 or length > 65535:
        raise ValueError(f"expand_message_xmd cannot give {length} bytes")
    dst_prime = dst + bytes([len(dst)])
    b0_hash = _Z_PAD.copy()  # Z_pad is one whole SHA-512 block: its compression is done once, at import
    b0_hash.update(msg + length.to_bytes(2, "big") + b"\x00" + dst_prime)
    b0 = b0_hash.digest()
    b = hashlib.sha512(b0 + b"\x01" + dst_prime).digest()
    out = [b]
    for i in range(2, ell + 1):
        xor = (int.from_bytes(b0, "big") ^ int.from_bytes(b, "big")).to_bytes(64, "big")
        b = hashlib.sha512(xor + bytes([i]) + dst_prime).digest()
        out.append(b)
    return b"".join(out)[:length]


def hash_to_field(msg: bytes, dst: bytes, count: int = 2) -> list[int]:
    """RFC 9380 Sec. 5.2: `count` elements of GF(p), each from 48 bytes of `expand_message_xmd`."""
    uniform = expand_message_xmd(msg, dst, count * _L)
    return [int.from_bytes(uniform[i * _L : (i + 1) * _L], "big") % P for i in range(count)]


def _sqrt(a: int) -> int:
    """A square root of the square `a` mod p (p = 5 mod 8: one exponentiation, then maybe a factor sqrt(-1))."""
    root = int(gmpy2.powmod(a, _C1, P))
    if root * root % P != a:
        root = root * _SQRT_M1 % P
    if root * root % P != a:
        raise ArithmeticError("not a square: the field arithmetic is broken")
    return root


def map_to_curve_elligator2(u: int) -> tuple[int, int]:
    """RFC 9380 Sec. 6.7.1 (K = 1): the point (x, y) on Curve25519 that field element `u` maps to."""
    x1 = (-J * int(gmpy2.invert(1 + Z * u * u, P))) % P if (1 + Z * u * u) % P else 0
    if x1 == 0:
        x1 = P - J
    gx1 = (x1 * x1 * x1 + J * x1 * x1 + x1) % P
    if gmpy2.legendre(gx1, P) >= 0:  # g(x1) a square (or 0): take x1 and the root with sgn0 = 1
        x, sign = x1, 1
        y = _sqrt(gx1)
    else:  # else g(x2) is the square: x2 = -x1 - J, the root with sgn0 = 0
        x, sign = (-x1 - J) % P, 0
        y = _sqrt((x * x * x + J * x * x + x) % P)
    if y % 2 != sign:
        y = P - y
    return x, y


def _add(p1: tuple[int, int] | None, p2: tuple[int, int] | None) -> tuple[int, int] | None:
    """Affine addition on v^2 = u^3 + J u^2 + u (None is the point at infinity)."""
    if p1 is None:
        return p2
    if p2 is None:
        return p1
    (x1, y1), (x2, y2) = p1, p2
    if x1 == x2:
        if (y1 + y2) % P == 0:
            return None
        slope = (3 * x1 * x1 + 2 * J * x1 + 1) * int(gmpy2.invert(2 * y1, P)) % P
    else:
        slope = (y2 - y1) * int(gmpy2.invert((x2 - x1) % P, P)) % P
    x3 = (slope * slope - J - x1 - x2) % P
    return x3, (slope * (x1 - x3) - y1) % P


def _sum_of_maps(msg: bytes, dst: bytes) -> tuple[int, int]:
    u0, u1 = hash_to_field(msg, dst)
    point = _add(map_to_curve_elligator2(u0), map_to_curve_elligator2(u1))
    if point is None:  # probability ~2^-252
        raise ArithmeticError(f"hash_to_curve({msg!r}) hit the point at infinity")
    return point


def hash_to_curve(msg: bytes, dst: bytes) -> tuple[int, int]:
    """RFC 9380's `curve25519_XMD:SHA-512_ELL2_RO_`: the point (x, y), cofactor cleared."""
    point: tuple[int, int] | None = _sum_of_maps(msg, dst)
    for _ in range(3):  # h_eff = 8
        point = _add(point, point)
    if point is None:
        raise ArithmeticError(f"hash_to_curve({msg!r}) hit a point of small order")
    return point


def hash_to_u(msg: bytes, dst: bytes) -> bytes:
    """The 32-byte little-endian u-coordinate (X25519's encoding) of the RO point before the cofactor is cleared.

    For X25519 only: its clamped scalars clear the cofactor (see the module docstring).
    """
    return _sum_u(*hash_to_field(msg, dst), msg).to_bytes(32, "little")


def _map_projective(u: gmpy2.mpz) -> tuple[gmpy2.mpz, gmpy2.mpz, gmpy2.mpz]:
    """RFC 9380 Appendix G.2.1: Elligator 2 for Curve25519 as (xn, xd, y), the point (xn / xd, y).

    The same point as `map_to_curve_elligator2`: one exponentiation gives the candidate root of g(x1) (with the
    inversion of xd folded in), and from it the root of g(x2) = 2u^2 g(x1).
    """
    tv1 = 2 * u * u % _PM
    xd = tv1 + 1  # never 0 mod p: -1 is a square and 2u^2 is not (or is 0)
    x1n = -_JM
    tv2 = xd * xd % _PM
    gxd = tv2 * xd % _PM  # g(x1) = gx1 / gxd
    gx1 = ((x1n + _JM * xd) * x1n + tv2) * x1n % _PM
    tv3 = gxd * gxd % _PM
    tv2 = tv3 * tv3 % _PM
    tv3 = tv3 * gxd * gx1 % _PM  # gx1 gxd^3
    y11 = gmpy2.powmod(tv2 * tv3 % _PM, _C4, _PM) * tv3 % _PM  # gx1 gxd^3 (gx1 gxd^7)^((p - 5) / 8)
    if y11 * y11 * gxd % _PM == gx1:  # g(x1) is a square: x = x1, y its root with sgn0 = 1
        xn, y, sign = x1n % _PM, y11, 1
    elif (y12 := y11 * _C3 % _PM) * y12 * gxd % _PM == gx1:
        xn, y, sign = x1n % _PM, y12, 1
    else:  # g(x2) is the square: x = x2 = 2u^2 x1, y its root with sgn0 = 0
        y21 = y11 * u * _C2 % _PM
        y = y21 if y21 * y21 * gxd % _PM == gx1 * tv1 % _PM else y21 * _C3 % _PM
        xn, sign = x1n * tv1 % _PM, 0
    if y % 2 != sign:
        y = _PM - y
    return xn, xd, y


def _sum_u(u0: int, u1: int, msg: bytes = b"") -> int:
    """The u-coordinate of map(u0) + map(u1) (the RO point before the cofactor is cleared), with one inversion.

    x3 = lambda^2 - J - x0 - x1 with lambda = (y1 - y0) / (x1 - x0), all over the common denominator
    D^2 xd0 xd1 (D = xn1 xd0 - xn0 xd1). Equal u-coordinates (D = 0: the same point or opposite points, about
    2^-253 for hashed inputs) take the affine reference, which handles the doubling and the point at infinity.
    """
    xn0, xd0, y0 = _map_projective(gmpy2.mpz(u0))
    xn1, xd1, y1 = _map_projective(gmpy2.mpz(u1))
    d = (xn1 * xd0 - xn0 * xd1) % _PM
    if not d:
        point = _add(map_to_curve_elligator2(u0), map_to_curve_elligator2(u1))
        if point is None:
            raise ArithmeticError(f"hash_to_curve({msg!r}) hit the point at infinity")
        return point[0]
    xd01 = xd0 * xd1 % _PM
    n = (y1 - y0) * xd01 % _PM
    d2 = d * d % _PM
    num = (n * n * xd01 - (_JM * xd01 + xn0 * xd1 + xn1 * xd0) * d2) % _PM
    return int(num * gmpy2.invert(d2 * xd01 % _PM, _PM) % _PM)
