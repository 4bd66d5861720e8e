"""Table 4 of the student-model oblivious inference paper, measured: oblivious inference vs naive OT lookups.

.venv/bin/python -m benchmarks.perf.ot [--sizes 16 64 256] [--ids 4096] [--dim 4] [--queries 128] [--naive-repeats 15]

Setting: the passive party holds a float32 result row of `--dim` values for every one of `--ids` sample IDs, in
M = ids / N buckets of N entries. Three ways for the active party to fetch the row of one ID, all built on the same
1-out-of-2 OT (`lvfl.crypto.ot`, simplest OT over secp256k1) and all metered on an `lvfl.wire.Wire`:

- ``(MN over 1)-OT``: one 1-out-of-MN OT over every entry per query (hides the whole ID; log2 MN OTs + MN
  ciphertexts per query);
- ``(N over 1)-OT``: one 1-out-of-N OT over the ID's bucket per query (reveals the bucket; log2 N OTs + N
  ciphertexts per query);
- ``oblivious``: `lvfl.inference.oblivious`: N * log2 N OTs and M * N**2 * log2 N layered AES-GCM encryptions once
  per preparation, then one round trip of 12 + N * l bytes per query; a preparation serves at most N queries (one
  per key set), so the online median is over queries spread across as many preparations as needed;
- ``oblivious, copy encrypted per query``: the same with `precompute=False`: the passive party encrypts the
  requested bucket copy (N * log2 N encryptions) when asked instead of all copies in the preparation; same messages.

Online time is the wall time of a whole query with both parties in this process (no network): request, answer,
decryption for oblivious; the full OT for the naive rows. It is the median over `--queries` (oblivious) or
`--naive-repeats` (naive) queries of random IDs. Preparation time is the median over the preparations run.
The paper's cost formulas (in units of OT operations/encryptions and of l-byte ciphertexts) are printed beside.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import statistics
import time

import torch

from benchmarks.perf.naive_ot import ot_1_of_n
from lvfl.crypto.ot import TAG_BYTES
from lvfl.inference.oblivious import ObliviousClient, ObliviousTable, prepare, query
from lvfl.privacy.oblivious_transfer import batch_ot, ot_1_of_2
from lvfl.wire import Wire


def machine() -> str:
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}"
    )


def time_one_of_two(repeats: int) -> tuple[float, float]:
    """Median ms of one stand-alone 1-out-of-2 OT (fresh sender) and ms per OT in a batch of 1024."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ot_1_of_2(b"a" * 16, b"b" * 16, 1, wire=Wire())
        times.append(time.perf_counter() - start)
    pairs = [(b"a" * 16, b"b" * 16)] * 1024
    start = time.perf_counter()
    batch_ot(pairs, [i & 1 for i in range(1024)], wire=Wire())
    return statistics.median(times) * 1e3, (time.perf_counter() - start) / 1024 * 1e3


def bench_oblivious(
    n: int, m: int, rows: torch.Tensor, queries: int, rng: random.Random, precompute: bool = True
) -> dict:
    table = ObliviousTable({x: rows[x] for x in range(n * m)}, n, precompute=precompute)
    client = ObliviousClient(table.layout)
    prep_wire, online_wire = Wire(), Wire()
    prep_times, online_times = [], []
    done = 0
    while done < queries:
        start = time.perf_counter()
        prepare(table, client, wire=prep_wire)
        prep_times.append(time.perf_counter() - start)
        # one query per key set: the offsets of a preparation are distinct, the buckets random
        for offset in rng.sample(range(n), min(n, queries - done)):
            x = rng.randrange(m) * n + offset
            start = time.perf_counter()
            got = query(table, client, x, wire=online_wire)
            online_times.append(time.perf_counter() - start)
            if not torch.equal(got, rows[x]):
                raise RuntimeError(f"oblivious lookup returned a wrong row for ID {x}")
            done += 1
    l = table.layout.entry_bytes  # noqa: E741 - the paper's name
    return {
        "l": l,
        "prep_s": statistics.median(prep_times),
        "preparations": len(prep_times),
        "prep_bytes": prep_wire.total_bytes() // len(prep_times),
        "prep_messages": prep_wire.total_messages() // len(prep_times),
        "online_ms": statistics.median(online_times) * 1e3,
        "online_bytes": online_wire.total_bytes() // done,
        "online_messages": online_wire.total_messages() / done,
    }


