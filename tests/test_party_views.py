"""Every party its own view of the run (docs/federation.md): the same training_step, run by each party on what it
holds, ends bit-identical to the simulation, with the same ledger, and each view holds only its own party's data."""

from __future__ import annotations

import dataclasses
import re
import sys
import threading
import types
from collections import Counter
from functools import partial

import pytest
import torch
from helpers import REPO, make_trainer, mlp_parties, recording

from lvfl.compression import Compressor
from lvfl.datamodules import Digits
from lvfl.federation import FederationError
from lvfl.federation.federation_file import write_federation
from lvfl.federation.link import SocketLink
from lvfl.federation.pki import write_test_pki
from lvfl.federation.rehearsal import MemoryCarrier, held_tensors, party_batch, party_view
from lvfl.federation.transport import Transport
from lvfl.models import MLP
from lvfl.privacy import DHMasking, Plain
from lvfl.protocols import CVFL, EASTER, AggVFL, SplitNN
from lvfl.wire import Absent, Wire, is_shadow, shadow

STEPS = 4


class Batches:
    """A fixed sequence of batches as one loader (Lightning reads a bare list as a list of loaders)."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def memory_views(model, tmp_path):
    """Every party's view, all on one in-memory transport."""
    transport = MemoryCarrier(timeout=20)
    return {k: party_view(model, k, transport) for k in model.party_names}, {}


def socket_views(model, tmp_path):
    """Every party's view on its own gRPC server with mutual TLS (a test CA), on localhost ports."""
    names = model.party_names
    write_test_pki(tmp_path / "pki", names)
    federation = write_federation(tmp_path / "pki" / "federation.yaml", names)
    links = {k: SocketLink(Transport(k, federation, run_id="views", timeout=20).start()) for k in names}
    # the star's greetings, as `lvfl party` makes them: the active party greets every other, each other it
    greet = {k: [j for j in names if j != k] if k == model.active else [model.active] for k in names}
    threads = [threading.Thread(target=links[k].transport.hello, args=(greet[k],)) for k in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {k: party_view(model, k, links[k]) for k in names}, links


PROTOCOLS = {
    "EASTER": lambda backend: recording(EASTER)(parties=mlp_parties(4), aggregation=backend(), embedding_dim=8),
    "SplitNN": lambda backend: recording(SplitNN)(
        parties=mlp_parties(4), top_model=partial(MLP, hidden=[16]), aggregation=backend(), embedding_dim=8
    ),
    "SplitNN mean": lambda backend: recording(SplitNN)(
        parties=mlp_parties(4), top_model=MLP, aggregation=backend(), embedding_dim=8, fusion="mean"
    ),
    "C_VFL": lambda backend: recording(CVFL)(
        parties=mlp_parties(4),
        top_model=MLP,
        aggregation=backend(),
        embedding_dim=8,
        local_iterations=2,
        compressor=Compressor(bits=8),
    ),
    # FedBCD-style local updates: one exchange, then three updates on sub-batches of 11, 11 and 10 rows
    "EASTER local updates": lambda backend: recording(EASTER)(
        parties=mlp_parties(4), aggregation=backend(), embedding_dim=8, schedule="local_updates", local_updates=3
    ),
    # pipelined: each batch's shares travel with the previous batch's predictions; the last step finishes its own
    "EASTER pipelined": lambda backend: recording(EASTER)(
        parties=mlp_parties(4), aggregation=backend(), embedding_dim=8, schedule="pipelined", local_updates=2
    ),
    # ... with delay compensation: each passive party moves the stale gradient to its current R_k, in its own process
    "EASTER pipelined compensated": lambda backend: recording(EASTER)(
        parties=mlp_parties(4),
        aggregation=backend(),
        embedding_dim=8,
        schedule="pipelined",
        local_updates=2,
        delay_compensation=True,
    ),  # fmt: skip
    "AggVFL": lambda backend: recording(AggVFL)(parties=mlp_parties(4), aggregation=backend(), embedding_dim=8),
    "AggVFL weighted": lambda backend: recording(AggVFL)(
        parties=mlp_parties(4), aggregation=backend(), embedding_dim=8, aggregate="weighted"
    ),
    # dropout in every party model and the top model: each party's masks come from its own generator
    "SplitNN dropout": lambda backend: recording(SplitNN)(
        parties=[dataclasses.replace(p, model=partial(MLP, hidden=[16], dropout=0.3)) for p in mlp_parties(4)],
        top_model=partial(MLP, hidden=[16], dropout=0.2),
        aggregation=backend(),
        embedding_dim=8,
    ),
}


def simulate(tmp_path, model, dm, make_views=memory_views):
    """A few steps of `model` (a `recording` protocol) in simulation, and every party's view of the same run
    before its first step."""
    model.build(dm.party_specs, dm.task)
    views, links = make_views(model, tmp_path)
    make_trainer(tmp_path / "sim", limit_train_batches=STEPS, limit_val_batches=0).fit(model, datamodule=dm)
    return model, views, links


def simulate_on_digits(tmp_path, protocol, backend, make_views=memory_views):
    """`simulate` for one of `PROTOCOLS` with 4 parties on digits."""
    torch.manual_seed(0)
    return simulate(tmp_path, PROTOCOLS[protocol](backend), Digits(num_parties=4, batch_size=32), make_views)


def rehearse(tmp_path, model, views, links=None):
    """Each view agrees on its keys and trains on its own part of the simulation's batches, in its own thread."""
    errors: list[BaseException] = []
    links = links or {}

    def run(name, view):
        try:
            view.aggregation.setup(view.party_specs, view.active, view.wire)
            batches = [party_batch(b, name, view.active) for b in model.batches]
            trainer = make_trainer(tmp_path / name, limit_train_batches=STEPS, limit_val_batches=0)
            trainer.fit(view, train_dataloaders=Batches(batches))
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=run, args=item) for item in views.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for link in links.values():
        link.transport.close()
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("protocol", "backend", "make_views"),
    [
        ("EASTER", Plain, memory_views),
        ("EASTER", DHMasking, memory_views),
        ("EASTER", DHMasking, socket_views),
        ("EASTER local updates", DHMasking, memory_views),
        ("EASTER local updates", DHMasking, socket_views),
        ("EASTER pipelined", DHMasking, memory_views),
        ("EASTER pipelined", DHMasking, socket_views),
        ("EASTER pipelined compensated", DHMasking, socket_views),
        ("SplitNN", Plain, memory_views),
        ("SplitNN mean", DHMasking, memory_views),
        ("C_VFL", Plain, memory_views),
        ("C_VFL", Plain, socket_views),  # compressed embeddings as records on the allow-list
        ("AggVFL", DHMasking, memory_views),
        ("AggVFL weighted", Plain, memory_views),
        ("SplitNN dropout", Plain, memory_views),
    ],
)
def test_every_partys_view_ends_bit_identical_to_the_simulation(tmp_path, protocol, backend, make_views):
    model, views, links = simulate_on_digits(tmp_path, protocol, backend, make_views)
    rehearse(tmp_path, model, views, links)
    assert_parity(model, views, links)


