"""Local and Central against independent references: EASTER with one participant, a hand-written SGD step on the
concatenated features, the un-partitioned (scaled) rows rebuilt from scikit-learn, an empty ledger, bad input."""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
import yaml
from helpers import REPO, make_trainer, mlp_parties, recording
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.preprocessing import StandardScaler

from lvfl.commands import bench
from lvfl.datamodules import BreastCancer, Digits, ShuffledColumns
from lvfl.models import MLP
from lvfl.parties import PartySpec, TaskInfo
from lvfl.privacy import DHMasking, Plain
from lvfl.protocols import EASTER, PartyConfig
from lvfl.protocols.standalone import Central, Local

RecordingCentral = recording(Central)


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def whole(split) -> object:
    """A whole split as one batch."""
    return split.__getitems__(torch.arange(len(split)))


# ---------------------------------------------------------------------------------------------------------- Local
def test_local_equals_easter_with_one_participant_and_sends_nothing(tmp_path):
    """Same seed, same active model: one epoch of Local on the 4-party split equals EASTER on participants=[0]."""
    parties = mlp_parties(1, lr=0.1, hidden=(16,), momentum=0.9)
    dm_local = Digits(num_parties=4, batch_size=64)
    dm_easter = Digits(num_parties=4, participants=[0], batch_size=64)
    torch.manual_seed(0)
    local = Local(parties=parties, embedding_dim=8)
    local.build(dm_local.party_specs, dm_local.task)
    torch.manual_seed(0)
    ref = EASTER(parties=parties, aggregation=Plain(), embedding_dim=8)
    ref.build(dm_easter.party_specs, dm_easter.task)
    start = params(local.party_models["party0"])
    assert local.party_names == ["party0"]
    assert list(local.party_models) == ["party0"]  # no passive model built

    make_trainer(tmp_path / "l").fit(local, datamodule=dm_local)
    make_trainer(tmp_path / "e").fit(ref, datamodule=dm_easter)

    after, expected = params(local.party_models["party0"]), params(ref.party_models["party0"])
    assert after.keys() == expected.keys()
    for name in after:
        assert torch.equal(after[name], expected[name]), name
        assert not torch.equal(after[name], start[name]), f"{name} did not move"
    # the ledger (training, validation and set-up) is empty, as EASTER's is with one party
    assert local.wire.total_bytes() == 0
    assert local.wire.total_messages() == 0
    assert dict(local.wire.bytes) == dict(ref.wire.bytes) == {}


def test_local_uses_the_active_partys_entry_and_reads_only_its_slice():
    dm = Digits(num_parties=4, active_party=2, batch_size=32)
    parties = [PartyConfig(model=partial(MLP, hidden=[8 * (k + 1)])) for k in range(4)]
    local = Local(parties=parties, embedding_dim=8)
    local.build(dm.party_specs, dm.task)
    assert local.party_names == ["party2"]
    assert local.active == "party2"
    model = local.party_models["party2"]
    assert model.encoder[1].out_features == 24  # parties[2]'s hidden width
    assert model.input_shape == (1, 8, 2)
    assert list(local.metrics) == ["val_acc_party2", "test_acc_party2"]

    batch = next(iter(dm.val_dataloader()))
    with torch.no_grad():
        out = local.party_logits(batch)
        poisoned = copy.copy(batch)
        poisoned.features = {
            k: (v if k == "party2" else torch.full_like(v, float("nan"))) for k, v in batch.features.items()
        }
        assert torch.equal(local.party_logits(poisoned)["party2"], out["party2"])  # other slices are never read
        assert torch.equal(out["party2"], model.head(model.encoder(batch.features["party2"])))


