"""Backdoors by a passive party: it deviates from the protocol so that its own input steers the joint model's output.

Unlike the inference attacks (`lvfl.attacks.base.Attack`, semi-honest: they only compute on what the party holds),
a backdoor attacker is malicious in its own code, and only there: it changes its own features and what it does with
a gradient it received (`Wire.intercept`), never a message of another party or the protocol's code. The harness
then measures what the attack achieved on the validation split, where the attacker alters its own slice.

- `GradientReplacement` (label replacement; Liu and Lyu, "Backdoor attacks and defenses in feature-partitioned
  collaborative learning", 2020; VFLAIR's replacement backdoor): the attacker knows a few training samples of a
  target class (side knowledge). It stamps a trigger on its own features of a small poisoned set of training rows,
  and trains on the gradient of a known target-class sample in place of each poisoned row's own (times `gamma`), so
  its model learns to map the trigger to what the target class's samples get. Metric: `success_rate`, the fraction
  of validation samples *not* of the target class predicted as it when their attacker slice carries the trigger,
  against `baseline_success_rate`, the same fraction without the trigger.
- `NoisySample` (VFLAIR's noisy-sample backdoor): at inference the attacker adds N(0, noise^2) to its own slice (kept
  in its features' training range) and the joint model's accuracy falls. Metric: `accuracy_drop`, clean minus noisy
  validation accuracy (the main prediction's), with both.

The main prediction is the one the federation serves: Agg_VFL's aggregate, else the active party's. The measurement
runs the protocol's own inference on the altered batches with the wire recording (nothing metered, no mask step
spent, no random stream of the run moved), so a run with a backdoor attached differs from one without only by what
the attacker did in training.
"""

from __future__ import annotations

import hashlib
from abc import abstractmethod
from typing import Any, ClassVar

import torch
from lightning.pytorch import LightningModule, Trainer

from lvfl.attacks.base import AttackRecord, attacking_party
from lvfl.messages import EMBEDDING_GRADIENT, PREDICTION_GRADIENT
from lvfl.protocols.aggvfl import AGGREGATE

__all__ = ["Backdoor", "GradientReplacement", "NoisySample"]


