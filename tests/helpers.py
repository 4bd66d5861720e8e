"""Helpers shared by the tests: a quiet trainer, small protocol builders, a recording subclass, ledgers, DDP runs."""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import torch

from lvfl.callbacks import CommunicationMeter
from lvfl.models import MLP
from lvfl.protocols import EASTER, PartyConfig

REPO = Path(__file__).resolve().parents[1]


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


def dh_key_ledger(model) -> dict[tuple[str, str, str], int]:
    """DHMasking's key exchange, once: each passive party's 32-byte public key up, the K - 1 others' keys down."""
    k_passive = len(model.passive)
    out = {}
    for k in model.passive:
        out[(k, model.active, "keys")] = 32
        out[(model.active, k, "keys")] = 32 * (k_passive - 1)
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
    """`base` datamodule whose training samples get other true labels after the (label-stratified) split is made.

    `Relabelled(relabel, **kwargs)`: with `relabel`, sample i's label y becomes (y + 1 + i mod (M - 1)) mod M in every
    view of the training split (the VFL view and the active party's own view), so each label changes and the split,
    features and IDs stay as they were: the counterfactual of the label-DP tests.
    """

    class Relabelled(base):
        def __init__(self, relabel: bool, **kwargs) -> None:
            super().__init__(**kwargs)
            self.relabel = relabel
            self._done = False

        def setup(self, stage: str | None = None) -> None:
            super().setup(stage)
            if self.relabel and not self._done:
                m = self.task.num_classes
                views = {v.labels.data_ptr(): v for v in (self.train_set, self.active_set("train"))}
                for view in views.values():
                    view.labels.copy_((view.labels + 1 + view.ids.long() % max(m - 1, 1)) % m)
                self._done = True

    Relabelled.__name__ = Relabelled.__qualname__ = f"Relabelled{base.__name__}"
    return Relabelled
