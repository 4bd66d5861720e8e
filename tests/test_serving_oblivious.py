"""Serving's oblivious mode: the lookup opens the asked row and no other, a passive party's view does not depend on
which of its rows is asked, and served answers are `lvfl predict`'s with real `lvfl serve --oblivious` processes.

References: the contributions tensor itself (the scheme), and `lvfl predict`'s file for the same run and rows.
"""

from __future__ import annotations

import itertools
import time

import pytest
import torch
from cryptography.exceptions import InvalidTag
from scipy.stats import chisquare
from served_runs import TABLES, assert_same_answers, passive, read, score_here, score_refused, table_ids

from lvfl.crypto.layered import decrypt_entry, entry_nonce
from lvfl.federation.federation_file import load_federation
from lvfl.serving import ExportedParty, FeatureSource, Scorer
from lvfl.serving import oblivious as scheme
from lvfl.serving import serving_pb2 as pb
from lvfl.serving.contributions import ContributionServer
from lvfl.serving.oblivious import (
    QUERY_BYTES,
    BucketSizeError,
    KeySetPool,
    KeySets,
    KeySetSpentError,
    ObliviousRows,
    open_answer,
    parse_queries,
    query,
    serving_layout,
)


def prepared(count: int, bucket_size: int) -> tuple[KeySets, KeySetPool]:
    """Both sides of a preparation of `count` key sets, the messages passed by hand."""
    sender = KeySets(bucket_size.bit_length() - 1)
    pool = KeySetPool(bucket_size)
    batch, point = sender.offer(count)
    pending, points = pool.choose(batch, point, count)
    first, ciphertexts = sender.prepare(batch, points)
    pool.finish(pending, first, ciphertexts)
    return sender, pool


# -- the scheme ---------------------------------------------------------------------------------------------------
def test_each_lookup_opens_the_asked_row_and_no_other_entry() -> None:
    """Every row of a 3-bucket table (the last one part empty) fetched by lookup equals the contribution itself;
    with the key set used, every other entry of the returned bucket fails authentication; a dummy and an empty slot
    give None with a message of the same size."""
    n = 8
    values = torch.randn(19, 2, 3)
    rows = ObliviousRows(values, n)
    assert (rows.layout.num_buckets, rows.layout.bucket_size) == (3, n)
    sender, pool = prepared(19 + 2 + 1, n)
    for position in range(19):
        key_set = pool.take(1)[0]
        message, pending = query(rows.layout, key_set, position)
        assert len(message) == QUERY_BYTES
        ((bucket, t, shift),) = parse_queries(rows.layout, message)
        answer = rows.answer(sender.take(t), bucket, shift)
        assert torch.equal(open_answer(rows.layout, pending, answer), values[position])
        size = rows.layout.entry_bytes
        for u in range(n):
            if u != position % n:
                with pytest.raises(InvalidTag):
                    decrypt_entry(list(key_set.ciphers), entry_nonce(bucket, u), answer[u * size : (u + 1) * size])
    for position in (None, 20):  # a dummy; the empty slot past the last row
        message, pending = query(rows.layout, pool.take(1)[0], position)
        ((bucket, t, shift),) = parse_queries(rows.layout, message)
        answer = rows.answer(sender.take(t), bucket, shift)
        assert len(answer) == rows.layout.answer_bytes
        assert open_answer(rows.layout, pending, answer) is None


def test_a_key_set_serves_one_query_and_bad_messages_are_refused() -> None:
    sender, pool = prepared(2, 4)
    rows = ObliviousRows(torch.randn(4, 1), 4)
    message, _ = query(rows.layout, pool.take(1)[0], 1)
    ((_, t, _),) = parse_queries(rows.layout, message)
    sender.take(t)
    with pytest.raises(KeySetSpentError, match=f"key set {t} is spent"):
        sender.take(t)
    with pytest.raises(ValueError, match="no preparation 'nope' is offered"):
        sender.prepare("nope", b"")
    batch, _ = sender.offer(1)
    with pytest.raises(ValueError, match="needs 2 OT points"):
        sender.prepare(batch, b"\x02" * 33)
    with pytest.raises(ValueError, match="1 to 4096 key sets"):
        sender.offer(4097)
    with pytest.raises(ValueError, match="outside the table's 1 buckets"):
        parse_queries(rows.layout, (1).to_bytes(8, "big") + bytes(12))
    with pytest.raises(ValueError, match="whole 20-byte queries"):
        parse_queries(rows.layout, bytes(21))
    with pytest.raises(ValueError, match="the bucket size must be a power of two"):
        serving_layout(10, 48, (4,))
    with pytest.raises(ValueError, match="at most 4096"):
        serving_layout(10, 8192, (4,))
    assert pool.take(2) is None  # one left: none taken
    assert pool.available == 1


