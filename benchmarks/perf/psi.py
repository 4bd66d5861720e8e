"""Private set intersection throughput: N x N business IDs with 50% overlap, both parties in this process.

    .venv/bin/python -m benchmarks.perf.psi            # 1,000,000 x 1,000,000 (the goal: 50 s on 2 cores), KKRT16's PSI
    .venv/bin/python -m benchmarks.perf.psi --ids 100000   # a quicker look
    .venv/bin/python -m benchmarks.perf.psi --ids 10000000 --skip-unit-costs   # 10 M x 10 M: time and peak memory
    .venv/bin/python -m benchmarks.perf.psi --protocol ecdh   # ECDH-PSI, on every core, and its unit costs

Runs `lvfl.alignment.private_intersection` (by default KKRT16's OT-based PSI, `lvfl.alignment.kkrt`, in this
process; with `--protocol ecdh` ECDH over Curve25519, RFC 9380 hash to curve, X25519 via OpenSSL, on all CPU cores,
`--workers`) with every message on a `Wire`, and prints the wall time, the bytes on the wire
and IDs per second per core, (|X| + |Y|) / (seconds x cores), the peak resident memory of this process (both
parties' lists, messages and matching) and of the largest worker process (`WorkerPeaks`), beside published
figures: SecretFlow's
ECDH-PSI (~7,400 IDs/s per core, its documentation's benchmark) and FATE 2.0 (100 M x 100 M in 51 min on 2 x 16
cores, i.e. 200 M IDs / (3,060 s x 32 cores) = 2,042 IDs/s per core). Their hardware differs from this machine's.
"""

from __future__ import annotations

import argparse
import os
import resource
import threading
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from lvfl.crypto.hash_to_curve import _sum_of_maps, hash_to_u
from lvfl.crypto.psi_batches import DST

# What imports PyTorch is imported in `main`: a spawned worker runs this script's top level again (as
# `__mp_main__`), and lvfl's workers are meant to be small (`lvfl.crypto.psi_batches`), as they are under `lvfl`.

PUBLISHED = {"SecretFlow ECDH-PSI": 7400.0, "FATE 2.0 (100M x 100M, 51 min, 32 cores)": 200e6 / (51 * 60 * 32)}


def unit_costs(n: int = 5000) -> tuple[float, float, float]:
    """Microseconds per ID, in this process: the hash to curve as the PSI runs it, the same u-coordinate by the
    affine reference (`_sum_of_maps`: a Legendre symbol, a root and an inversion per map), one X25519 multiplication.
    """
    ids = [f"cust-{i:09d}".encode() for i in range(n)]
    start = time.perf_counter()
    points = [hash_to_u(x, DST) for x in ids]
    hashed = time.perf_counter()
    reference = [_sum_of_maps(x, DST)[0].to_bytes(32, "little") for x in ids]
    referenced = time.perf_counter()
    assert reference == points, "the hash and its reference disagree"
    key = X25519PrivateKey.generate()
    for p in points:
        key.exchange(X25519PublicKey.from_public_bytes(p))
    done = time.perf_counter()
    return (hashed - start) / n * 1e6, (referenced - hashed) / n * 1e6, (done - referenced) / n * 1e6


class WorkerPeaks(threading.Thread):
    """The largest resident high-water mark (`VmHWM`) among this process's children, read from /proc while it runs.

    Why not `getrusage(RUSAGE_CHILDREN)`: a spawned worker starts as a fork of this process, and Linux carries the
    fork's resident set into the started program's `ru_maxrss`, so that figure is this process's size when the pool
    started, not the worker's. `VmHWM` belongs to the worker's own program. Read every `period` seconds: growth in a
    worker's last `period` before it ends would be missed (it is a high-water mark, so nothing earlier is).
    """

    def __init__(self, period: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.period, self.peak_kb, self._done = period, 0, threading.Event()

    def run(self) -> None:
        me = str(os.getpid())
        while not self._done.wait(self.period):
            for status in Path("/proc").glob("[0-9]*/status"):
                try:
                    fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
                except OSError:  # the process ended while being read
                    continue
                if fields.get("PPid", "").strip() == me and "VmHWM" in fields:
                    self.peak_kb = max(self.peak_kb, int(fields["VmHWM"].split()[0]))

    def stop(self) -> float:
        """Stop reading; the largest `VmHWM` seen, in MB."""
        self._done.set()
        self.join()
        return self.peak_kb / 1024


def main() -> None:
    from lvfl.alignment import message_bytes, private_intersection
    from lvfl.wire import Wire

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=1_000_000, help="IDs per party (default 1,000,000)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="processes (default: every core)")
    parser.add_argument("--skip-unit-costs", action="store_true", help="leave out the per-operation timing")
    parser.add_argument("--protocol", choices=["kkrt", "ecdh"], default="kkrt", help="the PSI (default kkrt, lvfl's)")
    args = parser.parse_args()
    n, half = args.ids, args.ids // 2
    bank = [f"cust-{i:09d}" for i in range(n)]  # business IDs as strings; 50% shared with the retailer
    retailer = [f"cust-{i:09d}" for i in range(half, half + n)][::-1]
    wire = Wire()
    workers = WorkerPeaks()
    workers.start()
    start = time.perf_counter()
    alignment = private_intersection(
        {"bank": bank, "retailer": retailer}, active="bank", wire=wire, workers=args.workers, protocol=args.protocol
    )
    seconds = time.perf_counter() - start
    worker = workers.stop()
    assert len(alignment.ids) == n - half, "the intersection is wrong"
    expected = message_bytes({"bank": n, "retailer": n}, "bank", n - half, args.protocol)
    assert wire.bytes_by_tag() == {f"psi/{k}": v for k, v in expected.items()}, "the ledger is wrong"
    cores = args.workers if args.protocol == "ecdh" else 1  # KKRT runs in the parties' process alone
    rate = 2 * n / (seconds * cores)
    print(f"{n:,} x {n:,} IDs, {n - half:,} shared, {args.protocol}, {cores} core(s) used of {os.cpu_count()}")
    goal = f" ({'within' if seconds < 50 else 'over'} the goal of 50 s for 1 M x 1 M)" if n == 1_000_000 else ""
    print(f"wall time {seconds:.1f} s{goal}")
    print(f"on the wire {wire.total_bytes() / 1e6:.1f} MB in {wire.total_messages()} messages: {wire.bytes_by_tag()}")
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.protocol == "ecdh":
        print(f"peak resident memory: {own:,.0f} MB in this process (both parties), {worker:,.0f} MB in the largest")
        print("of the worker processes (each a fresh Python with lvfl's imports; VmHWM read every 0.5 s)")
    else:
        print(f"peak resident memory: {own:,.0f} MB in this process (both parties; KKRT runs no workers)")
    print("| implementation | IDs/s per core |")
    print("|---|---|")
    print(f"| lvfl {args.protocol.upper()} (this run) | {rate:,.0f} |")
    for name, value in PUBLISHED.items():
        print(f"| {name} (published) | {value:,.0f} |")
    if args.skip_unit_costs or args.protocol != "ecdh":
        return
    hash_us, reference_us, mult_us = unit_costs()
    print(
        f"per ID, one process: hash to curve {hash_us:.1f} us (the affine reference {reference_us:.1f} us, ratio "
        f"{hash_us / reference_us:.2f}), one X25519 multiplication {mult_us:.1f} us"
    )


if __name__ == "__main__":
    main()
