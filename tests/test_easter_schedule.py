"""EASTER's `schedule: local_updates` (FedBCD-style local updates per exchange) against a hand-written reference.

One exchange over the batch (shares up, E down, R_k up, dloss_k/dR_k down), then one update per sub-batch, each party
recomputing its own E_k and R_k with its current parameters: its own part of E up to date, the others' as exchanged and,
for a passive party, the exchanged gradient. The reference below writes that out in plain torch, with no lvfl code; the
ledger shows the same messages per sample as the synchronous step at a `local_updates`-th of the exchanges; bad options
are refused by name. Parity of every party's view with the simulation is in tests/test_party_views.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from helpers import make_trainer, mlp_parties, recording

from lvfl.datamodules import Digits
from lvfl.network import simulate
from lvfl.parties import TaskInfo
from lvfl.privacy import DHMasking, LaplaceLabels, Plain
from lvfl.protocols import EASTER


def exchange(models: dict, batch) -> tuple[dict, torch.Tensor]:
    """The first half of an exchange: every party's E_k (at its current parameters) and their mean E."""
    with torch.no_grad():
        exchanged = {k: models[k].encoder(batch.features[k]) for k in models}
    return exchanged, sum(exchanged.values()) / len(models)


def stale_gradients(models: dict, batch, e: torch.Tensor) -> dict[str, torch.Tensor]:
    """The second half: each passive party's R_k on E (its current head), and dloss_k/dR_k computed from it."""
    stale = {}
    for k in list(models)[1:]:
        r = models[k].head(e).detach().requires_grad_(True)
        (stale[k],) = torch.autograd.grad(F.cross_entropy(r, batch.labels), r)
    return stale


def update_on(models, optimizers, batch, exchanged, e, stale, updates: int, fresh: bool = False) -> None:
    """The updates over `batch`'s sub-batches, each party's own part of E at its current parameters; with `fresh`, a
    passive party trains on dloss_k/dR_k taken from the labels at its current R_k (what delay compensation gives it
    without them), the loss still the batch's mean."""
    names, c, n = list(models), len(models), len(batch.ids)
    for part in torch.arange(n).tensor_split(updates):
        rows = slice(int(part[0]), int(part[-1]) + 1)
        for k in names:
            optimizers[k].zero_grad()
            own = models[k].encoder(batch.features[k][rows])  # its own part of E at its current parameters
            r = models[k].head(e[rows] + (own - exchanged[k][rows]) / c)
            if k == names[0]:
                F.cross_entropy(r, batch.labels[rows]).backward()
            elif fresh:
                now = r.detach().requires_grad_(True)
                (gradient,) = torch.autograd.grad(F.cross_entropy(now, batch.labels[rows], reduction="sum") / n, now)
                (r * gradient).sum().mul(n / len(part)).backward()
            else:
                (r * stale[k][rows]).sum().mul(n / len(part)).backward()
            optimizers[k].step()


def local_updates_reference(
    models: dict, batch, lr: float, updates: int, fresh: bool = False
) -> dict[str, dict[str, torch.Tensor]]:
    """FedBCD-style local updates for EASTER, by hand: the exchange at the first parameters, then the sub-batches."""
    models = copy.deepcopy(models)
    optimizers = {k: torch.optim.SGD(models[k].parameters(), lr=lr) for k in models}
    exchanged, e = exchange(models, batch)
    update_on(models, optimizers, batch, exchanged, e, stale_gradients(models, batch, e), updates, fresh)
    return {k: {name: p.detach() for name, p in models[k].named_parameters()} for k in models}


