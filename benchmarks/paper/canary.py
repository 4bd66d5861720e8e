"""Canary audit of label DP: can a passive party read training labels off everything it receives?

A DP audit with side information (the strongest standard setting): a set of training rows, the *canaries*, get
inputs of Gaussian noise (at every party) and labels drawn uniformly at random, so nothing about their labels is
predictable from features and whatever the models learn about them is memorized; the attacker, passive
party `party1`, knows the true labels of every other training row. It records every message it receives during
training (the global embedding E and the prediction gradients in EASTER, the embedding gradients in SplitNN), with
the sample IDs of each batch (alignment is public in VFL), and guesses each canary's label:

- `grad-argmin` (EASTER): the label read off dloss/dR, the argmin of each gradient row (as `LabelLeakageAudit`);
- `own-argmax` (EASTER): the argmax of the attacker's own head on E (its own prediction R_1 = p_1(E));
- `E` / `grad` / `E+grad` / `E+own`: a multinomial logistic regression (scikit-learn, standardized inputs) from
  the rows a sample received in the last `--window` epochs (concatenated) to its label, fitted on the non-canary
  rows with their known labels, applied to the canaries.

Under epsilon-label-DP with a uniform prior over M classes no attack beats e^eps / (e^eps + M - 1) on the canaries
(23.2% for eps = 1, M = 10); randomized response attains it exactly, so a perfect reader of the release lands on the
bound up to sampling error. `control` scores the best attack against a second, never-used random labelling of the
canaries (chance, 1/M): what the attack reads without any signal. Each cell: canaries from 5 seeds pooled,
standard error sqrt(p(1-p)/n).

.venv/bin/python -m benchmarks.paper.canary [--seeds 0 1 2 3 4] [--canaries 200] [--epochs 20]
"""

from __future__ import annotations

import argparse
import math
import time
from collections import defaultdict
from functools import partial
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from benchmarks.common import machine, quiet
from lvfl.callbacks.label_audit import infer_labels_from_gradients
from lvfl.datamodules import Digits
from lvfl.models import MLP
from lvfl.privacy import LaplaceLabels, RandomizedResponse
from lvfl.protocols import EASTER, PartyConfig, SplitNN

ATTACKER = "party1"
PARTIES = 4