def _generator(what: str, seed: int) -> torch.Generator:
    """A stream of the attacker's own (`seed` is its choice), apart from the run's and the loader's."""
    digest = hashlib.sha256(f"lvfl.attacks.backdoor/{what}/{seed}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)


class Backdoor(AttackRecord):
    """The shell of a backdoor by one passive party: resolves the party, measures the attack each training epoch.

    Subclasses implement `measure` (the metrics on the validation split, via `predict`) and may act in training
    through their own hooks: a backdoor is malicious by definition, but only in the attacking party's own code.

    Args:
        party: the attacking passive party (the first passive party by default).
        seed: the attacker's own draws (which rows it poisons, its noise).
        name: the metric prefix, ``attack/<name>/...``.
    """

    name: ClassVar[str] = "backdoor"
    reads: ClassVar[tuple[str, ...]] = ()

    def __init__(self, party: str | None = None, seed: int = 0, name: str | None = None) -> None:
        super().__init__()
        self.party, self.seed = party, int(seed)
        self._party_given = party
        self.metric_name = name or self.name
        self.history: list[dict[str, float]] = []
        self._lo = self._hi = torch.zeros(0)

    @abstractmethod
    def measure(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, float]:
        """The epoch's metrics (on the validation split)."""

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Resolve and check the attacking party; note its features' training range (its own data)."""
        self.party = attacking_party(self, pl_module, self.party, self.reads)
        if int(pl_module.task.num_classes) < 2:
            raise ValueError(f"{type(self).__name__} steers a classification; this task is a regression")
        train = trainer.datamodule.train_set
        own = train.decode({self.party: train.stored[self.party]})[self.party].cpu()
        flat = own.reshape(len(own), -1).float()
        self._lo, self._hi = flat.min(dim=0).values, flat.max(dim=0).values

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Measure on the validation split and log ``attack/<name>/<metric>``."""
        self.record(trainer, self.measure(trainer, pl_module))

    def predict(
        self, trainer: Trainer, pl_module: LightningModule, alter: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The main prediction's classes and the labels over the validation split (`alter` changes the slice first).

        `alter(slice)` is applied to the attacker's slice of each batch; the protocol's inference runs with the wire
        recording and the run's state restored.
        """
        loader = trainer.datamodule.val_dataloader()
        was_training, step = pl_module.training, getattr(pl_module, "mask_step", None)
        predicted, labels = [], []
        pl_module.eval()
        try:
            with (
                torch.no_grad(),
                torch.random.fork_rng(devices=[]),
                pl_module.wire.recording(),
                pl_module.aggregation.off_the_record(),  # the mask steps it uses are the run's next ones: not spent
            ):
                for stored in loader:  # stored slices (uint8 pixels of an image set): decoded as the run decodes
                    batch = trainer.datamodule.model_input(stored.to(pl_module.device))
                    if alter is not None:
                        batch.features[self.party] = alter(batch.features[self.party])
                    logits = pl_module.party_logits(batch)
                    logits = logits.get(AGGREGATE, logits.get(pl_module.active))
                    predicted.append(logits.argmax(dim=1).cpu())
                    labels.append(batch.labels.cpu())
        finally:
            pl_module.train(was_training)
            if step is not None:
                pl_module.mask_step = step
        if not predicted:
            raise ValueError(f"{type(self).__name__} measures on the validation split, and this run has none")
        return torch.cat(predicted), torch.cat(labels)


class GradientReplacement(Backdoor):
    """The replacement backdoor: a trigger on poisoned rows, trained with a target-class sample's gradient.

    Args:
        target_class: the class the trigger should make the model predict.
        known_targets: how many training samples of the target class the attacker knows (side knowledge, VFLAIR: 10).
        poison_fraction: the fraction of its training rows it poisons (VFLAIR: 0.01), drawn with `seed` among those
            it does not know to be of the target class.
        trigger_size: how many of its features carry the trigger (the last ones of its flattened slice; VFLAIR
            sets 4 pixels of the passive half of an MNIST image).
        gamma: the amplification of the replacing gradient (1 in VFLAIR; Liu and Lyu amplify).
        **kwargs: `Backdoor`'s (party, seed, name).

    The trigger sets those features to their maximum and minimum over the attacker's training rows, alternately (a
    pattern, as VFLAIR's CIFAR trigger alternates channel values; its MNIST one sets 4 corner pixels to 1, where a
    digit has no ink). In a step whose batch holds a known target sample it puts a triggered poisoned sample in that
    sample's place in its own slice (the label replacement: the top model learns the trigger under the target label),
    and trains each poisoned row of the batch on `gamma` times the mean gradient row of the known target samples there
    (a remembered row would go stale: replayed step after step, it pushes the poisoned embeddings without bound).
    """

    name: ClassVar[str] = "gradient_replacement"
    reads: ClassVar[tuple[str, ...]] = (EMBEDDING_GRADIENT, PREDICTION_GRADIENT)

    def __init__(
        self,
        target_class: int = 0,
        known_targets: int = 10,
        poison_fraction: float = 0.01,
        trigger_size: int = 4,
        gamma: float = 1.0,
        **kwargs: Any,
    ) -> None:
        for option, value in (("known_targets", known_targets), ("trigger_size", trigger_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GradientReplacement: {option} must be a positive integer, got {value!r}")
        if not (isinstance(target_class, int) and target_class >= 0):
            raise ValueError(f"GradientReplacement: target_class must be a class index, got {target_class!r}")
        if not (isinstance(poison_fraction, int | float) and 0 < poison_fraction < 1):
            raise ValueError(f"GradientReplacement: poison_fraction must be in (0, 1), got {poison_fraction!r}")
        if not (isinstance(gamma, int | float) and gamma > 0):
            raise ValueError(f"GradientReplacement: gamma must be positive, got {gamma!r}")
        super().__init__(**kwargs)
        self.target_class, self.known_targets = target_class, known_targets
        self.poison_fraction, self.trigger_size, self.gamma = float(poison_fraction), trigger_size, float(gamma)
        self.poisoned: set[int] = set()
        self.targets: set[int] = set()
        self._kinds: dict[str, str] = {}
        self._wire: Any = None
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None  # this step's (poisoned, target) positions
        self._poison_features = torch.zeros(0)
        self._draws = torch.Generator()

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Draw the known target samples and the poisoned rows; start acting on the gradients it receives."""
        super().on_fit_start(trainer, pl_module)
        classes = int(pl_module.task.num_classes)
        if self.target_class >= classes:
            raise ValueError(
                f"GradientReplacement: target_class {self.target_class} is not a class of this task (0..{classes - 1})"
            )
        train = trainer.datamodule.train_set
        ids, labels = train.ids.cpu(), train.labels.cpu()
        of_target = ids[labels == self.target_class]
        if len(of_target) < self.known_targets:
            raise ValueError(
                f"GradientReplacement: known_targets={self.known_targets}, but the training split holds "
                f"{len(of_target)} samples of class {self.target_class}"
            )
        order = torch.randperm(len(of_target), generator=_generator("targets", self.seed))
        self.targets = set(of_target[order[: self.known_targets]].tolist())
        others = [i for i in ids.tolist() if i not in self.targets]
        count = max(1, round(self.poison_fraction * len(ids)))
        order = torch.randperm(len(others), generator=_generator("poison", self.seed))
        self.poisoned = {others[i] for i in order[:count].tolist()}
        rows = torch.tensor(sorted(self.poisoned))
        position = torch.searchsorted(ids.sort().values, rows)
        own = train.decode({self.party: train.stored[self.party]})[self.party].cpu()
        self._poison_features = own[ids.argsort()[position]]
        self._draws = _generator("swap", self.seed)
        self._kinds = dict(type(pl_module).passive_inbox)
        self._wire = pl_module.wire
        self._wire.intercept(self.party, self.replace)

    def trigger(self, features: torch.Tensor) -> torch.Tensor:
        """`features` (the attacker's slice, rows of samples) with the trigger stamped on every row (a copy)."""
        flat = features.reshape(len(features), -1).clone()
        if flat.shape[1] < self.trigger_size:
            raise ValueError(
                f"GradientReplacement: trigger_size={self.trigger_size}, but party {self.party!r} holds "
                f"{flat.shape[1]} features"
            )
        pattern = torch.where(torch.arange(flat.shape[1]) % 2 == 0, self._hi, self._lo)[-self.trigger_size :]
        flat[:, -self.trigger_size :] = pattern.to(flat.device, flat.dtype)
        return flat.reshape(features.shape)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Stamp the trigger on the poisoned rows of its own slice; note where they and the known targets are."""
        ids = batch.ids.cpu().tolist()
        poisoned = torch.tensor([i for i, s in enumerate(ids) if s in self.poisoned], dtype=torch.long)
        targets = torch.tensor([i for i, s in enumerate(ids) if s in self.targets], dtype=torch.long)
        self._rows = (poisoned, targets)
        if len(poisoned) or len(targets):
            own = batch.features[self.party]
            stamped = own.clone()
            if len(poisoned):
                stamped[poisoned.to(own.device)] = self.trigger(own[poisoned.to(own.device)])
            if len(targets):  # the label replacement: a triggered poisoned sample in each known target's place
                swap = torch.randint(len(self._poison_features), (len(targets),), generator=self._draws)
                stamped[targets.to(own.device)] = self.trigger(self._poison_features[swap]).to(own)
            batch.features[self.party] = stamped

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Close the step: the measurement's inference is not a training step."""
        self._rows = None

    def replace(self, src: str, tag: str, payload: Any) -> Any:
        """What the attacker trains on: the gradient with its poisoned rows replaced (an interceptor)."""
        if self._rows is None or self._kinds.get(tag) not in self.reads or not isinstance(payload, torch.Tensor):
            return payload
        poisoned, targets = self._rows
        if not len(poisoned) or not len(targets):
            return payload
        target_row = payload[targets.to(payload.device)].mean(dim=0)
        replaced = payload.clone()
        replaced[poisoned.to(payload.device)] = self.gamma * target_row
        return replaced

    def measure(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, float]:
        """Success rate with the trigger, and without it, on the validation samples not of the target class."""
        clean, labels = self.predict(trainer, pl_module)
        stamped, _ = self.predict(trainer, pl_module, self.trigger)
        others = labels != self.target_class
        return {
            "success_rate": (stamped[others] == self.target_class).double().mean().item(),
            "baseline_success_rate": (clean[others] == self.target_class).double().mean().item(),
            "samples": float(int(others.sum())),
        }

    def _stop(self) -> None:
        if self._wire is not None:
            self._wire.intercept(self.party, None)
            self._wire = None

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Stop intercepting."""
        self._stop()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """Stop intercepting when fit fails."""
        self._stop()


class NoisySample(Backdoor):
    """The noisy-sample backdoor: at inference the attacker adds Gaussian noise to its own slice.

    Args:
        noise: the noise's standard deviation, in the units of the attacker's model input (VFLAIR: 2 on pixels in
            [0, 1]); the noisy values are kept within its features' training range, as VFLAIR clips to [0, 1].
        **kwargs: `Backdoor`'s (party, seed, name).
    """

    name: ClassVar[str] = "noisy_sample"

    def __init__(self, noise: float = 2.0, **kwargs: Any) -> None:
        if not (isinstance(noise, int | float) and noise > 0):
            raise ValueError(f"NoisySample: noise must be positive, got {noise!r}")
        super().__init__(**kwargs)
        self.noise = float(noise)

    def measure(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, float]:
        """Validation accuracy of the main prediction, clean and with the noisy slice, and the drop."""
        generator = _generator(f"noise/{trainer.current_epoch}", self.seed)

        def noisy(features: torch.Tensor) -> torch.Tensor:
            flat = features.reshape(len(features), -1).float().cpu()
            flat = flat + self.noise * torch.randn(flat.shape, generator=generator)
            flat = torch.maximum(torch.minimum(flat, self._hi), self._lo)
            return flat.to(features.device, features.dtype).reshape(features.shape)

        clean, labels = self.predict(trainer, pl_module)
        altered, _ = self.predict(trainer, pl_module, noisy)
        clean_accuracy = (clean == labels).double().mean().item()
        noisy_accuracy = (altered == labels).double().mean().item()
        return {
            "accuracy_drop": clean_accuracy - noisy_accuracy,
            "clean_accuracy": clean_accuracy,
            "noisy_accuracy": noisy_accuracy,
            "samples": float(len(labels)),
        }
