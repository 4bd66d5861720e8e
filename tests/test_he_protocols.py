"""Paillier and CKKS inside the protocols: the coordinator only ever sees masked aggregates, results track Plain."""

from __future__ import annotations

import math
from functools import partial

import pytest
from helpers import make_trainer, mlp_parties, recording

from lvfl.datamodules import Digits
from lvfl.models import MLP
from lvfl.privacy import CKKS, LaplaceLabels, Paillier
from lvfl.protocols import EASTER, AggVFL, PraVFed, SplitNN

BACKENDS = {"Paillier": Paillier, "CKKS": CKKS}
PROTOCOLS = {
    "EASTER": lambda backend: EASTER(parties=mlp_parties(4), aggregation=backend, embedding_dim=8),
    "PraVFed": lambda backend: PraVFed(
        parties=mlp_parties(4),
        aggregation=backend,
        embedding_dim=8,
        label_mechanism=LaplaceLabels(epsilon=1.0, seed=0),
        local_epochs=1,
    ),
    "SplitNN": lambda backend: SplitNN(
        parties=mlp_parties(4), top_model=partial(MLP, hidden=[]), aggregation=backend, embedding_dim=8, fusion="sum"
    ),
    "AggVFL": lambda backend: AggVFL(parties=mlp_parties(4), aggregation=backend, embedding_dim=8, aggregate="mean"),
}


def count_combines(backend) -> list[int]:
    calls = [0]
    combine = backend.combine

    def counted(*args, **kwargs):
        calls[0] += 1
        return combine(*args, **kwargs)

    backend.combine = counted
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", list(BACKENDS))
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_coordinator_receives_only_the_masked_aggregate(tmp_path, protocol, backend_name):
    backend = BACKENDS[backend_name]()
    model = PROTOCOLS[protocol](backend)
    calls = count_combines(backend)
    seen: list[tuple[str, str, str]] = []
    model.wire.subscribe(lambda src, dst, tag, payload: seen.append((src, dst, tag)))
    dm = Digits(num_parties=4, batch_size=64)
    make_trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=1).fit(model, datamodule=dm)
    coordinator = backend.coordinator
    assert coordinator == "coordinator"
    into = [(s, t) for s, d, t in seen if d == coordinator]
    assert into == [(model.active, "he_aggregate")] * calls[0]  # never a passive party's share, one per combine
    assert calls[0] >= 2
    out_of = sorted((d, t) for s, d, t in seen if s == coordinator)
    keys = sorted((p, "keys") for p in model.party_names)  # the public key (context) to every party, once
    assert out_of == sorted(keys + [(model.active, "he_decrypted")] * calls[0])
    assert not any(s in model.passive and d != model.active for s, d, _ in seen)  # passive parties talk to A only


@pytest.mark.parametrize("backend_name", list(BACKENDS))
def test_easter_aggregate_matches_plain_at_every_step(tmp_path, backend_name):
    backend = BACKENDS[backend_name]()
    model = recording(EASTER, aggregates=True)(parties=mlp_parties(4), aggregation=backend, embedding_dim=8)
    make_trainer(tmp_path, max_epochs=1, limit_train_batches=4, limit_val_batches=0).fit(
        model, datamodule=Digits(num_parties=4, batch_size=64)
    )
    k = len(model.passive)
    tolerance = backend.error_bound(k) if isinstance(backend, CKKS) else k * 2.0**-17  # round-to-nearest per value
    assert len(model.aggregates) == 4
    for step, (protected, plain) in enumerate(model.aggregates):
        diff = (protected - plain).abs().max().item()
        assert diff <= tolerance, f"step {step}: {diff} > {tolerance}"


@pytest.mark.slow
def test_paillier_easter_epoch_ledger_is_analytic(tmp_path):
    """Per step and passive party: ceil(B d / S) ciphertexts of 2 x 256 bytes up; the same count to and (at 256
    bytes a plaintext) from the coordinator; the public key (256 bytes) to each of the 4 parties once."""
    dm = Digits(num_parties=4, batch_size=100)  # 100 does not divide the training set: the last batch is short
    backend = Paillier()
    model = EASTER(parties=mlp_parties(4), aggregation=backend, embedding_dim=8)
    make_trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(model, datamodule=dm)
    _, slots = backend.layout()
    n, d = len(dm.train_set), model.embedding_dim
    batches = [min(100, n - i) for i in range(0, n, 100)]
    cts = sum(math.ceil(b * d / slots) for b in batches)
    by_tag = model.wire.bytes_by_tag()
    assert by_tag["keys"] == 4 * 256
    assert by_tag["embeddings"] == 3 * cts * 512
    assert by_tag["he_aggregate"] == cts * 512
    assert by_tag["he_decrypted"] == cts * 256
    assert model.wire.messages[(model.active, "coordinator", "he_aggregate")] == len(batches)
