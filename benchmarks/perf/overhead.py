"""Training throughput of lvfl against a bare PyTorch loop, and of DH masking against Plain aggregation.

.venv/bin/python -m benchmarks.perf.overhead [--repeats 7] [--epochs 10] [--workloads digits synthetic] [--threads 1]
.venv/bin/python -m benchmarks.perf.overhead --workloads bank --repeats 3 --epochs 3 [--bank-rows 1000000]

Five variants run the same EASTER step on the same party models (same classes, hyperparameters, optimizers and
init seed) and the same training split:

- ``bare``: a plain PyTorch loop over batches cut from a random permutation of the training tensors: every party's
  encoder, the mean embedding, ``head_k(E.detach() + (E_k - E_k.detach()) / C)``, cross-entropy, one backward on the
  summed losses, every party's optimizer steps. No Lightning, no wire, no masking, no logging.
- ``bare_dh``: the same loop with the mean embedding computed as DH masking computes it: each passive party's
  ``DHMasking.protect`` (fixed point, range check, pairwise AES masks) and the active party's ``combine``, on the
  backend lvfl uses, set up on a wire of its own. What any implementation of the protocol pays for its masks, so
  ``dh / bare_dh`` is what lvfl's loaders and step add to a masked run.
- ``plain``: a real ``lightning.pytorch.Trainer`` fitting ``lvfl.protocols.EASTER`` with ``Plain`` aggregation on the
  lvfl datamodule, with a CSVLogger at Lightning's default logging cadence and the ``CommunicationMeter`` callback;
  progress bar, checkpointing, model summary, sanity check and validation are off, so only training is timed.
- ``dh``: the same with ``DHMasking``.
- ``dh_memory``: ``dh`` fed from memory: the same fit, its training batches gathered once before it (one epoch's
  shuffled batches, the same every epoch) and handed to Lightning by a DataLoader that returns each as it is, so no
  step gathers a row. So
  ``dh / dh_memory`` is what lvfl's loader costs a step: issue 46's "the same models fed from in-memory tensors (the
  loader is not the bottleneck)", the same protocol, step and masks on both sides.

Workloads:

- ``digits``: scikit-learn digits, 4 parties, batch 128, the party models and optimizers of
  ``configs/easter/digits.yaml`` (embedding 64).
- ``cifar``: CIFAR-shaped random uint8 images (``--cifar-samples``, default 1,024, 3x32x32, 10 classes) over 4
  parties (32x8 strips), ``ResNet18`` party models (CIFAR stem), embedding 128, batch 128, SGD(lr=0.1); lvfl keeps
  the images uint8 and normalizes each batch after the transfer, the bare loop reads pre-normalized float tensors;
  no augmentation in either.
- ``bank``: a bank's size (issue 46): ``--bank-rows`` samples (default 1,000,000), every one held by all 3 parties,
  each party 310 float32 columns (what ``benchmarks/perf/scale.py``'s 100 numeric and 10 twenty-level categorical
  columns encode to, one-hot), a label from a linear rule; the party models and optimizer of ``scale.py``'s config
  (``MLP(hidden=[64])``, embedding 16, Adam(lr=1e-3)), batch ``--bank-batch`` (default 1,024). The bare loop is the
  same models fed from the same in-memory tensors: its ratio is what lvfl's loaders and step add at that size.
- ``synthetic``: ``Synthetic`` with 8,192 samples, 1,000 features (100 informative, 2 classes) over 4 parties
  (250 each), ``MLP(hidden=[512])`` encoders, embedding 128 (``--synthetic-embedding-dim``), batch 512,
  SGD(lr=0.01, momentum=0.9) for every party.

Timing: one repetition runs bare, bare_dh, plain, dh in turn (interleaved, so slow phases of a shared machine hit all
four), each for ``--epochs`` epochs. An epoch's time is the period from one epoch's start to the next (the last
one: to the end of training), so Lightning's per-epoch work (epoch-end hooks, logger writes) is counted while
start-up (Trainer construction, setup, the first epoch) is not: the first epoch of every run is dropped. Per
repetition each variant's time is the median over its remaining epochs; the table gives the median over
repetitions as samples/s, and each ratio as the median over repetitions of the paired ratio (with its min-max).
A second table gives the same ratios of the process's CPU time (`time.process_time`, every thread of this process)
over the same epochs: on a shared machine another program's work stretches the wall time of whichever variant it
overlaps, not this process's CPU time, so those ratios spread less (both are printed; the wall time is the one a
user waits).

Threads: ``torch.set_num_threads(--threads)``, default 1, because the reference machine has 2 shared cores. More
threads shrink the model compute but not lvfl's per-step Python work or the (single-threaded) AES-CTR masks, so the
ratios grow with ``--threads``; report the thread count with the table (it is in the machine line).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils.data import DataLoader

from benchmarks.common import machine, quiet
from lvfl.callbacks import CommunicationMeter
from lvfl.datamodules import Digits, Synthetic, VerticalDataModule
from lvfl.models import CNN, MLP, LeNet, ResNet18
from lvfl.privacy import AggregationBackend, DHMasking, Plain
from lvfl.protocols import EASTER, PartyConfig
from lvfl.wire import Wire

VARIANTS = ("bare", "bare_dh", "plain", "dh", "dh_memory")
BACKENDS: dict[str, Callable[[], AggregationBackend]] = {"plain": Plain, "dh": DHMasking, "dh_memory": DHMasking}
#: the targets the ratios are reported against: lvfl Plain / bare, DHMasking / Plain (per workload)
PLAIN_TARGET = 1.30


@dataclass
class Workload:
    """A datamodule and the party models trained on it."""

    name: str
    description: str
    datamodule: Callable[[], VerticalDataModule]
    parties: list[PartyConfig]
    embedding_dim: int
    dh_target: float
    plain_target: float = PLAIN_TARGET


def digits_workload() -> Workload:
    """The models and optimizers of configs/easter/digits.yaml on Digits (4 parties, batch 128)."""
    sgd = partial(torch.optim.SGD, lr=0.1, momentum=0.9)
    parties = [
        PartyConfig(model=partial(MLP, hidden=[64]), optimizer=sgd),
        PartyConfig(model=partial(CNN, channels=[16, 32]), optimizer=sgd),
        PartyConfig(model=LeNet, optimizer=sgd),
        PartyConfig(model=partial(MLP, hidden=[128]), optimizer=sgd),
    ]
    return Workload(
        name="digits",
        description="digits, 4 parties (MLP/CNN/LeNet/MLP of digits.yaml), emb 64, batch 128",
        datamodule=partial(Digits, num_parties=4, batch_size=128, seed=0),
        parties=parties,
        embedding_dim=64,
        dh_target=1.35,
    )


def synthetic_workload(embedding_dim: int) -> Workload:
    """1,000 features over 4 parties, MLP encoders of width 512, batch 512."""
    sgd = partial(torch.optim.SGD, lr=0.01, momentum=0.9)
    return Workload(
        name="synthetic",
        description=f"Synthetic 8192x1000 (100 informative, 2 classes), 4 parties, MLP [512], emb {embedding_dim}, "
        "batch 512",
        datamodule=partial(
            Synthetic,
            num_samples=8192,
            num_features=1000,
            num_informative=100,
            num_classes=2,
            num_parties=4,
            batch_size=512,
            seed=0,
        ),
        parties=[PartyConfig(model=partial(MLP, hidden=[512]), optimizer=sgd)],
        embedding_dim=embedding_dim,
        dh_target=1.05,  # issue 16: masks at Plain's bytes (Z_2^32) and <= 1.05x its step time
    )


class RandomImages(VerticalDataModule):
    """CIFAR-shaped random uint8 images (N, 3, 32, 32) with random labels: the data path and compute of CIFAR-10."""

    num_classes = 10

    def __init__(self, num_samples: int = 1024, **kwargs) -> None:
        self.num_samples = num_samples
        super().__init__(**kwargs)

    def load(self):
        """Seeded random pixels and labels."""
        generator = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (self.num_samples, 3, 32, 32), dtype=torch.uint8, generator=generator)
        return x.numpy(), (torch.arange(self.num_samples) % 10).numpy()


class RandomTable(VerticalDataModule):
    """Seeded normal float32 features with a label from a linear rule: a large encoded table without a file."""

    num_classes = 2

    def __init__(self, num_samples: int, num_features: int, **kwargs) -> None:
        self.num_samples, self.num_features = num_samples, num_features
        super().__init__(**kwargs)

    def load(self):
        """Seeded features, built a block of rows at a time (no float64 temporary of the whole table)."""
        generator = torch.Generator().manual_seed(0)
        x = torch.empty(self.num_samples, self.num_features)
        for start in range(0, self.num_samples, 65_536):
            x[start : start + 65_536].normal_(generator=generator)
        weights = torch.randn(self.num_features, generator=generator)
        return x.numpy(), (x @ weights > 0).long().numpy()


def bank_workload(rows: int, batch_size: int) -> Workload:
    """scale.py's encoded bank tables and models at `rows` customers, every one at each of 3 parties."""
    return Workload(
        name="bank",
        description=f"{rows:,} x 3 parties x 310 float32 columns, MLP [64], emb 16, Adam, batch {batch_size:,}",
        datamodule=partial(
            RandomTable, num_samples=rows, num_features=930, num_parties=3, batch_size=batch_size, seed=0
        ),
        parties=[PartyConfig(model=partial(MLP, hidden=[64]), optimizer=partial(torch.optim.Adam, lr=1e-3))],
        embedding_dim=16,
        dh_target=1.20,
        plain_target=1.20,
    )


