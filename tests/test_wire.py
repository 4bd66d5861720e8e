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
