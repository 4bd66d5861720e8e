"""Oblivious inference lookup: correctness, one decryptable entry, a passive view independent of the offset, bytes."""

from __future__ import annotations

import random

import pytest
import torch
from cryptography.exceptions import InvalidTag
from scipy.stats import chi2_contingency, chisquare

from lvfl.inference import oblivious
from lvfl.inference.oblivious import (
    REQUEST_BYTES,
    KeySetSpentError,
    ObliviousClient,
    ObliviousInference,
    ObliviousTable,
    prepare,
    query,
)
from lvfl.wire import Wire, payload_nbytes


def make_pair(values, bucket_size, **kwargs):
    table = ObliviousTable(values, bucket_size, **kwargs)
    client = ObliviousClient(table.layout)
    prepare(table, client)
    return table, client


@pytest.mark.parametrize("precompute", [True, False])
def test_lookup_matches_a_plain_dictionary(precompute: bool) -> None:
    rng = random.Random(0)
    values = {x: rng.randbytes(rng.randint(0, 9)) for x in rng.sample(range(64), 40)}
    lookup = ObliviousInference(ObliviousTable(values, 8, precompute=precompute))
    for x in rng.sample(range(80), 80):
        assert lookup.lookup(x) == values.get(x)  # None for FAIL slots and for IDs past the last bucket
    assert lookup.preparations > 1  # offsets repeat, so key sets ran out and were prepared afresh


def test_tensor_rows_round_trip() -> None:
    rows = torch.randn(32, 3, dtype=torch.float64)
    lookup = ObliviousInference(ObliviousTable({x: rows[x] for x in range(0, 32, 3)}, 16))
    torch.testing.assert_close(lookup.lookup(9), rows[9], rtol=0, atol=0)
    assert lookup.lookup(10) is None


def test_exactly_one_entry_of_a_copy_decrypts() -> None:
    n = 16
    table, client = make_pair({x: b"v%d" % x for x in range(0, 3 * n, 2)}, n)
    x = 2 * n + 6
    bucket, offset = divmod(x, n)
    request = client.request(x)
    t = int.from_bytes(request[8:], "big")
    answer = table.answer(request)
    entry = table.layout.entry_bytes
    assert len(answer) == n * entry
    for u in range(n):
        chunk = answer[u * entry : (u + 1) * entry]
        if u == offset:
            plaintext = client.decrypt_entry(bucket, t, u, chunk)
            assert plaintext[0] == 1  # the REAL flag
            assert plaintext[5:] == b"v%d" % x
        else:
            with pytest.raises(InvalidTag):
                client.decrypt_entry(bucket, t, u, chunk)
    # no other key set opens the entry either, nor the right key set under another bucket's nonce
    for other in range(n):
        if other != t:
            with pytest.raises(InvalidTag):
                client.decrypt_entry(bucket, other, offset, answer[offset * entry : (offset + 1) * entry])
    with pytest.raises(InvalidTag):
        client.decrypt_entry(bucket - 1, t, offset, answer[offset * entry : (offset + 1) * entry])
    assert client.decrypt(answer) == b"v%d" % x


def passive_views(trials: int, n: int) -> list[tuple[int, int]]:
    """(offset, t) for random offsets, t as the passive party receives it, one fresh preparation per trial."""
    seen: list[bytes] = []
    wire = Wire()
    wire.subscribe(lambda src, dst, tag, payload: seen.append(payload) if tag == "ot_query" else None)
    table = ObliviousTable({}, n, num_buckets=2)
    client = ObliviousClient(table.layout)
    rng = random.Random(1)
    pairs = []
    for _ in range(trials):
        prepare(table, client)
        for offset in rng.sample(range(n), 2):  # two queries per preparation, distinct offsets
            assert query(table, client, n + offset, wire=wire) is None
            pairs.append((offset, int.from_bytes(seen[-1][8:], "big")))
            assert int.from_bytes(seen[-1][:8], "big") == 1
    return pairs


def independence_pvalue(pairs: list[tuple[int, int]], n: int) -> float:
    table = [[0] * n for _ in range(n)]
    for offset, t in pairs:
        table[offset][t] += 1
    return chi2_contingency(table).pvalue


@pytest.mark.slow
def test_passive_view_is_independent_of_the_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 4
    pairs = passive_views(400, n)  # 800 queries, 50 expected per cell of the 4 x 4 offset x t table
    # a correct implementation fails this with probability 1e-6; the broken one below gets p ~ 1e-300
    assert independence_pvalue(pairs, n) > 1e-6
    # negative control: a broken client whose permutation is the identity sends t = offset
    monkeypatch.setattr(oblivious, "_random_permutation", lambda k: list(range(k)))
    broken = passive_views(400, n)
    assert all(offset == t for offset, t in broken)
    assert independence_pvalue(broken, n) < 1e-6


def test_key_sets_are_single_use() -> None:
    n = 8
    table, client = make_pair({3: b"a", 11: b"b"}, n)
    assert query(table, client, 3) == b"a"
    assert not client.can_query(11)  # same offset, same key set
    with pytest.raises(KeySetSpentError, match="prepare"):
        client.request(11)
    # the passive party refuses a replayed t as well
    replay = client.request(4)
    table.answer(replay)
    with pytest.raises(KeySetSpentError):
        table.answer(replay)
    prepare(table, client)
    assert client.key_sets_left() == table.key_sets_left() == n
    assert query(table, client, 11) == b"b"