def cifar_workload(num_samples: int) -> Workload:
    """ResNet18 at 4 parties on CIFAR-shaped uint8 strips, batch 128 (issue 14's GPU data path workload)."""
    return Workload(
        name="cifar",
        description=f"random uint8 3x32x32 x {num_samples}, 4 parties (32x8 strips), ResNet18, emb 128, batch 128",
        datamodule=partial(RandomImages, num_samples=num_samples, num_parties=4, batch_size=128, seed=0),
        parties=[PartyConfig(model=ResNet18, optimizer=partial(torch.optim.SGD, lr=0.1))],
        embedding_dim=128,
        dh_target=1.10,
        plain_target=1.15,
    )


# ---------------------------------------------------------------------------------------------------- bare PyTorch
def run_bare(
    workload: Workload, dm: VerticalDataModule, epochs: int, seed: int, masked: bool = False
) -> tuple[list[float], list[float]]:
    """Epoch wall and CPU times (after the first) of the EASTER step math in a plain PyTorch loop (with DH masks if
    `masked`)."""
    torch.manual_seed(seed)
    specs, task = dm.party_specs, dm.task
    names = [spec.name for spec in specs]
    active = next(spec.name for spec in specs if spec.role == "active")
    passive = [name for name in names if name != active]
    if masked:
        backend = DHMasking()
        backend.setup(specs, active, Wire())
    configs = workload.parties * len(specs) if len(workload.parties) == 1 else workload.parties
    models = [
        cfg.model(tuple(spec.input_shape), workload.embedding_dim, task.num_classes)
        for spec, cfg in zip(specs, configs, strict=True)
    ]
    optimizers = [cfg.make_optimizer(m.parameters()) for m, cfg in zip(models, configs, strict=True)]
    train = dm.train_set
    features = [train.features[spec.name] for spec in specs]
    labels = train.labels
    num_samples, batch_size, c = len(train), dm.batch_size, len(models)
    generator = torch.Generator().manual_seed(seed)

    marks, cpu, step = [], [], 0
    for _ in range(epochs):
        marks.append(time.perf_counter())
        cpu.append(time.process_time())
        for index in torch.randperm(num_samples, generator=generator).split(batch_size):
            xs = [x.index_select(0, index) for x in features]
            y = labels.index_select(0, index)
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            local = [m.encoder(x) for m, x in zip(models, xs, strict=True)]
            with torch.no_grad():
                if masked:  # EASTER's aggregate: (E_a + sum of the passive shares' ring sum) / C
                    by_name = dict(zip(names, local, strict=True))
                    shares = {k: backend.protect(k, by_name[k], step=step) for k in passive}
                    e = backend.combine(by_name[active], shares) / c
                    step += 1
                else:
                    e = torch.stack(local).mean(0)
            loss = sum(
                F.cross_entropy(m.head(e + (e_k - e_k.detach()) / c), y) for m, e_k in zip(models, local, strict=True)
            )
            loss.backward()
            for opt in optimizers:
                opt.step()
    marks.append(time.perf_counter())
    cpu.append(time.process_time())
    return [b - a for a, b in pairwise(marks)][1:], [b - a for a, b in pairwise(cpu)][1:]