def assert_parity(model, views, links, extra_senders=None):
    """Each view holds data only for its own parameters, equal to the simulation's; the ledgers agree (with the
    messages of `extra_senders`, views that hold no party, e.g. an HE backend's coordinator)."""
    for name, view in views.items():
        own = {id(p) for p in view.party_parameters(name)}
        held = dict(view.named_parameters())
        assert own == {id(p) for p in held.values() if not is_shadow(p)}, name
        for pname, p in model.named_parameters():
            if not is_shadow(held[pname]):
                assert torch.equal(held[pname], p), f"{name}: {pname} differs from the simulation"
    # the simulation's ledger (training messages, and the key agreement it ran at build) is the union of what
    # every party sent, tag by tag
    sent = Counter()
    for name, view in {**views, **(extra_senders or {})}.items():
        sent.update({key: n for key, n in view.wire.bytes.items() if key[0] == name})
    assert dict(sent) == dict(model.wire.bytes)
    if isinstance(model.aggregation, DHMasking):
        assert any(tag == "keys" for (_, _, tag) in sent)
    for name, link in links.items():  # the socket transport carried every message on the view's ledger, no other
        carried = {key: n for key, n in link.transport.messages.items() if key[2] != "hello"}  # not the Wire's
        assert carried == dict(views[name].wire.messages)
        framed = {key: n for key, n in link.transport.envelope_bytes.items() if key[2] != "hello"}
        assert all(framed[key] > n for key, n in views[name].wire.bytes.items())  # the payload, and its framing


def test_the_extension_guides_protocol_runs_as_party_views_with_no_extra_code(tmp_path, monkeypatch):
    """docs/extending.md's SumSplit, written with no thought of processes, runs as one view per party."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "extending.md").read_text(), flags=re.DOTALL)
    guide = types.ModuleType("extending_guide")
    monkeypatch.setitem(sys.modules, guide.__name__, guide)
    monkeypatch.chdir(tmp_path)
    for i, code in enumerate(blocks):  # the model, the datamodule and the protocol, in the guide's order
        exec(compile(code, f"extending.md[block {i}]", "exec"), guide.__dict__)  # noqa: S102 - our own docs
        if "SumSplit" in guide.__dict__:
            break
    torch.manual_seed(0)
    model = recording(guide.SumSplit)(parties=[guide.adam], aggregation=DHMasking(), embedding_dim=8)
    model, views, links = simulate(tmp_path, model, guide.Blobs(num_parties=3, batch_size=32))
    rehearse(tmp_path, model, views, links)
    assert_parity(model, views, links)


def test_each_view_holds_only_its_own_party(tmp_path):
    """Every tensor with data in a view (parameters and buffers) is its own party's; its keys are its own."""
    model, views, _ = simulate_on_digits(tmp_path, "SplitNN mean", DHMasking)
    rehearse(tmp_path, model, views)
    for name, view in views.items():
        owned = {id(p) for p in view.party_parameters(name)}
        held = held_tensors(view)
        assert held, name
        assert all(id(t) in owned or key.startswith(f"party_models.{name}.") for key, t in held.items()), name
        assert set(view.aggregation._peers) == ({name} if name != view.active else set())  # its own pair keys only