# ---------------------------------------------------------------------------------------------------------- Central
@pytest.mark.parametrize(("datamodule", "active"), [(Digits, 0), (BreastCancer, 1)])
def test_central_one_step_equals_hand_written_reference(tmp_path, datamodule, active):
    torch.manual_seed(0)
    dm = datamodule(num_parties=4, active_party=active, batch_size=64)
    # four entries: Central must take the active party's (hidden [16]); the others would not fit its input anyway
    lr = 0.1
    parties = [
        PartyConfig(model=partial(MLP, hidden=[16] if k == active else [3]), optimizer=partial(torch.optim.SGD, lr=lr))
        for k in range(4)
    ]
    model = RecordingCentral(parties=parties, embedding_dim=8)
    model.build(dm.party_specs, dm.task)
    name = f"party{active}"
    before = copy.deepcopy(model.party_models[name])
    make_trainer(tmp_path, limit_train_batches=1, limit_val_batches=0).fit(model, datamodule=dm)
    (batch,) = model.batches

    x = torch.cat([batch.features[f"party{k}"] for k in range(4)], dim=-1)  # the join, written out
    loss = F.cross_entropy(before(x), batch.labels)
    grads = torch.autograd.grad(loss, list(before.parameters()))
    for (pname, p0), g in zip(before.named_parameters(), grads, strict=True):
        p1 = dict(model.party_models[name].named_parameters())[pname].detach()
        assert torch.allclose(p1, p0.detach() - lr * g, atol=1e-6), pname
        assert not torch.equal(p1, p0.detach()), f"{pname} did not move"
    assert model.party_names == [name]
    assert model.wire.total_bytes() == 0


def test_central_joins_digits_back_into_the_original_images():
    images = load_digits().images
    raw = Digits(num_parties=4, scale=False)
    central = Central(parties=mlp_parties(1), embedding_dim=8)
    central.build(raw.party_specs, raw.task)
    assert central.party_models["party0"].input_shape == (1, 8, 8)
    for split in (raw.train_set, raw.val_set, raw.test_set):
        batch = whole(split)
        assert torch.equal(central.site_features(batch), torch.from_numpy(images[batch.ids.numpy()][:, None]))

    # scaled: each 2-pixel strip standardized with its own training pixels (the datamodule scales per party)
    scaled = Digits(num_parties=4)
    train_ids = whole(scaled.train_set).ids.numpy()
    expected = images.astype(np.float64).copy()
    for k in range(4):
        strip = images[train_ids][:, :, 2 * k : 2 * k + 2].astype(np.float64)
        expected[:, :, 2 * k : 2 * k + 2] = (images[:, :, 2 * k : 2 * k + 2] - strip.mean()) / strip.std()
    for split in (scaled.train_set, scaled.test_set):
        batch = whole(split)
        got = central.site_features(batch)
        assert torch.allclose(got, torch.from_numpy(expected[batch.ids.numpy()][:, None]).float(), atol=1e-5)


