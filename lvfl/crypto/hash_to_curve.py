"""Hashing byte strings to Curve25519 points: RFC 9380's `curve25519_XMD:SHA-512_ELL2_RO_` suite.

`hash_to_curve(msg, dst)` is the RFC's random-oracle construction: `expand_message_xmd` with SHA-512 gives two
field elements, each is mapped by Elligator 2 (`map_to_curve_elligator2`, Z = 2), the two points are added and the
cofactor 8 is cleared. It matches the RFC's test vectors (Appendix J.4.1; `tests/test_psi.py`).

The private set intersection (`lvfl.crypto.psi`) needs only the u-coordinate of the sum *before* the cofactor is
cleared (`hash_to_u`): it is fed straight into X25519, whose clamped scalars are multiples of 8, so X25519(k, u(R))
= (k/8)·(8R) is the same group element as the RFC's output raised to k/8, and the three doublings are saved.

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


def expand_message_xmd(msg: bytes, dst: bytes, length: int) -> bytes:
    """RFC 9380 Sec. 5.3.1 with SHA-512: `length` uniform bytes from `msg` under domain separation tag `dst`."""
    if len(dst) > 255:
        raise ValueError(f"the domain separation tag must be at most 255 bytes, got {len(dst)}")
    ell = -(-length // 64)
    if ell > 255 or length > 65535:
        raise ValueError(f"expand_message_xmd cannot give {length} bytes")
    dst_prime = dst + bytes([len(dst)])
    b0 = hashlib.sha512(bytes(128) + msg + length.to_bytes(2, "big") + b"\x00" + dst_prime).digest()
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
    return _sum_of_maps(msg, dst)[0].to_bytes(32, "little")