def test_a_bucket_size_serving_cannot_use_is_refused_by_its_type() -> None:
    """N not a power of two, or over 4096, is a `BucketSizeError` (a `ValueError`, its words unchanged); a table's
    negative row count is another fault, a plain `ValueError`."""
    for n, message in ((48, "the bucket size must be a power of two >= 2, got 48"), (8192, "at most 4096, got 8192")):
        with pytest.raises(BucketSizeError, match=message):
            serving_layout(10, n, (4,))
    with pytest.raises(ValueError, match="a number of rows >= 0") as refused:
        serving_layout(-1, 64, (4,))
    assert not isinstance(refused.value, BucketSizeError)


@pytest.mark.slow
def test_lvfl_serve_names_its_bucket_size_option_on_a_bucket_size_it_cannot_use(served, capsys) -> None:
    """`lvfl serve --oblivious --bucket_size 48` at a passive party stops in one line naming the option, before it
    listens."""
    from lvfl.commands import serve

    run = served["SplitNN"]
    with pytest.raises(SystemExit) as stopped:
        serve.main(["--party", "party1", "--model", str(run.export / "party1"), "--federation", str(run.federation),
                    "--table", str(TABLES["party1"]), "--oblivious", "--bucket_size", "48"])  # fmt: skip
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1:] == ["lvfl: error: --bucket_size 48: the bucket size must be a power of two >= 2, got 48"], err


def test_a_query_is_the_same_whatever_row_it_asks_for_given_a_matching_secret() -> None:
    """Counterfactual, the passive party's view of a query: (bucket, t, d) for offset o under secret r equals the
    query for any other offset o' of the bucket under r' = r XOR o XOR o'; r -> r' is a bijection of [0, N), so with
    r uniform the two views have one distribution. And t is the next key set, whatever the row."""
    n = 16
    layout = serving_layout(3 * n, n, (2,))
    ciphers = tuple(KeySetPool(n).num_bits * [None])
    for o, o2, r in itertools.product(range(n), range(n), range(n)):
        mine = query(layout, scheme.KeySet(7, r, ciphers), n + o)[0]
        theirs = query(layout, scheme.KeySet(7, r ^ o ^ o2, ciphers), n + o2)[0]
        assert mine == theirs
    assert sorted(r ^ 3 ^ 9 for r in range(n)) == list(range(n))


@pytest.mark.slow
def test_the_shift_of_a_row_asked_again_and_again_is_uniform() -> None:
    """The same row asked 4,096 times with fresh key sets: its shifts d are uniform on [0, N) (chi-square, p >
    1e-6) and no t repeats: a repeated customer is not recognisable from its queries."""
    n = 16
    sender, pool = prepared(4096, n)
    layout = serving_layout(n, n, (1,))
    queries = parse_queries(layout, b"".join(query(layout, k, 5)[0] for k in pool.take(4096)))
    shifts = torch.bincount(torch.tensor([d for _, _, d in queries]), minlength=n)
    assert chisquare(shifts.numpy()).pvalue > 1e-6
    assert len({t for _, t, _ in queries}) == 4096


