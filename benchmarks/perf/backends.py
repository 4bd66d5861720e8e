"""Aggregation backends side by side: protect + combine time and wire bytes for one batch of embeddings.

.venv/bin/python -m benchmarks.perf.backends [--repeats 5] [--rows 128] [--dim 128] [--passive 3] [--workers 2]

One batch is a `rows x dim` float32 embedding at each of `passive` passive parties plus the active party (default
128 x 128 and 1 + 3 = 4 parties, the setting of the HE issue). Per backend and repetition: every passive party
protects its embedding and sends the share to the active party over a `Wire` (as the protocols do, so the wire
metering - for CKKS, serializing every ciphertext - is counted in "protect"), then the active party combines
(HE: masked aggregate to the coordinator, decryption, unmasking). Repetitions are interleaved over the backends,
so slow phases of a shared machine hit all of them; the table gives medians.

Rows:

- `Plain`, `DHMasking`: the reference and the pairwise-masking backend.
- `Paillier naive`: `Paillier(pack=False, workers=1)`, one value per ciphertext, serial; too slow for a whole
  batch, so it runs on the first `--naive-values` values of each embedding and its batch time is extrapolated
  linearly (marked *), which is exact for a per-value cost.
- `phe EncryptedNumber`: the library's own API, value by value (encrypt, add, decrypt): the baseline users write.
- `Paillier packed + parallel`: the default `Paillier()` (values packed per plaintext, a process pool of
  `--workers`).
- `CKKS`: the default `CKKS()` (N = 8192, primes (60, 40, 60), 4,096 values per ciphertext; `--ckks-moduli`
  for another chain), and `CKKS one ciphertext per row`
  (`packing="row"`), the layout that wastes the slots.

The ratios printed under the table are the issue's targets: packed + parallel Paillier vs naive serial per value
(>= 50x), CKKS protect + combine for the batch (<= 60 ms), CKKS one-ciphertext-per-row vs packed (time and bytes),
DHMasking's wire bytes vs Plain's (1.0x).

Then the CKKS coordinator's distinguishing advantage per batch at the defaults (the mask hides statistically):
`--distinguisher-trials` combines of the batch whose passive values sum to 0, as many summing to 1, and two
coordinators guessing which from what they decrypt (empirical mean above 0.5; any value above the mask bound, the
optimal test for a uniform mask); printed beside the stated bound `CKKS.advantage_bound` (sums 0 vs 1 and the worst
case over sums in range).

Last, Paillier encryptions per second per core at 2048 bits: lvfl's fixed-base encryption, its textbook one and
`phe`'s, interleaved in the same run (`benchmarks/perf/paillier_speed.py`; goal >= 1,500).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from benchmarks.common import machine, quiet
from benchmarks.perf.paillier_speed import measure as measure_paillier
from benchmarks.perf.paillier_speed import report as report_paillier
from lvfl.parties import PartySpec
from lvfl.privacy import CKKS, AggregationBackend, DHMasking, Paillier, Plain
from lvfl.wire import Wire


class Setup:
    """One backend, set up once for 1 active + K passive parties, and its timings."""

    def __init__(self, label: str, backend: AggregationBackend, passive: int, values: int | None = None) -> None:
        self.label, self.backend, self.values = label, backend, values
        self.parties = [PartySpec("a", "active", (1,))] + [
            PartySpec(f"p{i}", "passive", (1,), i) for i in range(1, passive + 1)
        ]
        self.wire = Wire()
        backend.setup(self.parties, "a", self.wire)
        self.key_bytes = self.wire.total_bytes()
        self.protect_s: list[float] = []
        self.combine_s: list[float] = []
        self.batch_bytes = 0
        self.step = 0

    def run(self, embeddings: dict[str, torch.Tensor], active: torch.Tensor) -> torch.Tensor:
        """Protect + send every passive embedding, then combine; records the times and the batch's bytes."""
        if self.values is not None:  # the naive rows: a prefix of every embedding
            embeddings = {k: v.flatten()[: self.values] for k, v in embeddings.items()}
            active = active.flatten()[: self.values]
        before = self.wire.total_bytes()
        t0 = time.perf_counter()
        shares = {
            k: self.wire.send(k, "a", self.backend.protect(k, e, self.step), "embeddings")
            for k, e in embeddings.items()
        }
        t1 = time.perf_counter()
        out = self.backend.combine(active, shares)
        t2 = time.perf_counter()
        self.step += 1
        self.protect_s.append(t1 - t0)
        self.combine_s.append(t2 - t1)
        self.batch_bytes = self.wire.total_bytes() - before
        return out


