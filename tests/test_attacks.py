"""Label attacks (`lvfl.attacks`): what each reads, what each recovers, where each refuses, against references."""

from __future__ import annotations

import csv
import inspect
import math
import re
from dataclasses import fields

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from helpers import easter, make_trainer, mlp_parties
from sklearn.metrics import roc_auc_score

import lvfl.attacks
from lvfl.attacks import (
    Attack,
    DirectionScoring,
    DirectLabelInference,
    EmbeddingInversion,
    NormScoring,
    PartyView,
    PassiveModelCompletion,
    Received,
    evaluate,
)
from lvfl.attacks.side_knowledge import read_known_features, read_known_labels, write_known
from lvfl.datamodules import BreastCancer, Digits
from lvfl.messages import EMBEDDING_GRADIENT, KINDS, PREDICTION_GRADIENT
from lvfl.models import MLP
from lvfl.privacy import MID, RandomizedResponse
from lvfl.protocols import CVFL, EASTER, AggVFL, PraVFed, SplitNN


def fit(tmp_path, model, dm, attacks, epochs: int = 1, **kwargs):
    trainer = make_trainer(tmp_path, max_epochs=epochs, callbacks=list(attacks), limit_val_batches=0, **kwargs)
    trainer.fit(model, datamodule=dm)
    return trainer


def logged(tmp_path, key: str) -> list[float]:
    (path,) = tmp_path.rglob("metrics.csv")
    with path.open() as f:
        return [float(row[key]) for row in csv.DictReader(f) if row.get(key)]


def view(grad: torch.Tensor, kind: str, known: dict[int, int] | None = None, num_classes: int = 2) -> PartyView:
    """A hand-made view: one message of `kind` with `grad`, sample IDs 0..B-1."""
    n = grad.shape[0]
    return PartyView(
        party="party1",
        ids=torch.arange(n),
        features=torch.zeros(n, 3),
        inbox=(Received("party0", "gradients", grad),),
        setup_inbox=(),
        model=None,
        train_ids=torch.arange(n),
        train_features=torch.zeros(n, 3),
        known_labels=known or {},
        kinds={"gradients": kind},
        num_classes=num_classes,
        epoch=0,
        batch_idx=0,
    )


# ------------------------------------------------------------------------------------------------ what an attack reads
class Recorder(Attack):
    """An attack that guesses nothing and keeps every view it was given."""

    name = "recorder"
    reads = (PREDICTION_GRADIENT,)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.views: list[PartyView] = []

    def infer(self, view: PartyView) -> None:
        self.views.append(view)


def test_the_view_is_exactly_the_party_inbox_and_its_own_slice(tmp_path):
    model = easter(3)
    dm = Digits(num_parties=3, batch_size=64)
    delivered: list[list[tuple[str, str, object]]] = []
    batches = []

    class Spy(Recorder):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
            delivered.append([])
            batches.append(batch)

    recorder = Spy(party="party2", known_labels=3)
    model.wire.subscribe(lambda src, dst, tag, payload: delivered and delivered[-1].append((src, dst, tag, payload)))
    fit(tmp_path, model, dm, [recorder], limit_train_batches=3)
    assert len(recorder.views) == 3
    for v, messages, batch in zip(recorder.views, delivered, batches, strict=True):
        mine = [(src, tag, payload) for src, dst, tag, payload in messages if dst == "party2"]
        assert [(m.src, m.tag) for m in v.inbox] == [(src, tag) for src, tag, _ in mine]
        assert all(m.payload is p for m, (_, _, p) in zip(v.inbox, mine, strict=True))  # as delivered, unchanged
        assert {m.tag for m in v.inbox} == {"global_embedding", "gradients"}
        assert torch.equal(v.features, batch.features["party2"])
        assert torch.equal(v.ids, batch.ids)
        assert v.model is model.party_models["party2"]
        assert {m.tag for m in v.setup_inbox} == {"split"}  # what party2 received before training
        assert len(v.known_labels) == 3
    # the view has no field for anything else: no labels, no other party's slice or model, no protocol module
    assert [f.name for f in fields(PartyView)] == [
        "party", "ids", "features", "inbox", "setup_inbox", "model", "train_ids", "train_features", "known_labels",
        "kinds", "num_classes", "epoch", "batch_idx", "num_parties", "own_encoding", "known_features",
    ]  # fmt: skip