# ---------------------------------------------------------------------------------------------------- lvfl
class EpochClock(pl.Callback):
    """Records the start of every training epoch and the end of training."""

    def __init__(self) -> None:
        self.marks: list[float] = []
        self.cpu: list[float] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.marks.append(time.perf_counter())
        self.cpu.append(time.process_time())

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.marks.append(time.perf_counter())
        self.cpu.append(time.process_time())

    def periods(self) -> list[float]:
        """Epoch wall times after the first epoch."""
        return [b - a for a, b in pairwise(self.marks)][1:]

    def cpu_periods(self) -> list[float]:
        """The process's CPU time in each of those epochs."""
        return [b - a for a, b in pairwise(self.cpu)][1:]


def make_lvfl(
    workload: Workload, variant: str, epochs: int, seed: int, log_dir: str
) -> tuple[pl.Trainer, EASTER, EpochClock]:
    """A seeded EASTER module and a Trainer set up as described in the module docstring."""
    pl.seed_everything(seed, verbose=False)
    module = EASTER(parties=workload.parties, aggregation=BACKENDS[variant](), embedding_dim=workload.embedding_dim)
    clock = EpochClock()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        logger=pl.loggers.CSVLogger(log_dir, name=f"{workload.name}_{variant}"),
        callbacks=[CommunicationMeter(), clock],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    return trainer, module, clock