def pipelined_reference(
    models: dict, batches: list, lr: float, updates: int, fresh: bool = False
) -> dict[str, dict[str, torch.Tensor]]:
    """The pipelined schedule by hand, over one epoch's batches: batch t's first half-exchange at the parameters
    before batch t-1's updates, batch t-1's second half (R_k at the parameters before its own updates) and updates
    next; the last batch finished in the last step."""
    models = copy.deepcopy(models)
    optimizers = {k: torch.optim.SGD(models[k].parameters(), lr=lr) for k in models}
    pending = None
    for t, batch in enumerate(batches):
        exchanged, e = exchange(models, batch)
        if pending is not None:
            update_on(models, optimizers, *pending, stale_gradients(models, pending[0], pending[2]), updates, fresh)
        pending = (batch, exchanged, e)
        if t == len(batches) - 1:
            update_on(models, optimizers, *pending, stale_gradients(models, batch, e), updates, fresh)
    return {k: {name: p.detach() for name, p in models[k].named_parameters()} for k in models}


@pytest.mark.parametrize(("aggregation", "updates", "batch_size"), [(Plain, 3, 64), (DHMasking, 4, 50)])
def test_one_exchange_and_its_updates_equal_the_hand_written_reference(tmp_path, aggregation, updates, batch_size):
    torch.manual_seed(0)
    dm = Digits(num_parties=3, batch_size=batch_size)  # 50 into 4 sub-batches: 13, 13, 12, 12 rows
    model = recording(EASTER, snapshot=True)(
        parties=mlp_parties(3, lr=0.1), aggregation=aggregation(), embedding_dim=8, schedule="local_updates",
        local_updates=updates,
    )  # fmt: skip
    make_trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, datamodule=dm)
    (batch,) = model.batches
    expected = local_updates_reference(model.before, batch, lr=0.1, updates=updates)
    atol = 1e-6 if aggregation is Plain else 1e-4  # DHMasking's fixed point perturbs E by 2^-16 at most
    for k in model.party_names:
        for name, p in model.party_models[k].named_parameters():
            assert torch.allclose(p.detach(), expected[k][name], atol=atol), f"{k}.{name}"
    assert model.trainer.global_step == updates * len(model.party_names)  # every party stepped once per sub-batch


@pytest.mark.parametrize(("aggregation", "updates"), [(Plain, 3), (DHMasking, 2)])
def test_a_pipelined_epoch_equals_the_hand_written_reference(tmp_path, aggregation, updates):
    torch.manual_seed(0)
    dm = Digits(num_parties=3, batch_size=40)
    model = recording(EASTER, snapshot=True)(
        parties=mlp_parties(3, lr=0.5), aggregation=aggregation(), embedding_dim=8, schedule="pipelined",
        local_updates=updates,
    )  # fmt: skip
    make_trainer(tmp_path, max_epochs=1, limit_train_batches=4, limit_val_batches=0).fit(model, datamodule=dm)
    expected = pipelined_reference(model.before, model.batches, lr=0.5, updates=updates)
    atol = 1e-6 if aggregation is Plain else 1e-4  # DHMasking's fixed point perturbs E by 2^-16 at most
    for k in model.party_names:
        for name, p in model.party_models[k].named_parameters():
            assert torch.allclose(p.detach(), expected[k][name], atol=atol), f"{k}.{name}"
    # not the local schedule: the same batches, each exchanged at the parameters its own updates start from, differ
    models = copy.deepcopy(model.before)
    optimizers = {k: torch.optim.SGD(models[k].parameters(), lr=0.5) for k in models}
    for batch in model.batches:
        exchanged, e = exchange(models, batch)
        update_on(models, optimizers, batch, exchanged, e, stale_gradients(models, batch, e), updates)
    apart = max(
        (p.detach() - expected[k][n]).abs().max().item() for k in models for n, p in models[k].named_parameters()
    )
    assert apart > 10 * atol, apart
    assert model.trainer.global_step == 4 * updates * len(model.party_names)  # every batch's updates, in the epoch


def parameters_of(model) -> dict[str, dict[str, torch.Tensor]]:
    return {k: {n: p.detach().clone() for n, p in model.party_models[k].named_parameters()} for k in model.party_names}


def largest_difference(a: dict, b: dict) -> float:
    return max((a[k][n] - b[k][n]).abs().max().item() for k in a for n in a[k])


