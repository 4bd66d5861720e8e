"""The unit costs behind three design choices, measured side by side on this machine.

.venv/bin/python -m benchmarks.perf.costs [--repeats 5]

- ``self.log`` vs a direct logger write (why `lvfl.loggers` writes unmonitored figures straight to the loggers):
  a Lightning fit of a tiny module whose step calls ``self.log`` 20 times, against the same fit writing the same
  20 values through `lvfl.loggers.log_to_loggers`; the per-call difference of the epoch times.
- moving a `VFLBatch` with Lightning's generic ``move_data_to_device`` vs `VFLBatch.to` (why the datamodule
  overrides ``transfer_batch_to_device``), to the CPU, for a 4-party batch of 128 rows.
- Paillier with a 2048-bit key (why `lvfl.privacy.Paillier` packs values and encrypts in a worker pool): one
  encryption (``rho**n mod n**2`` and the ``1 + m n`` product), one CRT decryption, starting the forkserver pool
  (the workers re-import this script's imports), and a round trip to the warm pool.
- CKKS (TenSEAL, one thread; why `lvfl.privacy.CKKS` defaults to N = 8192 with primes (60, 40, 60)): per packed
  ciphertext of random values, a public-key encryption, its serialization (and size), a ciphertext addition, a
  plaintext (mask) addition and a decryption, for the default chain, the often-quoted (60, 40, 40, 60) and the
  smaller N = 4096 chain (54, 55) that meets the same 128-bit bound.

Each figure is the median over ``--repeats`` repetitions; the ratios are printed beside the times.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from benchmarks.common import machine, quiet
from lvfl.crypto import ckks, paillier
from lvfl.loggers import log_to_loggers
from lvfl.parties import VFLBatch

VALUES_PER_STEP = 20
STEPS = 200


class Logging(pl.LightningModule):
    """One linear layer; every step writes VALUES_PER_STEP scalars, through `self.log` or straight to the loggers."""

    def __init__(self, direct: bool) -> None:
        super().__init__()
        self.direct = direct
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch).pow(2).mean()
        values = {f"v{i}": loss.detach() for i in range(VALUES_PER_STEP)}
        if self.direct:
            log_to_loggers(self.trainer, {k: float(v) for k, v in values.items()})
        else:
            for name, value in values.items():
                self.log(name, value)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit_seconds(direct: bool, log_dir: str) -> float:
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=pl.loggers.CSVLogger(log_dir),
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    loader = torch.utils.data.DataLoader(torch.randn(STEPS, 4), batch_size=1)
    start = time.perf_counter()
    trainer.fit(Logging(direct), loader)
    return time.perf_counter() - start


CKKS_CHAINS = {
    "N=8192 (60, 40, 60)": ckks.CKKSParameters(8192, (60, 40, 60), 40),
    "N=8192 (60, 40, 40, 60)": ckks.CKKSParameters(8192, (60, 40, 40, 60), 40),
    "N=4096 (54, 55)": ckks.CKKSParameters(4096, (54, 55), 40),
}


def ckks_costs(record: Callable[[str, float], None], sizes: dict[str, int]) -> None:
    """One repetition of the CKKS unit costs, for every chain in CKKS_CHAINS."""
    rng = np.random.default_rng(0)
    for name, params in CKKS_CHAINS.items():
        context = ckks.secret_context(params)
        values = rng.uniform(-1.0, 1.0, ckks.slots(params))
        vector = ckks.encrypt(context, values)
        other = ckks.encrypt(context, values)
        blob, mask = vector.serialize(), values.tolist()
        sizes[name] = len(blob)
        record(f"CKKS {name}: encryption", per_call(lambda c=context, v=values: ckks.encrypt(c, v), 10))
        record(f"CKKS {name}: serialization", per_call(vector.serialize, 10))
        record(f"CKKS {name}: ciphertext addition", per_call(lambda a=vector, b=other: a + b, 50))
        record(f"CKKS {name}: plaintext addition", per_call(lambda a=vector, m=mask: a + m, 10))
        key = context.secret_key()
        record(f"CKKS {name}: decryption", per_call(lambda a=vector, k=key: ckks.decrypt([a], k), 10))


def per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(1)
    rows: dict[str, list[float]] = {}

    def record(name: str, seconds: float) -> None:
        rows.setdefault(name, []).append(seconds)

    batch = VFLBatch(
        ids=torch.arange(128),
        features={f"party{k}": torch.randn(128, 16) for k in range(4)},
        labels=torch.zeros(128, dtype=torch.long),
    )
    n, secret = paillier.generate_keypair(2048)
    ciphertext = paillier.encrypt(n, [12345])[0]
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as log_dir:
        for _ in range(args.repeats):
            ckks_costs(record, sizes)
            logged, direct = fit_seconds(False, log_dir), fit_seconds(True, log_dir)
            record("self.log, one call", (logged - direct) / (STEPS * VALUES_PER_STEP))
            record("move_data_to_device(VFLBatch)", per_call(lambda: move_data_to_device(batch, "cpu"), 2000))
            record("VFLBatch.to", per_call(lambda: batch.to("cpu"), 2000))
            record("Paillier encryption (2048-bit)", per_call(lambda: paillier.encrypt(n, [12345]), 20))
            record("Paillier decryption (2048-bit, CRT)", per_call(lambda: paillier.decrypt(secret, ciphertext), 50))
            start = time.perf_counter()  # the pool `Paillier` starts: forkserver, as many workers as asked
            with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("forkserver")) as pool:
                pool.submit(int, 0).result()
                record("Paillier pool start (forkserver, 2 workers)", time.perf_counter() - start)
                record("Paillier pool round trip (warm)", per_call(lambda p=pool: p.submit(int, 0).result(), 50))

    print(f"\nUnit costs, median of {args.repeats} repetitions ({machine()})\n")
    print("| operation | time | ratio |")
    print("|---|---|---|")
    median = {name: statistics.median(times) for name, times in rows.items()}
    ratios = {
        "move_data_to_device(VFLBatch)": median["move_data_to_device(VFLBatch)"] / median["VFLBatch.to"],
        "Paillier decryption (2048-bit, CRT)": median["Paillier decryption (2048-bit, CRT)"]
        / median["Paillier encryption (2048-bit)"],
    }
    notes = {
        "move_data_to_device(VFLBatch)": "× VFLBatch.to",
        "Paillier decryption (2048-bit, CRT)": "× an encryption",
    }
    for name, seconds in median.items():
        ratio = f"{ratios[name]:.2f} {notes[name]}" if name in ratios else ""
        print(f"| {name} | {seconds * 1e3:.3f} ms | {ratio} |")
    print()
    for name, size in sizes.items():
        print(f"- CKKS {name}: one serialized ciphertext of {size / 1e3:.1f} KB")


if __name__ == "__main__":
    main()