def test_all_key_sets_used_then_prepare_again() -> None:
    n = 4
    table, client = make_pair({x: bytes([x]) for x in range(n)}, n)
    assert [query(table, client, x) for x in range(n)] == [bytes([x]) for x in range(n)]
    assert client.key_sets_left() == 0
    with pytest.raises(KeySetSpentError):
        client.request(0)
    prepare(table, client)
    assert query(table, client, 0) == b"\0"


@pytest.mark.parametrize("bucket_size", [0, 1, 3, 12, 100])
def test_bucket_size_must_be_a_power_of_two(bucket_size: int) -> None:
    with pytest.raises(ValueError, match="bucket_size"):
        ObliviousTable({1: b"x"}, bucket_size)


def passive_inbox(wire: Wire, passive: str = "passive") -> list[tuple[str, str, str, int]]:
    """Every message to or from the passive party, as it sees it: (src, dst, tag, bytes), in order."""
    seen: list[tuple[str, str, str, int]] = []
    wire.subscribe(
        lambda src, dst, tag, payload: (
            seen.append((src, dst, tag, payload_nbytes(payload))) if passive in (src, dst) else None
        )
    )
    return seen


@pytest.mark.parametrize("precompute", [True, False])
def test_a_miss_costs_exactly_the_messages_of_a_hit(precompute: bool) -> None:
    """To the passive party an ID beyond its table (or negative) looks like a held ID: same tags, sizes, count."""
    n = 8
    wire = Wire()
    lookup = ObliviousInference(
        ObliviousTable({1: b"x", 9: b"nine"}, n, num_buckets=2, precompute=precompute), wire=wire
    )
    inbox = passive_inbox(wire)
    views = {}
    for x, expected in [(9, b"nine"), (16, None), (10**9, None), (-1, None), (10, None)]:  # hit, 3 misses, FAIL slot
        lookup.prepare()  # the same preparation before each, so only the query differs
        inbox.clear()
        assert lookup.lookup(x) == expected
        views[x] = list(inbox)
    hit = views[9]
    assert [(src, dst, tag) for src, dst, tag, _ in hit] == [
        ("active", "passive", "ot_plan"),  # one byte: no preparation first (the same for every ID here)
        ("active", "passive", "ot_query"),
        ("passive", "active", "ot_answer"),
    ]
    assert [size for *_, size in hit] == [1, REQUEST_BYTES, lookup.table.layout.answer_bytes]
    for x in (16, 10**9, -1, 10):
        assert views[x] == hit, f"ID {x}"
    with pytest.raises(ValueError, match="outside"):
        ObliviousTable({16: b"x"}, 8, num_buckets=2)


def test_a_miss_requests_a_uniform_address_and_spends_a_key_set() -> None:
    """The dummy request is a well-formed (bucket, t) in range, uniform over buckets; it spends one key set."""
    n, buckets = 4, 3
    table = ObliviousTable({0: b"a"}, n, num_buckets=buckets)
    client = ObliviousClient(table.layout)
    seen_buckets = []
    for _ in range(300):
        prepare(table, client)
        request = client.request(10**6)
        bucket, t = int.from_bytes(request[:8], "big"), int.from_bytes(request[8:], "big")
        assert 0 <= bucket < buckets
        assert 0 <= t < n
        assert client.key_sets_left() == n - 1
        assert client.decrypt(table.answer(request)) is None  # the passive party answered; the entry is discarded
        seen_buckets.append(bucket)
    assert chisquare([seen_buckets.count(b) for b in range(buckets)]).pvalue > 1e-6


def test_entries_are_padded_to_one_size() -> None:
    table, client = make_pair({0: b"", 1: b"a" * 30, 5: b"bbb"}, 8)
    l = table.layout.entry_bytes  # noqa: E741
    assert l == 5 + 30 + 16 * 3
    for x in (0, 1, 2, 5):
        answer = table.answer(client.request(x))
        assert len(answer) == 8 * l
        client.decrypt(answer)  # closes the request, so the client can make the next one
    with pytest.raises(ValueError, match="value_bytes"):
        ObliviousTable({0: b"abc"}, 8, value_bytes=2)


@pytest.mark.parametrize("n", [4, 32])
def test_online_wire_bytes_and_rounds(n: int) -> None:
    wire = Wire()
    table = ObliviousTable({x: b"0123456789" for x in range(2 * n)}, n)
    lookup = ObliviousInference(table, wire=wire, active="active", passive="passive")
    lookup.prepare()
    nbits = n.bit_length() - 1
    assert wire.total_messages() == 3
    assert wire.bytes_by_tag() == {"ot_prepare": 33 + n * nbits * 33 + n * nbits * 2 * (16 + 16)}
    wire.reset()
    assert lookup.lookup(n + 3) == b"0123456789"
    l = table.layout.entry_bytes  # noqa: E741
    assert l == 5 + 10 + 16 * nbits
    plan = 1  # the byte that tells the passive party no preparation comes first
    assert wire.total_bytes() == n * l + REQUEST_BYTES + plan
    assert wire.bytes_by_link() == {"active->passive": REQUEST_BYTES + plan, "passive->active": n * l}
    assert wire.total_messages() == 3  # one round trip, after the plan byte (sent with the query, one direction)