@pytest.mark.parametrize(
    ("schedule", "aggregation", "updates"),
    [("local_updates", Plain, 3), ("pipelined", Plain, 3), ("pipelined", DHMasking, 2)],
)
def test_delay_compensation_trains_a_passive_party_on_the_fresh_gradient(tmp_path, schedule, aggregation, updates):
    """With delay compensation each passive update equals one on dloss_k/dR_k taken from the labels at the current
    R_k (the reference's `fresh`), which the party never holds; without it the same run differs from that."""
    runs = {}
    for compensate in (True, False):
        torch.manual_seed(0)
        dm = Digits(num_parties=3, batch_size=48)
        model = recording(EASTER, snapshot=True)(
            parties=mlp_parties(3, lr=0.5), aggregation=aggregation(), embedding_dim=8, schedule=schedule,
            local_updates=updates, delay_compensation=compensate,
        )  # fmt: skip
        steps = 1 if schedule == "local_updates" else 4
        make_trainer(tmp_path / str(compensate), max_epochs=1, limit_train_batches=steps, limit_val_batches=0).fit(
            model, datamodule=dm
        )
        runs[compensate] = parameters_of(model)
    if schedule == "local_updates":
        expected = local_updates_reference(model.before, model.batches[0], lr=0.5, updates=updates, fresh=True)
    else:
        expected = pipelined_reference(model.before, model.batches, lr=0.5, updates=updates, fresh=True)
    atol = 1e-6 if aggregation is Plain else 1e-4  # DHMasking's fixed point perturbs E by 2^-16 at most
    assert largest_difference(runs[True], expected) < atol
    assert largest_difference(runs[False], expected) > 10 * atol  # the option changes the updates


def test_the_gradient_shift_is_the_change_of_the_labelled_gradient() -> None:
    """`task_loss_gradient_shift` against autograd of the loss with its labels, for classes and for a regression."""
    torch.manual_seed(0)
    old, new = torch.randn(6, 4), torch.randn(6, 4)
    model = EASTER(parties=mlp_parties(2), embedding_dim=8)
    for task, labels in ((TaskInfo(4), torch.randint(0, 4, (6,))), (TaskInfo(0, "regression"), torch.randn(6))):
        model.task = task
        if task.is_regression:
            old, new = old[:, :1], new[:, :1]

        def gradient(logits, labels=labels):
            at = logits.clone().requires_grad_(True)
            (g,) = torch.autograd.grad(model.task_loss(at, labels) * len(labels) / 10, at)  # a mean over 10 rows
            return g

        shift = model.task_loss_gradient_shift(new, old, rows=10)
        assert torch.allclose(shift, gradient(new) - gradient(old), atol=1e-6), task.kind
        assert torch.allclose(gradient(old) + shift, gradient(new), atol=1e-6)


def test_a_pipelined_step_waits_on_two_one_way_trips_where_local_updates_wait_on_four(tmp_path):
    """The messages of a pipelined step in the order they leave: shares and the previous R_k up together, then E
    and the previous gradients down; `NetworkSimulator` times them as two trips."""
    from lvfl.callbacks import NetworkSimulator

    trips = {}
    for schedule in ("local_updates", "pipelined"):
        torch.manual_seed(0)
        model = EASTER(parties=mlp_parties(3), embedding_dim=8, schedule=schedule, local_updates=2)
        dm = Digits(num_parties=3, batch_size=64)
        sim = NetworkSimulator(links={"up_mbps": 1e6, "down_mbps": 1e6, "latency_ms": 50.0}, keep_trace=True,
                               print_summary=False)  # fmt: skip
        make_trainer(
            tmp_path / schedule, max_epochs=1, limit_train_batches=4, limit_val_batches=0, callbacks=[sim]
        ).fit(model, datamodule=dm)
        steps = [p for p in sim.trace if p.kind == "step"]
        trips[schedule] = [round(simulate(p.schedule, sim._links).comm_s / 0.1, 3) for p in steps]
    assert trips["local_updates"] == [4.0] * 4  # 100 ms a one-way trip between two parties
    assert trips["pipelined"] == [2.0, 2.0, 2.0, 4.0]  # the last step finishes its own batch too