def run_lvfl(
    workload: Workload, dm: VerticalDataModule, variant: str, epochs: int, seed: int, log_dir: str
) -> tuple[list[float], list[float]]:
    """Epoch wall and CPU times (after the first) of a Lightning fit of EASTER with the variant's backend."""
    trainer, module, clock = make_lvfl(workload, variant, epochs, seed, log_dir)
    trainer.fit(module, datamodule=dm)
    periods = clock.periods()
    if len(periods) != epochs - 1:
        raise RuntimeError(f"{workload.name}/{variant}: expected {epochs - 1} timed epochs, got {len(periods)}")
    return periods, clock.cpu_periods()


def fed_from_memory(dm: VerticalDataModule) -> VerticalDataModule:
    """`dm` (a shallow copy: the same tensors) whose training loader is one epoch's batches, gathered here."""
    batches = list(dm.train_dataloader())
    fed = copy.copy(dm)
    fed.train_dataloader = lambda: DataLoader(batches, batch_size=None, collate_fn=lambda batch: batch)  # as they are
    return fed


# ---------------------------------------------------------------------------------------------------- the table
def measure(workload: Workload, repeats: int, epochs: int, seed: int) -> dict[str, list[float]]:
    """Per repetition and variant, the median epoch time (seconds; `<variant>_cpu`: the process's CPU time);
    variants interleaved within a repetition."""
    dm = workload.datamodule()
    dm.setup("fit")
    fed = fed_from_memory(dm)
    per_rep: dict[str, list[float]] = {k: [] for v in VARIANTS for k in (v, f"{v}_cpu")}
    with tempfile.TemporaryDirectory() as log_dir:
        for rep in range(repeats):
            for variant in VARIANTS:
                if variant.startswith("bare"):
                    periods, cpu = run_bare(workload, dm, epochs, seed, masked=variant == "bare_dh")
                else:
                    source = fed if variant == "dh_memory" else dm
                    periods, cpu = run_lvfl(workload, source, variant, epochs, seed, log_dir)
                per_rep[variant].append(statistics.median(periods))
                per_rep[f"{variant}_cpu"].append(statistics.median(cpu))
            cells = ", ".join(f"{v} {per_rep[v][-1] * 1e3:.1f} ms" for v in VARIANTS)
            print(f"{workload.name} repetition {rep + 1}/{repeats}: epoch {cells}", file=sys.stderr, flush=True)
    per_rep["samples"] = [float(len(dm.train_set))]
    return per_rep


def ratio_cell(num: list[float], den: list[float], target: float | None) -> str:
    """Median of the paired ratios, their min-max, and whether the median meets `target` (if any)."""
    ratios = [a / b for a, b in zip(num, den, strict=True)]
    med = statistics.median(ratios)
    cell = f"{med:.3f} ({min(ratios):.2f}-{max(ratios):.2f})"
    if target is None:
        return cell
    return f"{cell} {'ok' if med <= target else 'MISSED'} ≤{target:.2f}"


