"""A checkpoint records the run that wrote it; loading it into a run that differs is refused, naming the difference.

The bug this guards against: runs with the same logger name share `last.ckpt`, so `lvfl test --ckpt_path last`
silently tested whichever run wrote last (another backend, another data split).
"""

from __future__ import annotations

import hashlib
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, dh_key_ledger, make_trainer, split_ledger, write_tables
from lightning.pytorch.callbacks import ModelCheckpoint

from lvfl.datamodules import Synthetic
from lvfl.models import MLP
from lvfl.privacy import DHMasking, Plain, RandomizedResponse
from lvfl.protocols import EASTER, PartyConfig
from lvfl.runs import CheckpointMismatchError, digest_array, run_fingerprint, split_resume_traffic


def tiny_data(seed: int = 0, **kwargs) -> Synthetic:
    args = {"num_samples": 60, "num_features": 6, "num_informative": 4, "num_parties": 3, "batch_size": 20}
    return Synthetic(seed=seed, **{**args, **kwargs})


def tiny_easter(aggregation=None, hidden: int = 8, label_mechanism=None) -> EASTER:
    party = PartyConfig(model=partial(MLP, hidden=[hidden]), optimizer=partial(torch.optim.SGD, lr=0.1))
    return EASTER(parties=[party], aggregation=aggregation, embedding_dim=4, label_mechanism=label_mechanism)


@pytest.fixture(scope="module")
def dh_checkpoint(tmp_path_factory) -> Path:
    """One epoch of EASTER + DHMasking on the tiny data, seed 0: its last.ckpt."""
    tmp = tmp_path_factory.mktemp("dh")
    checkpoint = ModelCheckpoint(dirpath=tmp / "ckpt", save_last=True, save_top_k=0)
    trainer = make_trainer(tmp, callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(tiny_easter(DHMasking()), datamodule=tiny_data())
    return tmp / "ckpt" / "last.ckpt"


def test_the_checkpoint_records_its_run(dh_checkpoint):
    run = torch.load(dh_checkpoint, weights_only=False)["lvfl"]["run"]
    assert run["protocol"]["class"] == "lvfl.protocols.easter.EASTER"
    assert run["protocol"]["embedding_dim"] == 4
    assert run["aggregation"] == {
        "class": "lvfl.privacy.aggregation.masking.DHMasking",
        "frac_bits": 16,
        "allow_insecure": False,
        "ring_bits": 32,
    }
    assert run["label_mechanism"] is None
    assert run["parties"]["party0"]["role"] == "active"
    assert run["parties"]["party1"]["model"]["class"] == "lvfl.models.mlp.MLP"
    assert run["parties"]["party1"]["parameters"]["encoder.1.weight"] == [8, 2]
    data = run["data"]
    assert data["class"] == "lvfl.datamodules.embedded.Synthetic"
    assert data["settings"]["seed"] == 0
    assert data["settings"]["num_samples"] == 60
    assert set(data["splits"]) == {"train", "val", "test"}
    assert sum(s["all"]["samples"] for s in data["splits"].values()) == 60


def test_the_same_run_loads_and_its_set_up_is_named_resume_traffic(tmp_path, dh_checkpoint):
    model = tiny_easter(DHMasking())
    trainer = make_trainer(tmp_path)
    dm = tiny_data(batch_size=7)
    trainer.test(model, datamodule=dm, ckpt_path=str(dh_checkpoint))  # loader settings may differ
    saved = torch.load(dh_checkpoint, weights_only=False)["state_dict"]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items() if k.startswith("party_models"))
    own, again = split_resume_traffic(model.wire.bytes)
    expected = dh_key_ledger(model) | split_ledger(dm)
    assert again == expected, "this process's key exchange and split message, named as re-done set-up"
    assert own["party1", "party0", "keys"] == 96, "the written run's own key exchange, once"


def test_another_backend_is_refused(tmp_path, dh_checkpoint):
    trainer = make_trainer(tmp_path)
    with pytest.raises(CheckpointMismatchError, match=r"aggregation\.class=.*DHMasking.*this run has.*Plain"):
        trainer.test(tiny_easter(Plain()), datamodule=tiny_data(), ckpt_path=str(dh_checkpoint))


def test_another_data_split_is_refused(tmp_path, dh_checkpoint):
    trainer = make_trainer(tmp_path)
    with pytest.raises(CheckpointMismatchError) as info:
        trainer.test(tiny_easter(DHMasking()), datamodule=tiny_data(seed=1), ckpt_path=str(dh_checkpoint))
    message = str(info.value)
    assert "data.settings.seed: checkpoint has 0, this run has 1" in message
    assert "data.splits.train.all.ids_sha256" in message