def test_attacks_override_no_hook_so_the_view_is_all_they_read():
    shell = {name for name, _ in inspect.getmembers(Attack, inspect.isfunction)}
    hooks = {name for name in shell if name.startswith("on_") or name in ("setup", "teardown", "state_dict")}
    attacks = [c for _, c in inspect.getmembers(lvfl.attacks, inspect.isclass) if issubclass(c, Attack)]
    assert {c.__name__ for c in attacks} >= {
        "DirectLabelInference",
        "NormScoring",
        "DirectionScoring",
        "PassiveModelCompletion",
        "EmbeddingInversion",
    }
    for cls in attacks:
        for klass in cls.__mro__[: cls.__mro__.index(Attack)]:
            assert not hooks & set(vars(klass)), f"{cls.__name__} overrides a hook: {hooks & set(vars(klass))}"


def test_side_knowledge_is_balanced_and_its_samples_are_not_scored(tmp_path):
    dm = Digits(num_parties=2, batch_size=64)
    attack = DirectLabelInference(known_labels=20, seed=3)
    fit(tmp_path, easter(2), dm, [attack])
    known = attack._known
    assert len(known) == 20
    assert sorted(torch.bincount(torch.tensor(list(known.values())), minlength=10).tolist()) == [2] * 10
    labels = dict(zip(dm.train_set.ids.tolist(), dm.train_set.labels.tolist(), strict=True))
    assert all(labels[i] == y for i, y in known.items())  # the true labels of training samples
    assert attack.history[-1]["samples"] == len(dm.train_set) - 20


def test_side_knowledge_from_a_file_is_exactly_what_it_lists_and_the_drawn_one_is_written(tmp_path):
    """A simulated run writes the side knowledge it drew (attacks/NAME.known.csv, in the reader's format); a run handed
    a file knows exactly its rows (not the draw), and leaves exactly those out of the score."""
    dm = Digits(num_parties=2, batch_size=64)
    drawn = DirectLabelInference(known_labels=20, seed=3)
    fit(tmp_path / "drawn", easter(2), dm, [drawn])
    (written,) = (tmp_path / "drawn").rglob("attacks/dli.known.csv")
    assert read_known_labels(written, 10) == drawn._known
    ids = dm.train_set.ids.tolist()[:7]
    labels = dict(zip(dm.train_set.ids.tolist(), dm.train_set.labels.tolist(), strict=True))
    given = tmp_path / "given.csv"
    write_known(given, {i: (labels[i] + 1) % 10 for i in ids})  # a file may be wrong: the attacker's belief
    attack = DirectLabelInference(known_labels=7, side_knowledge=str(given))
    fit(tmp_path / "given", easter(2), Digits(num_parties=2, batch_size=64), [attack])
    assert attack._known == {i: (labels[i] + 1) % 10 for i in ids}
    assert attack.history[-1]["samples"] == len(dm.train_set) - 7
    assert not list((tmp_path / "given").rglob("*.known.csv"))  # nothing drawn, nothing written


