"""Helpers shared by the tests: a quiet trainer, small protocol builders, a recording subclass, ledgers, DDP runs."""

from __future__ import annotations

import copy
import csv
import os
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from lvfl.callbacks import CommunicationMeter
from lvfl.models import MLP
from lvfl.protocols import EASTER, PartyConfig

REPO = Path(__file__).resolve().parents[1]


def each_in_a_thread(run: Any, names: list[str], timeout: float = 120) -> dict[str, Any]:
    """`run(name)` for every name at once, a thread each (as separate processes would run); their results by name.

    An exception in any thread fails the caller with every thread's error.
    """
    results, errors = {}, []

    def one(name: str) -> None:
        try:
            results[name] = run(name)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append((name, err))

    threads = [threading.Thread(target=one, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not errors, errors
    return results


def lvfl(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m lvfl ARGS` from the repository root, output captured."""
    return subprocess.run(  # noqa: S603 - our own command
        [sys.executable, "-m", "lvfl", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def checkpoints_of(experiment: Path) -> Path:
    """`<experiment>/version_N/checkpoints` of the newest fit (highest N) that wrote a checkpoint there."""
    folders = [p / "checkpoints" for p in experiment.glob("version_*") if list((p / "checkpoints").glob("*.ckpt"))]
    if not folders:
        raise FileNotFoundError(f"no version of {experiment} holds a checkpoint")
    return max(folders, key=lambda p: int(p.parent.name.split("_")[1]))


def make_trainer(tmp_path: Path, **kwargs) -> pl.Trainer:
    """A CPU trainer with lvfl's meter, no progress bar, checkpoints only when asked for."""
    defaults = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 1,
        "logger": pl.loggers.CSVLogger(tmp_path, name="t"),
        "callbacks": [CommunicationMeter(print_summary=False)],
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "num_sanity_val_steps": 0,
    }
    defaults.update(kwargs)
    return pl.Trainer(**defaults)


def mlp_parties(n: int, lr: float = 0.1, hidden: tuple[int, ...] = (16,), momentum: float = 0.0) -> list[PartyConfig]:
    """n MLP parties with plain SGD (so a reference update is easy to write by hand)."""
    return [
        PartyConfig(
            model=partial(MLP, hidden=list(hidden)),
            optimizer=partial(torch.optim.SGD, lr=lr, momentum=momentum),
        )
        for _ in range(n)
    ]


def easter(n: int, aggregation=None, embedding_dim: int = 8, **kwargs) -> EASTER:
    """An EASTER module with n MLP parties."""
    return EASTER(parties=mlp_parties(n, **kwargs), aggregation=aggregation, embedding_dim=embedding_dim)


def recording(protocol: type, *, labels: bool = False, aggregates: bool = False, snapshot: bool = False) -> type:
    """A subclass of `protocol` that keeps what a test needs to check against a hand-written reference.

    Always: `batches` (every batch trained on) and `epochs` (the epoch of each). With `labels`, `labels` holds per
    step the labels each party's loss used (`labels_for`) and, under "private", `private_labels`. With `aggregates`,
    `aggregates` holds per aggregation the protected sum beside the plain sum of the same embeddings. With
    `snapshot`, `before` holds copies of every party model (and the top model, if any) before the first step.
    """

    class Recording(protocol):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.batches: list = []
            self.epochs: list[int] = []
            self.labels: list[dict[str, torch.Tensor]] = []
            self.aggregates: list[tuple[torch.Tensor, torch.Tensor]] = []
            self.before: dict[str, torch.nn.Module] = {}

        def training_step(self, batch, batch_idx):
            if snapshot and not self.batches:
                self.before = {k: copy.deepcopy(self.party_models[k]) for k in self.party_names}
                if getattr(self, "top", None) is not None:
                    self.before["top"] = copy.deepcopy(self.top)
            if labels:
                used = {k: self.labels_for(k, batch).clone() for k in self.party_names}
                used["private"] = self.private_labels(batch).clone()
                self.labels.append(used)
            self.batches.append(batch)
            self.epochs.append(self.current_epoch)
            return super().training_step(batch, batch_idx)

        @property
        def steps(self) -> list[tuple[int, object, dict[str, torch.Tensor]]]:
            """(epoch, batch, labels used) per step; needs `labels=True`."""
            return list(zip(self.epochs, self.batches, self.labels, strict=True))

        def aggregate_embeddings(self, local):
            out = super().aggregate_embeddings(local)
            if aggregates:
                plain = sum(local[k].detach() for k in self.party_names)  # what Plain would have produced
                self.aggregates.append((out.detach().clone(), plain.clone()))
            return out

    Recording.__name__ = Recording.__qualname__ = f"Recording{protocol.__name__}"
    return Recording


def spy_on(wire) -> list[tuple[str, str, str, object]]:
    """Every later message on `wire` as its receiver gets it: (src, dst, tag, payload), in order (a Wire observer)."""
    seen: list[tuple[str, str, str, object]] = []
    wire.subscribe(lambda src, dst, tag, payload: seen.append((src, dst, tag, payload)))
    return seen


def split_ledger(dm) -> dict[tuple[str, str, str], int]:
    """The split message where only the active party can compute the split: one byte per shared sample to each
    passive participant (`lvfl.datamodules.split`); nothing where the split is public."""
    dm.setup()
    if dm.split_is_public:
        return {}
    shared = len(dm.overlap_ids())
    active = dm.active_party_name
    return {(active, f"party{k}", "split"): shared for k in dm.participants if f"party{k}" != active}


def dh_key_ledger(model) -> dict[tuple[str, str, str], int]:
    """DHMasking's key exchange, once: each passive party's signed public key up (32 + 64 bytes), the K - 1 others'
    keys down."""
    from lvfl.privacy.aggregation.masking import SIGNED_KEY_BYTES

    k_passive = len(model.passive)
    out = {}
    for k in model.passive:
        out[(k, model.active, "keys")] = SIGNED_KEY_BYTES
        out[(model.active, k, "keys")] = SIGNED_KEY_BYTES * (k_passive - 1)
    return out


def run_ddp(config: str, save_dir, *extra: str) -> str:
    """`lvfl fit` of `config` for one epoch under DDP with 2 CPU processes (gloo); returns its output, which holds
    the CommunicationMeter's summary summed over the ranks. Fails the test if the run fails."""
    import subprocess
    import sys

    args = [
        sys.executable, "-m", "lvfl", "fit", "--config", config, "--trainer.strategy=ddp", "--trainer.devices=2",
        "--trainer.accelerator=cpu", "--trainer.max_epochs=1", f"--trainer.logger.init_args.save_dir={save_dir}",
        "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
        '--trainer.callbacks=[{"class_path": "lvfl.callbacks.CommunicationMeter"}]', *extra,
    ]  # fmt: skip
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)  # noqa: S603
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "summed over 2 ranks" in output
    return output


BAD_LABELS_MESSAGE = r"labels must be in 0\.\.2 \(num_classes=3\); found out-of-range label values \[3\]"
"""What `bad_labels_datamodule` must be refused with: the valid range and the offending label."""


def bad_labels_datamodule(num_parties: int = 4):
    """A 3-class datamodule whose labels run 0..3: class 3 is out of range, which every protocol must refuse."""
    import numpy as np

    from lvfl.datamodules import VerticalDataModule

    class BadLabels(VerticalDataModule):
        num_classes = 3

        def load(self):
            return np.random.default_rng(0).normal(size=(120, 8)), np.arange(120) % 4

    return BadLabels(num_parties=num_parties)


def relabelled(base: type) -> type:
    """`base` datamodule whose samples get other true labels *before* anything is derived from them.

    `Relabelled(relabel, **kwargs)`: with `relabel`, sample i's label y becomes (y + 1 + i mod (M - 1)) mod M as
    `load()` returns it, so every label changes and the split, the overlap draw, the scaling and everything else are
    recomputed from the new labels, never held fixed: the counterfactual of the label-DP tests. Whatever a passive
    party sees that depends on the true labels (a split stratified on them, say) changes with it.
    """

    class Relabelled(base):
        def __init__(self, relabel: bool, **kwargs) -> None:
            super().__init__(**kwargs)
            self.relabel = relabel

        def load(self):
            x, y = super().load()
            if self.relabel:
                y = np.asarray(y).copy()
                m = int(self.num_classes or len(np.unique(y)))
                y = (y + 1 + np.arange(len(y)) % max(m - 1, 1)) % m
            return x, y

    Relabelled.__name__ = Relabelled.__qualname__ = f"Relabelled{base.__name__}"
    return Relabelled


def write_tables(root: Path, relabel: bool) -> list[str]:
    """A bank (active: income, age, status) and a retailer (spend): 300 and 260 IDs, 200 shared, in their own orders.

    With `relabel` every status is flipped: the counterfactual's other true labels, in the file."""
    rng = np.random.default_rng(0)
    bank_ids = [f"C{i:04d}" for i in rng.permutation(300)]
    retail_ids = [f"C{i:04d}" for i in rng.permutation(np.arange(100, 360))]
    income = rng.normal(50, 10, size=300)
    status = np.where(income + rng.normal(0, 5, size=300) < 50, "default", "ok")
    if relabel:
        status = np.where(status == "ok", "default", "ok")
    folder = root / ("relabelled" if relabel else "true")
    folder.mkdir(parents=True, exist_ok=True)
    bank, retail = folder / "bank.csv", folder / "retailer.csv"
    with bank.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["customer_id", "income", "age", "status"])
        w.writerows(
            [[i, round(x, 3), 20 + k % 50, s] for k, (i, x, s) in enumerate(zip(bank_ids, income, status, strict=True))]
        )
    with retail.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["client", "spend", "channel"])
        w.writerows([[i, round(float(v), 3), ["web", "store"][k % 2]] for k, (i, v) in enumerate(
            zip(retail_ids, rng.gamma(2.0, 3.0, size=260), strict=True)
        )])  # fmt: skip
    return [str(bank), str(retail)]


def bank_retailer_tables(relabel: bool, root: Path, **kwargs: Any):
    """`PartyTables` over `write_tables`' files (written under `root`): a bank (active) and a retailer."""
    from lvfl.datamodules import PartyTable, PartyTables

    bank, retail = write_tables(root, relabel)
    parties = [
        PartyTable(bank, id_column="customer_id", label_column="status"),
        PartyTable(retail, id_column="client"),
    ]
    return PartyTables(parties, batch_size=32, seed=0, **kwargs)


def tiny_wine_cli(tmp_path: Path, parties: int = 2, *extra: str) -> list[str]:
    """CLI arguments of a small EASTER run on Wine (multiclass) logging under `tmp_path` as `tiny`: 2 training
    batches an epoch, no sanity check; `extra` arguments last."""
    mlp = "{class_path: lvfl.models.MLP, init_args: {hidden: [4]}}"
    config = tmp_path / "tiny.yaml"
    config.write_text(
        "model:\n  class_path: lvfl.protocols.EASTER\n  init_args:\n    embedding_dim: 4\n"
        f"    parties:\n      - {{model: {mlp}}}\n"
        f"data:\n  class_path: lvfl.datamodules.Wine\n  init_args: {{num_parties: {parties}, batch_size: 32}}\n"
    )
    return [
        "--config",
        str(config),
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.logger.init_args.name=tiny",
        "--trainer.enable_progress_bar=false",
        "--trainer.limit_train_batches=2",
        "--trainer.num_sanity_val_steps=0",
        *extra,
    ]


def spy_on_fold_teachers(monkeypatch, cross_fit_module) -> tuple[list[set[int]], list[set[int]]]:
    """Record, per fold teacher of `lvfl.inference.cross_fit`, the samples it trained on and those it labelled."""
    trained: list[set[int]] = []
    labelled: list[set[int]] = []
    real = cross_fit_module.teacher_soft_label_parts

    class SpyTrainer(cross_fit_module.Trainer):
        def fit(self, model, datamodule=None, **kwargs):
            trained.append(set(datamodule.train_set.ids.tolist()))
            labelled.append(set())
            return super().fit(model, datamodule=datamodule, **kwargs)

    def spy(teacher, batch, producer=None):
        labelled[-1].update(batch.ids.tolist())
        return real(teacher, batch, producer)

    monkeypatch.setattr(cross_fit_module, "Trainer", SpyTrainer)
    monkeypatch.setattr(cross_fit_module, "teacher_soft_label_parts", spy)
    return trained, labelled