def test_the_same_settings_with_other_rows_are_refused(tmp_path, dh_checkpoint):
    """A datamodule whose settings match but whose split holds other rows (e.g. a changed `load()`)."""

    class Shifted(Synthetic):
        def _split(self, num_rows, key):
            rows = super()._split(num_rows, key)
            rows["train"], rows["val"] = rows["val"], rows["train"]
            return rows

    Shifted.__module__, Shifted.__qualname__ = Synthetic.__module__, Synthetic.__qualname__
    trainer = make_trainer(tmp_path)
    args = {"num_samples": 60, "num_features": 6, "num_informative": 4, "num_parties": 3, "batch_size": 20}
    with pytest.raises(CheckpointMismatchError, match=r"data\.splits\.train\.all\.samples"):
        trainer.test(tiny_easter(DHMasking()), datamodule=Shifted(**args), ckpt_path=str(dh_checkpoint))


def test_other_party_models_are_refused(tmp_path, dh_checkpoint):
    trainer = make_trainer(tmp_path)
    with pytest.raises(CheckpointMismatchError, match=r"parties\.party0\.parameters\.encoder\.1\.weight"):
        trainer.test(tiny_easter(DHMasking(), hidden=16), datamodule=tiny_data(), ckpt_path=str(dh_checkpoint))


def test_a_resume_into_another_backend_is_refused_too(tmp_path, dh_checkpoint):
    trainer = make_trainer(tmp_path, max_epochs=2)
    with pytest.raises(
        CheckpointMismatchError, match=r"aggregation\.class: checkpoint has \S*DHMasking\S*, this run has \S*Plain"
    ):
        trainer.fit(tiny_easter(Plain()), datamodule=tiny_data(), ckpt_path=str(dh_checkpoint))


def test_load_without_a_trainer_checks_what_it_can(dh_checkpoint):
    checkpoint = torch.load(dh_checkpoint, weights_only=False)
    dm = tiny_data()
    same = tiny_easter(DHMasking())
    same.on_load_checkpoint(checkpoint)  # not built, no datamodule: protocol and backend are checked
    same.build(dm.party_specs, dm.task)
    same.on_load_checkpoint(checkpoint)  # built: the party models are checked too
    assert run_fingerprint(same)["data"] is None

    with pytest.raises(CheckpointMismatchError, match="aggregation"):
        tiny_easter(Plain()).on_load_checkpoint(checkpoint)
    with pytest.raises(
        CheckpointMismatchError, match=r"label_mechanism: checkpoint has None, this run has .*Randomized"
    ):
        tiny_easter(DHMasking(), label_mechanism=RandomizedResponse(epsilon=1.0)).on_load_checkpoint(checkpoint)
    other = tiny_easter(DHMasking(), hidden=16)
    other.build(dm.party_specs, dm.task)
    with pytest.raises(CheckpointMismatchError, match="parties"):
        other.on_load_checkpoint(checkpoint)


@pytest.mark.slow
def test_lvfl_test_refuses_the_last_checkpoint_of_another_backend(tmp_path, monkeypatch):
    """The audit's scenario: fit with DHMasking, fit again with Plain (same logger name), test the DHMasking config."""
    from lvfl.commands.fit import build_cli

    monkeypatch.chdir(REPO)
    common = [
        "--config",
        "configs/easter/wine.yaml",
        "--trainer.max_epochs=1",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    ]
    build_cli(["fit", *common])
    build_cli(
        ["fit", *common, "--model.aggregation=lvfl.privacy.Plain"]
    )  # a second version: --ckpt_path last is now its last.ckpt
    with pytest.raises(
        CheckpointMismatchError, match=r"aggregation\.class=lvfl\.privacy\.aggregation\.plain\.Plain.*DHMasking"
    ):
        build_cli(["test", *common, "--ckpt_path=last"])
    tested = build_cli(["test", *common, "--model.aggregation=lvfl.privacy.Plain", "--ckpt_path=last"])
    assert tested.trainer.ckpt_path.endswith("last.ckpt")