def test_side_knowledge_files_refuse_what_they_cannot_be(tmp_path):
    path = tmp_path / "known.csv"  # sample 1 is a training row of digits' default split
    cases = [
        ("id,label\n1,3\n", 2, "holds 1 samples, but known_labels=2: set known_labels=1"),
        ("id,label\n1,10\n", 1, "label '10' is not a class index of this task (0 .. 9)"),
        ("id,label\n1,3\n1,4\n", 2, "sample 1 is listed twice"),
        ("id,class\n1,3\n", 1, "the header must be id,label"),
        ("id,label\n", 1, "no known samples"),
        ("id,label\n999999,3\n", 1, "names samples that are not training rows party1 holds: [999999]"),
    ]
    for text, count, message in cases:
        path.write_text(text)
        attack = DirectLabelInference(known_labels=count, side_knowledge=str(path))
        with pytest.raises((ValueError, FileNotFoundError), match=re.escape(message)):
            fit(tmp_path, easter(2), Digits(num_parties=2, batch_size=64), [attack])
    path.write_text("id,x0,x1\n1,0.5\n")
    with pytest.raises(ValueError, match="line 2: 2 fields, expected id and 2 values"):
        read_known_features(path)
    path.write_text("id,x0\n1,nan\n")
    with pytest.raises(ValueError, match="line 2: a feature value is not finite"):
        read_known_features(path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_known_features(tmp_path / "absent.csv")


# ----------------------------------------------------------------------------------------------- direct label inference
@pytest.mark.parametrize("protocol", ["EASTER", "AggVFL"])
def test_dli_recovers_every_training_label_from_the_prediction_gradient(tmp_path, protocol):
    model = easter(4) if protocol == "EASTER" else AggVFL(parties=mlp_parties(4))
    attack = DirectLabelInference(party="party3")
    fit(tmp_path, model, Digits(num_parties=4, batch_size=64), [attack], limit_train_batches=6)
    last = attack.history[-1]
    assert last["samples"] == 6 * 64
    assert last["accuracy"] >= 0.99
    assert last["baseline_accuracy"] < 0.2
    assert logged(tmp_path, "attack/dli/accuracy") == [last["accuracy"]]  # to every logger
    assert "epsilon_bound" not in last  # no label mechanism, no bound


@pytest.mark.parametrize("protocol", ["EASTER", "CVFL", "PraVFed"])
def test_dli_under_randomized_response_recovers_the_release_not_the_label(tmp_path, protocol):
    mechanism = RandomizedResponse(epsilon=1.0)
    parties = mlp_parties(3)
    if protocol == "EASTER":
        model = EASTER(parties=parties, embedding_dim=8, label_mechanism=mechanism)
    elif protocol == "CVFL":
        model = CVFL(parties=parties, top_model=MLP, label_mechanism=mechanism)
    else:
        model = PraVFed(parties=parties, label_mechanism=mechanism, local_epochs=1)
    attack = DirectLabelInference()
    dm = Digits(num_parties=3, batch_size=128)
    fit(tmp_path, model, dm, [attack])
    release = model.label_release
    truth = dict(zip(dm.train_set.ids.tolist(), dm.train_set.labels.tolist(), strict=True))
    kept = [int(y) == truth[int(i)] for i, y in zip(release.ids.tolist(), release.labels.tolist(), strict=True)]
    # the attack reads the release exactly: its accuracy is the fraction the mechanism kept (an independent count)
    assert attack.history[-1]["accuracy"] == pytest.approx(sum(kept) / len(kept), abs=1e-12)
    bound = math.e / (math.e + 9)  # e^eps / (e^eps + K - 1), K = 10
    assert attack.history[-1]["accuracy"] <= bound + 3 * attack.history[-1]["accuracy_se"]
    assert attack.history[-1]["epsilon_bound"] == pytest.approx(bound)  # logged beside the measured accuracy


def test_dli_refuses_splitnn_by_name_and_says_what_applies(tmp_path):
    model = SplitNN(parties=mlp_parties(2), top_model=MLP)
    with pytest.raises(
        ValueError, match="DirectLabelInference does not apply to SplitNN: it reads prediction_gradient"
    ):
        fit(tmp_path, model, BreastCancer(num_parties=2), [DirectLabelInference()])


def test_an_attack_refuses_the_active_party_and_a_name_clash(tmp_path):
    with pytest.raises(ValueError, match="party must be a passive party"):
        fit(tmp_path, easter(2), Digits(num_parties=2), [DirectLabelInference(party="party0")])
    with pytest.raises(ValueError, match="two attacks log under attack/dli/: give one of them a `name`"):
        fit(tmp_path, easter(3), Digits(num_parties=3), [DirectLabelInference(), DirectLabelInference(party="party2")])
    fit(
        tmp_path,
        easter(3),
        Digits(num_parties=3),
        [DirectLabelInference(), DirectLabelInference(party="party2", name="dli2")],
        limit_train_batches=1,
    )


# ------------------------------------------------------------------------------------------------ Li et al.'s scoring
def test_norm_scoring_ranks_by_the_gradient_norm_like_sklearn():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(2, (300,), generator=g)
    grad = torch.randn(300, 16, generator=g) * (1 + labels[:, None])  # label 1: larger norms, with overlap
    scores = NormScoring(larger_norm_class=1).infer(view(grad, EMBEDDING_GRADIENT))
    reference = roc_auc_score(labels.numpy(), grad.norm(dim=1).numpy())
    assert evaluate(scores, labels, ("auc",))["auc"] == pytest.approx(reference, abs=1e-6)
    assert 0.8 < reference < 1  # informative, not perfect: the attack is measured, not given the answer
    flipped = NormScoring(larger_norm_class=0).infer(view(grad, EMBEDDING_GRADIENT))
    assert evaluate(flipped, labels, ("auc",))["auc"] == pytest.approx(1 - reference, abs=1e-6)


def test_norm_scoring_orients_itself_by_known_samples():
    g = torch.Generator().manual_seed(1)
    labels = torch.randint(2, (200,), generator=g)
    grad = torch.randn(200, 8, generator=g) * (1 + 2 * (1 - labels[:, None]))  # label 0: larger norms
    known = {i: int(labels[i]) for i in range(200) if i < 10}
    attack = NormScoring(known_labels=2)
    scores = attack.infer(view(grad, EMBEDDING_GRADIENT, known))
    assert evaluate(scores, labels, ("auc",))["auc"] > 0.8
    with pytest.raises(ValueError, match="give larger_norm_class"):
        NormScoring()


def test_direction_scoring_separates_opposite_gradients_and_needs_a_known_label():
    g = torch.Generator().manual_seed(2)
    labels = torch.randint(2, (100,), generator=g)
    direction = torch.randn(32, generator=g)
    # dL/dE = (p - y) dz/dE: opposite signs for the two classes along one direction, plus noise
    grad = (torch.rand(100, 1, generator=g) + 0.1) * (0.5 - labels[:, None]) * direction + 0.05 * torch.randn(100, 32)
    known = {int(torch.nonzero(labels == 1)[0]): 1}
    scores = DirectionScoring(known_labels=1).infer(view(grad, EMBEDDING_GRADIENT, known))
    assert evaluate(scores, labels, ("auc", "accuracy"))["auc"] > 0.99
    # the same gradients with the labels' link cut (shuffled rows): the attack learns nothing
    shuffled = grad[torch.randperm(100, generator=g)]
    scores = DirectionScoring(known_labels=1).infer(view(shuffled, EMBEDDING_GRADIENT, known))
    assert abs(evaluate(scores, labels, ("auc",))["auc"] - 0.5) < 0.2
    with pytest.raises(ValueError, match="needs known_labels >= 1"):
        DirectionScoring(known_labels=0)


def test_scoring_attacks_refuse_a_multiclass_task(tmp_path):
    model = SplitNN(parties=mlp_parties(2), top_model=MLP)
    with pytest.raises(ValueError, match="NormScoring is for binary tasks"):
        fit(tmp_path, model, Digits(num_parties=2), [NormScoring(larger_norm_class=1)])


def test_direction_scoring_reads_the_label_off_splitnn_cut_layer_gradients(tmp_path):
    model = SplitNN(parties=mlp_parties(2), top_model=MLP)
    attacks = [DirectionScoring(known_labels=4), NormScoring(known_labels=10)]
    fit(tmp_path, model, BreastCancer(num_parties=2, batch_size=32), attacks, epochs=2)
    direction = attacks[0].history[-1]
    assert direction["auc"] >= 0.95
    assert direction["accuracy"] > direction["baseline_accuracy"] + 0.2
    norm = attacks[1].history[-1]
    assert 0 <= norm["auc"] <= 1
    assert logged(tmp_path, "attack/norm_scoring/auc") == [h["auc"] for h in attacks[1].history]


# ------------------------------------------------------------------------------------------------ the declarations
@pytest.mark.parametrize("protocol", ["EASTER", "AggVFL", "SplitNN", "CVFL", "PraVFed"])
def test_every_tag_a_passive_party_receives_is_declared(tmp_path, protocol):
    parties = mlp_parties(3)
    model = {
        "EASTER": lambda: easter(3),
        "AggVFL": lambda: AggVFL(parties=parties),
        "SplitNN": lambda: SplitNN(parties=parties, top_model=MLP),
        "CVFL": lambda: CVFL(parties=parties, top_model=MLP),
        "PraVFed": lambda: PraVFed(parties=parties, local_epochs=1),
    }[protocol]()
    received: set[str] = set()
    model.wire.subscribe(lambda src, dst, tag, payload: dst != "party0" and received.add(tag))
    trainer = make_trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    trainer.fit(model, datamodule=Digits(num_parties=3, batch_size=64))
    declared = type(model).passive_inbox
    assert received <= set(declared), received - set(declared)
    assert set(declared.values()) <= set(KINDS)


def test_dli_scores_match_the_softmax_reference():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(50, 10, generator=g, requires_grad=True)
    labels = torch.randint(10, (50,), generator=g)
    (grad,) = torch.autograd.grad(F.cross_entropy(logits, labels), logits)
    scores = DirectLabelInference().infer(view(grad, PREDICTION_GRADIENT, num_classes=10))
    assert torch.equal(scores.argmax(1), labels)


# --------------------------------------------------------------------------------------------- passive model completion
class Encoded(torch.nn.Module):
    """A party model with an encoder (batch norm in training mode: running it would change its buffers)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.BatchNorm1d(width))


def completion_view(features, labels, known: dict[int, int], model, batch: slice) -> PartyView:
    n = len(labels)
    return PartyView(
        party="party1",
        ids=torch.arange(n)[batch],
        features=features[batch],
        inbox=(),
        setup_inbox=(),
        model=model,
        train_ids=torch.arange(n),
        train_features=features,
        known_labels=known,
        kinds={},
        num_classes=4,
        epoch=0,
        batch_idx=0,
    )


def test_pmc_labels_from_known_samples_and_learns_nothing_when_their_link_is_cut():
    g = torch.Generator().manual_seed(5)
    labels = torch.randint(4, (400,), generator=g)
    features = torch.randn(400, 6, generator=g) + 2.5 * F.one_hot(labels, 6).float()  # classes apart in 4 of 6 dims
    model = Encoded(6).train()
    with torch.no_grad():
        model.encoder[0].weight.copy_(torch.eye(6))
        model.encoder[0].bias.zero_()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    known = {i: int(labels[i]) for i in range(40)}
    scores = PassiveModelCompletion(known_labels=40).infer(
        completion_view(features, labels, known, model, slice(40, None))
    )
    right = evaluate(scores, labels[40:], ("accuracy",))
    assert right["accuracy"] > 0.8 > right["baseline_accuracy"] + 0.4
    # the attack ran a copy: the party's model, its batch-norm statistics included, is as it was
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # the reference on the raw features needs no model: here the encoder is the identity, so the two agree
    raw = PassiveModelCompletion(known_labels=40, inputs="raw", name="pmc_raw")
    scores = raw.infer(completion_view(features, labels, known, None, slice(40, None)))
    assert evaluate(scores, labels[40:], ("accuracy",))["accuracy"] > 0.8
    with pytest.raises(ValueError, match="inputs must be 'encoder' or 'raw'"):
        PassiveModelCompletion(inputs="embeddings")
    cut = {i: int(y) for i, y in zip(range(40), torch.randperm(4, generator=g).repeat(10).tolist(), strict=True)}
    scores = PassiveModelCompletion(known_labels=40).infer(
        completion_view(features, labels, cut, model, slice(40, None))
    )
    assert evaluate(scores, labels[40:], ("accuracy",))["accuracy"] < right["baseline_accuracy"] + 0.15


def test_pmc_on_splitnn_reads_only_its_own_encoder_and_beats_the_prior(tmp_path):
    attack = PassiveModelCompletion(known_labels=40, party="party3")
    model = SplitNN(parties=mlp_parties(4), top_model=MLP)
    fit(tmp_path, model, Digits(num_parties=4, batch_size=64), [attack], limit_train_batches=8)
    last = attack.history[-1]
    assert 8 * 64 - 40 <= last["samples"] <= 8 * 64  # the batches' samples, less the known ones among them
    assert last["accuracy"] > last["baseline_accuracy"] + 0.2
    assert logged(tmp_path, "attack/pmc/accuracy") == [last["accuracy"]]


# ----------------------------------------------------------------------------------------------- feature reconstruction
def easter_two() -> EASTER:
    """EASTER with C = 2: C * E - E_1 is the active party's embedding, whatever the backend (Plain here)."""
    return EASTER(parties=mlp_parties(2, hidden=(64,)), embedding_dim=64)


@pytest.mark.slow
def test_embedding_inversion_reconstructs_the_active_party_features_from_the_global_embedding(tmp_path):
    attack = EmbeddingInversion(known_features=100)
    fit(tmp_path, easter_two(), Digits(num_parties=2, batch_size=128), [attack], epochs=3)
    assert [h["epoch"] for h in attack.history] == [1.0, 2.0]  # no guess before a first epoch of pairs
    last = attack.history[-1]
    assert last["samples"] == 1257 - 100
    assert last["mse"] < 0.4 * last["baseline_mse"]  # C * E - E_1 = E_a: the active party's strip, reconstructed
    assert logged(tmp_path, "attack/embedding_inversion/mse") == [h["mse"] for h in attack.history]


class CutInversion(EmbeddingInversion):
    """The same attack with its known samples' features shuffled among them: the link to the embeddings is cut."""

    def on_fit_start(self, trainer, pl_module):
        super().on_fit_start(trainer, pl_module)
        ids = list(self._known_features)
        values = [self._known_features[i] for i in ids[1:] + ids[:1]]
        self._known_features = dict(zip(ids, values, strict=True))


@pytest.mark.slow
def test_embedding_inversion_learns_nothing_when_its_link_is_cut(tmp_path):
    attack = CutInversion(known_features=100)
    fit(tmp_path, easter_two(), Digits(num_parties=2, batch_size=128), [attack], epochs=3)
    assert attack.history[-1]["mse"] > 0.8 * attack.history[-1]["baseline_mse"]


@pytest.mark.slow
def test_attacks_leave_the_run_bit_identical(tmp_path):
    import lightning.pytorch as pl

    finals = []
    for attacks in ([], [EmbeddingInversion(known_features=50), PassiveModelCompletion(known_labels=20)]):
        pl.seed_everything(0)
        model = easter_two()
        fit(tmp_path / str(len(attacks)), model, Digits(num_parties=2, batch_size=128), attacks, epochs=2)
        finals.append({k: v.clone() for k, v in model.state_dict().items()})
    assert finals[0].keys() == finals[1].keys()
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


def test_an_attack_leaves_a_run_that_draws_from_the_global_generator_bit_identical(tmp_path):
    """MID draws its noise from the global generator at every step, so an attack that drew from it (a layer built
    outside a forked random state) changes every later step: a review found PassiveModelCompletion doing so on
    SplitNN with MID (every tensor differed)."""
    import lightning.pytorch as pl

    finals = []
    for attacks in ([], [PassiveModelCompletion(known_labels=20)]):
        pl.seed_everything(0)
        model = SplitNN(parties=mlp_parties(2), top_model=MLP, embedding_dim=8, received_defense=MID())
        fit(tmp_path / str(len(attacks)), model, BreastCancer(num_parties=2, batch_size=32), attacks, epochs=2)
        finals.append({k: v.clone() for k, v in model.state_dict().items()})
    assert finals[0].keys() == finals[1].keys()
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


def test_embedding_inversion_refuses_splitnn_and_needs_known_features(tmp_path):
    with pytest.raises(ValueError, match="EmbeddingInversion does not apply to SplitNN: it reads global_embedding"):
        fit(tmp_path, SplitNN(parties=mlp_parties(2), top_model=MLP), Digits(num_parties=2), [EmbeddingInversion()])
    with pytest.raises(ValueError, match="EmbeddingInversion needs known_features >= 1"):
        EmbeddingInversion(known_features=0)
    with pytest.raises(ValueError, match="C_VFL sends the other parties' embeddings one by one"):
        fit(tmp_path, CVFL(parties=mlp_parties(2), top_model=MLP), Digits(num_parties=2), [EmbeddingInversion()])


# ------------------------------------------------------------------------------------------------ batch-level inference
@pytest.mark.slow
def test_batch_inversion_recovers_a_linear_top_models_labels_up_to_naming():
    from scipy.optimize import linear_sum_assignment

    from lvfl.attacks.batch_label import invert_batch_gradient

    torch.manual_seed(0)
    batch, width, classes = 64, 8, 4
    h, weight, rest = torch.randn(batch, width), torch.randn(classes, width), torch.randn(batch, classes)
    y = torch.randint(classes, (batch,))
    leaf = h.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(F.cross_entropy(leaf @ weight.T + rest, y), leaf)

    def recovered(g):
        found = invert_batch_gradient(h, g, classes, True, 1000, 0.05, torch.Generator().manual_seed(1)).argmax(1)
        votes = torch.zeros(classes, classes).index_put_((found, y), torch.ones(batch), accumulate=True)
        rows, cols = linear_sum_assignment(-votes.numpy())
        return votes[rows, cols].sum().item() / batch

    assert recovered(grad) >= 0.9
    assert recovered(grad[torch.randperm(batch)]) < 0.6  # the rows' link to the samples cut: nothing to invert


def test_batch_level_inference_names_classes_by_the_known_samples():
    scores = F.one_hot(torch.tensor([2, 2, 0, 1, 1]), 3).float()  # found classes; truth is found + 1 (mod 3)
    v = view(torch.zeros(5, 3), EMBEDDING_GRADIENT, known={0: 0, 3: 2}, num_classes=3)
    renamed = lvfl.attacks.BatchLabelInference.name_classes(scores, v)
    assert renamed.argmax(1).tolist() == [0, 0, 1, 2, 2]


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["EASTER", "AggVFL"])
def test_batch_level_inference_recovers_a_sum_tops_batch_and_is_bounded_by_the_release(tmp_path, protocol):
    def make(**kw):
        return EASTER(mlp_parties(2), embedding_dim=8, **kw) if protocol == "EASTER" else AggVFL(mlp_parties(2), **kw)

    dm = Digits(num_parties=2, batch_size=256)
    attack = lvfl.attacks.BatchLabelInference(iterations=200, batches=2)
    fit(tmp_path / "plain", make(), dm, [attack])
    assert attack.history[-1]["accuracy"] >= 0.99, attack.history
    assert attack.history[-1]["samples"] == 512  # the first two batches only
    defended = lvfl.attacks.BatchLabelInference(iterations=200, batches=2)
    mechanism = RandomizedResponse(epsilon=1.0)
    fit(tmp_path / "rr", make(label_mechanism=mechanism), Digits(num_parties=2, batch_size=256), [defended])
    last = defended.history[-1]
    assert last["accuracy"] <= last["epsilon_bound"] + 3 * last["accuracy_se"]
