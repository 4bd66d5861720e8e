"""The Wire's own uses besides `send`: a prefixed view for sub-runs and a recording that holds messages back."""

from __future__ import annotations

import pytest
import torch

from lvfl.wire import Wire


def test_prefixed_view_meters_on_the_parent_and_notifies_its_observers():
    wire = Wire()
    seen = []
    wire.subscribe(lambda src, dst, tag, payload: seen.append((src, dst, tag, tuple(payload.shape))))
    view = wire.prefixed("cross_fit/")
    x = torch.ones(3, 2, requires_grad=True)
    out = view.send("party1", "party0", x, "embeddings")
    assert not out.requires_grad  # arrives detached, as on any wire
    assert wire.bytes == {("party1", "party0", "cross_fit/embeddings"): 24}
    assert wire.messages == {("party1", "party0", "cross_fit/embeddings"): 1}
    assert view.total_bytes() == 0  # a view keeps no ledger of its own
    assert seen == [("party1", "party0", "cross_fit/embeddings", (3, 2))]
    with pytest.raises(ValueError, match="sent a message to itself"):
        view.send("party0", "party0", x, "embeddings")


def test_recording_holds_messages_back_until_the_caller_sends_them():
    wire = Wire()
    seen = []
    wire.subscribe(lambda *message: seen.append(message))
    x = torch.zeros(4, requires_grad=True)
    with wire.recording() as held:
        received = wire.send("party1", "party0", x, "predictions")
        with pytest.raises(RuntimeError, match="already active"), wire.recording():
            pass
    assert not received.requires_grad
    assert wire.total_bytes() == 0  # nothing metered inside the block
    assert not seen  # nor observed
    ((src, dst, payload, tag, arrived),) = held
    assert (src, dst, tag) == ("party1", "party0", "predictions")
    assert payload is x
    assert arrived is received
    wire.send("party1", "party2", payload, "teacher/" + tag)  # the caller decides where it really goes
    assert wire.bytes == {("party1", "party2", "teacher/predictions"): 16}
    assert len(seen) == 1
    wire.send("party1", "party0", x, "predictions")  # after the block, sends are metered again
    assert wire.total_messages() == 2


def test_observers_lists_the_subscribed_in_order_and_unsubscribe_stops_one():
    wire = Wire()
    seen: list[str] = []

    def first(*message: object) -> None:
        seen.append("first")

    def second(*message: object) -> None:
        seen.append("second")

    handle = wire.subscribe(first)
    wire.subscribe(second)
    assert wire.observers == (first, second)
    wire.unsubscribe(handle)
    wire.unsubscribe(handle)  # idempotent
    assert wire.observers == (second,)
    wire.send("party1", "party0", torch.zeros(1), "embeddings")
    assert seen == ["second"]


def test_the_protocol_sets_the_step_every_message_carries(tmp_path):
    """Set-up messages go at step -1; each training batch's at the trainer's batch count, set by the protocol."""
    from helpers import easter, make_trainer

    from lvfl.datamodules import Digits
    from lvfl.privacy import DHMasking

    model = easter(3, aggregation=DHMasking())
    steps: list[tuple[str, int]] = []
    model.wire.subscribe(lambda src, dst, tag, payload: steps.append((tag, model.wire.step)))
    make_trainer(tmp_path, limit_train_batches=3, limit_val_batches=0).fit(
        model, datamodule=Digits(num_parties=3, batch_size=32)
    )
    in_order = [step for _, step in steps]
    assert in_order == sorted(in_order)
    assert {step for tag, step in steps if tag == "keys"} == {-1}
    per_step = [sorted(tag for tag, step in steps if step == k) for k in (0, 1, 2)]
    assert per_step[0]
    assert per_step[0] == per_step[1] == per_step[2]
    assert model.wire.step == 2


def test_a_prefixed_view_shares_its_parents_step_and_a_recording_restores_the_route():
    wire = Wire()
    view = wire.prefixed("cross_fit/")
    view.step = 4
    assert wire.step == view.step == 4
    with wire.recording() as held:
        wire.send("party1", "party0", torch.zeros(2), "embeddings")
        with pytest.raises(RuntimeError, match="already active"), wire.recording():
            pass
    assert len(held) == 1
    assert wire.total_bytes() == 0
    wire.send("party1", "party0", torch.zeros(2), "embeddings")
    assert wire.total_bytes() == 8  # the route is the simulation's again


def test_a_party_view_meters_what_it_sends_and_takes_and_only_shadows_the_rest():
    from lvfl.federation.rehearsal import MemoryCarrier

    carrier = MemoryCarrier(timeout=5)
    sender, receiver, bystander = (Wire(here=p, carrier=carrier) for p in ("party1", "party0", "party2"))
    for view in (sender, receiver, bystander):
        view.step = 7
    x = torch.arange(6.0).reshape(3, 2)
    assert sender.send("party1", "party0", x, "embeddings").is_meta  # the sender keeps a shadow
    assert torch.equal(receiver.send("party1", "party0", torch.empty(3, 2, device="meta"), "embeddings"), x)
    assert bystander.send("party1", "party0", torch.empty(3, 2, device="meta"), "embeddings").is_meta
    key = ("party1", "party0", "embeddings")
    assert sender.bytes == receiver.bytes == {key: 24}
    assert not bystander.bytes
    sender.send("party1", "party0", x, "embeddings")
    receiver.step = 8  # the receiver is at another step: refused, naming the sender and the step
    with pytest.raises(ValueError, match="party1 sent 'embeddings' for step 7; party0 expected step 8"):
        receiver.send("party1", "party0", torch.empty(3, 2, device="meta"), "embeddings")
