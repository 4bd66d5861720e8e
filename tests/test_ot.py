"""Simplest OT over secp256k1: the receiver learns the chosen message and cannot open the other; 1-out-of-N OT."""

from __future__ import annotations

import secrets

import pytest
from coincurve import PublicKey
from cryptography.exceptions import InvalidTag

from benchmarks.perf import naive_ot  # the OT benchmark's naive 1-out-of-N baseline, tested here
from lvfl.crypto import ot
from lvfl.privacy.oblivious_transfer import batch_ot, ot_1_of_2
from lvfl.wire import Wire


@pytest.mark.parametrize("choice", [0, 1])
def test_receiver_learns_exactly_the_chosen_message(choice: int) -> None:
    m = (secrets.token_bytes(24), secrets.token_bytes(24))
    sender = ot.OTSender(b"test")
    receiver = ot.OTReceiver(sender.public_point(), b"test")
    points = receiver.choose([choice])
    (key,) = receiver.chosen_keys()
    ((c0, c1),) = sender.respond(points, [m])
    cts = (c0, c1)
    assert ot.decrypt_message(key, cts[choice]) == m[choice]
    with pytest.raises(InvalidTag):
        ot.decrypt_message(key, cts[1 - choice])
    assert receiver.receive([(c0, c1)]) == [m[choice]]


def test_keys_match_the_diffie_hellman_reference() -> None:
    """k0 = H(aB), k1 = H(a(B - A)), k_c = H(bA), computed here from the scalars with plain coincurve calls."""
    a, b = ot.random_scalar(), ot.random_scalar()
    big_a = PublicKey.from_valid_secret(a)
    for choice in (0, 1):
        big_b = ot.receiver_point(big_a, choice, b)
        ab = big_b.multiply(a)
        a_bytes, b_bytes = big_a.format(), big_b.format()
        b_minus_a = PublicKey.combine_keys([big_b, PublicKey(bytes([a_bytes[0] ^ 1]) + a_bytes[1:])])
        k = [ot.ot_key(b"", a_bytes, b_bytes, 0, ab), ot.ot_key(b"", a_bytes, b_bytes, 0, b_minus_a.multiply(a))]
        assert ot.ot_key(b"", a_bytes, b_bytes, 0, big_a.multiply(b)) == k[choice] != k[1 - choice]


def test_batch_reuses_one_sender_point_and_meters_three_messages() -> None:
    pairs = [(bytes([i]) * 16, bytes([100 + i]) * 16) for i in range(8)]
    choices = [i % 2 for i in range(7)] + [1]
    wire = Wire()
    got = batch_ot(pairs, choices, wire=wire, sender="passive", receiver="active", tag="ot")
    assert got == [p[c] for p, c in zip(pairs, choices, strict=True)]
    assert wire.total_messages() == 3
    # A, then one point per OT, then two ciphertexts (16-byte message + 16-byte tag) per OT
    assert wire.total_bytes() == ot.POINT_BYTES + 8 * ot.POINT_BYTES + 8 * 2 * (16 + ot.TAG_BYTES)
    assert wire.bytes_by_link() == {"passive->active": 33 + 8 * 64, "active->passive": 8 * 33}


def test_session_tags_must_match() -> None:
    sender = ot.OTSender(b"one")
    receiver = ot.OTReceiver(sender.public_point(), b"two")
    points = receiver.choose([0])
    with pytest.raises(InvalidTag):
        receiver.receive(sender.respond(points, [(b"x" * 4, b"y" * 4)]))


@pytest.mark.parametrize("n", [2, 4, 16, 64])
def test_one_of_n_returns_the_chosen_message(n: int) -> None:
    messages = [secrets.token_bytes(12) for _ in range(n)]
    for choice in {0, n - 1, n // 3}:
        assert naive_ot.ot_1_of_n(messages, choice, wire=Wire()) == messages[choice]


def test_one_of_n_other_messages_do_not_open() -> None:
    n, nbits, choice = 8, 3, 5
    messages = [bytes([u]) * 8 for u in range(n)]
    pairs = [(secrets.token_bytes(16), secrets.token_bytes(16)) for _ in range(nbits)]
    cts = naive_ot.one_of_n_encrypt(messages, pairs)
    held = [pairs[j][bit] for j, bit in enumerate(ot.bits_of(choice, nbits))]
    for u in range(n):
        key = naive_ot.one_of_n_key(held, u)
        if u == choice:
            assert ot.decrypt_message(key, cts[u]) == messages[u]
        else:
            with pytest.raises(InvalidTag):
                ot.decrypt_message(key, cts[u])


def test_one_of_n_wire_bytes() -> None:
    wire = Wire()
    naive_ot.ot_1_of_n([bytes(10)] * 16, 3, wire=wire)
    nbits = 4
    assert wire.total_messages() == 3
    assert wire.total_bytes() == 33 + nbits * 33 + nbits * 2 * (16 + 16) + 16 * (10 + 16)


def test_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="power of two"):
        naive_ot.ot_1_of_n([b"a"] * 3, 0, wire=Wire())
    with pytest.raises(ValueError, match="same length"):
        ot_1_of_2(b"a", b"bb", 0, wire=Wire())
    with pytest.raises(ValueError, match="0 or 1"):
        ot_1_of_2(b"a", b"b", 2, wire=Wire())
    with pytest.raises(ValueError, match="secp256k1"):
        ot.OTReceiver(b"\x02" + bytes(32))
    with pytest.raises(ValueError, match="choice"):
        naive_ot.ot_1_of_n([b"a"] * 4, 4, wire=Wire())