def test_the_references_first_update_is_algorithm_1_on_its_sub_batch() -> None:
    """The reference's first update equals the synchronous step (VFedMH Algorithm 1) on the first sub-batch."""
    torch.manual_seed(1)
    dm = Digits(num_parties=2, batch_size=32, seed=3)
    model = EASTER(parties=mlp_parties(2, lr=0.1), embedding_dim=8)
    model.build(dm.party_specs, dm.task)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    first = batch.rows(0, 16)
    expected = local_updates_reference(dict(model.party_models), first, lr=0.1, updates=1)
    models = copy.deepcopy(dict(model.party_models))
    names = list(models)
    embeddings = [models[j].encoder(first.features[j]) for j in names]
    grads = {}
    for k in names:  # party k's own loss through E, its gradient in its own parameters only
        e = sum(em if j == k else em.detach() for j, em in zip(names, embeddings, strict=True)) / len(names)
        loss = F.cross_entropy(models[k].head(e), first.labels)
        grads[k] = torch.autograd.grad(loss, list(models[k].parameters()))
    for k in names:
        for (name, p), g in zip(models[k].named_parameters(), grads[k], strict=True):
            assert torch.allclose(p.detach() - 0.1 * g, expected[k][name], atol=1e-6), f"{k}.{name}"


def test_an_epoch_sends_what_sync_sends_per_sample_in_a_quarter_of_the_exchanges(tmp_path):
    ledgers, exchanges, rows = {}, {}, {}
    for schedule, batch_size, kwargs in (("sync", 32, {}), ("local_updates", 128, {"local_updates": 4})):
        torch.manual_seed(0)
        model = EASTER(parties=mlp_parties(4), aggregation=DHMasking(), embedding_dim=8, schedule=schedule, **kwargs)
        dm = Digits(num_parties=4, batch_size=batch_size)
        seen = []
        trainer = make_trainer(tmp_path / schedule, limit_val_batches=0)
        model.build(dm.party_specs, dm.task)
        model.wire.subscribe(lambda src, dst, tag, payload, seen=seen: seen.append(tag))
        trainer.fit(model, datamodule=dm)
        ledgers[schedule] = {tag: n for (_, _, tag), n in model.wire.bytes.items() if tag != "keys"}
        exchanges[schedule] = seen.count("global_embedding") / 3  # E goes down to each of the 3 passive parties
        rows[schedule] = len(dm.train_dataloader().dataset)
    assert rows["sync"] == rows["local_updates"]
    for tag in ("embeddings", "global_embedding", "predictions", "gradients"):  # the same bytes per sample
        assert ledgers["sync"][tag] == ledgers["local_updates"][tag], tag
    assert exchanges["sync"] == -(-rows["sync"] // 32)
    assert exchanges["local_updates"] == -(-rows["sync"] // 128)  # a quarter, the last batch a short one


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"schedule": "stale"},
            "model.schedule must be one of ['sync', 'local_updates', 'pipelined'], got 'stale'",
        ),
        ({"local_updates": 4}, "model.local_updates=4 applies to model.schedule: local_updates or pipelined only"),
        ({"schedule": "local_updates", "local_updates": 1}, "model.local_updates must be an integer >= 2, got 1"),
        (
            {"delay_compensation": True},
            "model.delay_compensation applies to model.schedule: local_updates or pipelined only",
        ),  # fmt: skip
        ({"schedule": "pipelined", "delay_compensation": "yes"}, "model.delay_compensation must be true or false"),
        (
            {"schedule": "pipelined", "delay_compensation": True, "label_mechanism": LaplaceLabels(1.0, seed=0)},
            "model.delay_compensation needs a loss whose gradient in R_k is a function of R_k minus one of the label",
        ),
    ],
)
def test_a_bad_schedule_is_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        EASTER(parties=mlp_parties(2), **kwargs)