# -- in one process: the server and the scorer ----------------------------------------------------------------------
class Recording(ContributionServer):
    """party1's server in oblivious mode, keeping every message it receives: its whole view of the serving."""

    view: list[tuple[str, bytes]] = []

    def _record(self, kind, request):
        type(self).view.append((kind, request.SerializeToString()))

    def _greet(self, request, context):
        self._record("greet", request)
        return super()._greet(request, context)

    def _table(self, request, context):
        self._record("table", request)
        return super()._table(request, context)

    def _members(self, request, context):
        self._record("members", request)
        return super()._members(request, context)

    def _contribute(self, request, context):
        self._record("contribute", request)
        return super()._contribute(request, context)

    def _offer(self, request, context):
        self._record("offer", request)
        return super()._offer(request, context)

    def _prepare(self, request, context):
        self._record("prepare", request)
        return super()._prepare(request, context)

    def _lookup(self, request, context):
        self._record("lookup", request)
        return super()._lookup(request, context)


@pytest.mark.slow
def test_a_passive_partys_view_is_the_same_whichever_of_its_customers_is_scored(served, monkeypatch) -> None:
    """Counterfactual: the bank scores one shared customer, then another of the retailer's customers in its place
    (one bucket holds the retailer's whole table). The active party's secret draws are the same but for the key
    set's r, replaced by r XOR o XOR o' (as likely). Everything the retailer receives is then the same but the
    customer's blinded point, which matches nothing it can compute; no ID comes in the clear; t is the number of
    the first key set it prepared itself. The answers are the VFL model's, equal to plain mode's."""
    from lvfl.crypto.ecdh_blinding import DST, split_points
    from lvfl.crypto.hash_to_curve import hash_to_u

    run = served["SplitNN"]
    federation = load_federation(run.federation)
    bank, retailer = table_ids(TABLES["party0"]), table_ids(TABLES["party1"])
    plain_answers = {r["id"]: r for r in read(run.predicted)}
    shared = [k for k, r in plain_answers.items() if r["path"] == "vfl"][:2]
    party1 = ExportedParty(run.export / "party1", "party1")
    server = Recording(federation, party1, FeatureSource(TABLES["party1"], party1), federation.key_path("party1"),
                       oblivious=True, bucket_size=1024).start()  # fmt: skip
    order = server.blinded_table().order
    position = {retailer[row]: at for at, row in enumerate(order)}
    offsets = [position[k] % 1024 for k in shared]
    draws = [(5 + 11 * i) % 1024 for i in range(64)]
    party0 = ExportedParty(run.export / "party0", "party0")
    views, firsts = [], []
    try:
        for world, customer in enumerate(shared):
            mine = list(draws)
            if world == 1:
                mine[0] ^= offsets[0] ^ offsets[1]
            sequence = iter(mine)
            monkeypatch.setattr(scheme, "_draw", lambda bound, sequence=sequence: next(sequence))
            scorer = Scorer(federation, party0, FeatureSource(TABLES["party0"], party0), federation.key_path("party0"),
                            oblivious=True, prepare_ahead=0)  # fmt: skip
            try:
                Recording.view = []
                assert scorer.greet(timeout=10) == {"party1": ""}
                scored = scorer.score([customer], request_id="same")
            finally:
                scorer.close()
            assert [r["path"] for r in scored.rows] == ["vfl"]
            assert_same_answers(scored.rows, [plain_answers[customer]])
            views.append(list(Recording.view))
            firsts.append(server._key_sets._next - 64)  # the key sets it numbered itself
    finally:
        server.stop()
    kinds = [[kind for kind, _ in view] for view in views]
    assert kinds[0] == kinds[1] == ["greet", "table", "members", "offer", "prepare", "lookup"]
    for kind in ("greet", "table", "offer"):
        assert views[0][kinds[0].index(kind)] == views[1][kinds[1].index(kind)], kind
    lookups = [pb.LookupRequest.FromString(view[-1][1]) for view in views]
    queries = [parse_queries(serving_layout(len(retailer), 1024, (16,)), lk.queries) for lk in lookups]
    assert [(b, d) for b, _, d in queries[0]] == [(b, d) for b, _, d in queries[1]]  # bucket and shift
    assert [t for _, t, _ in queries[0]] == [firsts[0]]
    assert [t for _, t, _ in queries[1]] == [firsts[1]]
    lookups[1].queries = lookups[0].queries
    assert lookups[0] == lookups[1]  # the rest of the message too
    everything = b"".join(payload for view in views for _, payload in view)
    assert not [k for k in bank if k.encode() in everything]  # no ID of the bank's, shared or not, in the clear
    members = [pb.MembershipRequest.FromString(view[2][1]).points for view in views]
    computable = {hash_to_u(k.encode(), DST) for k in bank}
    computable |= set(split_points(server.blinded_table().points))
    assert not computable & set(members)


