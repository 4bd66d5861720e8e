"""Paillier encryptions per second per core at 2048 bits: lvfl's fixed-base encryption against the textbook one.

.venv/bin/python -m benchmarks.perf.paillier_speed [--repeats 5] [--key-size 2048]

Three encryptions of the same random plaintexts (below n / 3, so that phe accepts them as ints) under one key, in
this one process, the repetitions interleaved (new, old, phe, new, old, phe, ...) so that a noisy machine hurts
them alike:

- (a) lvfl now: `lvfl.crypto.paillier.encrypt_fixed_base`, (1 + m n) h_s**r mod n**2 with a 448-bit r and the
  table of h_s's powers (8-bit windows) that `lvfl.privacy.Paillier` builds once per passive party (its build time
  and size are printed apart);
- (b) lvfl before: `lvfl.crypto.paillier.encrypt`, (1 + m n) rho**n mod n**2 with a full-length rho;
- (c) phe: `PaillierPublicKey.encrypt(int)` (encoding included), with gmpy2.

A figure is encryptions per second of one process's CPU time (`time.process_time`; gmpy2 runs on one thread), so
it is a per-core rate; the wall-clock rate is printed beside it. Medians over the repetitions; every ciphertext of
the last repetition is decrypted and checked.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
from collections.abc import Callable

from phe import paillier as phe_paillier

from benchmarks.common import machine
from lvfl.crypto import paillier

GOAL = 1500  # encryptions per second per core at 2048 bits


def timed(encrypt: Callable[[list[int]], list[int]], plaintexts: list[int]) -> tuple[float, float, list[int]]:
    """(per second of CPU time, per second of wall time, ciphertexts) for one batch."""
    cpu, wall = time.process_time(), time.perf_counter()
    ciphertexts = encrypt(plaintexts)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return len(plaintexts) / cpu, len(plaintexts) / wall, ciphertexts


LABELS = {
    "new": "(a) lvfl fixed base, 448-bit r, table",
    "old": "(b) lvfl textbook, rho**n",
    "phe": "(c) phe PublicKey.encrypt(int)",
}


def measure(repeats: int = 5, key_size: int = 2048) -> dict:
    """The three encryptions' medians, interleaved: {"cpu": {name: /s/core}, "wall": {...}, "key": ..., "base": ...}."""
    n, secret = paillier.generate_keypair(key_size)
    public = phe_paillier.PaillierPublicKey(n)
    start = time.process_time()
    base = paillier.fixed_base_table(n, paillier.fixed_base(n))
    build = time.process_time() - start

    batches = {"new": 400, "old": 24, "phe": 24}  # about 0.2 s each
    cells: dict[str, Callable[[list[int]], list[int]]] = {
        "new": lambda ms: paillier.encrypt_fixed_base(base, ms),
        "old": lambda ms: paillier.encrypt(n, ms),
        "phe": lambda ms: [public.encrypt(m).ciphertext(be_secure=False) for m in ms],
    }
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in cells}
    for _ in range(repeats):
        for name, encrypt in cells.items():
            plaintexts = [secrets.randbelow(n // 3) for _ in range(batches[name])]
            cpu, wall, ciphertexts = timed(encrypt, plaintexts)
            rates[name].append((cpu, wall))
            if [paillier.decrypt(secret, c) for c in ciphertexts] != plaintexts:
                raise SystemExit(f"{name}: a ciphertext does not decrypt to its plaintext")
    return {
        "cpu": {name: statistics.median(r[0] for r in values) for name, values in rates.items()},
        "wall": {name: statistics.median(r[1] for r in values) for name, values in rates.items()},
        "n_bits": n.bit_length(),
        "base": base,
        "build": build,
        "repeats": repeats,
    }


def report(measured: dict) -> None:
    """Print the table and the goal's verdict."""
    cpu, wall, base = measured["cpu"], measured["wall"], measured["base"]
    print(
        f"key: {measured['n_bits']} bits; short exponent: {base.exponent_bits} bits; table: {len(base.rows)} rows x "
        f"{len(base.rows[0])} (window {base.window} bits), {base.nbytes / 1e6:.1f} MB, built in "
        f"{measured['build']:.2f} s of CPU"
    )
    print(f"{measured['repeats']} interleaved repetitions, medians; /s/core from process CPU time, /s wall beside it\n")
    print(f"| {'encryption':<38} | {'/s/core':>8} | {'/s wall':>8} | {'vs (b)':>7} | {'vs (c)':>7} |")
    print(f"|{'-' * 40}|{'-' * 10}|{'-' * 10}|{'-' * 9}|{'-' * 9}|")
    for name, label in LABELS.items():
        print(
            f"| {label:<38} | {cpu[name]:>8,.0f} | {wall[name]:>8,.0f} | {cpu[name] / cpu['old']:>6.1f}x "
            f"| {cpu[name] / cpu['phe']:>6.1f}x |"
        )
    verdict = "met" if cpu["new"] >= GOAL else "NOT met"
    print(f"\ngoal >= {GOAL:,}/s/core at 2048 bits: {verdict} ({cpu['new']:,.0f}/s/core)")


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions of each encryption")
    parser.add_argument("--key-size", type=int, default=2048, help="bits of n")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    report(measure(args.repeats, args.key_size))


if __name__ == "__main__":
    main()
