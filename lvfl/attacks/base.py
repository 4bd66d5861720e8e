"""An attack mounted by one named party on exactly what that party holds, scored by a harness that holds the truth.

Why this shape: a privacy measurement is only as honest as the attacker's view. An attack here never sees the
protocol module, the batch or another party's anything: each step it gets a `PartyView`, built by the `Attack`
shell from

- the messages the party received on the Wire during the step (`inbox`), and those it received outside any training
  step so far, at set-up (`setup_inbox`: keys, a label release sent once);
- its own slice of the batch and the batch's sample IDs (a party knows which of its rows it served), its own
  training IDs, and its own party model (encoder and head);
- the side knowledge the attack declares, and nothing more: `known_labels` auxiliary samples with their labels
  (e.g. Fu et al.'s passive model completion with K labelled samples);
- what is public: the protocol's declaration of what each tag a passive party receives is (`VFLModule.passive_inbox`)
  and the task (the number of classes).

The subclass implements `infer(view)` and nothing else (the view: `lvfl.attacks.view`); the shell holds the batch's true
labels for scoring only (`lvfl.attacks.scoring`), excludes the samples whose labels the attacker was given, and logs
`attack/<name>/<metric>` (and the trivial baseline the metric is judged against, `attack/<name>/baseline_<metric>`) per
training epoch to every logger. An attack refuses, by name, a protocol whose passive parties receive none of the
messages it reads.

Assumptions: a semi-honest attacker (it follows the protocol and computes on the side); the simulation's Wire
delivers to its observers exactly what the receiving party's process would receive (the parity tests check that).

Deployed (`lvfl party`, `lvfl launch`: every party its own process), the attack runs in the attacking party's process
only, with exactly what that process holds; in every other process it does nothing. That process holds no truth (no
label, no other party's features), so it scores nothing: each epoch it writes its guesses to its own run folder
(`lvfl.attacks.guesses`), `attacks/<name>.csv` (epoch, step, sample ID, one score per class, or the guessed features)
beside `attacks/<name>.json` (the attack, its metrics, the task, which samples it knew), and `lvfl attack-score` scores
them afterwards against the truth, in a separate step that whoever holds both files runs (`lvfl.commands.attack_score`).
Side knowledge (`known_labels`, `known_features`) reaches a deployed attacker as a file in its own hands
(`side_knowledge`, `lvfl.attacks.side_knowledge`), never drawn from truth its process does not hold; a simulated attack
that drew its side knowledge writes it in that format (`attacks/<name>.known.csv`), so a deployed rerun can be given the
same.
"""

from __future__ import annotations

import copy
import hashlib
import math
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn

from lvfl.attacks.fitting import fit_full_batch
from lvfl.attacks.guesses import Guess, inferences_path, write_guesses
from lvfl.attacks.scoring import Tally, evaluate
from lvfl.attacks.side_knowledge import known_path, read_known_features, read_known_labels, write_known
from lvfl.attacks.view import PartyView, Received
from lvfl.loggers import log_to_loggers
from lvfl.observing import WireObserver
from lvfl.privacy.labels.mechanisms import randomized_response_keep_probability
from lvfl.wire import Wire

# the view, the scoring, the attacker's fitting and the guesses file live in their own modules; their public names
# are importable from here as well
__all__ = [
    "Attack",
    "AttackRecord",
    "PartyView",
    "Received",
    "attacking_party",
    "evaluate",
    "fit_full_batch",
    "inferences_path",
]


@dataclass(frozen=True)
class _Addressed(Received):
    """A message received outside a training step, with its addressee (held before the attacker is known)."""

    dst: str = ""


