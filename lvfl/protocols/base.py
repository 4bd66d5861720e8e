"""`VFLModule`: the base every protocol builds on.

It turns the datamodule's `party_specs` into one model, optimizer and (optional) LR scheduler per party, owns the
`Wire` and the aggregation backend, keeps the mask step counter, and logs per-party metrics. A protocol subclass
writes its `training_step` (and, if its inference differs, `party_logits`) in the order of the paper's algorithm.

Manual optimization is used throughout: each party owns its optimizer, as the papers require heterogeneous
optimizers (VFedMH Table IV). A step does one backward pass over a surrogate objective in which every party's
graph touches only that party's parameters (everything that crossed the wire arrives detached), so each party's
gradient is exactly its own loss gradient, and Lightning's DDP sees one backward per forward.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F  # noqa: N812
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch import nn

from lvfl import messages
from lvfl.loggers import is_logging_step, log_to_loggers
from lvfl.models.base import PartyModelFactory
from lvfl.parties import PartySpec, TaskInfo, VFLBatch
from lvfl.privacy.base import AggregationBackend
from lvfl.privacy.gradient_defenses import GradientDefense
from lvfl.privacy.label_dp import LabelMechanism, PrivacyLedger
from lvfl.privacy.label_release import LabelRelease
from lvfl.privacy.plain import Plain
from lvfl.protocols.task_metrics import (
    BEST_EPOCHS_METRIC,
    main_validation_metric,
    make_metric,
    metric_names,
    update_metric,
)
from lvfl.shadows import empty_shadow
from lvfl.wire import Absent, Wire, is_shadow, shadow


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
                raise ValueError(f"lr_scheduler {_callable_name(lr_scheduler)}: {err}") from err

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        """The party's optimizer over `params`; raises ValueError naming the optimizer for a refused setting."""
        return _make_optimizer(self.optimizer, params)


def _make_optimizer(optimizer: OptimizerCallable | None, params: Any) -> torch.optim.Optimizer:
    """`optimizer(params)` (SGD with lr 0.01 when None), refusing with the optimizer's name in the message."""
    if optimizer is None:
        return torch.optim.SGD(params, lr=0.01)
    what = f"optimizer {_callable_name(optimizer)}"
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


def _callable_name(factory: Any) -> str:
    """`torch.optim.SGD` for a class, or for the partial that jsonargparse makes from a class path."""
    classes = [a for a in (factory, *getattr(factory, "args", ())) if isinstance(a, type)]  # partial(f, .., cls)
    target = classes[-1] if classes else getattr(factory, "func", factory)
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(name, str)):
        return repr(factory)
    import sys  # the shortest module that exports it: torch.optim.SGD rather than torch.optim.sgd.SGD

    parts = module.split(".")
    public = (".".join(parts[:i]) for i in range(1, len(parts)))
    module = next((m for m in public if getattr(sys.modules.get(m), name, None) is target), module)
    return f"{module}.{name}"


def describe_setup(metrics: Mapping[str, float]) -> str:
    """One line on the PSI's counts (`setup/psi/...`): each list, each pairwise overlap, the common intersection."""
    prefix = "setup/psi/"
    counts = {k[len(prefix) :]: int(v) for k, v in metrics.items() if k.startswith(prefix)}
    parties = sorted({k.split("/")[0] for k in counts if "/" in k})
    parts = []
    for party in parties:
        shared = counts.get(f"{party}/shared_with_active")
        part = f"{party} {counts.get(f'{party}/ids', 0):,} IDs"
        parts.append(part + (f" ({shared:,} shared with the active party)" if shared is not None else ""))
    return f"lvfl: PSI: {'; '.join(parts)}; every party holds {counts.get('intersection', 0):,}"


