"""The split is part of a passive party's view: with a label mechanism it must not depend on the true labels.

A passive party sees which of its rows land in train, val and test (the batches it serves, the `split` message, the
scaling and encoders it fits on its training rows) and reads the public config, seed included. A split stratified on
the true labels is a function of them, so the party can search for labels that reproduce it (the review recovered
training labels with certainty this way). The counterfactual, for every datamodule: change the true labels *before*
anything is derived from them (the split, the overlap draw, the scaling are recomputed, never held fixed) and
everything a passive party sees must be bit-identical. The negative control runs the same counterfactual on a split
stratified on the labels (`stratify: labels`, what runs without a mechanism get), where the view must change.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import bank_retailer_tables, make_trainer, relabelled

from lvfl.datamodules import (
    CIFAR10,
    MNIST,
    Adult,
    BreastCancer,
    ClickThrough,
    Diabetes,
    Digits,
    PartyTable,
    PartyTables,
    Synthetic,
    VerticalDataModule,
    Wine,
)
from lvfl.datamodules.split import SPLIT_TAG, decode_split
from lvfl.models import MLP
from lvfl.privacy import RandomizedResponse
from lvfl.protocols import EASTER, Local, PartyConfig

WHY = "the test's label mechanism"


def embedded(cls: type, **kwargs: Any) -> Callable[[bool, Path], VerticalDataModule]:
    return lambda relabel, root: relabelled(cls)(relabel, seed=0, **kwargs)


def files(cls: type, rows: int, **kwargs: Any) -> Callable[[bool, Path], VerticalDataModule]:
    def make(relabel: bool, root: Path) -> VerticalDataModule:
        folder = root / cls.__name__
        if not folder.exists():
            cls.write_stand_in(folder, rows)
        return relabelled(cls)(relabel, root=str(folder), seed=0, **kwargs)

    return make


DATAMODULES: dict[str, Callable[[bool, Path], VerticalDataModule]] = {
    "digits": embedded(Digits, num_parties=3, overlap=0.7),
    "breast_cancer": embedded(BreastCancer, num_parties=2, overlap=0.6),
    "wine": embedded(Wine, num_parties=3),
    "diabetes": embedded(Diabetes, num_parties=2),
    "synthetic": embedded(Synthetic, num_samples=300, num_parties=2, overlap=0.8),
    "clickthrough": embedded(ClickThrough, num_samples=600, num_parties=2),
    "adult": files(Adult, 300, num_parties=2),
    "mnist": files(MNIST, 120, num_parties=2),
    "cifar10": files(CIFAR10, 120, num_parties=2, augmentation="none"),
    "party_tables": bank_retailer_tables,
}


def passive_view(dm: VerticalDataModule) -> dict[str, Any]:
    """Everything a passive party sees before training: its rows of each split (by the IDs it knows them by),
    its features as served (scaled with what it fitted on its training rows), its fitted statistics and encoders, and
    the set-up messages it receives (the PSI's by size: fresh keys; the split, task and input columns exactly)."""
    view: dict[str, Any] = {}
    active = dm.active_party_name
    names = [s.name for s in dm.party_specs if s.name != active]
    assert names, "the datamodule must have a passive party, or the check proves nothing"
    key_of = dm.business_ids if hasattr(dm, "business_ids") else (lambda ids: [int(i) for i in ids])
    for party in names:
        for split in ("train", "val", "test"):
            data = getattr(dm, f"{split}_set")
            view[(party, split, "ids")] = key_of(data.ids)
            view[(party, split, "features")] = data.features[party].numpy().tobytes()
        view[(party, "scaling")] = dm.scaling.get(party)
        view[(party, "encoders")] = repr(getattr(dm, "encoders", {}).get(party))
        view[(party, "decoder")] = repr(dm.train_set.decoders.get(party))
        view[(party, "inbox")] = [
            (src, tag, len(payload) if tag.startswith("psi/") else exact(payload))
            for src, dst, payload, tag in dm.setup_messages()
            if dst == party
        ]
    return view


def exact(payload: Any) -> Any:
    """A deterministic set-up message (the split, `PartyTables`' task and input columns) as its bytes, by party name
    where it is a dict (the input columns)."""
    if isinstance(payload, dict):
        return {name: exact(value) for name, value in payload.items()}
    return payload.numpy().tobytes() if isinstance(payload, torch.Tensor) else bytes(payload)


def prepared(make: Callable[[bool, Path], VerticalDataModule], relabel: bool, root: Path, label_free: bool):
    dm = make(relabel, root)
    if label_free:
        dm.require_label_free_split(WHY)
    else:
        dm.stratify = "labels"
    dm.setup("fit")
    return dm


@pytest.mark.parametrize("name", sorted(DATAMODULES))
def test_with_a_label_mechanism_nothing_a_passive_party_sees_before_training_depends_on_the_true_labels(name, tmp_path):
    make = DATAMODULES[name]
    first = prepared(make, False, tmp_path, label_free=True)
    second = prepared(make, True, tmp_path, label_free=True)
    assert not torch.equal(first.active_set("train").labels, second.active_set("train").labels)
    a, b = passive_view(first), passive_view(second)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == b[key], f"{name}: {key} changed with the true labels"


@pytest.mark.parametrize("name", ["breast_cancer", "digits", "party_tables"])
def test_a_split_stratified_on_the_labels_shows_them_to_passive_parties(name, tmp_path):
    """Negative control: stratified on the labels, the same counterfactual changes what a passive party sees."""
    make = DATAMODULES[name]
    a = passive_view(prepared(make, False, tmp_path, label_free=False))
    b = passive_view(prepared(make, True, tmp_path, label_free=False))
    changed = [key for key in a if a[key] != b[key]]
    assert any(key[1] == "train" and key[2] == "ids" for key in changed), changed


def test_the_split_message_carries_exactly_the_passive_partys_split_and_is_metered(tmp_path):
    """Where only the active party can compute the split (its own rows, or stratified on its labels), each passive
    participant receives one byte per shared sample (0 train, 1 val, 2 test) in the order it knows the samples by,
    on the wire as set-up traffic; where the split is public (label-free over a public dataset) nothing is sent."""
    dm = bank_retailer_tables(False, tmp_path)
    dm.setup("fit")
    split = [m for m in dm.setup_messages() if m[3] == SPLIT_TAG]
    assert [(src, dst) for src, dst, _, _ in split] == [("party0", "party1")]
    payload = split[0][2]
    shared = dm.overlap_ids().numpy()
    assert len(payload) == len(shared) == 200
    order = dm.shared_order(shared)
    assert dm.business_ids(order) == sorted(dm.business_ids(shared))  # the PSI's agreed order: by ID text
    received = decode_split(payload, order)
    for name in ("train", "val", "test"):
        assert received[name].tolist() == sorted(getattr(dm, f"{name}_set").ids.tolist())

    model = EASTER([PartyConfig(partial(MLP, hidden=[8]), partial(torch.optim.SGD, lr=0.1))], embedding_dim=4)
    make_trainer(tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=0).fit(model, datamodule=dm)
    assert model.wire.bytes[("party0", "party1", SPLIT_TAG)] == 200

    public = Digits(num_parties=3, seed=0)
    public.require_label_free_split(WHY)
    assert public.split_is_public
    assert not [m for m in public.setup_messages() if m[3] == SPLIT_TAG]
    stratified = Digits(num_parties=3, seed=0)  # stratified on the labels: the active party alone knows it
    assert [(dst, len(p)) for _, dst, p, tag in stratified.setup_messages() if tag == SPLIT_TAG] == [
        ("party1", 1797),
        ("party2", 1797),
    ]


def test_a_single_site_baseline_sends_no_split(tmp_path):
    """Local and Central train no passive party's rows: the split message is not theirs to send."""
    model = Local([PartyConfig(partial(MLP, hidden=[8]))], embedding_dim=4)
    make_trainer(tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=0).fit(
        model, datamodule=Digits(num_parties=3, seed=0)
    )
    assert model.wire.total_bytes() == 0


def test_the_party_tables_split_does_not_depend_on_the_order_of_the_rows_in_a_file(tmp_path):
    """Drawn over the active party's IDs in a keyed order: the same IDs in another row order give the same split."""
    dm = bank_retailer_tables(False, tmp_path)
    dm.setup("fit")
    bank = Path(dm.tables[0].path)
    lines = bank.read_text().splitlines()
    shuffled = tmp_path / "bank_sorted.csv"
    shuffled.write_text("\n".join([lines[0], *sorted(lines[1:], key=lambda r: float(r.split(",")[1]))]) + "\n")
    other = PartyTables([PartyTable(str(shuffled), "customer_id", label_column="status"), dm.tables[1]], seed=0)
    other.setup("fit")
    for split in ("train", "val", "test"):
        ids = getattr(dm, f"{split}_set").ids
        assert sorted(dm.business_ids(ids)) == sorted(other.business_ids(getattr(other, f"{split}_set").ids))


def test_a_label_mechanism_refuses_a_split_stratified_on_the_labels(tmp_path):
    mechanism = RandomizedResponse(epsilon=1.0)
    model = EASTER([PartyConfig(partial(MLP, hidden=[8]))], embedding_dim=4, label_mechanism=mechanism)
    trainer = make_trainer(tmp_path, max_epochs=1, limit_train_batches=1)
    with pytest.raises(ValueError, match=r"stratify=labels draws the split from the true labels.*set stratify: auto"):
        trainer.fit(model, datamodule=Digits(num_parties=3, seed=0, stratify="labels"))
    early = Digits(num_parties=3, seed=0)
    early.setup()  # prepared before any protocol asked for a label-free split: stratified on the labels
    with pytest.raises(ValueError, match=r"split was drawn stratified on the true labels before"):
        make_trainer(tmp_path, max_epochs=1, limit_train_batches=1).fit(model, datamodule=early)
    with pytest.raises(ValueError, match=r"stratify must be one of \['auto', 'labels', 'none'\], got stratify='x'"):
        Digits(stratify="x")


def test_criteo_split_never_reads_the_labels_and_refuses_to_stratify(tmp_path):
    """Criteo streams its arrays and splits by row index: public, label-free, nothing to send, `labels` refused."""
    from lvfl.datamodules import Criteo

    Criteo.write_stand_in(tmp_path, rows=200)
    dm = Criteo(root=str(tmp_path), num_parties=2, batch_size=32)
    assert dm.split_is_public
    assert not [m for m in dm.setup_messages() if m[3] == SPLIT_TAG]
    with pytest.raises(ValueError, match=r"Criteo's split is a seeded random split by row index.*stratify=labels"):
        Criteo(root=str(tmp_path), num_parties=2, stratify="labels")
