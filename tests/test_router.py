"""The router: VFL answers equal the model's own predictions for overlapping IDs, the student answers the rest."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from helpers import make_trainer, mlp_parties

from lvfl.callbacks import StudentDistillation
from lvfl.compression import Compressor
from lvfl.datamodules import Digits
from lvfl.inference.router import Router
from lvfl.models import MLP
from lvfl.privacy import DHMasking, LaplaceLabels, Paillier
from lvfl.protocols import CVFL, EASTER, AggVFL, Local, PraVFed, SplitNN

PROTOCOLS = {
    "EASTER": lambda: EASTER(parties=mlp_parties(4), embedding_dim=8),
    "SplitNN-concat": lambda: SplitNN(parties=mlp_parties(4), top_model=partial(MLP, hidden=[]), embedding_dim=8),
    "SplitNN-sum": lambda: SplitNN(
        parties=mlp_parties(4), top_model=partial(MLP, hidden=[]), embedding_dim=8, fusion="sum"
    ),
    "CVFL": lambda: CVFL(
        parties=mlp_parties(4), top_model=partial(MLP, hidden=[8]), embedding_dim=8, compressor=Compressor(bits=8)
    ),
    "AggVFL-mean": lambda: AggVFL(parties=mlp_parties(4), embedding_dim=8, aggregate="mean"),
    "AggVFL-weighted": lambda: AggVFL(parties=mlp_parties(4), embedding_dim=8, aggregate="weighted"),
    "PraVFed": lambda: PraVFed(
        parties=mlp_parties(4), embedding_dim=8, label_mechanism=LaplaceLabels(epsilon=1.0, seed=0), local_epochs=1
    ),
    "Local": lambda: Local(parties=mlp_parties(4), embedding_dim=8),
}


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_split_prediction_equals_the_protocols_own(tmp_path, name):
    """complete_prediction(own features, passive contributions) == party_logits[active], under Plain."""
    model = PROTOCOLS[name]()
    dm = Digits(num_parties=4, batch_size=64)
    trainer = make_trainer(tmp_path, max_epochs=1, limit_train_batches=3, limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    model.eval()
    batch = next(iter(dm.test_dataloader()))
    with torch.no_grad():
        own = model.party_logits(batch)["aggregate" if isinstance(model, AggVFL) else model.active]
        contributions = {k: model.passive_contribution(k, batch.features[k]) for k in model.passive}
        split = model.complete_prediction(batch.features[model.active], contributions)
    assert torch.allclose(split, own, atol=1e-6, rtol=0), (split - own).abs().max()
    assert torch.equal(split.argmax(-1), own.argmax(-1))


#: the protocols whose passive parties' outputs a backend sums, under the backends that round them to fixed point
ROUNDED = {
    "EASTER": lambda backend: EASTER(parties=mlp_parties(3), embedding_dim=8, aggregation=backend),
    "SplitNN-sum": lambda backend: SplitNN(
        parties=mlp_parties(3), top_model=partial(MLP, hidden=[]), embedding_dim=8, fusion="sum", aggregation=backend
    ),
    "AggVFL-mean": lambda backend: AggVFL(
        parties=mlp_parties(3), embedding_dim=8, aggregate="mean", aggregation=backend
    ),
    "PraVFed": lambda backend: PraVFed(
        parties=mlp_parties(3),
        embedding_dim=8,
        label_mechanism=LaplaceLabels(epsilon=1.0, seed=0),
        local_epochs=1,
        aggregation=backend,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["DHMasking", "Paillier"])
@pytest.mark.parametrize("name", list(ROUNDED))
def test_split_prediction_rounds_as_the_runs_backend_does_bit_for_bit(tmp_path, name, backend):
    """Under DHMasking and Paillier the run's own prediction sums the passive outputs in fixed point; the split
    prediction from the same outputs in the clear (what lvfl export, lvfl serve and the router compute) rounds
    them the same way, so the two are equal bit for bit, not merely close."""
    aggregation = DHMasking() if backend == "DHMasking" else Paillier(workers=1)
    model = ROUNDED[name](aggregation)
    dm = Digits(num_parties=3, batch_size=16)
    trainer = make_trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    model.eval()
    batch = dm.test_set.gather(torch.arange(16))
    with torch.no_grad():
        own = model.party_logits(batch)["aggregate" if isinstance(model, AggVFL) else model.active]
        contributions = {k: model.passive_contribution(k, batch.features[k]) for k in model.passive}
        split = model.complete_prediction(batch.features[model.active], contributions)
        plain = Plain_sum_of(model, batch, contributions)
    assert torch.equal(split, own), (split - own).abs().max()
    assert not torch.equal(plain, own)  # the float sum differs: the rounding is what makes them equal


def Plain_sum_of(model, batch, contributions):  # noqa: N802 - names the backend it stands in for
    """The split prediction with the backend's rounding left out (Plain's float sum)."""
    from lvfl.privacy import Plain

    saved, model.aggregation = model.aggregation, Plain()
    try:
        return model.complete_prediction(batch.features[model.active], contributions)
    finally:
        model.aggregation = saved


def test_central_refuses_split_inference(tmp_path):
    from lvfl.protocols import Central

    model = Central(parties=mlp_parties(1), embedding_dim=8)
    with pytest.raises(TypeError, match="Central does not support split"):
        model.complete_prediction(torch.zeros(1, 2), {})


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """EASTER fitted on the half of digits every party holds, with a student for the rest."""
    torch.manual_seed(0)
    dm = Digits(num_parties=4, batch_size=64, overlap=0.5)
    model = EASTER(parties=mlp_parties(4), embedding_dim=8)
    distill = StudentDistillation(epochs=2, lam=0.5)
    trainer = make_trainer(tmp_path_factory.mktemp("fit"), max_epochs=2, limit_val_batches=0, callbacks=[distill])
    trainer.fit(model, datamodule=dm)
    return model, dm, distill.student


@pytest.mark.slow
def test_router_answers_overlap_by_vfl_and_the_rest_by_the_student(fitted):
    model, dm, student = fitted
    router = Router(model, dm, student, bucket_size=16)
    test = dm.active_set("test")
    overlap = dm.overlap_mask("test")
    ids = test.ids[:40]
    answer = router.predict(ids.tolist())
    assert answer.path == tuple("vfl" if bool(o) else "student" for o in overlap[:40])
    assert 0 < answer.path.count("vfl") < 40

    model.eval()
    student.eval()
    vfl_rows = [i for i, p in enumerate(answer.path) if p == "vfl"]
    held = dm.test_set  # the overlap, with every party's features
    position = {int(i): n for n, i in enumerate(held.ids.tolist())}
    rows = torch.tensor([position[int(ids[i])] for i in vfl_rows])
    batch_features = {k: v.index_select(0, rows) for k, v in held.features.items()}
    with torch.no_grad():
        local = {k: model.party_models[k].encoder(batch_features[k]) for k in model.party_names}
        e = (local[model.active] + local["party1"] + local["party2"] + local["party3"]) / 4
        expected_vfl = model.party_models[model.active].head(e)
        expected_student = student(test.features[model.active][[i for i, p in enumerate(answer.path) if p != "vfl"]])
    # the same computation on other batch shapes: equal up to float32 summation order, the same classes
    assert torch.allclose(answer.logits[vfl_rows], expected_vfl, atol=1e-6, rtol=0)
    assert torch.equal(answer.predictions[vfl_rows], expected_vfl.argmax(-1))
    # and the fetched embeddings are the passive parties' own (computed over the split, as the table was), exactly
    first = int(ids[vfl_rows[0]])
    with torch.no_grad():
        for k in model.passive:
            own = model.passive_contribution(k, held.features[k])[position[first]]
            assert torch.equal(router.lookups[k].lookup(first), own)
    student_rows = [i for i, p in enumerate(answer.path) if p == "student"]
    assert torch.allclose(answer.logits[student_rows], expected_student, atol=1e-6)


def test_router_meters_one_round_per_party_and_query(fitted):
    model, dm, student = fitted
    router = Router(model, dm, student, bucket_size=16)
    router.predict([int(dm.active_set("test").ids[0])])
    queries = {k: router.wire.messages[(model.active, k, "ot_query")] for k in model.passive}
    answers = {k: router.wire.messages[(k, model.active, "ot_answer")] for k in model.passive}
    assert queries == answers == dict.fromkeys(model.passive, 1)  # every passive party is asked, hit or miss
    for k in model.passive:  # the table's layout once (5 numbers), the count once, a plan byte per query
        assert router.wire.bytes[(k, model.active, "ot_layout")] == 8 * (4 + 1)
        assert router.wire.bytes[(model.active, k, "ot_count")] == 8
        assert router.wire.bytes[(model.active, k, "ot_plan")] == 1
    for k in model.passive:
        layout = router.lookups[k].table.layout
        assert router.wire.bytes[(k, model.active, "ot_answer")] == layout.answer_bytes  # N * l


@pytest.mark.slow
def test_every_id_costs_each_passive_party_the_same_messages(fitted, monkeypatch):
    """A held ID, an active-only ID inside a passive table (FAIL) and one beyond it: identical passive views."""
    from lvfl.inference import router as router_module
    from lvfl.wire import payload_nbytes

    model, dm, student = fitted
    ids = sorted(int(i) for i in dm.active_set("test").ids)
    cut = ids[len(ids) // 2]  # the passive parties hold only IDs below this: the upper ones are beyond their tables
    real_table = router_module.ObliviousTable
    monkeypatch.setattr(
        router_module,
        "ObliviousTable",
        lambda values, bucket_size: real_table({i: v for i, v in values.items() if i < cut}, bucket_size=bucket_size),
    )
    router = Router(model, dm, student, bucket_size=16)
    layout = router.lookups[model.passive[0]].table.layout
    held = next(int(i) for i in dm.test_set.ids if int(i) < cut)
    inside = next(i for i in ids if layout.address(i) is not None and i not in set(dm.test_set.ids.tolist()))
    beyond = next(i for i in ids if layout.address(i) is None)
    views, paths = {}, {}
    for sample_id in (held, inside, beyond):
        for lookup in router.lookups.values():
            lookup.prepare()  # fresh key sets before each, so only the ID differs
        seen: list[tuple[str, str, str, int]] = []
        handle = router.wire.subscribe(
            lambda src, dst, tag, payload, seen=seen: seen.append((src, dst, tag, payload_nbytes(payload)))
        )
        paths[sample_id] = router.predict([sample_id]).path
        router.wire.unsubscribe(handle)
        views[sample_id] = {k: [m for m in seen if k in m[:2]] for k in model.passive}
    assert paths == {held: ("vfl",), inside: ("student",), beyond: ("student",)}
    for k in model.passive:
        assert [tag for *_, tag, _ in views[held][k]] == ["ot_count", "ot_plan", "ot_query", "ot_answer"]
        assert views[inside][k] == views[held][k]
        assert views[beyond][k] == views[held][k], f"party {k}: an ID beyond its table is visible"


def test_unknown_id_fails_clearly_and_without_a_student_an_active_only_id_gets_no_answer(fitted):
    """An ID nobody holds is refused; one only the active party holds, with no student, is asked like any other (the
    same lookups) and comes back with no answer (path "none", NaN logits) for the caller to give its reason."""
    model, dm, _ = fitted
    router = Router(model, dm, None, bucket_size=16)
    with pytest.raises(ValueError, match=r"sample IDs \[99999\] are held by no party"):
        router.predict([99999])
    test = dm.active_set("test")
    active_only = int(test.ids[~dm.overlap_mask("test")][0])
    held = int(test.ids[dm.overlap_mask("test")][0])
    routed = router.predict([active_only, held])
    assert routed.path == ("none", "vfl")
    assert torch.isnan(routed.logits[0]).all()
    assert torch.isfinite(routed.logits[1]).all()