@pytest.mark.parametrize("shuffled", [False, True])
def test_central_joins_breast_cancer_back_into_the_scaled_table(shuffled):
    x, _ = load_breast_cancer(return_X_y=True)
    dm = BreastCancer(num_parties=4, partitioner=ShuffledColumns(seed=3) if shuffled else None)
    central = Central(parties=mlp_parties(1), embedding_dim=8)
    central.build(dm.party_specs, dm.task)
    train_ids = whole(dm.train_set).ids.numpy()
    table = StandardScaler().fit(x[train_ids]).transform(x)  # the whole table, scaled at once
    order = [c for cols in dm.columns for c in cols]  # the join's column order: party0's columns, then party1's...
    assert sorted(order) == list(range(30))
    assert (order != list(range(30))) == shuffled  # contiguous groups give back the original order exactly
    assert central.party_models["party0"].input_shape == (30,)
    for split in (dm.train_set, dm.val_set, dm.test_set):
        batch = whole(split)
        expected = torch.from_numpy(table[batch.ids.numpy()][:, order]).float()
        assert torch.allclose(central.site_features(batch), expected, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------- learning
@pytest.fixture(scope="module")
def digits_runs(tmp_path_factory) -> dict[str, dict[str, float]]:
    """Local and Central on digits, 4 epochs each with the same model class, optimizer and seed."""
    out = {}
    for cls in (Local, Central):
        torch.manual_seed(0)
        dm = Digits(num_parties=4, batch_size=64)
        model = cls(parties=mlp_parties(1, lr=0.1, hidden=(32,), momentum=0.9), embedding_dim=16)
        trainer = make_trainer(tmp_path_factory.mktemp(cls.__name__), max_epochs=4)
        trainer.fit(model, datamodule=dm)
        val = {k: float(v) for k, v in trainer.callback_metrics.items()}
        (metrics,) = trainer.test(model, datamodule=dm, verbose=False)
        out[cls.__name__] = {**val, **metrics}
        out[cls.__name__]["wire_bytes"] = model.wire.total_bytes()
    return out


@pytest.mark.parametrize("name", ["Local", "Central"])
def test_learns_on_digits_and_reports_under_the_active_party(digits_runs, name):
    m = digits_runs[name]
    assert m["test/acc/mean"] == m["test/acc/party0"]
    assert m["val/acc/mean"] == m["val/acc/party0"]
    assert not any(k.startswith(("test/acc/party1", "val/acc/party1")) for k in m)
    assert m["wire_bytes"] == 0
    if name == "Local":  # 2 of 8 pixel columns: well above chance (0.1), far below the whole image
        assert 0.3 <= m["test/acc/party0"] <= 0.65
    else:
        assert m["test/acc/party0"] >= 0.85


def test_central_beats_local_on_digits(digits_runs):
    assert digits_runs["Central"]["test/acc/mean"] >= digits_runs["Local"]["test/acc/mean"] + 0.3


# ---------------------------------------------------------------------------------------------------------- configs
TABULAR = ["breast_cancer", "wine", "diabetes"]


@pytest.mark.parametrize("protocol", ["Local", "Central"])
def test_configs_use_the_easter_active_party_and_split(protocol):
    """Local and Central take EASTER's datamodule, split, epochs and party list: the same data and parties pieces.

    Their protocol piece adds only the class and the log name; `lvfl bench` composes every dataset's cell of both
    from the very files EASTER's cell uses, and tests/test_cli.py checks that EASTER's runnable configs equal those
    compositions, so the documented EASTER runs and the baselines share split, seed, batch size and active party.
    """
    piece = yaml.safe_load((REPO / "configs" / "protocols" / protocol.lower() / "default.yaml").read_text())
    assert piece["model"] == {"class_path": f"lvfl.protocols.{protocol}"}  # no parties, no backend, no width
    assert set(piece) == {"trainer", "model"}  # no data of its own
    assert piece["trainer"] == {"logger": {"init_args": {"name": protocol.lower()}}}  # no epochs of its own
    grid = bench.load_grid(REPO / "configs" / "bench" / "baselines.yaml")
    cells = {(c.protocol, c.dataset): c for c in grid.cells() if c.seed == grid.seeds[0]}
    assert set(grid.datasets) >= {"digits", "digits_homo", *TABULAR}
    for dataset in grid.datasets:
        ours, easter = cells[(protocol, dataset)].configs, cells[("EASTER", dataset)].configs
        assert (ours[0], ours[2]) == (easter[0], easter[2]), dataset  # the same data piece and parties piece
        data = yaml.safe_load(Path(ours[0]).read_text())
        assert data["trainer"]["max_epochs"] == 30, dataset


# ---------------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("cls", [Local, Central])
def test_an_aggregation_backend_is_refused(cls):
    with pytest.raises(ValueError, match=rf"{cls.__name__} .* model.aggregation=DHMasking would protect nothing"):
        cls(parties=mlp_parties(1), aggregation=DHMasking())


@pytest.mark.parametrize("cls", [Local, Central])
def test_party_entries_must_be_one_or_one_per_party(cls):
    dm = Digits(num_parties=4)
    model = cls(parties=mlp_parties(3))
    with pytest.raises(ValueError, match=r"model.parties has 3 entries but the datamodule has 4 parties"):
        model.build(dm.party_specs, dm.task)


def test_central_refuses_slices_that_cannot_be_joined():
    specs = [PartySpec("party0", "active", (1, 8, 2), 0), PartySpec("party1", "passive", (1, 6, 2), 1)]
    with pytest.raises(ValueError, match=r"every other axis must agree; got input shapes .*party1.: \(1, 6, 2\)"):
        Central(parties=mlp_parties(1)).build(specs, TaskInfo(num_classes=10))


def test_two_active_parties_are_refused():
    specs = [PartySpec("party0", "active", (3,), 0), PartySpec("party1", "active", (3,), 1)]
    with pytest.raises(ValueError, match=r"exactly one party must be active"):
        Local(parties=mlp_parties(1)).build(specs, TaskInfo(num_classes=2, kind="binary"))