@pytest.mark.slow
def test_a_passive_party_down_gives_student_answers_and_is_used_again_when_back(served) -> None:
    """party1 stopped: the request is answered by the student within the deadline, saying why; a new party1 on
    the same address (its key sets gone with the old one) answers the next request by the VFL model again."""
    run = served["SplitNN"]
    federation = load_federation(run.federation)
    bank, retailer = table_ids(TABLES["party0"]), set(table_ids(TABLES["party1"]))
    shared = [k for k in bank if k in retailer][:3]
    party1 = ExportedParty(run.export / "party1", "party1")

    def start() -> ContributionServer:
        return ContributionServer(federation, party1, FeatureSource(TABLES["party1"], party1),
                                  federation.key_path("party1"), oblivious=True).start()  # fmt: skip

    server = start()
    party0 = ExportedParty(run.export / "party0", "party0")
    scorer = Scorer(federation, party0, FeatureSource(TABLES["party0"], party0), federation.key_path("party0"),
                    deadline=2, oblivious=True, prepare_ahead=256)  # fmt: skip
    try:
        assert scorer.greet(timeout=10) == {"party1": ""}
        assert {r["path"] for r in scorer.score(shared).rows} == {"vfl"}
        server.stop()
        began = time.monotonic()
        down = scorer.score(shared)
        assert time.monotonic() - began < 3
        assert {r["path"] for r in down.rows} == {"student"}
        assert "party1" in down.rows[0]["reason"], down.rows[0]["reason"]
        server = start()
        end = time.monotonic() + 20
        while {r["path"] for r in scorer.score(shared).rows} != {"vfl"}:
            assert time.monotonic() < end, "party1 was not used again"
            time.sleep(0.2)
    finally:
        scorer.close()
        server.stop()


# -- real processes ------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ["SplitNN", "EASTER-DHMasking-RandomizedResponse"])
def test_served_oblivious_answers_are_lvfl_predicts(served, tmp_path, name) -> None:
    """Real passive `lvfl serve --oblivious` processes (two for the DH-masked EASTER run), `lvfl score --oblivious`
    as the active party: its file is `lvfl predict`'s, ID by ID; each passive party's log line for the request says
    it saw no ID, and holds none."""
    run = served[name]
    peers = [p for p in run.tables if p != "party0"]
    processes = {p: passive(run, party=p, extra=("--oblivious", "--bucket_size", "128")) for p in peers}
    try:
        for p in peers:
            processes[p].wait_for("only a bucket of 128 rows is seen here")
        predicted = read(run.predicted)
        ids = tmp_path / "ids.txt"
        ids.write_text("\n".join(r["id"] for r in predicted) + "\n")
        out = tmp_path / "out.csv"
        score_here(run, ids, out, "--oblivious")
        assert_same_answers(read(out), predicted)
        for p in peers:
            line = processes[p].wait_for(f"{p}: request")
            assert f"{len(predicted)} IDs asked (blinded), {len(predicted)} oblivious lookups" in line, line
            assert "oblivious (ids seen: 0)" in line, line
            logged = "\n".join(processes[p].lines)
            assert not [r["id"] for r in predicted if r["id"] in logged]
    finally:
        for process in processes.values():
            process.stop()


@pytest.mark.slow
def test_a_party_serving_another_mode_is_refused_at_the_greeting_in_one_line(served, tmp_path, capsys) -> None:
    """party1 serving oblivious lookups, the bank asking in plain mode: refused at the greeting, one line naming
    both modes; the IDs never leave the bank."""
    run = served["SplitNN"]
    process = passive(run, extra=("--oblivious",))
    try:
        process.wait_for("answers party0's contribution requests")
        err = score_refused(run, tmp_path, capsys)
        assert err == ["lvfl: error: party1 serves in oblivious mode, party0 asks in plain mode: start every party "
                       "with --oblivious, or none"], err  # fmt: skip
    finally:
        process.stop()