class AttackRecord(Callback):
    """What every attack keeps and logs: its per-epoch metrics (`history`), checkpointed by metric name and party."""

    metric_name: str
    _party_given: str | None
    history: list[dict[str, float]]

    def record(self, trainer: Trainer, values: dict[str, float]) -> None:
        """Keep the epoch's `values` and log them as ``attack/<name>/<metric>`` to every logger."""
        self.history.append({"epoch": float(trainer.current_epoch), **values})
        log_to_loggers(trainer, {f"attack/{self.metric_name}/{k}": v for k, v in values.items()}, epoch=True)

    @property
    def state_key(self) -> str:
        """Unique per metric name and party as given, so two attacks of one class checkpoint apart."""
        return self._generate_state_key(name=self.metric_name, party=self._party_given)

    def state_dict(self) -> dict[str, Any]:
        """The per-epoch history (a resumed run keeps the epochs before it)."""
        return {"history": [dict(h) for h in self.history]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore `state_dict`."""
        self.history = [dict(h) for h in state_dict.get("history", [])]


class Attack(AttackRecord, WireObserver):
    """The shell of an attack by one party: builds its view each training step, scores its guesses, logs the metrics.

    Subclasses set `name`, `reads` (the message kinds, any of which it can attack; none: it reads only the party's own
    data and model, and applies to every protocol), `metrics` (of "accuracy", "auc"), and implement `infer`;
    `check_task` may refuse a task. They override no hook: what an attack can read is the view, nothing else.

    Args:
        party: the attacking party; the first passive party by default. It must be a passive party.
        known_labels: how many training samples the attacker knows the labels of (side knowledge), drawn balanced
            over the classes from the training rows it holds; 0 for none.
        seed: draws which samples those are (the attacker's own choice: nothing secret to any other party).
        name: the metric prefix, ``attack/<name>/...``; the class's `name` by default (two attacks must differ).
        known_features: how many training samples of the active party's features the attacker knows (a feature
            attack's side knowledge), drawn with `seed`; 0 for none.
        side_knowledge: a CSV the attacker holds with its side knowledge (`lvfl.attacks.side_knowledge`: ``id,label``
            rows, or ``id,x0,...`` rows of the active party's features for a feature attack), in place of the draw;
            `known_labels` (or `known_features`) must then equal its row count. Deployed, the only way to give an
            attack side knowledge.
    """

    name: ClassVar[str] = "attack"
    reads: ClassVar[tuple[str, ...]] = ()
    metrics: ClassVar[tuple[str, ...]] = ("accuracy",)
    #: the fewest known labels the attack works with
    min_known_labels: ClassVar[int] = 0
    #: what the attack guesses: "labels" (class scores), or "active_features" (the active party's features)
    target: ClassVar[str] = "labels"
    #: the fewest samples of the active party's features the attack works with (a feature attack's side knowledge)
    min_known_features: ClassVar[int] = 0
    #: whether the view carries the party's own encoder output of the step (an attack that subtracts it)
    needs_own_encoding: ClassVar[bool] = False
    #: whether its accuracy is bounded by a label mechanism's epsilon: a guess from what the release determines, with
    #: no prior on a sample's label (then `epsilon_bound`, e^eps / (e^eps + K - 1), is logged beside it)
    bounded_by_release: ClassVar[bool] = False

    def __init__(
        self,
        party: str | None = None,
        known_labels: int = 0,
        seed: int = 0,
        name: str | None = None,
        known_features: int = 0,
        side_knowledge: str | None = None,
    ):
        if not isinstance(known_features, int) or known_features < self.min_known_features:
            raise ValueError(
                f"{type(self).__name__} needs known_features >= {self.min_known_features} (side knowledge: samples "
                f"of the active party's features), got {known_features!r}"
            )
        self.known_features = known_features
        if not isinstance(known_labels, int) or known_labels < 0:
            raise ValueError(
                f"{type(self).__name__}: known_labels must be a non-negative integer, got {known_labels!r}"
            )
        if known_labels < self.min_known_labels:
            raise ValueError(
                f"{type(self).__name__} needs known_labels >= {self.min_known_labels} (side knowledge), "
                f"got {known_labels}"
            )
        super().__init__()
        self.party, self.known_labels, self.seed = party, known_labels, int(seed)
        self.side_knowledge = None if side_knowledge is None else str(side_knowledge)
        self._party_given = party  # the state key's: `party` itself is resolved at fit start
        self.metric_name = name or self.name
        self.history: list[dict[str, float]] = []  # per training epoch: {"epoch": e, metric: value, ...}
        self._kinds: dict[str, str] = {}
        self._num_classes = 0
        self._known: dict[int, int] = {}
        self._known_features: dict[int, torch.Tensor] = {}
        self._num_parties = 0
        self._active: str | None = None
        self._bound: float | None = None
        self._own_encoding: torch.Tensor | None = None
        self._train_ids = torch.zeros(0, dtype=torch.long)
        self._train_features = torch.zeros(0)
        self._model: nn.Module | None = None
        self._step: list[Received] | None = None  # this step's inbox, while a training step runs
        self._setup: list[_Addressed] = []
        self._truth: torch.Tensor | None = None
        self._ids: torch.Tensor | None = None
        self._features: torch.Tensor | None = None
        self._tally = Tally()
        self._inert = False  # deployed, in a process other than the attacking party's: the attack is not here
        self._deployed = False  # deployed, in the attacking party's own process: guesses written, nothing scored
        self._guesses: list[Guess] = []  # (epoch, step, ids, scores)

    # -- what a subclass implements ----------------------------------------------------------------------------------
    @abstractmethod
    def infer(self, view: PartyView) -> torch.Tensor | None:
        """Class scores per sample of the batch, (B, K) with K the task's classes (higher: more likely); None: no guess.

        For a binary task, column 1 minus column 0 is the score that ranks samples for the leak AUC; a feature attack
        (`target = "active_features"`) returns its guess of the active party's features for the batch.
        """

    def check_task(self, num_classes: int) -> None:
        """Refuse a task the attack does not apply to (default: any classification task)."""
        if num_classes < 2:
            raise ValueError(f"{type(self).__name__} infers class labels; this task has none (regression)")

    # -- the shell ----------------------------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Start listening before the protocol's own set-up, whose messages (the split, keys) are in the inbox too.

        The parties are built in the protocol's `setup`, after this: until `on_fit_start` names the attacking party,
        every message is held, and then only that party's are kept.
        """
        if stage != "fit":
            return
        self.listen(pl_module)

    def listen(self, pl_module: LightningModule) -> Wire:
        """Subscribe (once per wire), starting with an empty set-up inbox."""
        wire = getattr(pl_module, "wire", None)
        if not (isinstance(wire, Wire) and self.listening_to(wire)):
            self._setup, self._step = [], None
        return super().listen(pl_module)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Check the protocol and the party, draw the side knowledge, keep only the party's inbox from now on."""
        self.listen(pl_module)
        party = self.party = attacking_party(self, pl_module, self.party, self.reads)
        here = getattr(getattr(pl_module, "wire", None), "here", None)
        self._inert, self._deployed = here is not None and here != party, here == party
        if self._inert:  # another party's process: the attack lives in the attacker's
            return
        if self._deployed and (self.known_labels or self.known_features) and self.side_knowledge is None:
            raise ValueError(
                f"{type(self).__name__} at {party}: deployed, an attack holds only what {party}'s process holds, so "
                f"its side knowledge (known_labels={self.known_labels}, known_features={self.known_features}) must "
                "be a file in its hands: give side_knowledge (a CSV of id,label or id,x0,... rows; a simulated run "
                f"writes the one it drew to attacks/{self.metric_name}.known.csv), or set them to 0"
            )
        kinds = dict(getattr(type(pl_module), "passive_inbox", {}))
        for other in trainer.callbacks:
            if isinstance(other, Attack) and other is not self and other.metric_name == self.metric_name:
                raise ValueError(f"two attacks log under attack/{self.metric_name}/: give one of them a `name`")
        task = pl_module.task
        self._num_classes = int(task.num_classes)
        self.check_task(self._num_classes)
        self._kinds = kinds
        self._model = pl_module.party_models[party]
        dm = trainer.datamodule
        train = dm.train_set
        order = torch.argsort(train.ids.cpu())
        self._train_ids = train.ids.cpu()[order]
        self._train_features = train.decode({party: train.stored[party]})[party].cpu()[order]
        self._known, self._known_features = {}, {}
        if self.side_knowledge is not None:
            self._read_side_knowledge(set(self._train_ids.tolist()))
        elif self.known_labels:
            # the labels are read only to draw declared side knowledge (deployed there is none: given by file there)
            self._known = self._draw_known(train.ids.cpu(), train.labels.cpu())
        self._num_parties = len(pl_module.party_names)
        mechanism = getattr(pl_module, "label_mechanism", None)
        self._bound = None
        if mechanism is not None and self.bounded_by_release and "accuracy" in self.metrics:
            self._bound = randomized_response_keep_probability(float(mechanism.epsilon), self._num_classes)
        self._active = pl_module.active
        if self.known_features and self.side_knowledge is None:
            digest = hashlib.sha256(f"lvfl.attacks.known_features/{self.seed}".encode()).digest()
            generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)
            rows = torch.randperm(len(train.ids), generator=generator)[: self.known_features]
            active = train.decode({self._active: train.stored[self._active][rows]})[self._active].cpu()
            self._known_features = {int(train.ids[r]): x for r, x in zip(rows.tolist(), active, strict=True)}
        drawn = self._known_features or self._known
        if drawn and self.side_knowledge is None and trainer.log_dir is not None and trainer.is_global_zero:
            write_known(known_path(trainer.log_dir, self.metric_name), drawn)  # what a deployed rerun can be given
        self._setup = [m for m in self._setup if m.dst == party]

    def _read_side_knowledge(self, held: set[int]) -> None:
        """The side knowledge from the `side_knowledge` file: its count as declared, only training rows it holds."""
        path = Path(self.side_knowledge)
        where = f"{type(self).__name__} side_knowledge"
        features = self.target == "active_features"
        if features:
            self._known_features = read_known_features(path, where)
            known, count, option = self._known_features, self.known_features, "known_features"
        else:
            self._known = read_known_labels(path, self._num_classes, where)
            known, count, option = self._known, self.known_labels, "known_labels"
        if len(known) != count:
            raise ValueError(f"{where}={self.side_knowledge!r} holds {len(known)} samples, but {option}={count}: set "
                             f"{option}={len(known)}")  # fmt: skip
        foreign = sorted(set(known) - held)
        if foreign:
            raise ValueError(f"{where}={self.side_knowledge!r} names samples that are not training rows {self.party} "
                             f"holds: {foreign[:5]}")  # fmt: skip

    def _draw_known(self, ids: torch.Tensor, labels: torch.Tensor) -> dict[int, int]:
        """`known_labels` training samples, as even over the classes as the counts allow, drawn with `seed`."""
        if self.known_labels == 0:
            return {}
        # a stream of its own: torch.Generator().manual_seed(seed) would replay the loader's epoch-0 shuffle of the
        # same seed (the config's), and every known sample would land in the first batch
        digest = hashlib.sha256(f"lvfl.attacks.known_labels/{self.seed}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)
        order = torch.randperm(len(ids), generator=generator)
        per_class = math.ceil(self.known_labels / self._num_classes)
        chosen: dict[int, int] = {}
        taken: dict[int, int] = {}
        for i in order.tolist():
            label = int(labels[i])
            if taken.get(label, 0) < per_class:
                taken[label] = taken.get(label, 0) + 1
                chosen[int(ids[i])] = label
            if len(chosen) == self.known_labels:
                break
        return chosen

    def observe(self, src: str, dst: str, tag: str, payload: Any) -> None:  # noqa: D102
        if self._inert:
            return
        if self._step is not None:
            if dst == self.party:
                self._step.append(Received(src, tag, payload))
        elif self.party is None or dst == self.party:  # before fit start the party may not be known yet
            self._setup.append(_Addressed(src, tag, payload, dst))

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:  # noqa: D102
        self._tally = Tally()
        self._guesses = []

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Open the step's inbox; hold the batch's true labels for scoring only, and the party's own slice."""
        if self._inert:
            return
        self._step = []
        feature_attack = self.target == "active_features" and self._active is not None
        # deployed, the attacker's process holds no truth: nothing is held for scoring (its labels are shadows)
        truth = None if self._deployed else (batch.features[self._active] if feature_attack else batch.labels)
        self._truth = None if truth is None else truth.detach()
        self._ids = batch.ids.detach()
        self._features = batch.features[self.party].detach()
        self._own_encoding = None
        if self.needs_own_encoding and self._model is not None:
            # what the party's encoder gives on its slice now, before the step changes it: run on a copy, with the
            # random streams restored, so the run itself (batch-norm statistics, dropout draws) is untouched
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                self._own_encoding = copy.deepcopy(self._model.encoder)(self._features).detach()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Give the attack its view of the step; score its guesses on the samples it was not told."""
        if self._inert:
            return
        inbox, self._step = tuple(self._step or ()), None
        if self._ids is None or self._features is None or (self._truth is None and not self._deployed):
            return  # a batch end without its start
        view = PartyView(
            party=str(self.party),
            ids=self._ids.cpu(),
            features=self._features,
            inbox=inbox,
            setup_inbox=tuple(Received(m.src, m.tag, m.payload) for m in self._setup),
            model=self._model,
            train_ids=self._train_ids,
            train_features=self._train_features,
            known_labels=dict(self._known),
            kinds=dict(self._kinds),
            num_classes=self._num_classes,
            epoch=int(trainer.current_epoch),
            batch_idx=int(batch_idx),
            num_parties=self._num_parties,
            own_encoding=self._own_encoding,
            known_features=dict(self._known_features),
        )
        with torch.random.fork_rng(devices=[]):  # an attack's own draws (a layer it builds) leave the run's alone
            scores = self.infer(view)
        truth, self._truth = self._truth, None
        if scores is None:
            return
        if self._deployed:  # kept for the file; scored later, against truth this process never holds
            labels = self.target == "labels"
            if (tuple(scores.shape) != (len(view.ids), self._num_classes)) if labels else len(scores) != len(view.ids):
                expected = f"{(len(view.ids), self._num_classes)} (batch, classes)" if labels else "one row per sample"
                raise RuntimeError(f"{type(self).__name__}.infer returned a guess of shape {tuple(scores.shape)}; "
                                   f"expected {expected}")  # fmt: skip
            guess = scores.detach().float().cpu().reshape(len(view.ids), -1)
            self._guesses.append((view.epoch, view.batch_idx, view.ids.clone(), guess))
            return
        if self.target == "labels":
            expected, shape = (len(truth), self._num_classes), tuple(scores.shape)
        else:  # a feature guess may come flat (side knowledge from a file is flat): per sample, as many values
            expected, shape = (len(truth), truth[0].numel()), (len(scores), scores[0].numel() if len(scores) else 0)
        if shape != expected:
            what = "(batch, classes)" if self.target == "labels" else "(the active party's features)"
            raise RuntimeError(
                f"{type(self).__name__}.infer returned a guess of shape {tuple(scores.shape)}; expected {expected} "
                f"{what}"
            )
        known = self._known.keys() | self._known_features.keys()
        unknown = torch.tensor([int(i) not in known for i in view.ids.tolist()], dtype=torch.bool)
        self._tally.add(scores.cpu()[unknown], truth.cpu()[unknown])

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Log the epoch's metrics and their trivial baselines; deployed, write the epoch's guesses instead."""
        if self._deployed:
            self._write_guesses(trainer)
            return
        if not len(self._tally):
            return
        prior = torch.stack(list(self._known_features.values())).mean(dim=0) if self._known_features else None
        values = evaluate(self._tally.scores, self._tally.truths, self.metrics, prior=prior)
        if self._bound is not None:  # the most any eps-label-DP release lets a guess keep, in expectation
            values["epsilon_bound"] = self._bound
        self.record(trainer, values)

    def _write_guesses(self, trainer: Trainer) -> None:
        """Append the epoch's guesses to `attacks/<name>.csv` in this party's run folder (the description beside it)."""
        if trainer.log_dir is None or not trainer.is_global_zero:
            return
        write_guesses(trainer.log_dir, self.metric_name, trainer.current_epoch, self._guesses, self._description)
        self._guesses = []

    def _description(self, width: int) -> dict[str, Any]:
        """The description written beside a deployed attack's guesses (`lvfl.attacks.guesses`), `width` values each."""
        # what the attacker knew is its own (its side knowledge's IDs, their features' mean for the baseline)
        known = sorted(self._known.keys() | self._known_features.keys())
        about = {"attack": f"{type(self).__module__}.{type(self).__qualname__}", "name": self.metric_name,
                 "party": self.party, "metrics": list(self.metrics), "num_classes": self._num_classes,
                 "target": self.target, "width": width, "known_ids": known}  # fmt: skip
        if self._known_features:
            prior = torch.stack([x.reshape(-1) for x in self._known_features.values()]).mean(dim=0)
            about["prior"] = [float(v) for v in prior.tolist()]
        return about


def attacking_party(attack: object, pl_module: LightningModule, party: str | None, reads: Sequence[str]) -> str:
    """The passive party that mounts `attack` (the first passive party if None); refuses a protocol it does not fit.

    Raises:
        ValueError: `party` is not a passive party of the run, or the protocol's passive parties receive none of the
            message kinds in `reads` (an attack that reads nothing applies everywhere).
    """
    who, protocol = type(attack).__name__, type(pl_module).__name__
    passive = list(getattr(pl_module, "passive", []))
    party = party if party is not None else (passive[0] if passive else None)
    if party not in passive:
        raise ValueError(f"{who}: party must be a passive party of this {protocol} run ({passive}), got {party!r}")
    kinds = dict(getattr(type(pl_module), "passive_inbox", {}))
    if reads and not set(kinds.values()) & set(reads):
        offers = sorted(set(kinds.values())) or ["nothing this attack reads"]
        raise ValueError(
            f"{who} does not apply to {protocol}: it reads {', '.join(reads)}, and a passive party of {protocol} "
            f"receives {', '.join(offers)}"
        )
    return str(party)