def main() -> None:
    """Measure every workload and print one Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repetitions (default 7)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs per run; the first is not timed (default 10)")
    parser.add_argument(
        "--workloads", nargs="+", choices=("digits", "synthetic", "cifar", "bank"), default=["digits", "synthetic"]
    )
    parser.add_argument("--bank-rows", type=int, default=1_000_000, help="samples in the bank workload")
    parser.add_argument("--bank-batch", type=int, default=1024, help="batch size of the bank workload")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--synthetic-embedding-dim", type=int, default=128, help="default 128")
    parser.add_argument("--cifar-samples", type=int, default=1024, help="images in the cifar workload (default 1024)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the per-repetition epoch times here (for revisions.py)")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first epoch is not timed)")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    quiet()
    torch.set_num_threads(args.threads)
    workloads = {
        "digits": digits_workload,
        "synthetic": partial(synthetic_workload, args.synthetic_embedding_dim),
        "cifar": partial(cifar_workload, args.cifar_samples),
        "bank": partial(bank_workload, args.bank_rows, args.bank_batch),
    }

    start = time.perf_counter()
    rows = []
    for name in args.workloads:
        workload = workloads[name]()
        rows.append((workload, measure(workload, args.repeats, args.epochs, args.seed)))
    if args.json is not None:
        args.json.write_text(json.dumps({workload.name: times for workload, times in rows}))

    print(
        f"\nEASTER training throughput, {args.repeats} interleaved repetitions x {args.epochs - 1} timed epochs "
        f"({machine()})\n"
    )
    print(
        "| workload | bare samples/s | lvfl Plain samples/s | lvfl DHMasking samples/s | Plain / bare time "
        "| DHMasking / Plain time | DHMasking / bare time | bare with masks / bare time | DHMasking / bare with masks "
        "time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for workload, times in rows:
        n = times["samples"][0]
        rate = {v: n / statistics.median(times[v]) for v in VARIANTS}
        print(
            f"| {workload.name} | {rate['bare']:,.0f} | {rate['plain']:,.0f} | {rate['dh']:,.0f} "
            f"| {ratio_cell(times['plain'], times['bare'], workload.plain_target)} "
            f"| {ratio_cell(times['dh'], times['plain'], workload.dh_target)} "
            f"| {ratio_cell(times['dh'], times['bare'], None)} "
            f"| {ratio_cell(times['bare_dh'], times['bare'], None)} "
            f"| {ratio_cell(times['dh'], times['bare_dh'], workload.plain_target)} |"
        )
    print("\nThe loader's share: lvfl's DHMasking fit against the same fit fed from batches gathered before it:\n")
    print("| workload | lvfl DHMasking fed from memory samples/s | DHMasking / DHMasking fed from memory time |")
    print("|---|---|---|")
    for workload, times in rows:
        n = times["samples"][0]
        print(
            f"| {workload.name} | {n / statistics.median(times['dh_memory']):,.0f} "
            f"| {ratio_cell(times['dh'], times['dh_memory'], workload.plain_target)} |"
        )
    print("\nThe same ratios of this process's CPU time over the same epochs:\n")
    print(
        "| workload | Plain / bare | DHMasking / Plain | DHMasking / bare | bare with masks / bare "
        "| DHMasking / bare with masks |"
    )
    print("|---|---|---|---|---|---|")
    for workload, times in rows:
        cpu = {v: times[f"{v}_cpu"] for v in VARIANTS}
        print(
            f"| {workload.name} | {ratio_cell(cpu['plain'], cpu['bare'], workload.plain_target)} "
            f"| {ratio_cell(cpu['dh'], cpu['plain'], workload.dh_target)} "
            f"| {ratio_cell(cpu['dh'], cpu['bare'], None)} "
            f"| {ratio_cell(cpu['bare_dh'], cpu['bare'], None)} "
            f"| {ratio_cell(cpu['dh'], cpu['bare_dh'], workload.plain_target)} |"
        )
    print()
    for workload, times in rows:
        print(f"- {workload.name}: {workload.description}; {int(times['samples'][0])} training samples per epoch")
    print(
        "- ratios: median over repetitions of the paired time ratio (min-max in brackets), against the target; "
        f"total wall time {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