class VFLModule(LightningModule, ABC):
    """Base LightningModule for VFL protocols: one model, optimizer and scheduler per party, one wire.

    Args:
        parties: one `PartyConfig` per participating party, in the datamodule's party order, or a single entry
            used for every party (homogeneous models).
        aggregation: the aggregation backend protecting passive embeddings (default `Plain`).
        embedding_dim: the size of every party's embedding (they are averaged, so all parties share it).
        label_mechanism: a label-DP mechanism (`lvfl.privacy.RandomizedResponse`, `LaplaceLabels`); when set,
            every model whose outputs, gradients or parameters leave the active party trains against protected
            labels drawn once for the run (`labels_for`), and only a private head sees the true labels.
        gradient_defense: what the active party does to every gradient it sends a passive party
            (`lvfl.privacy.GaussianNoise`, `LaplaceNoise`, `GradientSparsification`), in `gradient_down`; None sends
            the gradient as computed. Its noise is drawn from OS randomness, so a run with one is not reproducible.

    Label privacy covers a passive party's whole view. With a mechanism, every message that leaves the active party
    (global embedding, gradients, top-model parameters, labels, predictions) must be a function of the release, the
    active party's features and what the passive parties sent, never of the true training labels; then everything a
    passive party receives is post-processing of the epsilon-label-DP release and epsilon bounds what it can learn
    about any training label. The view includes what is fixed before training: the split and the overlap draw are
    label-free (`prepare_datamodule` asks the datamodule for it, `VerticalDataModule.require_label_free_split`), and
    a passive party's scaling and encoders follow from them. The rule is built into the two label accessors:

    - `labels_for(party, batch)` is the release for *every* party, the active one included: it is what any model
      whose outputs or parameters go down (the active party's encoder, a top model, logits that enter an
      aggregate) trains against;
    - `private_labels(batch)` is the true labels; only models whose outputs never leave the active party may use
      them: the `private_head` (built by a protocol when `protects_labels`), which reads a *detached* input
      (`private_loss`) and gives the active party's reported predictions (`active_prediction`), or a model no
      message depends on (PraVFed's active party, which sends nothing).

    A protocol that cannot satisfy the rule must refuse the mechanism. Tests check every protocol by a
    counterfactual: same seeds, same release, different true labels, and every message a passive party receives
    is bit-identical (`tests/test_label_view.py`).

    The release is drawn once per training sample at the start of fit (one `PrivacyLedger` entry, tag "train";
    redrawing per step would spend epsilon again every epoch), kept in a lookup by sample ID, and checkpointed with
    the ledger, so a resume reuses the release. Under DDP every rank holds all parties: rank 0 draws the release and
    broadcasts it (the mechanism's generator is OS-seeded per process by default, so ranks could not derive the same
    draw), and every rank records the one release. Validation and test labels are never released: they are used only
    by the active party's metrics (and so by any model selection on them, e.g. `lvfl bench`'s best-validation rule).
    """

    #: what a passive party receives under each training tag (`lvfl.messages`): attacks apply by it. Public, as the
    #: protocol's code is. A protocol that sends a passive party anything during training declares it here.
    passive_inbox: ClassVar[Mapping[str, str]] = {
        "keys": messages.SETUP,
        "split": messages.SETUP,
        "best_epoch": messages.CONTROL,
    }

    def __init__(
        self,
        parties: list[PartyConfig],
        aggregation: AggregationBackend | None = None,
        embedding_dim: int = 64,
        label_mechanism: LabelMechanism | None = None,
        gradient_defense: GradientDefense | None = None,
    ) -> None:
        super().__init__()
        if not parties:
            raise ValueError("model.parties is empty: give one PartyConfig per party, or one for all parties")
        if embedding_dim < 1:
            raise ValueError(f"model.embedding_dim must be >= 1, got {embedding_dim}")
        self.automatic_optimization = False
        self.party_configs = list(parties)
        self.aggregation = aggregation if aggregation is not None else Plain()
        self.embedding_dim = embedding_dim
        self.label_mechanism = label_mechanism
        self.gradient_defense = gradient_defense
        self.label_release = LabelRelease(label_mechanism)
        self.wire = Wire()
        self._prediction_recipient: str | None = None  # set by `predictions_delivered_to` (a teacher's inference)
        self._dropout_seed: int | None = None  # each party's dropout stream derives from it (`use_party_generators`)
        self._party_generators: dict[str, Any] = {}
        self.mask_step = 0
        self.party_specs: list[PartySpec] = []
        self.task: TaskInfo | None = None
        self.party_models = nn.ModuleDict()
        self.private_head: nn.Module | None = None  # the active party's true-label head (see `protects_labels`)
        self.metrics = nn.ModuleDict()
        self._train_loss_sum: torch.Tensor | None = None
        self._train_loss_count = 0
        self._train_loss_names: list[str] = []
        #: the best validation value so far (active party) and how many epochs set a new best (`share_best_epoch`)
        self._best_epoch: dict[str, Any] = {"value": None, "count": 0}

    def _apply(self, fn: Any, recurse: bool = True) -> VFLModule:
        """Moves and casts (`.to`, `.cpu`, `.half`) pass over shadows: another party's model stays a shadow.

        In a party's view (docs/federation.md) every other party's parameters live on the meta device; Lightning
        moves the module to its device at fit start and back at teardown, which a meta tensor cannot do.
        """
        return super()._apply(lambda t: t if t.device.type == "meta" else fn(t), recurse)

    # ------------------------------------------------------------------------------------------------ building
    @property
    def built(self) -> bool:
        """Whether party models exist (after `setup` or `build`)."""
        return len(self.party_models) > 0

    @property
    def party_names(self) -> list[str]:
        """Participating parties, in datamodule order."""
        return [s.name for s in self.party_specs]

    @property
    def active(self) -> str:
        """The name of the active (label-holding) party."""
        return next(s.name for s in self.party_specs if s.is_active)

    @property
    def passive(self) -> list[str]:
        """The names of the passive parties."""
        return [s.name for s in self.party_specs if not s.is_active]

    @property
    def num_parties(self) -> int:
        """C: the number of parties whose embeddings are averaged."""
        return len(self.party_specs)

    def setup(self, stage: str) -> None:
        """Build the parties from the trainer's datamodule (once; resumes keep the built models)."""
        if self.built:
            return
        dm = getattr(self.trainer, "datamodule", None)
        if dm is None or not hasattr(type(dm), "party_specs"):  # on the class: reading the property would prepare it
            raise ValueError("lvfl protocols need a VerticalDataModule (data:) that provides party_specs and task")
        self.check_backend()  # a refused backend is refused before anything crosses the wire
        self.prepare_datamodule(dm)
        for src, dst, payload, tag in self.setup_messages(dm):
            self.wire.send(src, dst, payload, tag)  # the datamodule's own exchange (PSI, the split), first
        self.report_setup(dm, stage)
        self.build(dm.party_specs, dm.task, rank=self.trainer.global_rank)
        if self.wire.here is not None:  # a party's own process (docs/federation.md): keep only what it holds
            if hasattr(dm, "hold_only"):  # an HE backend's coordinator holds no party's data
                dm.hold_only(self.wire.here if self.wire.here in self.party_names else None)
            self.hold_only(self.wire.here)

    def prepare_datamodule(self, datamodule: Any) -> None:
        """Tell `datamodule` what this protocol needs before it prepares: a label-free split with a label mechanism.

        `setup` calls it; so does code that sets a datamodule up before the trainer does (`lvfl predict`, `lvfl
        export`). A datamodule prepared earlier with a split drawn from the labels is refused by name.
        """
        if self.wire.here is not None and hasattr(datamodule, "exchange_on"):
            datamodule.exchange_on(self.wire)  # a party's own process: the data's set-up exchanges run live
        if self.label_mechanism is not None and hasattr(datamodule, "require_label_free_split"):
            mechanism = type(self.label_mechanism).__name__
            datamodule.require_label_free_split(f"the protocol's label mechanism ({mechanism})")

    def setup_messages(self, datamodule: Any) -> list[tuple[str, str, Any, str]]:
        """The datamodule's set-up messages (`VerticalDataModule.setup_messages`) this protocol puts on its wire."""
        return list(datamodule.setup_messages()) if hasattr(datamodule, "setup_messages") else []

    def report_setup(self, datamodule: Any, stage: str) -> None:
        """Log what the datamodule's set-up established (`setup_metrics`: the PSI's counts) and, in fit, print it."""
        metrics = datamodule.setup_metrics() if hasattr(datamodule, "setup_metrics") else {}
        if not metrics or self._trainer is None:
            return
        log_to_loggers(self._trainer, metrics)
        if stage == "fit" and self._trainer.is_global_zero:
            print(describe_setup(metrics))

    def build(self, party_specs: Sequence[PartySpec], task: TaskInfo, rank: int = 0) -> None:
        """Create every party's model and metrics and run the backend's key set-up on the wire."""
        specs = list(party_specs)
        if sum(s.is_active for s in specs) != 1:
            raise ValueError(f"exactly one party must be active, got roles {[s.role for s in specs]}")
        if self.label_mechanism is not None:
            self.label_mechanism.check_task(task.num_classes, task.kind)
        configs = self.party_configs
        if len(configs) == 1:
            configs = configs * len(specs)
        if len(configs) != len(specs):
            raise ValueError(
                f"model.parties has {len(self.party_configs)} entries but the datamodule has {len(specs)} parties "
                f"({[s.name for s in specs]}); give one entry per party, or a single entry for all"
            )
        self.party_specs = specs
        self.task = task
        self._configs = dict(zip([s.name for s in specs], configs, strict=True))
        for spec, cfg in zip(specs, configs, strict=True):
            self.party_models[spec.name] = self.build_party_model(spec, cfg)
        for stage in ("val", "test"):
            for name in self.predicting_parties:
                for metric in metric_names(task):
                    self.metrics[f"{stage}_{metric}_{name}"] = make_metric(task, metric)
        self.check_backend()
        self.aggregation.setup(self.party_specs, self.active, self.wire, rank=rank)

    def build_party_model(self, spec: PartySpec, config: PartyConfig) -> nn.Module:
        """Party `spec`'s model from its config (protocols that use only part of it, e.g. the encoder, override)."""
        if self.task is None:
            raise RuntimeError("build_party_model is called by build(), after the task is known")
        if spec.categories:  # categorical columns: only a model that takes `categories` can read them
            if not accepts_categories(config.model):
                raise ValueError(
                    f"party {spec.name!r} holds categorical columns (cardinalities {list(spec.categories)}), but its "
                    f"model {_callable_name(config.model)} takes no `categories`: use lvfl.models.TabularMLP, DeepFM "
                    "or WideDeep, or a datamodule that one-hot encodes"
                )
            configured = (getattr(config.model, "keywords", None) or {}).get("categories")
            if configured and tuple(configured) != tuple(spec.categories):
                raise ValueError(
                    f"party {spec.name}'s model sets categories={list(configured)}, but the datamodule describes "
                    f"{list(spec.categories)}; leave categories out of the config (the datamodule supplies it)"
                )
            try:
                return config.model(
                    tuple(spec.input_shape), self.embedding_dim, self.task.num_outputs, categories=spec.categories
                )
            except (ValueError, TypeError) as err:
                raise type(err)(f"party {spec.name!r}'s model: {err}") from err
        try:
            return config.model(tuple(spec.input_shape), self.embedding_dim, self.task.num_outputs)
        except (ValueError, TypeError) as err:  # a bad model hyperparameter: say whose model it is
            raise type(err)(f"party {spec.name!r}'s model: {err}") from err

    @property
    def predicting_parties(self) -> list[str]:
        """Parties whose own model makes predictions and gets metrics (EASTER: all; split learning: the active)."""
        return self.party_names

    def party_parameters(self, party: str) -> list[nn.Parameter]:
        """The parameters `party` owns and its optimizer updates (protocols add e.g. the active party's top model).

        The active party's optimizer also updates its `private_head`, when there is one.
        """
        params = list(self.party_models[party].parameters())
        if party == self.active and self.private_head is not None:
            params += list(self.private_head.parameters())
        return params

    def hold_only(self, party: str) -> None:
        """Turn every parameter and buffer `party` does not own into a shadow: `party`'s own process holds no more.

        Ownership is what the protocol already declares for its optimizers (`party_parameters`); a party model's
        buffers go with it, and a submodule's buffers with its parameters. The weights kept are the ones built from
        the public config and seed, as in simulation (docs/federation.md).
        """
        coordinator = self.aggregation.coordinator  # an HE backend's key holder: no model, no data
        if party not in self.party_names and party != coordinator:
            known = self.party_names + ([coordinator] if coordinator else [])
            raise ValueError(f"there is no party {party!r} in this run (parties: {known})")
        others = {id(p) for name in self.party_names if name != party for p in self.party_parameters(name)}
        for name in self.party_names:  # a model without parameters still holds its party's buffers
            if name != party:
                self.party_models[name].to("meta")
        for submodule in self.modules():
            direct = dict(submodule.named_parameters(recurse=False))
            if not any(id(p) in others for p in direct.values()):
                continue
            for pname, p in direct.items():
                if id(p) in others:
                    submodule._parameters[pname] = nn.Parameter(shadow(p), requires_grad=p.requires_grad)
            for bname, b in submodule.named_buffers(recurse=False):
                if b is not None:
                    submodule._buffers[bname] = shadow(b)

    def check_backend(self) -> None:
        """Refuse backends that make no sense for this protocol (override in protocols that restrict them).

        Overrides decide from the backend's declared capabilities (`lvfl.privacy.base`), through `require_backend`,
        never from its class.
        """

    def require_backend(self, reason: str, **capabilities: bool) -> None:
        """Refuse `self.aggregation` unless it declares each of `capabilities` (e.g. `reveals_shares=True`).

        `reason` is the protocol's message; `{backend}` in it is replaced by the backend's class name, and the
        message ends with what the backend declares and what this protocol needs.

        Raises:
            ValueError: if a declared capability differs from the one required.
        """
        backend = self.aggregation
        name = type(backend).__name__
        lacking = {key: want for key, want in capabilities.items() if getattr(backend, key) != want}
        if lacking:
            declared = ", ".join(f"{key}={getattr(backend, key)!r}" for key in lacking)
            needed = ", ".join(f"{key}={want!r}" for key, want in lacking.items())
            raise ValueError(f"{reason.format(backend=name)} ({name} declares {declared}; this needs {needed})")

    # ------------------------------------------------------------------------------------------------ optimizers
    def configure_optimizers(self) -> Any:
        """One optimizer (and optional scheduler) per party, in `party_names` order."""
        if not self.built:
            raise RuntimeError("configure_optimizers was called before the parties were built (setup/build)")
        optimizers, schedulers = [], []
        for name in self.party_names:
            cfg = self._configs[name]
            opt = cfg.make_optimizer(self.party_parameters(name))
            optimizers.append(opt)
            if cfg.lr_scheduler is not None:
                schedulers.append({"scheduler": cfg.lr_scheduler(opt), "interval": "epoch", "name": f"lr/{name}"})
        return optimizers, schedulers

    def party_optimizers(self) -> dict[str, Any]:
        """Optimizers keyed by party."""
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        return dict(zip(self.party_names, opts, strict=True))

    def on_train_epoch_end(self) -> None:
        """Step per-party schedulers (manual optimization leaves this to us) and log the epoch's mean losses."""
        scheds = self.lr_schedulers()
        if scheds is not None:
            for s in scheds if isinstance(scheds, list) else [scheds]:
                s.step()
        metrics: dict[str, float] = {}
        if self._train_loss_sum is not None and self._train_loss_count:
            means = self._train_loss_sum / self._train_loss_count
            if self.trainer.world_size > 1:
                means = self.trainer.strategy.reduce(means, reduce_op="mean")
            names = [f"train/loss_epoch/{n}" for n in self._train_loss_names]
            metrics.update(zip(names, means.tolist(), strict=True))
        if (self.label_mechanism is not None or len(self.privacy_ledger)) and self.wire.holds(self.active):
            metrics["privacy/label_epsilon"] = self.privacy_ledger.total_epsilon  # basic composition, all releases
        if metrics:
            log_to_loggers(self.trainer, metrics, epoch=True)
        self._train_loss_sum, self._train_loss_count = None, 0

    # ------------------------------------------------------------------------------------------------ the shared moves
    def next_mask_step(self) -> int:
        """A fresh mask step for each aggregation, so no mask stream is ever reused (it is checkpointed)."""
        step = self.mask_step
        self.mask_step += 1
        return step

    def local_embeddings(self, batch: VFLBatch) -> dict[str, torch.Tensor]:
        """Every party embeds its own feature slice with its encoder, locally (no message).

        In a party's own process another party's embedding is a shadow of the shape its encoder gives, worked out
        once per input shape (`shadow_call`) rather than by running the encoder on the meta device every step.
        """
        return {k: self.party_call(k, "encoder", batch.features[k]) for k in self.party_names}

    def involves(self, *parties: str) -> bool:
        """Whether any of `parties`' computations run in this process (always in simulation).

        A step may skip a term that only other parties compute and exchange between themselves: in a party's own
        process it would only work out shadows that nothing here reads (their messages do not pass through it).
        """
        return any(self.wire.holds(p) for p in parties)

    def party_call(self, party: str, part: str, x: torch.Tensor) -> torch.Tensor:
        """`party_models[party].<part>(x)` where `party` is held; elsewhere its shadow (`shadow_call`)."""
        if self.wire.holds(party):
            return getattr(self.party_models[party], part)(x)
        return self.shadow_call(party, part, x)

    def shadow_call(self, party: str, part: str, x: torch.Tensor) -> torch.Tensor:
        """The shadow of `party_models[party].<part>(x)` for another party's shadow input `x`, from a cache.

        Only for another party's model, through which this process never takes a gradient (that party's terms are
        its own process's): the shadow is a fresh leaf with the output's dtype, shape and `requires_grad`, found by
        running the module on the meta device the first time an input of this shape (and grad mode) comes; meta
        kernels cost milliseconds per layer in Python.
        """
        cache = self.__dict__.setdefault("_shadow_shapes", {})
        key = (party, part, tuple(x.shape), x.dtype, torch.is_grad_enabled())
        if key not in cache:
            out = getattr(self.party_models[party], part)(x)
            cache[key] = (tuple(out.shape), out.dtype, out.requires_grad)
        shape, dtype, requires_grad = cache[key]
        return empty_shadow(shape, dtype, requires_grad)

    def begin_step(self) -> dict[str, Any]:
        """Clear every party's gradients; returns the optimizers keyed by party (for `end_step`)."""
        optimizers = self.party_optimizers()
        for party, opt in optimizers.items():
            if self.wire.holds(party):  # another party's parameters (shadows) never have a gradient here
                opt.zero_grad(set_to_none=True)
        return optimizers

    def end_step(self, optimizers: Mapping[str, Any], surrogate: Sequence[torch.Tensor]) -> None:
        """One backward pass over the sum of the surrogate terms, then every party's optimizer steps.

        Each term reaches only its own party's parameters (everything that crossed the wire is detached), so every
        party gets exactly its own loss gradient, and DDP sees one backward per forward.
        """
        held = [term for term in surrogate if not is_shadow(term)]  # a party's view holds its own terms only
        if held:
            self.manual_backward(torch.stack(held).sum())
        for party, opt in optimizers.items():
            self.step_optimizer(party, opt)

    def step_optimizer(self, party: str, optimizer: Any) -> None:
        """`optimizer.step()` for `party`'s optimizer where `party` is held; elsewhere the step is only counted.

        Another party's parameters are shadows with no gradient, so its optimizer would leave them as they are and
        keep no state; counting its step keeps the trainer's step count (`global_step`, in the checkpoint) the
        simulation's, without the cost of Lightning's optimizer step in every process.
        """
        if self.wire.holds(party) or not isinstance(optimizer, LightningOptimizer):
            optimizer.step()
            return
        optimizer._on_before_step()  # what `LightningOptimizer.step` does around the strategy's step: the count
        optimizer._on_after_step()

    def gradient_down(self, party: str, output: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """Send dloss/d`output` (computed at the active party) down to `party`; returns party's surrogate term.

        `<output, grad>` has the gradient `grad` in `output`, so its gradient in the party's parameters is exactly
        the loss gradient the party would get by backpropagating through the wire.
        """
        if self.gradient_defense is not None and self.wire.holds(self.active):
            grad = self.gradient_defense.apply(grad)  # what goes down, and so what party k trains on
        received = self.wire.send(self.active, party, grad, "gradients")
        if not self.wire.holds(party):  # another party's term: its shadow
            return empty_shadow((), grad.dtype)
        return (output * received).sum()

    def outgoing(self, party: str, tensor: torch.Tensor) -> torch.Tensor:
        """What `party` puts into a message (or an aggregate) of its embedding or prediction `tensor`.

        With the party's `embedding_noise` (its `PartyConfig`'s), each sample's row clipped and noised where the party
        is held (the noise is its own, drawn in its process), in training and evaluation alike: everything it sends
        is noised. It protects what the row says about the party's features against whoever receives it (or an
        aggregate with it); the party trains its own model on its clean output.
        """
        noise = self._configs[party].embedding_noise if party in getattr(self, "_configs", {}) else None
        if noise is None or not self.wire.holds(party) or is_shadow(tensor):
            return tensor
        return noise.apply_per_sample(tensor.detach()).to(tensor.dtype)

    def aggregate_embeddings(self, local: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Passive shares up the wire, combined at the active party: returns E_a + sum_k E_k (not divided)."""
        if self.training:
            self.check_finite(local, "embedding")
        step = self.next_mask_step()
        shares = {
            k: self.wire.send(
                k, self.active, self.protected(k, self.outgoing(k, local[k].detach()), step), "embeddings"
            )
            for k in self.passive
        }
        return self.combined(self.outgoing(self.active, local[self.active].detach()), shares)

    def combined(self, active_tensor: torch.Tensor, shares: Mapping[str, Any]) -> torch.Tensor:
        """`aggregation.combine` at the active party; elsewhere the shadow of the sum (`active_tensor`'s shape)."""
        coordinator = self.aggregation.coordinator  # an HE backend's key holder runs its part of `combine` too
        if not self.wire.holds(self.active) and not (coordinator is not None and self.wire.holds(coordinator)):
            return shadow(active_tensor).requires_grad_(active_tensor.requires_grad)  # as differentiable as the sum
        return self.aggregation.combine(active_tensor, shares)

    def protected(self, party: str, tensor: torch.Tensor, step: int, index: int = 0) -> Any:
        """`aggregation.protect(party, ...)` where `party` is held; elsewhere the shadow of its share."""
        if self.wire.holds(party):
            return self.aggregation.protect(party, tensor, step, index)
        return shadow(tensor) if self.aggregation.reveals_shares else Absent("a protected share")

    @property
    def protects_labels(self) -> bool:
        """Whether a label mechanism is on and there is a passive party whose view it must cover."""
        return self.label_mechanism is not None and bool(self.passive)

    def labels_for(self, party: str, batch: VFLBatch) -> torch.Tensor:
        """The labels of a loss whose outputs, gradients or parameters may leave the active party (any `party`).

        With a label mechanism this is the release for every party, the active one included (its encoder's output
        or its top model's parameters go down, so they must not learn from the true labels); without one, the true
        labels. True labels are only for models nothing leaves: see `private_labels`.
        """
        if not self.protects_labels:
            return batch.labels
        return self.protected_labels(batch.ids).to(batch.labels.device)

    def private_labels(self, batch: VFLBatch) -> torch.Tensor:
        """The true labels, for the `private_head` (via `private_loss`) and models no message ever depends on."""
        return batch.labels

    def private_loss(self, inputs: torch.Tensor, batch: VFLBatch) -> torch.Tensor:
        """The private head's true-label loss on a *detached* input, so it trains the private head and nothing else."""
        if self.private_head is None:
            raise RuntimeError("private_loss needs a private head: protocols build one when protects_labels")
        return self.task_loss(self.private_head(inputs.detach()), self.private_labels(batch))

    def active_prediction(self, shared_head: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        """The active party's reported prediction on `inputs`: its private head if it has one, else `shared_head`."""
        return (shared_head if self.private_head is None else self.private_head)(inputs)

    def check_finite(
        self, values: Mapping[str, torch.Tensor], what: str, context: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        """Stop the run when a party's `what` (loss, embedding) is NaN or infinite, naming the party and the step.

        One fused check (a single host sync per call); the per-party search runs only on failure. The message lists
        the largest magnitudes of the finite `values`, or of `context` (e.g. the embeddings behind one joint loss),
        because a diverging party can stay finite while the NaN it causes appears elsewhere.
        """
        values = {k: v for k, v in values.items() if not is_shadow(v)}  # a party's view checks what it holds
        if not values:
            return
        flags = torch.stack([torch.isfinite(v.detach()).all() for v in values.values()])
        if bool(flags.all()):
            return
        bad = [k for k, ok in zip(values, flags.tolist(), strict=True) if not ok]
        trainer = self._trainer
        # batches, not optimizer steps: under manual optimization global_step counts every party's optimizer
        step = trainer.fit_loop.epoch_loop.total_batch_idx if trainer is not None else None
        epoch = trainer.current_epoch if trainer is not None else None
        # a diverging party can stay finite while the NaN it caused appears elsewhere (through a shared top model):
        # the finite parties' largest magnitudes point at it
        source, label = (values, what) if context is None else (context, "inputs")
        finite = {
            k: float(v.detach().abs().max()) for k, v in source.items() if v.numel() and bool(torch.isfinite(v).all())
        }
        hint = ", ".join(f"{k} {m:.3g}" for k, m in sorted(finite.items(), key=lambda kv: -kv[1]))
        raise FloatingPointError(
            f"party {bad[0]!r}: non-finite {what} (NaN or inf) at training step {step} (epoch {epoch})"
            + (f"; also {bad[1:]}" if len(bad) > 1 else "")
            + (f"; largest |{label}| of the finite parties: {hint}" if hint else "")
            + ": a party's model diverged or its features hold NaN/inf; lower its learning rate or check its data"
        )

    def task_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy against class indices (VFedMH Eq. 8); MSE against noisy one-hot rows (PraVFed Eq. 4).

        A regression task: MSE of the outputs (shape (N, 1)) against the standardized targets.

        Float labels of shape (N, M) are a `LaplaceLabels` release. Soft-target cross-entropy does not fit them:
        their entries go negative, and -y'_j log p_j with y'_j < 0 is unbounded below (it rewards p_j -> 0 without
        limit on noise drawn once per sample). The paper's 1/(2N) ||softmax(R) - Y'||^2 is bounded below and its
        gradient is linear in Y', so in expectation over the noise it equals the gradient against the one-hot label.
        """
        if is_shadow(logits):  # another party's loss in a party's own process: a shadow scalar, tied to `logits`
            return logits.sum() * 0  # so that a gradient of it has `logits`' shape; no loss kernel runs on meta
        if self.task is not None and self.task.is_regression:
            if logits.shape != (labels.shape[0], 1):
                shape = tuple(logits.shape)
                raise ValueError(f"a regression model outputs shape (N, 1), got {shape} for N={len(labels)}")
            return F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))
        if labels.dtype.is_floating_point:
            if labels.shape != logits.shape:
                shapes = f"{tuple(labels.shape)} vs logits {tuple(logits.shape)}"
                raise ValueError(f"soft labels must have the logits' shape (N, M), got {shapes}")
            return 0.5 * (logits.softmax(-1) - labels.to(logits.dtype)).pow(2).sum(-1).mean()
        return F.cross_entropy(logits, labels)

    # ------------------------------------------------------------------------------------------------ label privacy
    @property
    def privacy_ledger(self) -> PrivacyLedger:
        """The epsilon spent by this run's label releases (basic composition)."""
        return self.label_release.ledger

    def on_fit_start(self) -> None:
        """Give every party's dropout its own generator; draw the label release once (a resume keeps its own)."""
        self.use_party_generators()
        if self.label_mechanism is None:
            return
        train = self.trainer.datamodule.train_set
        self.release_labels(train.ids, train.labels)

    def use_party_generators(self) -> None:
        """Make every party's dropout draw from that party's own generator (`lvfl.models.dropout`), once.

        Each party's generator is seeded from the run's seed (the global one when the fit starts, kept in the
        checkpoint) and its index, and reseeded at every training epoch (`on_train_epoch_start`), so its masks do not
        depend on the other parties' models, and a party's own process and a resumed run draw the simulation's. The
        active party's generator also serves its other modules (a top model, a private head).
        """
        from lvfl.models.dropout import PartyGenerator, use_party_generator
        from lvfl.runs import derive_seed

        if self._party_generators or not self.built:
            return
        if self._dropout_seed is None:
            self._dropout_seed = int(torch.initial_seed())
        for index, name in enumerate(self.party_names):
            self._party_generators[name] = PartyGenerator(derive_seed(self._dropout_seed, "dropout", index))
            use_party_generator(self.party_models[name], self._party_generators[name])
        for name, child in self.named_children():
            if name != "party_models":
                use_party_generator(child, self._party_generators[self.active])

    def on_train_epoch_start(self) -> None:
        """Reseed every party's dropout generator for this epoch (from the run's seed, the party and the epoch)."""
        from lvfl.runs import derive_seed

        epoch = self.trainer.current_epoch
        for index, name in enumerate(self.party_names):
            if name in self._party_generators:
                self._party_generators[name].reseed(derive_seed(self._dropout_seed or 0, "dropout", index, epoch))

    def release_labels(self, ids: torch.Tensor, labels: torch.Tensor) -> None:
        """Draw the protected labels for training samples `ids` once (see `LabelRelease.draw`).

        No-op when there is nothing to protect (no mechanism or no passive party) or when a release for the same
        samples exists (a resume: redrawing would spend epsilon again); a release for other samples raises.
        """
        if self.label_mechanism is None or not self.passive:
            return
        if self.task is None:
            raise RuntimeError("release_labels needs the task: call it after setup/build")
        if not self.wire.holds(self.active):  # a passive party's process: the release is the active party's draw
            release = self.label_release
            if release.ids is None:
                release.ids = torch.sort(ids.detach().long().cpu()).values
                release.labels = self.label_mechanism.release_shadow(len(ids), self.task.num_classes)
            return
        trainer = self._trainer
        distributed = trainer is not None and trainer.world_size > 1
        self.label_release.draw(
            ids,
            labels,
            self.task.num_classes,
            rank=trainer.global_rank if trainer is not None else 0,
            broadcast=(lambda obj: trainer.strategy.broadcast(obj, src=0)) if distributed else None,
        )

    def protected_labels(self, ids: torch.Tensor) -> torch.Tensor:
        """The released labels of training samples `ids` (raises for IDs outside the release)."""
        return self.label_release.lookup(ids)

    def record_train_losses(self, losses: Mapping[str, torch.Tensor]) -> None:
        """Accumulate the step's losses and write them on the logging cadence (see `lvfl.loggers`).

        Keyed by the party that owns each loss: EASTER every party, split learning one joint loss under the active.
        """
        losses = {k: v for k, v in losses.items() if not is_shadow(v)}  # a party's view records its own
        if not losses:
            return
        self.check_finite(losses, "training loss")
        self._train_loss_names = list(losses)
        stacked = torch.stack([losses[k].detach() for k in self._train_loss_names])
        self._train_loss_sum = stacked if self._train_loss_sum is None else self._train_loss_sum + stacked
        self._train_loss_count += 1
        if is_logging_step(self._trainer):
            names = [f"train/loss/{n}" for n in self._train_loss_names]
            log_to_loggers(self._trainer, dict(zip(names, stacked.tolist(), strict=True)))

    # ------------------------------------------------------------------------------------------------ evaluation
    @abstractmethod
    def party_logits(self, batch: VFLBatch) -> dict[str, torch.Tensor]:
        """Each predicting party's logits for the batch, as the active party holds them, every move on the wire.

        A passive party's own prediction (EASTER's) goes to `prediction_recipient`: the active party, except in a
        teacher's inference for student distillation, where it goes to the producer (`predictions_delivered_to`).
        """

    @property
    def prediction_recipient(self) -> str:
        """Who receives a passive party's own prediction in `party_logits`: the active party unless redirected."""
        return self._prediction_recipient or self.active

    @contextmanager
    def predictions_delivered_to(self, party: str) -> Iterator[None]:
        """Inside the block, `party_logits` delivers the passive parties' own predictions to `party`.

        The teacher's inference (`lvfl.inference.teacher`) sends them to the producer, who sums them, so that the
        active party never sees one passive party's prediction; a party's own prediction then stays where it is.
        """
        if party not in self.party_names:
            raise ValueError(f"there is no party {party!r} to deliver predictions to (parties: {self.party_names})")
        before, self._prediction_recipient = self._prediction_recipient, party
        try:
            yield
        finally:
            self._prediction_recipient = before

    # ------------------------------------------------------------------------------------------------ inference
    # ID-private inference (`lvfl.inference.router`) splits a prediction in two: each passive party precomputes its
    # contribution for the IDs it holds (from its own features alone), the active party fetches it obliviously and
    # completes the prediction. A protocol supports it by overriding both hooks; they must reproduce the active
    # party's `party_logits` exactly under Plain aggregation (tests check it).
    def passive_contribution(self, party: str, features: torch.Tensor) -> torch.Tensor:
        """What passive `party` contributes to the prediction of samples with `features`: default, its embedding."""
        return self.party_models[party].encoder(features)

    def complete_prediction(
        self, active_features: torch.Tensor, contributions: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        """The active party's logits from its own features and every passive party's contribution."""
        raise TypeError(
            f"{type(self).__name__} does not support split (ID-private) inference: it has no complete_prediction"
        )

    def describe_combination(self) -> dict[str, Any]:
        """How the two hooks above combine the parties' outputs, as JSON data (`lvfl export` writes it to party.json).

        An exported folder is served without lvfl, so its reader needs in words and numbers what each passive party
        sends (`contribution`) and what the active party computes from it (`combine`), with any values that enter
        (weights, the number of parties, which head). The default quotes the two hooks' docstrings, so a protocol
        that implements them exports with no extra code; built-in protocols override it with their formulas.

        Raises:
            TypeError: the protocol has no `complete_prediction` (named): there is no split prediction to describe.
        """
        name = type(self).__name__
        if type(self).complete_prediction is VFLModule.complete_prediction:
            raise TypeError(
                f"{name} does not support split (ID-private) inference: it has no complete_prediction, so its "
                "parties' outputs have no combination to export"
            )
        contribution = inspect.getdoc(type(self).passive_contribution) or ""
        combine = inspect.getdoc(type(self).complete_prediction) or ""
        return {
            "contribution": contribution.split("\n\n")[0].replace("\n", " "),
            "combine": combine.split("\n\n")[0].replace("\n", " "),
        }

    def reported_head(self, shared: str) -> str:
        """The head the active party reports (`active_prediction`): its private head, else the `shared` module.

        For `describe_combination`: with a label mechanism the release-trained `shared` head is not what lvfl scores.
        """
        if self.private_head is None:
            return shared
        return f"private_head (trained on the true labels; {shared}, trained on the label release, is not used)"

    @staticmethod
    def plain_sum(
        active: torch.Tensor, contributions: Mapping[str, torch.Tensor], order: Sequence[str]
    ) -> torch.Tensor:
        """`active + sum_k contributions[k]` in `order`, exactly as `Plain.combine` adds the shares."""
        out = active
        for k in order:
            out = out + contributions[k].to(active)
        return out

    def _eval_step(self, batch: VFLBatch, stage: str) -> None:
        logits = self.party_logits(batch)
        if not self.wire.holds(self.active):  # a passive party's process: it sent its part; scores need the labels
            return
        for name, out in logits.items():
            self.log(f"{stage}/loss/{name}", self.task_loss(out, batch.labels), sync_dist=True)
            for metric in metric_names(self.task):
                tracker = self.metrics[f"{stage}_{metric}_{name}"]
                update_metric(tracker, metric, self.task, out, batch.labels)
                self.log(f"{stage}/{metric}/{name}", tracker, on_step=False, on_epoch=True)

    def validation_step(self, batch: VFLBatch, batch_idx: int) -> None:
        """Every party's model on the validation batch."""
        self._eval_step(batch, "val")

    def test_step(self, batch: VFLBatch, batch_idx: int) -> None:
        """Every party's model on the test batch."""
        self._eval_step(batch, "test")

    def _log_mean(self, stage: str) -> None:
        if not self.wire.holds(self.active):  # the metrics are the active party's (it holds the labels)
            return
        self._epoch_means = {}
        for metric in metric_names(self.task) if self.task is not None else ():
            keys = [f"{stage}_{metric}_{n}" for n in self.predicting_parties]
            if keys and all(k in self.metrics for k in keys):
                values = torch.stack([self.metrics[k].compute() for k in keys])
                self._epoch_means[f"{stage}/{metric}/mean"] = float(values.mean())
                # compute() already synced the metric states across ranks; sync_dist only silences Lightning's hint
                self.log(f"{stage}/{metric}/mean", values.mean(), on_epoch=True, sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        """Log the mean over party models; tell the passive parties whether this epoch is the best so far."""
        self._log_mean("val")
        self.share_best_epoch()

    def share_best_epoch(self) -> None:
        """One byte to each passive party after a validation epoch: 1 if it is the best so far, else 0.

        Where the run keeps a best checkpoint (`ExperimentCheckpoint`, selecting by the task's main validation
        metric), every party must keep the same epoch, but only the active party holds the labels that score it.
        So the active party sends each passive party whether this epoch beat every earlier one (strictly, as the
        checkpoint compares), and a passive party's own process selects its best epoch by the running count of
        such epochs (`lvfl.protocols.task_metrics.BEST_EPOCHS_METRIC`). The byte is a function of the validation
        labels; it is metered (tag `best_epoch`) in simulation too, since a deployment sends it.
        """
        trainer = self._trainer
        if trainer is None or trainer.sanity_checking or not self.passive:
            return
        keeps_best = any(  # an `ExperimentCheckpoint` (lvfl.callbacks) choosing its own monitor, keeping a best file
            getattr(cb, "auto_monitor", False) and getattr(cb, "save_top_k", 0) != 0
            for cb in trainer.checkpoint_callbacks
        )
        if not keeps_best:
            return
        flag = torch.zeros(1, dtype=torch.uint8)
        if self.wire.holds(self.active):
            value = getattr(self, "_epoch_means", {}).get(main_validation_metric(self.task))
            best = self._best_epoch["value"]
            improved = value is not None and value == value and (best is None or value > best)  # NaN never wins
            if improved:
                self._best_epoch["value"] = value
            flag[0] = int(improved)
        else:
            flag = shadow(flag)
        for party in self.passive:
            received = self.wire.send(self.active, party, flag, "best_epoch")
            if party == self.wire.here:  # a passive party's own process: what it selects its best epoch by
                self._best_epoch["count"] += int(received.item())
                self.log(BEST_EPOCHS_METRIC, float(self._best_epoch["count"]), on_epoch=True)

    def on_test_epoch_end(self) -> None:
        """Log the mean over party models."""
        self._log_mean("test")

    def predict_step(self, batch: VFLBatch, batch_idx: int) -> dict[str, Any]:
        """Every predicting party's class probabilities ("probs"), keyed by party, with the sample IDs.

        A regression gives the predicted values in the target's units ("values") instead. In a party's own process,
        the predictions it holds only (a passive party's: none; it served its part of the batch).
        """
        logits = {k: v for k, v in self.party_logits(batch).items() if not is_shadow(v)}
        if self.task is not None and self.task.is_regression:
            return {"ids": batch.ids, "values": {k: self.task.to_target(v.reshape(-1)) for k, v in logits.items()}}
        return {"ids": batch.ids, "probs": {k: v.softmax(-1) for k, v in logits.items()}}

    # ------------------------------------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Save the mask step, the ledger, the backend's non-secret state (never keys), label release, run fingerprint.

        The label release and its privacy ledger are saved because the release is what spent epsilon: a resume
        reuses it rather than drawing (and spending) again. The fingerprint (`lvfl.runs.run_fingerprint`: protocol,
        backend and label mechanism with their settings, party models, data split with a digest of every split's
        sample IDs) lets `on_load_checkpoint` refuse a checkpoint of another run. `writer` names this module object
        (the same on every rank), so that reloading a checkpoint it wrote itself does not add its ledger twice.
        """
        import uuid

        from lvfl.runs import run_fingerprint

        trainer = self._trainer
        if getattr(self, "_checkpoint_writer", None) is None:
            writer = uuid.uuid4().hex
            if trainer is not None and trainer.world_size > 1:  # every rank dumps the checkpoint: agree on one name
                writer = trainer.strategy.broadcast(writer, src=0)
            self._checkpoint_writer = writer
        datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
        checkpoint["lvfl"] = {
            "mask_step": self.mask_step,
            "wire": self.wire.state_dict(),
            "aggregation": self.aggregation.state_dict(),
            "party_names": self.party_names,
            "label_privacy": self.label_release.state_dict(),
            "run": run_fingerprint(self, datamodule),
            "writer": self._checkpoint_writer,
            "best_epoch": dict(self._best_epoch),
            "dropout_seed": self._dropout_seed,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Check that the checkpoint belongs to this run, then restore the counter, ledger, backend state and release.

        A checkpoint whose run fingerprint differs from this run's is refused (`lvfl.runs.CheckpointMismatchError`,
        naming what differs): `lvfl test --ckpt_path last` must not test another run's weights. Without a trainer
        with a VerticalDataModule the data split cannot be compared, and before `build` the party models cannot;
        everything else is. Checkpoints without a fingerprint (older lvfl) load with a warning.

        The ledger: a checkpoint this module wrote itself (testing the best epoch after fit) is already part of its
        ledger and is not added again. For a checkpoint of another process (a resume, `lvfl test --ckpt_path last`)
        the saved ledger is added, and what this module sent before loading it (the backend's fresh key set-up) moves
        under the tag `resume/<tag>` (`lvfl.runs.RESUME_TAG_PREFIX`): traffic that really happened again, kept apart,
        so that the ledger without `resume/*` tags is the uninterrupted run's.
        """
        from lightning.pytorch.utilities import rank_zero_warn

        from lvfl.runs import check_fingerprint, resume_rows, run_fingerprint

        state = checkpoint.get("lvfl")
        if state is None:
            return
        trainer = self._trainer
        saved_run = state.get("run")
        if saved_run is None:
            rank_zero_warn("the checkpoint records no run fingerprint (older lvfl): cannot check it is this run's")
        else:
            datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
            path = getattr(trainer, "ckpt_path", None) if trainer is not None else None
            where = f"checkpoint {path}" if path else "checkpoint"
            check_fingerprint(saved_run, run_fingerprint(self, datamodule), where)
        saved_parties = state.get("party_names")
        if self.built and saved_parties is not None and saved_parties != self.party_names:
            raise ValueError(f"checkpoint has parties {saved_parties}, this run has {self.party_names}")
        # the step counter is a nonce: never move it back (loading an earlier checkpoint into this process, e.g. to
        # test the best epoch after fit, would otherwise reuse masks that already went on the wire)
        self.mask_step = max(self.mask_step, int(state["mask_step"]))
        if state.get("writer") is None or state.get("writer") != getattr(self, "_checkpoint_writer", None):
            own = self.wire.state_dict()
            self.wire.load_state_dict({key: resume_rows(rows) for key, rows in own.items()})
            self.wire.merge_state_dict(state["wire"])
        self.aggregation.load_state_dict(state.get("aggregation", {}))
        if "best_epoch" in state:
            self._best_epoch = dict(state["best_epoch"])
        if state.get("dropout_seed") is not None and not self._party_generators:  # the run's own dropout streams
            self._dropout_seed = int(state["dropout_seed"])
        label_state = state.get("label_privacy")
        if label_state is not None:
            self.label_release.load_state_dict(label_state)