def bench_naive(n_messages: int, plaintexts: list[bytes], repeats: int, rng: random.Random, sub: bool, n: int) -> dict:
    """1-out-of-n_messages OT per query, over all entries (sub=False) or over the ID's bucket of n (sub=True)."""
    wire = Wire()
    times = []
    for _ in range(repeats):
        x = rng.randrange(len(plaintexts))
        messages, choice = (plaintexts[x - x % n : x - x % n + n], x % n) if sub else (plaintexts, x)
        start = time.perf_counter()
        got = ot_1_of_n(messages, choice, wire=wire)
        times.append(time.perf_counter() - start)
        if got != plaintexts[x]:
            raise RuntimeError("naive OT returned a wrong entry")
    assert len(messages) == n_messages
    return {
        "online_ms": statistics.median(times) * 1e3,
        "online_bytes": wire.total_bytes() // repeats,
        "online_messages": wire.total_messages() / repeats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--ids", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=4)
    parser.add_argument("--queries", type=int, default=128)
    parser.add_argument("--naive-repeats", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = torch.randn(args.ids, args.dim, generator=torch.Generator().manual_seed(args.seed))

    single_ms, batched_ms = time_one_of_two(200)
    print(f"# OT benchmark ({machine()})\n")
    print(f"1-out-of-2 OT (simplest OT, secp256k1, 16-byte messages): {single_ms:.3f} ms stand-alone (median of 200),")
    print(f"{batched_ms:.3f} ms per OT in a batch of 1024 sharing one sender point.\n")

    lines = [
        "| N | M | method | prep time (s) | prep bytes | online median (ms) | online bytes/query | msgs/query "
        "| paper online comm (bytes) | paper prep comm (bytes) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in args.sizes:
        m = max(1, args.ids // n)
        obl = bench_oblivious(n, m, rows, args.queries, rng)
        lazy = bench_oblivious(n, m, rows, args.queries, rng, precompute=False)
        l, b, mn = obl["l"], int(math.log2(n)), n * m  # noqa: E741
        table = ObliviousTable({x: rows[x] for x in range(mn)}, n, precompute=False)
        plaintexts = [bytes(table._plain[x // n][x % n]) for x in range(mn)]  # the padded entries, same for all
        big = bench_naive(mn, plaintexts, args.naive_repeats, rng, sub=False, n=n)
        small = bench_naive(n, plaintexts, args.naive_repeats, rng, sub=True, n=n)
        log_mn = math.ceil(math.log2(mn))
        l_naive = len(plaintexts[0]) + TAG_BYTES  # one GCM layer per message in the naive OTs
        for name, row, paper_online in (
            (f"(MN over 1)-OT (l={l_naive})", big, 2 * l_naive * log_mn + l_naive * mn),
            (f"(N over 1)-OT (l={l_naive})", small, 2 * l_naive * b + l_naive * n),
        ):
            lines.append(
                f"| {n} | {m} | {name} | - | - | {row['online_ms']:.2f} | {row['online_bytes']:,} "
                f"| {row['online_messages']:.0f} | {paper_online:,} | - |"
            )
        lines.append(
            f"| {n} | {m} | oblivious (l={l}) | {obl['prep_s']:.2f} ({obl['preparations']} runs) "
            f"| {obl['prep_bytes']:,} | {obl['online_ms']:.3f} | {obl['online_bytes']:,} "
            f"| {obl['online_messages']:.0f} | {n * l:,} | {l * n * b:,} |"
        )
        lines.append(
            f"| {n} | {m} | oblivious, copy encrypted per query | {lazy['prep_s']:.3f} ({lazy['preparations']} runs) "
            f"| {lazy['prep_bytes']:,} | {lazy['online_ms']:.3f} | {lazy['online_bytes']:,} "
            f"| {lazy['online_messages']:.0f} | {n * l:,} | {l * n * b:,} |"
        )
        print(f"done N={n}", flush=True)
    print()
    print("\n".join(lines))
    print(
        "\nPaper (Table 4), per query: (MN over 1)-OT 2l*log MN + l*MN bytes, 2 rounds; (N over 1)-OT 2l*log N + l*N, "
        "2 rounds (paper columns use each method's own ciphertext size l); oblivious N*l, 1 round, after a "
        "preparation of N^2*M*log N encryptions and l*N*log N bytes. "
        "Measured online bytes include the 12-byte request and, for the naive rows, the 33-byte curve points; "
        "measured preparation bytes are 33 + N*log N*(33 + 2*32): one point per OT plus two 32-byte key ciphertexts."
    )


if __name__ == "__main__":
    main()