def phe_naive(embeddings: dict[str, torch.Tensor], values: int, key_size: int) -> Callable[[], tuple[float, float]]:
    """phe's own API value by value: (protect seconds, combine seconds) for the first `values` of each embedding."""
    from phe import paillier

    public, private = paillier.generate_paillier_keypair(n_length=key_size)

    def run() -> tuple[float, float]:
        t0 = time.perf_counter()
        cts = {k: [public.encrypt(float(x)) for x in e.flatten()[:values].tolist()] for k, e in embeddings.items()}
        t1 = time.perf_counter()
        total = [sum(column[1:], column[0]) for column in zip(*cts.values(), strict=True)]
        [private.decrypt(c) for c in total]
        return t1 - t0, time.perf_counter() - t1

    return run


def main() -> None:
    """Time every backend on the same batches and print one Markdown table plus the target ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--passive", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="Paillier's encryption processes")
    parser.add_argument("--naive-values", type=int, default=128, help="values per party for the naive rows")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--ckks-moduli", type=int, nargs="+", help="CKKS coeff_mod_bit_sizes (default: the backend's)")
    parser.add_argument("--distinguisher-trials", type=int, default=20, help="CKKS combines per hypothesis (0: skip)")
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(args.threads)
    numel = args.rows * args.dim
    ckks = {"coeff_mod_bit_sizes": tuple(args.ckks_moduli)} if args.ckks_moduli else {}
    setups = [
        Setup("Plain", Plain(), args.passive),
        Setup("DHMasking", DHMasking(), args.passive),
        Setup("Paillier naive (1 value/ct, serial)", Paillier(pack=False, workers=1), args.passive, args.naive_values),
        Setup(f"Paillier packed + parallel ({args.workers} workers)", Paillier(workers=args.workers), args.passive),
        Setup("CKKS (packed slots)", CKKS(**ckks), args.passive),
        Setup("CKKS one ciphertext per row", CKKS(packing="row", **ckks), args.passive),
    ]
    gen = torch.Generator().manual_seed(0)
    batches = [
        (
            {f"p{i}": torch.randn(args.rows, args.dim, generator=gen) for i in range(1, args.passive + 1)},
            torch.randn(args.rows, args.dim, generator=gen),
        )
        for _ in range(args.repeats)
    ]
    phe_run = phe_naive(batches[0][0], args.naive_values, 2048)
    phe_times: list[tuple[float, float]] = []
    worst_error: dict[str, float] = {}
    for embeddings, active in batches:  # interleaved: every backend once per repetition
        reference = active + sum(embeddings.values())
        for s in setups:
            out = s.run(embeddings, active)
            ref = reference.flatten()[: s.values] if s.values is not None else reference
            err = (out.reshape(ref.shape) - ref).abs().max().item()
            worst_error[s.label] = max(worst_error.get(s.label, 0.0), err)
        phe_times.append(phe_run())
        print(f"repetition {len(phe_times)}/{args.repeats} done", file=sys.stderr, flush=True)

    plain_total = statistics.median(p + c for p, c in zip(setups[0].protect_s, setups[0].combine_s, strict=True))
    plain_bytes = setups[0].batch_bytes
    print(
        f"\nOne batch: {args.rows} x {args.dim} embeddings, 1 active + {args.passive} passive parties; median of "
        f"{args.repeats} interleaved repetitions ({machine()}).\n"
    )
    print(
        "| backend | protect + send, all passive (ms) | combine (ms) | total (ms) | per value (µs) | time vs Plain "
        "| wire bytes per batch | bytes vs Plain | set-up key bytes | max abs error |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    per_value: dict[str, float] = {}
    totals: dict[str, float] = {}
    bytes_of: dict[str, float] = {}
    rows = []
    for s in setups:
        scale = numel / s.values if s.values is not None else 1.0
        protect = statistics.median(s.protect_s) * scale
        combine = statistics.median(s.combine_s) * scale
        total = protect + combine
        nbytes = s.batch_bytes * scale
        star = "*" if s.values is not None else ""
        per_value[s.label] = total / (numel * args.passive)
        totals[s.label], bytes_of[s.label] = total, nbytes
        rows.append(
            (s.label + star, protect, combine, total, per_value[s.label], nbytes, s.key_bytes, worst_error[s.label])
        )
    phe_protect = statistics.median(p for p, _ in phe_times) * numel / args.naive_values
    phe_combine = statistics.median(c for _, c in phe_times) * numel / args.naive_values
    per_value["phe"] = (phe_protect + phe_combine) / (numel * args.passive)
    rows.insert(
        3,
        (
            "phe EncryptedNumber, value by value*",
            phe_protect,
            phe_combine,
            phe_protect + phe_combine,
            per_value["phe"],
            float("nan"),
            float("nan"),
            float("nan"),
        ),
    )
    for label, protect, combine, total, pv, nbytes, keys, err in rows:
        b = "–" if nbytes != nbytes else f"{nbytes:,.0f}"
        bvs = "–" if nbytes != nbytes else f"{nbytes / plain_bytes:.1f}x"
        k = "–" if keys != keys else f"{keys:,}"
        e = "–" if err != err else f"{err:.1e}"
        print(
            f"| {label} | {protect * 1e3:,.1f} | {combine * 1e3:,.1f} | {total * 1e3:,.1f} | {pv * 1e6:,.2f} | "
            f"{total / plain_total:,.0f}x | {b} | {bvs} | {k} | {e} |"
        )
    print("\n* measured on the first", args.naive_values, "values of each embedding and scaled to the batch.\n")
    packed = setups[3].label
    naive = setups[2].label
    print(
        f"- Paillier packed + parallel vs naive serial, per value: {per_value[naive] / per_value[packed]:.1f}x faster "
        f"(target >= 50x); vs phe EncryptedNumber: {per_value['phe'] / per_value[packed]:.1f}x"
    )
    ckks, row = setups[4].label, setups[5].label
    print(
        f"- CKKS protect + combine of the batch: {totals[ckks] * 1e3:.1f} ms (target <= 60 ms); protect alone "
        f"{statistics.median(setups[4].protect_s) * 1e3:.1f} ms, "
        f"combine {statistics.median(setups[4].combine_s) * 1e3:.1f} ms"
    )
    print(
        f"- CKKS one ciphertext per row vs packed: {totals[row] / totals[ckks]:.1f}x the time, "
        f"{bytes_of[row] / bytes_of[ckks]:.1f}x the bytes"
    )
    dh = setups[1].label
    print(
        f"- DHMasking wire bytes per batch vs Plain: {bytes_of[dh] / plain_bytes:.2f}x (goal 1.0x; the secure "
        "aggregation of Bonawitz et al. costs 1.73x); its step time beside Plain's: benchmarks/perf/overhead.py"
    )
    if args.distinguisher_trials > 0:
        print(ckks_distinguisher(setups[4], args.rows, args.dim, args.distinguisher_trials))
    print("\nPaillier encryptions per second per core (benchmarks/perf/paillier_speed.py, in this run):")
    report_paillier(measure_paillier(args.repeats))


def ckks_distinguisher(s: Setup, rows: int, dim: int, trials: int) -> str:
    """The coordinator telling passive sums 0 and 1 apart from its decryptions: measured advantage vs the bound."""
    from lvfl.crypto.ckks import masking_advantage

    backend: CKKS = s.backend
    passive = [p.name for p in s.parties if p.role == "passive"]
    seen: list[torch.Tensor] = []
    s.wire.subscribe(lambda src, dst, tag, payload: seen.append(payload) if tag == "he_decrypted" else None)
    bound = backend.mask_bound
    guesses = {"mean > 0.5": lambda v: float(v.mean()) > 0.5, "any value > M": lambda v: bool((v > bound).any())}
    counts = {name: [0, 0] for name in guesses}
    for hypothesis in (0, 1):
        x = torch.full((rows, dim), hypothesis / len(passive), dtype=torch.float64)
        for _ in range(trials):
            s.run(dict.fromkeys(passive, x), torch.zeros(rows, dim, dtype=torch.float64))
            for name, guess in guesses.items():
                counts[name][hypothesis] += guess(seen[-1])
    stderr = (0.5 / trials) ** 0.5
    measured = ", ".join(f"{name}: {(c[1] - c[0]) / trials:+.3f}" for name, c in counts.items())
    return (
        f"- CKKS coordinator telling passive sums 0 and 1 apart per {rows} x {dim} batch (defaults: mask_bound="
        f"{backend.mask_bound:g}, max_abs={backend.max_abs:g}, {len(passive)} passive; {trials} batches per sum): "
        f"measured advantage {measured} (sampling std error ~{stderr:.2f}); stated bound "
        f"{masking_advantage(rows * dim, 1.0, backend.mask_bound):.2e} for sums 0 vs 1, "
        f"{backend.advantage_bound(rows * dim):.2e} worst case in range (refused above {backend.max_advantage:g})"
    )


if __name__ == "__main__":
    main()