class CanaryDigits(Digits):
    """Digits whose `canaries` random training rows get random inputs and labels after the split is made."""

    def __init__(self, canaries: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.canaries = canaries
        self.canary_ids: torch.Tensor | None = None
        self.shadow: torch.Tensor | None = None  # an independent random labelling, never used: the control

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        if self.canary_ids is None:
            g = torch.Generator().manual_seed(10_000 + self.seed)
            train = self.train_set
            pick = torch.randperm(len(train), generator=g)[: self.canaries]
            m = self.task.num_classes
            train.labels[pick] = torch.randint(0, m, (self.canaries,), generator=g)
            for x in train.features.values():  # out-of-distribution inputs: only memorization can tell their label
                x[pick] = torch.randn(x[pick].shape, generator=g).to(x.dtype)
            self.canary_ids = train.ids[pick].clone()
            self.shadow = torch.randint(0, m, (self.canaries,), generator=g)


class Inbox(pl.Callback):
    """What the attacker receives in the last `window` training epochs, per sample ID and tag (E and gradients)."""

    def __init__(self, epochs: int, window: int) -> None:
        self.first = epochs - window
        self.rows: dict[str, dict[int, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
        self.ids: torch.Tensor | None = None

    def setup(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        pl_module.wire.subscribe(self.observe)
        self.module = pl_module

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.ids = batch.ids if trainer.current_epoch >= self.first else None

    def on_train_batch_end(self, *args: Any) -> None:
        self.ids = None  # validation traffic is not attributed to training rows

    def observe(self, src: str, dst: str, tag: str, payload: Any) -> None:
        if self.ids is None or not isinstance(payload, torch.Tensor):
            return
        if src == ATTACKER and tag == "predictions":  # what it computed itself is in its view too
            tag = "own_predictions"
        elif dst != ATTACKER:
            return
        for i, row in zip(self.ids.tolist(), payload.detach().float().cpu().numpy(), strict=True):
            self.rows[tag][i].append(row)


def parties(n: int) -> list[PartyConfig]:
    return [
        PartyConfig(model=partial(MLP, hidden=[64]), optimizer=partial(torch.optim.SGD, lr=0.1, momentum=0.9))
        for _ in range(n)
    ]


def build(protocol: str, mechanism: str, epsilon: float) -> Any:
    mech = {"none": None, "rr": RandomizedResponse(epsilon=epsilon), "laplace": LaplaceLabels(epsilon=epsilon)}
    if protocol == "EASTER":
        return EASTER(parties=parties(PARTIES), embedding_dim=32, label_mechanism=mech[mechanism])
    return SplitNN(
        parties=parties(PARTIES),
        top_model=partial(MLP, hidden=[64]),
        embedding_dim=32,
        top_hidden=32,
        label_mechanism=mech[mechanism],
    )


def attack(protocol: str, mechanism: str, epsilon: float, seed: int, canaries: int, epochs: int, window: int) -> dict:
    """One run; returns per attack the canaries guessed right, the control hits and the count."""
    pl.seed_everything(seed, verbose=False)
    dm = CanaryDigits(canaries, num_parties=PARTIES, batch_size=64, seed=seed)
    model = build(protocol, mechanism, epsilon)
    inbox = Inbox(epochs, window)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        logger=False,
        callbacks=[inbox],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_val_batches=0,
    )
    trainer.fit(model, datamodule=dm)
    train = dm.train_set
    label_of = dict(zip(train.ids.tolist(), train.labels.tolist(), strict=True))
    canary = set(dm.canary_ids.tolist())
    canary_order = dm.canary_ids.tolist()
    truth = np.array([label_of[i] for i in canary_order])
    shadow = dm.shadow.numpy()
    guesses: dict[str, np.ndarray] = {}
    tags = {
        "E": ["global_embedding"],
        "grad": ["gradients"],
        "E+grad": ["global_embedding", "gradients"],
        "E+own": ["global_embedding", "own_predictions"],
    }
    for name, use in tags.items():
        if not all(t in inbox.rows for t in use):
            continue
        ids = sorted(inbox.rows[use[0]])
        feats = {i: np.concatenate([r for t in use for r in inbox.rows[t][i]]) for i in ids}
        known = [i for i in ids if i not in canary]
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=3000))
        clf.fit(np.stack([feats[i] for i in known]), [label_of[i] for i in known])
        guesses[name] = clf.predict(np.stack([feats[i] for i in canary_order]))
    if protocol == "EASTER":
        grads = torch.tensor(np.stack([inbox.rows["gradients"][i][-1] for i in canary_order]))
        guesses["grad-argmin"] = infer_labels_from_gradients(grads).numpy()
        own = np.stack([inbox.rows["own_predictions"][i][-1] for i in canary_order])
        guesses["own-argmax"] = own.argmax(1)
    out = {name: int((g == truth).sum()) for name, g in guesses.items()}
    best = max(out, key=out.get)
    out["control"] = int((guesses[best] == shadow).sum())
    out["n"] = len(canary_order)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--canaries", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--window", type=int, default=5, help="the last epochs whose messages the attacker uses")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--protocols", nargs="+", default=["EASTER", "SplitNN"])
    parser.add_argument("--mechanisms", nargs="+", default=["none", "rr", "laplace"])
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(1)
    m = 10
    bound = math.exp(args.epsilon) / (math.exp(args.epsilon) + m - 1)
    print(f"# canary label attack, digits, {PARTIES} parties, attacker {ATTACKER}; {machine()}")
    print(f"# eps-label-DP bound on canary accuracy at eps = {args.epsilon:g}: {bound:.4f}; chance {1 / m:.4f}\n")
    print("| protocol | mechanism | attack | canary accuracy ± SE | within bound | n |")
    print("|---|---|---|---|---|---|")
    for protocol in args.protocols:
        for mechanism in args.mechanisms:
            start = time.time()
            totals: dict[str, int] = defaultdict(int)
            for seed in args.seeds:
                for k, v in attack(
                    protocol, mechanism, args.epsilon, seed, args.canaries, args.epochs, args.window
                ).items():
                    totals[k] += v
            n = totals.pop("n")
            for name, hits in totals.items():
                p = hits / n
                se = math.sqrt(p * (1 - p) / n)
                verdict = "–" if mechanism == "none" else ("yes" if p <= bound + 2 * se else "NO")
                label = f"eps={args.epsilon:g} {mechanism}" if mechanism != "none" else "none"
                print(f"| {protocol} | {label} | {name} | {p:.4f} ± {se:.4f} | {verdict} | {n} |")
            print(f"<!-- {protocol} {mechanism}: {time.time() - start:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
