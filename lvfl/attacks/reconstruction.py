"""Feature reconstruction by the active party: a generative regression network (Luo et al., arXiv 2010.10152).

Luo et al. ("Feature inference attack on model predictions in vertical federated learning", ICDE 2021) give the
active party the trained joint model (white-box: the paper's assumption, the model being released to it for
prediction) and the model's outputs on the samples; it trains a generator G(x_a, r) -> x_hat_p from its own
features x_a and noise r, so that the model on (x_a, x_hat_p) gives the outputs it observed:

    min_G  sum_i || f(x_a_i, G(x_a_i, r_i)) - v_i ||^2.

In SplitNN (concat fusion) the active party holds the top model and receives each passive party's embedding E_p;
`match="prediction"` fits the paper's objective on the joint model's class probabilities v; `match="embedding"`
fits h_p(G(x_a, r)) to the received E_p itself, which the active party of SplitNN holds anyway (a stronger
attacker in the same seat). The side knowledge is the passive party's trained bottom model h_p (white-box, as the
paper assumes) and the range the generator's output is scaled to (`feature_range`): by default each of the victim's
features' training minimum and maximum, declared as side knowledge (the paper's generator writes into the feature
domain it takes as known); or public bounds given as a pair, the same for every feature. The other passive parties'
embeddings enter as received.

It runs on the trained model at the end of training (every `every` epochs, and the last), on the training samples,
with copies of the models and the random streams restored, so the run itself is untouched. Metric
`attack/grn/mse`: the mean squared error per feature of the victim's (scaled) features, against `baseline_mse`,
the error of guessing each feature's mean (an attacker who knows the marginal means and nothing else), and
`random_mse`, the paper's random guess (uniform in each feature's range).
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any, ClassVar, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import nn

from lvfl.attacks.base import AttackRecord
from lvfl.attacks.fitting import fit_full_batch

__all__ = ["GenerativeRegression"]


def _frozen(module: nn.Module) -> nn.Module:
    """A copy of `module` on the CPU in evaluation mode with no parameter requiring a gradient (the run's untouched)."""
    copied = copy.deepcopy(module).cpu().eval()
    for p in copied.parameters():
        p.requires_grad_(False)
    return copied


class _Prediction(nn.Module):
    """The active party's prediction from every party's embedding, as `predict_from_fused` makes it, on copies."""

    def __init__(self, pl_module: Any) -> None:
        super().__init__()
        self.parties, self.active = list(pl_module.party_names), pl_module.active
        private = pl_module.private_head
        self.head = _frozen(private if private is not None else pl_module.top)
        defense = getattr(pl_module, "received_defense", None)
        self.defense = _frozen(defense) if defense is not None and private is None else None

    def forward(self, embeddings: dict[str, torch.Tensor]) -> torch.Tensor:
        """Class probabilities: the (private) top model on the concatenation, through the defense if there is one."""
        slots = [
            embeddings[k] if self.defense is None or k == self.active else self.defense(k, embeddings[k])
            for k in self.parties
        ]
        return self.head(torch.cat(slots, dim=1)).softmax(dim=1)


class GenerativeRegression(AttackRecord):
    """The active party reconstructs a passive party's features with a generative regression network (GRN).

    Args:
        victim: the passive party whose features it reconstructs (the first passive party by default).
        match: "prediction" (the paper: the joint model's class probabilities) or "embedding" (the received E_p).
        hidden: the generator's hidden widths (Luo et al. use a 3-layer MLP).
        steps: full-batch Adam steps to train it.
        lr: its learning rate.
        every: measure every this many epochs (and at the last); None: at the last epoch only.
        seed: the attacker's own draws (the generator's initialisation and noise).
        name: the metric prefix, ``attack/<name>/...``.
        feature_range: what the generator's output is scaled to: "victim" (side knowledge: each of the victim's
            features' training minimum and maximum) or [low, high] (public bounds, for every feature).
    """

    name: ClassVar[str] = "grn"

    def __init__(
        self,
        victim: str | None = None,
        match: Literal["prediction", "embedding"] = "prediction",
        hidden: tuple[int, ...] | list[int] = (600, 200, 100),
        steps: int = 500,
        lr: float = 1e-3,
        every: int | None = None,
        seed: int = 0,
        name: str | None = None,
        feature_range: Literal["victim"] | tuple[float, float] | list[float] = "victim",
    ) -> None:
        if feature_range != "victim":
            bounds = tuple(feature_range) if isinstance(feature_range, list | tuple) else ()
            if len(bounds) != 2 or not all(isinstance(b, int | float) for b in bounds) or not bounds[0] < bounds[1]:
                raise ValueError(
                    f"GenerativeRegression: feature_range must be 'victim' (side knowledge: the victim's training "
                    f"ranges) or [low, high] with low < high, got {feature_range!r}"
                )
            feature_range = (float(bounds[0]), float(bounds[1]))
        if match not in ("prediction", "embedding"):
            raise ValueError(f"GenerativeRegression: match must be 'prediction' or 'embedding', got {match!r}")
        if not (isinstance(steps, int) and steps >= 1) or not lr > 0:
            raise ValueError(f"GenerativeRegression: steps >= 1 and lr > 0, got {steps!r} and {lr!r}")
        if every is not None and not (isinstance(every, int) and every >= 1):
            raise ValueError(f"GenerativeRegression: every must be a positive integer or None, got {every!r}")
        if not all(isinstance(h, int) and h >= 1 for h in hidden):
            raise ValueError(f"GenerativeRegression: hidden must be positive widths, got {hidden!r}")
        super().__init__()
        self.victim, self.match, self.hidden = victim, match, tuple(hidden)
        self.steps, self.lr, self.every, self.seed = steps, float(lr), every, int(seed)
        self.feature_range = feature_range
        self._party_given = victim
        self.metric_name = name or self.name
        self.history: list[dict[str, float]] = []

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Check the seat: an active party with a top model over concatenated embeddings, a passive victim."""
        protocol = type(pl_module).__name__
        if getattr(pl_module, "top", None) is None or getattr(pl_module, "fusion", None) != "concat":
            raise ValueError(
                f"GenerativeRegression does not apply to {protocol}: it needs the active party's top model over each "
                "passive party's embedding as received (SplitNN with fusion: concat)"
            )
        passive = list(pl_module.passive)
        victim = self.victim if self.victim is not None else passive[0]
        if victim not in passive:
            raise ValueError(f"GenerativeRegression: victim must be a passive party ({passive}), got {victim!r}")
        self.victim = victim

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Reconstruct on the trained model when this epoch is measured."""
        epoch = trainer.current_epoch
        last = trainer.max_epochs is not None and epoch + 1 >= trainer.max_epochs
        if not (last or (self.every is not None and (epoch + 1) % self.every == 0)):
            return
        with torch.random.fork_rng(devices=[]):
            self.record(trainer, self.reconstruct(trainer, pl_module))

    def observed(self, target: torch.Tensor) -> torch.Tensor:
        """What the generator is fit to, one row per training sample (the seam a test cuts)."""
        return target

    def reconstruct(self, trainer: Trainer, pl_module: Any) -> dict[str, float]:
        """Train the generator on the training samples; its error on them, and the mean-guess baseline."""
        train = trainer.datamodule.train_set
        active, victim = pl_module.active, str(self.victim)
        features = train.decode(dict(train.stored))
        if not features[victim].is_floating_point():
            raise ValueError(
                f"GenerativeRegression reconstructs numeric features; party {victim!r}'s model input is "
                f"{features[victim].dtype} (category codes)"
            )
        x_a = features[active].float().cpu()
        truth = features[victim].float().cpu()
        flat = truth.reshape(len(truth), -1)
        if self.feature_range == "victim":  # declared side knowledge: the victim's own training ranges
            lo, hi = flat.min(dim=0).values, flat.max(dim=0).values
        else:  # public bounds: nothing of the victim's data
            lo, hi = (torch.full((flat.shape[1],), bound) for bound in self.feature_range)
        encoders = {k: _frozen(pl_module.party_models[k].encoder) for k in pl_module.party_names}
        predict = _Prediction(pl_module)
        with torch.no_grad():
            received = {k: encoders[k](features[k].cpu()) for k in pl_module.party_names}
            observed = predict(received) if self.match == "prediction" else None
        digest = hashlib.sha256(f"lvfl.attacks.grn/{self.seed}".encode()).digest()
        torch.manual_seed(int.from_bytes(digest[:8], "big") >> 1)
        noise = torch.rand(flat.shape)
        widths = [x_a.reshape(len(x_a), -1).shape[1] + flat.shape[1], *self.hidden, flat.shape[1]]
        layers: list[nn.Module] = []
        for a, b in zip(widths[:-1], widths[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU()]
        generator = nn.Sequential(*layers[:-1], nn.Sigmoid())
        inputs = torch.cat([x_a.reshape(len(x_a), -1), noise], dim=1)

        class Joint(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.generator = generator

            def forward(self, z: torch.Tensor) -> torch.Tensor:
                guess = (lo + (hi - lo) * self.generator(z)).reshape(truth.shape)
                own = encoders[victim](guess)
                if observed is None:
                    return own
                return predict({**received, victim: own})

        joint = Joint()
        target = self.observed(received[victim] if observed is None else observed)
        fit_full_batch(joint, inputs, target, nn.functional.mse_loss, self.steps, self.lr, 0.0)
        with torch.no_grad():
            guess = lo + (hi - lo) * generator(inputs)
        return {
            "mse": (guess - flat).pow(2).mean().item(),
            "baseline_mse": (flat.mean(dim=0, keepdim=True) - flat).pow(2).mean().item(),
            # Luo et al.'s random guess, uniform in each feature's range: E(U - x)^2 = Var U + (E U - x)^2
            "random_mse": ((hi - lo).pow(2) / 12 + ((lo + hi) / 2 - flat).pow(2)).mean().item(),
            "samples": float(len(flat)),
        }
