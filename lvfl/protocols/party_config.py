"""`PartyConfig`: how one party is built (its model, optimizer, LR scheduler and embedding noise), and its checks.

A config is data the CLI parses and checks before any protocol exists (`PartyConfig.check_optimization` also serves
`lvfl.commands`' error messages), so it lives apart from `VFLModule` (`lvfl.protocols.base`), which reads it when it
builds the parties. The helpers here name a config's classes in messages and tell whether a model takes the
datamodule's categorical columns.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn

from lvfl.models.base import PartyModelFactory
from lvfl.privacy.defenses.gradients import GradientDefense


@dataclass
class PartyConfig:
    """How one party is built: its model (class + init args) and its optimizer and optional LR scheduler.

    In YAML::

        - model: {class_path: lvfl.models.MLP, init_args: {hidden: [64]}}
          optimizer: {class_path: torch.optim.Adam, init_args: {lr: 0.001}}
          lr_scheduler: {class_path: torch.optim.lr_scheduler.ExponentialLR, init_args: {gamma: 0.95}}

    Without `optimizer`, the party uses SGD with lr 0.01 (the papers' MNIST setting). Schedulers step once per epoch.
    `embedding_noise` (e.g. ``{class_path: lvfl.privacy.GaussianNoise, init_args: {noise_multiplier: 0.2, clip: 5}}``)
    is the party's own noise on every embedding or prediction it sends (`VFLModule.outgoing`).

    The optimizer and scheduler are checked when the config is made, by building them once over a one-element
    probe parameter: a negative or non-finite learning rate (or any value the optimizer itself refuses) fails at
    start-up with the party's config in the message, not at the first training step with torch's bare message.
    """

    model: PartyModelFactory
    optimizer: OptimizerCallable | None = None
    lr_scheduler: LRSchedulerCallable | None = None
    #: noise the party adds to each embedding or prediction it sends (`VFLModule.outgoing`): a gradient defense's
    #: clip and noise on each sample's own row (`lvfl.privacy.GaussianNoise`, `LaplaceNoise`); None sends it as is
    embedding_noise: GradientDefense | None = None

    def __post_init__(self) -> None:
        if not callable(self.model):
            raise TypeError(f"party model must be a model class such as lvfl.models.MLP, got {self.model!r}")
        self.check_optimization(self.optimizer, self.lr_scheduler)

    @staticmethod
    def check_optimization(optimizer: OptimizerCallable | None, lr_scheduler: LRSchedulerCallable | None) -> None:
        """Build `optimizer` (and `lr_scheduler` on it) once over a probe parameter; raise ValueError naming them."""
        for name, value in (("optimizer", optimizer), ("lr_scheduler", lr_scheduler)):
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be a class path such as torch.optim.SGD, got {value!r}")
        probe = _make_optimizer(optimizer, [nn.Parameter(torch.zeros(1))])
        if lr_scheduler is not None:
            try:
                lr_scheduler(probe)
            except (ValueError, TypeError) as err:
                raise ValueError(f"lr_scheduler {callable_name(lr_scheduler)}: {err}") from err

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        """The party's optimizer over `params`; raises ValueError naming the optimizer for a refused setting."""
        return _make_optimizer(self.optimizer, params)


def _make_optimizer(optimizer: OptimizerCallable | None, params: Any) -> torch.optim.Optimizer:
    """`optimizer(params)` (SGD with lr 0.01 when None), refusing with the optimizer's name in the message."""
    if optimizer is None:
        return torch.optim.SGD(params, lr=0.01)
    what = f"optimizer {callable_name(optimizer)}"
    try:
        built = optimizer(params)
    except (ValueError, TypeError) as err:  # torch's "Invalid learning rate: -0.1" names neither party nor option
        raise ValueError(f"{what}: {err}") from err
    for group in built.param_groups:
        lr = group.get("lr")
        if isinstance(lr, (int, float)) and not 0 <= lr < float("inf"):  # NaN fails both comparisons
            raise ValueError(f"{what}: lr must be a finite number >= 0, got lr={lr!r}")
    return built


def accepts_categories(factory: Any) -> bool:
    """Whether a party-model factory (a class, a partial or jsonargparse's callable) takes a `categories` keyword."""
    target = factory
    for _ in range(4):  # unwrap partials and class-instantiating lambdas down to a class or function
        if isinstance(target, type):
            break
        inner = getattr(target, "func", None)
        classes = [a for a in getattr(target, "args", ()) if isinstance(a, type)]
        target = classes[-1] if classes else inner if inner is not None else target
        if inner is None and not classes:
            break
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False
    return "categories" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def callable_name(factory: Any) -> str:
    """`torch.optim.SGD` for a class, or for the partial that jsonargparse makes from a class path."""
    classes = [a for a in (factory, *getattr(factory, "args", ())) if isinstance(a, type)]  # partial(f, .., cls)
    target = classes[-1] if classes else getattr(factory, "func", factory)
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(name, str)):
        return repr(factory)
    # the shortest module that exports it: torch.optim.SGD rather than torch.optim.sgd.SGD
    parts = module.split(".")
    public = (".".join(parts[:i]) for i in range(1, len(parts)))
    module = next((m for m in public if getattr(sys.modules.get(m), name, None) is target), module)
    return f"{module}.{name}"
