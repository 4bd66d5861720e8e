"""`VFLModule`: the base every protocol builds on.

It turns the datamodule's `party_specs` into one model, optimizer and (optional) LR scheduler per party (each from
its `PartyConfig`, `lvfl.protocols.party_config`), owns the `Wire` and the aggregation backend, keeps the mask step
counter, and holds the moves every training step shares (local embeddings, the aggregation, gradients down, the
losses). A protocol subclass writes its `training_step` (and, if its inference differs, `party_logits`) in the
order of the paper's algorithm.

The plumbing around the step lives in plain mixin classes that `VFLModule` inherits, one module each (they never
import this one):

- `lvfl.protocols.data_setup`: what the protocol asks of the datamodule, and the set-up messages (PSI, split);
- `lvfl.protocols.evaluation`: losses and metrics logged, the validation, test and predict steps, the best-epoch byte;
- `lvfl.protocols.labels`: which labels each loss trains on, and the run's label release;
- `lvfl.protocols.split_inference`: the hooks of split (ID-private) inference;
- `lvfl.protocols.dropout_streams`: each party's own dropout generator;
- `lvfl.protocols.checkpointing`: the protocol's checkpoint state and the run-fingerprint check.

Manual optimization is used throughout: each party owns its optimizer, as the papers require heterogeneous
optimizers (VFedMH Table IV). A step does one backward pass over a surrogate objective in which every party's
graph touches only that party's parameters (everything that crossed the wire arrives detached), so each party's
gradient is exactly its own loss gradient, and Lightning's DDP sees one backward per forward.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F  # noqa: N812
from lightning.pytorch import LightningModule
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lvfl import messages
from lvfl.parties import PartySpec, TaskInfo, VFLBatch
from lvfl.privacy.aggregation.base import AggregationBackend
from lvfl.privacy.aggregation.plain import Plain
from lvfl.privacy.defenses.gradients import GradientDefense
from lvfl.privacy.labels.mechanisms import LabelMechanism
from lvfl.privacy.labels.release import LabelRelease
from lvfl.protocols.checkpointing import CheckpointState
from lvfl.protocols.data_setup import DataSetup
from lvfl.protocols.dropout_streams import DropoutStreams
from lvfl.protocols.evaluation import Evaluation
from lvfl.protocols.labels import LabelHandling
from lvfl.protocols.party_config import PartyConfig, accepts_categories, callable_name
from lvfl.protocols.split_inference import SplitInference
from lvfl.protocols.steps import Steps
from lvfl.protocols.task_metrics import make_metric, metric_names
from lvfl.shadows import empty_shadow
from lvfl.wire import Absent, Wire, is_shadow, shadow


class VFLModule(
    DataSetup, Steps, Evaluation, SplitInference, LabelHandling, DropoutStreams, CheckpointState, LightningModule, ABC
):
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
        """Declare the run's links on the wire (`declared_links`); build the parties once (resumes keep them)."""
        dm = getattr(self.trainer, "datamodule", None)
        if dm is None or not hasattr(type(dm), "party_specs"):  # on the class: reading the property would prepare it
            if self.built:
                return
            raise ValueError("lvfl protocols need a VerticalDataModule (data:) that provides party_specs and task")
        self.wire.links = self.declared_links(dm, self.trainer.callbacks)  # before the first message
        if self.built:
            return
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
                    f"model {callable_name(config.model)} takes no `categories`: use lvfl.models.TabularMLP, DeepFM "
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
        # a party run as a DDP group (`lvfl party --devices N`) reduces its own gradients only: the shadows hold no
        # data to broadcast or reduce
        shadows = [n for n, t in [*self.named_parameters(), *self.named_buffers()] if t.device.type == "meta"]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(self, shadows)

    def fixed_noise_seeds(self) -> dict[str, int]:
        """The privacy noise this run draws from a seed its config fixes: option (under `model`) -> seed.

        The config is public (every party reads it), so a fixed seed there lets any party regenerate that noise and
        strip it: the label mechanism's release, the gradient defense's noise, a party's `embedding_noise`. Tests
        and reproducible experiments fix them on purpose; a deployment must not (`lvfl party` refuses them).
        """
        found = {}
        noises = {"label_mechanism": self.label_mechanism, "gradient_defense": self.gradient_defense}
        for option, mechanism in noises.items():
            if getattr(mechanism, "fixed_seed", None) is not None:
                found[f"{option}.init_args.seed"] = mechanism.fixed_seed
        for index, config in enumerate(self.party_configs):
            noise = config.embedding_noise
            if getattr(noise, "fixed_seed", None) is not None:
                found[f"parties[{index}].embedding_noise.init_args.seed"] = noise.fixed_seed
        return found

    def check_backend(self) -> None:
        """Refuse backends that make no sense for this protocol (override in protocols that restrict them).

        Overrides decide from the backend's declared capabilities (`lvfl.privacy.aggregation.base`), through
        `require_backend`, never from its class.
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
        self.log_train_epoch()  # `lvfl.protocols.evaluation`

    # ------------------------------------------------------------------------------------------------ the shared moves
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
        received = self.send_gradient(party, grad)
        if not self.wire.holds(party):  # another party's term: its shadow
            return empty_shadow((), grad.dtype)
        return (output * received).sum()

    def send_gradient(self, party: str, grad: torch.Tensor) -> torch.Tensor:
        """dloss/d(party's output), computed at the active party, sent down to `party` (defended, if configured)."""
        if self.gradient_defense is not None and self.wire.holds(self.active):
            grad = self.gradient_defense.apply(grad)  # what goes down, and so what party k trains on
        return self.wire.send(self.active, party, grad, "gradients")

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
        # A tensor's sum is NaN or inf whenever one of its values is (IEEE: NaN and inf propagate through addition,
        # inf + -inf is NaN), and a sum costs a fraction of `isfinite` (a mask the tensor's size): so one sum per
        # tensor clears the common case; a sum that is not finite (which finite values can also give, overflowing)
        # is decided value by value below.
        sums = torch.stack([v.detach().sum().float() for v in values.values()])  # float32: every device has it
        if bool(torch.isfinite(sums).all()):
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

    def task_loss_gradient_shift(self, new: torch.Tensor, old: torch.Tensor, rows: int) -> torch.Tensor:
        """How `task_loss`'s gradient in the logits moves from `old` logits to `new`, the loss a mean over `rows` rows.

        Why no labels are needed: against class indices the gradient is (softmax(R) - onehot(y)) / N, and a
        regression's MSE has 2 (R - y) / N, so the labels cancel in the difference. A party holding the gradient at
        `old` (and not the labels) so has the one at `new` exactly. Soft labels (`LaplaceLabels`) mix labels and logits
        in their gradient; callers refuse them (`EASTER`'s `delay_compensation`).
        """
        if self.task is not None and self.task.is_regression:
            return 2 * (new - old) / rows
        return (new.softmax(-1) - old.softmax(-1)) / rows

    # ------------------------------------------------------------------------------------------------ fit start
    def on_fit_start(self) -> None:
        """Give every party's dropout its own generator; draw the label release once (a resume keeps its own)."""
        self.use_party_generators()
        if self.label_mechanism is None:
            return
        train = self.trainer.datamodule.train_set
        self.release_labels(train.ids, train.labels)

    # ---------------------------------------------------------------------------------- the protocol's inference
    @abstractmethod
    def party_logits(self, batch: VFLBatch) -> dict[str, torch.Tensor]:
        """Each predicting party's logits for the batch, as the active party holds them, every move on the wire.

        A passive party's own prediction (EASTER's) goes to `prediction_recipient`: the active party, except in a
        teacher's inference for student distillation, where it goes to the producer (`predictions_delivered_to`).
        """