def test_reloading_its_own_checkpoint_adds_nothing_to_the_ledger(tmp_path):
    """Testing the best/last epoch after fit in the same process (`lvfl bench`): that history is already counted."""
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0)
    trainer = make_trainer(tmp_path, callbacks=[checkpoint], enable_checkpointing=True)
    model = tiny_easter(DHMasking())
    trainer.fit(model, datamodule=tiny_data())
    after_fit = dict(model.wire.bytes)
    trainer.test(model, datamodule=tiny_data(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    own, again = split_resume_traffic(model.wire.bytes)
    assert again == {}
    assert {k: n for k, n in own.items() if k[2] == "keys"} == {k: n for k, n in after_fit.items() if k[2] == "keys"}


def test_a_checkpoint_from_before_ring_bits_reads_as_the_64_bit_ring():
    """Checkpoints written before DHMasking had `ring_bits` ran in Z_2^64: they resume with ring_bits=64 only."""
    from lvfl.runs import fingerprint_differences

    old = {"aggregation": {"class": "lvfl.privacy.masking.DHMasking", "frac_bits": 16, "allow_insecure": False}}
    now = {"aggregation": {**old["aggregation"], "ring_bits": 64}}
    assert fingerprint_differences(old, now) == []
    assert fingerprint_differences(old, {"aggregation": {**now["aggregation"], "ring_bits": 32}}) == [
        ("aggregation.ring_bits", 64, 32)
    ]


@pytest.mark.slow
def test_party_tables_fingerprint_covers_the_tables_themselves(tmp_path):
    """The review's finding: renaming every ID or changing every feature under the same paths left the fingerprint
    unchanged. Each party's IDs, columns, fitted encoders and scaling, and encoded features are digested now, and
    loading a checkpoint fitted on other tables is refused naming the party and what changed."""
    import csv

    from lvfl.datamodules import PartyTable, PartyTables
    from lvfl.runs import fingerprint_differences

    bank, retail = write_tables(tmp_path / "a", relabel=False)

    def datamodule() -> PartyTables:
        tables = [PartyTable(bank, "customer_id", label_column="status"), PartyTable(retail, "client")]
        return PartyTables(tables, batch_size=64, seed=0)

    def rewrite(path: str, change) -> None:
        with open(path, newline="") as f:
            header, *rows = list(csv.reader(f))
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows([header, *(change(header, list(r)) for r in rows)])

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0)
    trainer = make_trainer(tmp_path, callbacks=[checkpoint], enable_checkpointing=True, limit_val_batches=0)
    trainer.fit(tiny_easter(), datamodule=datamodule())
    saved = run_fingerprint(trainer.lightning_module, trainer.datamodule)
    assert run_fingerprint(tiny_easter(), datamodule())["data"] == saved["data"]  # the same tables: the same digest

    def spend_doubled(header: list[str], row: list[str]) -> list[str]:
        row[header.index("spend")] = str(2 * float(row[header.index("spend")]))
        return row

    def differences() -> list[str]:
        return [key for key, _, _ in fingerprint_differences(saved, run_fingerprint(tiny_easter(), datamodule()))]

    original = Path(retail).read_text()
    rewrite(retail, spend_doubled)  # an affine change: the standardized features stay, the scaling does not
    assert differences() == ["data.content.party1.scaling"]
    Path(retail).write_text(original)
    spends = [r.split(",")[1] for r in original.splitlines()[1:]]

    def spend_reversed(header: list[str], row: list[str]) -> list[str]:  # the same values at other customers
        row[header.index("spend")] = spends[
            len(spends) - 1 - [r.split(",")[0] for r in original.splitlines()[1:]].index(row[0])
        ]
        return row

    rewrite(retail, spend_reversed)
    assert "data.content.party1.features" in differences()  # the same values at other customers
    Path(retail).write_text(original)

    def renamed(header: list[str], row: list[str]) -> list[str]:
        row[0] = "X" + row[0]
        return row

    rewrite(bank, renamed)
    rewrite(retail, renamed)  # every ID renamed at both parties: the same intersection, the same rows
    assert {"data.content.party0.ids", "data.content.party1.ids"} <= set(differences())
    with pytest.raises(CheckpointMismatchError, match=r"belongs to another run.*data\."):  # split too: keyed by ID
        make_trainer(tmp_path).test(tiny_easter(), datamodule=datamodule(), ckpt_path=str(tmp_path / "ckpt/last.ckpt"))


def test_an_arrays_digest_is_sha256_of_its_dtype_shape_and_bytes_and_its_parts_digest_as_the_whole() -> None:
    """Read in place (a party's million encoded rows are not copied to be digested), the same digest as before."""

    def reference(array: np.ndarray) -> str:
        data = np.ascontiguousarray(array)
        return hashlib.sha256(f"{data.dtype.str}{data.shape}".encode() + data.tobytes()).hexdigest()[:16]

    rng = np.random.default_rng(0)
    parts = [torch.from_numpy(rng.normal(size=(n, 5)).astype(np.float32)) for n in (3, 7, 0, 4)]
    assert digest_array(parts) == reference(torch.cat(parts).numpy())
    for array in (np.arange(10), np.float32(3.0), np.zeros((0, 3)), rng.normal(size=(4, 3)).T, np.array([True])):
        assert digest_array(array) == reference(array), array
    assert digest_array(parts) != digest_array(parts[::-1])