def test_a_view_refuses_a_message_of_another_shape():
    transport = MemoryCarrier(timeout=1)
    sender, receiver = Wire(here="party1", carrier=transport), Wire(here="party0", carrier=transport)
    sent = sender.send("party1", "party0", torch.zeros(4, 8), "embeddings")
    assert is_shadow(sent)
    with pytest.raises(
        FederationError, match=r"party1 sent 'embeddings' as float32 \[4, 8\]; expected float32 \[4, 9\]"
    ):
        receiver.send("party1", "party0", torch.empty(4, 9, device="meta"), "embeddings")


def test_a_view_names_the_party_it_waited_for():
    receiver = Wire(here="party0", carrier=MemoryCarrier(timeout=0.05))
    with pytest.raises(FederationError, match="party2 did not send 'predictions' to party0 within 0.05 s"):
        receiver.send("party2", "party0", torch.empty(3, device="meta"), "predictions")


def test_a_view_passes_messages_between_others_as_shadows():
    wire = Wire(here="party3", carrier=MemoryCarrier(timeout=1))
    out = wire.send("party1", "party0", {"a": torch.ones(2, 3), "b": b"key"}, "keys")
    assert out["a"].device.type == "meta"
    assert out["a"].shape == (2, 3)
    assert isinstance(out["b"], Absent)
    assert wire.total_bytes() == 0
    assert is_shadow(shadow(b"x"))
    assert not is_shadow(torch.ones(1))


def test_a_record_without_tensors_has_an_absent_shadow():
    @dataclasses.dataclass(frozen=True)
    class Ciphertexts:
        values: tuple[int, ...]

    assert isinstance(shadow(Ciphertexts((1, 2))), Absent)
    compressed = shadow(Compressor(bits=8).compress(torch.ones(2, 3)))
    assert is_shadow(compressed.payload)
    assert compressed.shape == (2, 3)


@pytest.mark.slow
def test_paillier_runs_with_the_coordinator_as_a_view_of_its_own(tmp_path):
    """The HE backend's key holder is one more view: it generates the key pair, decrypts the masked aggregate and
    holds nothing else; every party's parameters end bit-identical to the simulation (a Paillier sum is exact)."""
    from lvfl.privacy import Paillier

    transport = MemoryCarrier(timeout=60)

    def views_with_coordinator(model, _):
        return {k: party_view(model, k, transport) for k in [*model.party_names, "coordinator"]}, {}

    torch.manual_seed(0)
    model = recording(EASTER)(parties=mlp_parties(3), aggregation=Paillier(workers=1), embedding_dim=8)
    model, views, _ = simulate(tmp_path, model, Digits(num_parties=3, batch_size=16), views_with_coordinator)
    rehearse(tmp_path, model, views)

    coordinator = views.pop("coordinator")
    assert_parity(model, views, {}, extra_senders={"coordinator": coordinator})
    assert coordinator.aggregation._secret_key is not None  # the secret key is in the coordinator's view only
    assert all(view.aggregation._secret_key is None for view in views.values())
    assert held_tensors(coordinator) == {}  # no party's parameters or buffers
    assert all(is_shadow(p) for p in coordinator.parameters())


def test_a_party_refuses_a_paillier_modulus_of_another_size():
    """What a passive party's view takes as the coordinator's public key is checked before it encrypts under it."""
    from lvfl.parties import PartySpec
    from lvfl.privacy import Paillier

    transport = MemoryCarrier(timeout=5)
    transport.post("coordinator", "p1", "keys", -1, (12345).to_bytes(256, "big"))
    parties = [PartySpec("a", "active", (2,)), PartySpec("p1", "passive", (2,), 1)]
    with pytest.raises(ValueError, match="p1 received a 14-bit modulus; this run's key_size is 2048 bits"):
        Paillier(workers=1).setup(parties, "a", Wire(here="p1", carrier=transport))


def test_a_party_views_run_token_is_its_transports_run_id():
    """`lvfl export --party` writes the run token into each party's identity: in a party's process it must be the
    federation's run ID, the same at every party (a random one per process would make the exports disagree)."""
    from lvfl.protocols import PartyConfig

    class Federated:  # what the link reads of the gRPC transport
        me, identities, run_id = "party0", None, "launch-1234"

    views = [EASTER(parties=[PartyConfig(model=MLP)]) for _ in range(2)]
    for view in views:
        view.wire = Wire(here="party0", carrier=SocketLink(Federated()))
    assert [view.run_token for view in views] == ["launch-1234", "launch-1234"]
    assert EASTER(parties=[PartyConfig(model=MLP)]).run_token != EASTER(parties=[PartyConfig(model=MLP)]).run_token
