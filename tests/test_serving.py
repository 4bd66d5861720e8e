"""`lvfl serve` and `lvfl score`: served answers are `lvfl predict`'s, a passive party's faults never hang a request,
and parties serving different exports are refused at the greeting.

The reference is lvfl itself: `lvfl predict`'s file for the same run and rows. The passive parties are real
`lvfl serve` processes (mutual TLS on localhost); so is the active party where its API is tested.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time

import grpc
import pytest
import torch
from served_runs import (
    TABLES,
    Process,
    assert_same_answers,
    free_port,
    passive,
    read,
    score_here,
    score_refused,
    table_ids,
)

from lvfl.export import export_id
from lvfl.federation.channels import pinned_channel
from lvfl.federation.federation_file import load_federation, write_federation
from lvfl.federation.pki import write_test_pki
from lvfl.serving import ExportedParty, FeatureSource
from lvfl.serving import serving_pb2 as pb
from lvfl.serving.client import score_remote
from lvfl.serving.contributions import ContributionServer
from lvfl.serving.http_endpoint import HttpEndpoint
from lvfl.serving.service import CONTRIBUTE, check_loopback


@pytest.mark.slow
def test_served_answers_are_lvfl_predicts_for_every_protocol(served, tmp_path) -> None:
    """EASTER with DH masking and randomized response, SplitNN, Agg_VFL with DH masking and PraVFed (label DP): a
    real passive `lvfl serve` process per run, `lvfl score` as the active party; its file is `lvfl predict`'s (both
    paths: the VFL model for the shared customers, the student for the bank's own), ID by ID."""
    processes = {
        (name, party): passive(run, party=party)
        for name, run in served.items()
        for party in run.tables
        if party != "party0"
    }
    try:
        for name, run in served.items():
            for party in run.tables:
                if party != "party0":
                    processes[name, party].wait_for("answers party0's contribution requests")
            predicted = read(run.predicted)
            assert {r["path"] for r in predicted} == {"vfl", "student"}, name
            ids = tmp_path / f"{name}.txt"
            ids.write_text("\n".join(r["id"] for r in predicted) + "\n")
            out = tmp_path / f"{name}.csv"
            score_here(run, ids, out)
            assert_same_answers(read(out), predicted)
            # each passive party's log: one line for the request, saying it saw the IDs
            for party in run.tables:
                if party != "party0":
                    line = processes[name, party].wait_for(f"{party}: request")
                    assert f"{len(predicted)} IDs asked (blinded)" in line, line
                    assert "plain (ids seen:" in line, line
    finally:
        for process in processes.values():
            process.stop()


@pytest.mark.slow
def test_a_passive_party_down_or_late_never_hangs_a_request_and_is_used_again_when_back(served, tmp_path) -> None:
    """The active party's real `lvfl serve` with its gRPC API: a passive party stopped (SIGSTOP) misses the deadline,
    one killed mid-stream is unreachable; either way every request is answered within the deadline, by the student
    with a reason naming the party, and once the party is back the VFL model answers again."""
    run = served["PraVFed"]
    predicted = read(run.predicted)
    shared = [r["id"] for r in predicted if r["path"] == "vfl"][:20]
    api = f"127.0.0.1:{free_port()}"
    first = passive(run)
    active = Process("--party", "party0", "--federation", str(run.federation), "--model", str(run.export / "party0"),
                     "--table", str(TABLES["party0"]), "--api", api, "--deadline", "0.5")  # fmt: skip
    second = None
    try:
        first.wait_for("answers party0's contribution requests")
        active.wait_for("party0 scores at grpc")

        def ask() -> tuple[list[dict], float]:
            start = time.perf_counter()
            rows = score_remote(api, shared, deadline=0.5, timeout=10)
            return rows, time.perf_counter() - start

        rows, _ = ask()
        assert {r["path"] for r in rows} == {"vfl"}
        first.process.send_signal(signal.SIGSTOP)  # alive, silent: it misses the deadline
        rows, seconds = ask()
        assert seconds < 0.5 + 1.0, seconds
        assert {r["path"] for r in rows} == {"student"}
        assert {r["reason"] for r in rows} == {"party1 did not answer within the deadline (0.5 s): answered by "
                                               "the student"}  # fmt: skip
        first.process.send_signal(signal.SIGCONT)
        rows, _ = ask()
        assert {r["path"] for r in rows} == {"vfl"}
        # killed while requests stream in: each is answered within the deadline, by the VFL model or the student
        answered: list[tuple[set[str], float]] = []

        def stream() -> None:
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                rows, seconds = ask()
                answered.append(({r["path"] for r in rows}, seconds))

        streaming = threading.Thread(target=stream)
        streaming.start()
        time.sleep(0.5)
        first.process.kill()
        streaming.join(30)
        assert answered
        assert max(s for _, s in answered) < 0.5 + 1.0, answered
        assert {"student"} in [paths for paths, _ in answered], answered
        assert all(paths in ({"vfl"}, {"student"}) for paths, _ in answered), answered
        rows, seconds = ask()
        assert seconds < 0.5 + 1.0
        assert {r["path"] for r in rows} == {"student"}
        assert rows[0]["reason"].startswith("party1 is unreachable"), rows[0]["reason"]
        second = passive(run)  # back: used again with no restart of the active party
        second.wait_for("answers party0's contribution requests")
        end = time.monotonic() + 10
        while {r["path"] for r in rows} != {"vfl"} and time.monotonic() < end:
            time.sleep(0.2)
            rows, _ = ask()
        assert {r["path"] for r in rows} == {"vfl"}
        # one log line per request at the active party, with its paths and latency
        assert any("party0: request" in line and "20 student" in line and "ms; party1" in line
                   for line in active.lines), active.lines[-10:]  # fmt: skip
    finally:
        first.process.send_signal(signal.SIGCONT) if first.process.poll() is None else None
        for process in (first, active, second):
            if process is not None:
                process.stop()


@pytest.mark.slow
def test_a_party_serving_another_export_is_refused_at_the_greeting_in_one_line(served, tmp_path, capsys) -> None:
    """party1 serving the same run at another step (another model version): the active party's greeting is
    refused, naming both exports, and `lvfl score` stops with one line."""
    run = served["SplitNN"]
    other = tmp_path / "party1"
    shutil.copytree(run.export / "party1", other)
    info = json.loads((other / "party.json").read_text())
    info["export"]["step"] += 1000
    info["export"]["id"] = export_id(info["export"])
    (other / "party.json").write_text(json.dumps(info))
    process = passive(run, other)
    try:
        process.wait_for("answers party0's contribution requests")
        err = score_refused(run, tmp_path, capsys)
        assert len(err) == 1, err
        mine = info["export"]
        assert err[0].startswith(f"lvfl: error: party1 serves export {mine['id']} (run {mine['run'][:16]}, step "
                                 f"{mine['step']}), party0 serves export "), err  # fmt: skip
    finally:
        process.stop()


# -- in one process: the pieces, each against what it must refuse --------------------------------------------------
def test_a_changed_table_is_read_again_and_a_broken_one_leaves_the_old_serving(served, tmp_path, caplog) -> None:
    """The passive party's table rewritten with another value and a new customer: served from the next lookup (no
    restart); caught half-written (a line cut short): the rows read before keep serving, with a warning."""
    run = served["SplitNN"]
    party = ExportedParty(run.export / "party1", "party1")
    table = tmp_path / "retailer.csv"
    lines = TABLES["party1"].read_text().splitlines()
    table.write_text("\n".join(lines[:6]) + "\n")
    source = FeatureSource(table, party, check_every=0)
    first = lines[1].split(",")[0]
    before = source.lookup([first, "NEW"])
    assert before.held == [True, False]
    changed = lines[1].split(",")
    changed[1] = str(float(changed[1]) + 5)
    table.write_text("\n".join([lines[0], ",".join(changed), *lines[2:6], "NEW,1.0,2,store"]) + "\n")
    os.utime(table, ns=(time.time_ns(), time.time_ns() + 10**9))  # a later modification time, whatever the clock
    after = source.lookup([first, "NEW"])
    assert after.held == [True, True]
    assert source.reloads == 1
    assert not torch.equal(after.features[0], before.features[0])
    expected = party.encode([changed[1:], ["1.0", "2", "store"]], ["a", "b"])
    torch.testing.assert_close(after.features, expected, rtol=0, atol=0)
    table.write_text("\n".join([lines[0], lines[1][:12]]))  # caught half-written: a line cut short
    os.utime(table, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    with caplog.at_level("WARNING", logger="lvfl.serve"):
        again = source.lookup([first, "NEW"])
    assert again.held == [True, True]
    assert torch.equal(again.features, after.features)
    assert "cannot be read; still serving the rows read before" in caplog.text


def test_only_the_active_party_its_export_answers_may_ask_for_contributions(served, tmp_path) -> None:
    """A third party of the federation, with a certificate the CA signed and the federation pins, is refused:
    party1's export answers party0 only."""
    run = served["SplitNN"]
    names = ["party0", "party1", "party2"]
    write_test_pki(tmp_path / "pki", names, ca_key=None)
    federation = write_federation(tmp_path / "pki" / "federation.yaml", names)
    party = ExportedParty(run.export / "party1", "party1")
    server = ContributionServer(federation, party, FeatureSource(TABLES["party1"], party),
                                federation.key_path("party1")).start()  # fmt: skip
    try:
        for caller, code in (("party2", grpc.StatusCode.PERMISSION_DENIED), ("party0", None)):
            key = federation.key_path(caller).read_bytes()
            certificate = federation.party(caller).certificate.read_bytes()
            with pinned_channel(federation, "party1", key, certificate) as channel:
                call = channel.unary_unary(CONTRIBUTE.path, pb.ContributionRequest.SerializeToString,
                                           pb.ContributionReply.FromString)  # fmt: skip
                request = pb.ContributionRequest(request_id="r", export_id=party.export_id, ids=["x"])
                if code is None:
                    assert call(request, timeout=10).held == b"\x00"
                    continue
                with pytest.raises(grpc.RpcError) as refused:
                    call(request, timeout=10)
                assert refused.value.code() == code
                assert (
                    "party2 asked party1 for contributions; its export answers party0 only" in refused.value.details()
                )
    finally:
        server.stop()


def test_the_scoring_api_listens_on_this_machine_only_and_names_a_bad_field(served) -> None:
    """--api/--http on another host are refused by option; a JSON request with an unknown or mistyped field is
    answered 400 naming it."""
    for address in ("0.0.0.0:8500", "10.1.2.3:8500", "example.org:8500"):
        with pytest.raises(ValueError, match=r"^--api .*this machine only"):
            check_loopback(address, "--api")
    assert check_loopback("[::1]:8500", "--api") == ("::1", 8500)
    from urllib.error import HTTPError
    from urllib.request import Request, urlopen

    class NoScorer:  # the endpoint refuses before it scores
        party = ExportedParty(served["SplitNN"].export / "party0", "party0")
        order = ["party1"]

        def score(self, *args):
            raise AssertionError("not reached")

    endpoint = HttpEndpoint(NoScorer(), f"127.0.0.1:{free_port()}").start()
    try:
        for body, message in (
            ({"ids": ["a"], "deadline": 1}, "unknown field 'deadline'"),
            ({"ids": "a"}, "'ids' must be a list"),
            ({"rows": [{"income": 1}]}, "a row of 'rows' has no 'customer_id'"),
            ({}, "give 'ids' or 'rows'"),
        ):
            request = Request(f"http://127.0.0.1:{endpoint.port}/score", json.dumps(body).encode(), method="POST")
            with pytest.raises(HTTPError) as refused:
                urlopen(request, timeout=10)  # noqa: S310 - localhost
            assert refused.value.code == 400
            assert message in json.loads(refused.value.read())["error"]
    finally:
        endpoint.stop()


def test_lvfl_serve_refuses_another_partys_folder_and_a_missing_role_option_in_one_line(served, capsys) -> None:
    run = served["SplitNN"]
    from lvfl.commands import serve

    for args, message in (
        (["--party", "party1", "--model", str(run.export / "party0")], "is party 'party0''s folder, not --party"),
        (["--party", "party0", "--model", str(run.export / "party0")], "give --api HOST:PORT (gRPC) and/or --http"),
        (
            ["--party", "party1", "--model", str(run.export / "party1"), "--api", "127.0.0.1:1"],
            "--api and --http are the active party's; party1 is passive",
        ),
    ):
        with pytest.raises(SystemExit) as stopped:
            serve.main([*args, "--federation", str(run.federation), "--table", str(TABLES["party1"])])
        assert stopped.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert message in err[0], err
    assert load_federation(run.federation)  # untouched


def test_a_passive_partys_view_holds_none_of_the_active_partys_other_customers(served, tmp_path) -> None:
    """Counterfactual: the bank scores two shared customers and one of its own the retailer does not know; then the
    same with another such customer in that place. Everything the retailer receives (greeting, blinded table
    request, blinded points, the IDs in the clear) is the same but for that customer's 32-byte point, which matches
    nothing the retailer can compute from any candidate ID without the bank's key. The IDs it sees in the clear are
    its own customers', the ones scored."""
    from lvfl.crypto.ecdh_blinding import DST, split_points
    from lvfl.crypto.hash_to_curve import hash_to_u
    from lvfl.serving import Scorer

    run = served["SplitNN"]
    federation = load_federation(run.federation)
    bank, retailer = table_ids(TABLES["party0"]), set(table_ids(TABLES["party1"]))
    shared = [k for k in bank if k in retailer][:2]
    own = [k for k in bank if k not in retailer][:2]

    class Recording(ContributionServer):
        """party1's server, keeping every message it receives: its whole view of the serving."""

        view: list[tuple[str, bytes]] = []

        def _greet(self, request, context):
            self.view.append(("greet", request.SerializeToString()))
            return super()._greet(request, context)

        def _table(self, request, context):
            self.view.append(("table", request.SerializeToString()))
            return super()._table(request, context)

        def _members(self, request, context):
            self.view.append(("members", request.SerializeToString()))
            return super()._members(request, context)

        def _contribute(self, request, context):
            self.view.append(("contribute", request.SerializeToString()))
            return super()._contribute(request, context)

    party1 = ExportedParty(run.export / "party1", "party1")
    server = Recording(federation, party1, FeatureSource(TABLES["party1"], party1),
                       federation.key_path("party1")).start()  # fmt: skip
    party0 = ExportedParty(run.export / "party0", "party0")
    scorer = Scorer(federation, party0, FeatureSource(TABLES["party0"], party0), federation.key_path("party0"))
    try:
        assert scorer.greet(timeout=10) == {"party1": ""}
        views = []
        for secret in own:
            Recording.view = []
            scored = scorer.score([shared[0], secret, shared[1]], request_id="same")
            assert [r["path"] for r in scored.rows] == ["vfl", "student", "vfl"]
            views.append(list(Recording.view))
    finally:
        scorer.close()
        server.stop()
    (kinds_a, kinds_b) = ([kind for kind, _ in v] for v in views)
    assert kinds_a == kinds_b == ["members", "contribute"]
    contribute = [pb.ContributionRequest.FromString(v[1][1]) for v in views]
    assert [list(c.ids) for c in contribute] == [shared, shared]  # in the clear: its own customers, scored
    assert views[0][1] == views[1][1]  # the whole message, byte for byte
    members = [pb.MembershipRequest.FromString(v[0][1]) for v in views]
    points = [split_points(m.points) for m in members]
    assert points[0][1] != points[1][1]  # the one difference: the secret customer's point
    members[1].points = points[1][0] + points[0][1] + points[1][2]
    assert members[0] == members[1]  # and nothing else differs
    candidates = own + shared + [k for k in bank if k not in retailer][2:50]
    computable = {hash_to_u(k.encode(), DST) for k in candidates}  # H(x): what anyone can compute
    computable |= set(split_points(server.blinded_table().points))  # b·H(y) of its own customers
    table = server.blinded_table()
    computable |= set(split_points(table.reblind(b"".join(hash_to_u(k.encode(), DST) for k in candidates))))  # b·H(x)
    assert not computable & {points[0][1], points[1][1]}


@pytest.mark.slow
def test_each_party_counts_its_requests_rows_latency_and_failures_for_a_scraper(served) -> None:
    """`--metrics`: the counts a Prometheus scraper reads (parsed by prometheus_client's own parser) are the
    requests made, the rows by path each party answered, and, once party1 is stopped, its failure by kind."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    from lvfl.serving import Scorer
    from lvfl.serving.metrics import ServingMetrics

    run = served["SplitNN"]
    federation = load_federation(run.federation)
    bank, retailer = table_ids(TABLES["party0"]), set(table_ids(TABLES["party1"]))
    shared = [k for k in bank if k in retailer][:3]
    own = [k for k in bank if k not in retailer][:2]
    counted = {name: ServingMetrics(name) for name in ("party0", "party1")}
    party1 = ExportedParty(run.export / "party1", "party1")
    server = ContributionServer(federation, party1, FeatureSource(TABLES["party1"], party1),
                                federation.key_path("party1"), metrics=counted["party1"]).start()  # fmt: skip
    party0 = ExportedParty(run.export / "party0", "party0")
    scorer = Scorer(federation, party0, FeatureSource(TABLES["party0"], party0), federation.key_path("party0"),
                    deadline=2, metrics=counted["party0"])  # fmt: skip
    ports = {name: metrics.start(f"127.0.0.1:{free_port()}") for name, metrics in counted.items()}
    try:
        scorer.score([*shared, *own, "NOT-A-CUSTOMER"])
        scorer.score(shared[:1])
        server.stop()
        scorer.score(shared[:1])  # party1 is gone: the student answers
        scraped = {}
        for name, port in ports.items():
            text = urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()  # noqa: S310 - localhost
            scraped[name] = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }
    finally:
        scorer.close()
        server.stop()
        for metrics in counted.values():
            metrics.stop()

    def value(name, metric, **labels):
        return scraped[name].get((metric, tuple(sorted({"party": name, **labels}.items()))), 0.0)

    assert value("party0", "lvfl_serve_requests_total") == 3
    assert value("party0", "lvfl_serve_rows_total", path="vfl") == 3 + 1
    assert value("party0", "lvfl_serve_rows_total", path="student") == 2 + 1
    assert value("party0", "lvfl_serve_rows_total", path="unanswered") == 1
    assert value("party0", "lvfl_serve_peer_failures_total", peer="party1", kind="unreachable") == 1
    assert value("party0", "lvfl_serve_request_seconds_count") == 3
    assert value("party1", "lvfl_serve_requests_total") == 2
    assert value("party1", "lvfl_serve_rows_total", path="contributed") == 3 + 1


def _not_json(constant: str) -> None:
    raise AssertionError(f"the answer holds {constant}, which is not JSON")


@pytest.mark.slow
def test_non_finite_contributions_go_to_the_student_and_json_never_carries_nan(served) -> None:
    """A passive party whose contributions hold NaN or inf: its rows are answered by the student, the reason naming
    it, and the HTTP answer is strict JSON. (Its rows were once answered `path: vfl` with probability NaN.)"""
    from urllib.request import Request, urlopen

    from lvfl.serving import Scorer

    run = served["SplitNN"]
    federation = load_federation(run.federation)
    retailer = set(table_ids(TABLES["party1"]))
    shared = [k for k in table_ids(TABLES["party0"]) if k in retailer][:3]
    party1 = ExportedParty(run.export / "party1", "party1")
    honest = party1.contribution
    server = ContributionServer(federation, party1, FeatureSource(TABLES["party1"], party1),
                                federation.key_path("party1")).start()  # fmt: skip
    party0 = ExportedParty(run.export / "party0", "party0")
    scorer = Scorer(federation, party0, FeatureSource(TABLES["party0"], party0), federation.key_path("party0"))
    endpoint = HttpEndpoint(scorer, f"127.0.0.1:{free_port()}").start()
    try:
        assert scorer.greet(timeout=10) == {"party1": ""}
        assert {r["path"] for r in scorer.score(shared).rows} == {"vfl"}
        for bad in (float("nan"), float("inf"), float("-inf")):
            party1.contribution = lambda x, bad=bad: torch.full_like(honest(x), bad)
            body = json.dumps({"ids": shared}).encode()
            with urlopen(Request(f"http://127.0.0.1:{endpoint.port}/score", body, method="POST"), timeout=30) as got:
                answers = json.loads(got.read(), parse_constant=_not_json)["answers"]
            assert [a["path"] for a in answers] == ["student"] * 3, answers
            assert {a["reason"] for a in answers} == {
                "party1 sent contributions that are not finite (NaN or inf): answered by the student"
            }
        party1.contribution = honest
        assert {r["path"] for r in scorer.score(shared).rows} == {"vfl"}  # nothing remembered of the fault
    finally:
        endpoint.stop()
        scorer.close()
        server.stop()


@pytest.mark.slow
def test_a_table_that_changes_with_every_answer_costs_a_request_its_deadline_and_a_true_reason(served) -> None:
    """A passive party that sends a new table version in each answer once held each request for 32 s against a 1 s
    deadline, with the reason "did not answer within the deadline". Now a changed table is read on a thread of its
    own: the request waits for it at most its deadline, and the reason says what happened."""
    import lvfl.serving.membership as membership
    from lvfl.serving import Scorer

    run = served["SplitNN"]
    federation = load_federation(run.federation)
    retailer = set(table_ids(TABLES["party1"]))
    shared = [k for k in table_ids(TABLES["party0"]) if k in retailer][:3]

    class Churning(ContributionServer):
        churn = False

        def blinded_table(self):
            if self.churn:
                return membership.BlindedTable(self.source.snapshot()[0])  # a new version, every call
            return super().blinded_table()

    party1 = ExportedParty(run.export / "party1", "party1")
    server = Churning(federation, party1, FeatureSource(TABLES["party1"], party1),
                      federation.key_path("party1")).start()  # fmt: skip
    party0 = ExportedParty(run.export / "party0", "party0")
    scorer = Scorer(federation, party0, FeatureSource(TABLES["party0"], party0), federation.key_path("party0"),
                    deadline=0.5)  # fmt: skip
    learn = scorer.memberships.learn_table
    try:
        assert scorer.greet(timeout=10) == {"party1": ""}
        assert {r["path"] for r in scorer.score(shared).rows} == {"vfl"}
        Churning.churn = True
        for _ in range(2):  # read in time (its next version came meanwhile), or not: the reason says which
            scored = scorer.score(shared)
            assert scored.seconds < 0.5 + 3.0, scored.seconds
            (reason,) = {r["reason"] for r in scored.rows}
            again = reason == "party1's table changed again while it was read: answered by the student"
            assert again or reason.startswith("party1's table changed, and reading it again did not end within"), reason
        Churning.churn = False

        def slow(*args):  # a large table: its reading takes longer than the deadline
            time.sleep(3.0)
            learn(*args)

        scorer.memberships.learn_table = slow
        scorer.memberships._tables.pop("party1")  # as if its table had changed
        time.sleep(4.0)  # the churn's last readings end
        scored = scorer.score(shared)
        assert scored.seconds < 0.5 + 3.0, scored.seconds
        (reason,) = {r["reason"] for r in scored.rows}
        assert reason.startswith("party1's table changed, and reading it again did not end within the deadline")
        time.sleep(4.0)  # the reading went on, and ended
        assert {r["path"] for r in scorer.score(shared).rows} == {"vfl"}
    finally:
        scorer.close()
        server.stop()


@pytest.mark.slow
def test_health_says_which_passive_party_is_missing_and_is_ready_again_when_it_is_back(served, capsys) -> None:
    """`GET /health` (503 while degraded) and the gRPC health service follow a passive `lvfl serve` process that is
    killed, then started again: not ready once its connection drops, ready once it is connected and greeted."""
    from urllib.error import HTTPError
    from urllib.request import urlopen

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from lvfl.serving import Scorer
    from lvfl.serving.api import ScoringService

    run = served["PraVFed"]
    federation = load_federation(run.federation)
    first = passive(run)
    second = None
    party0 = ExportedParty(run.export / "party0", "party0")
    scorer = Scorer(federation, party0, FeatureSource(TABLES["party0"], party0), federation.key_path("party0"))
    http = api = None
    try:
        first.wait_for("answers party0's contribution requests")
        scorer.watch(scorer.greet(timeout=30))
        http = HttpEndpoint(scorer, f"127.0.0.1:{free_port()}").start()
        api = ScoringService(scorer, f"127.0.0.1:{free_port()}").start()
        checking = health_pb2_grpc.HealthStub(grpc.insecure_channel(api.address))

        def health() -> tuple[int, dict, int]:
            try:
                with urlopen(f"http://127.0.0.1:{http.port}/health", timeout=30) as reply:  # noqa: S310
                    status, body = reply.status, json.loads(reply.read())
            except HTTPError as err:
                status, body = err.code, json.loads(err.read())
            served_status = checking.Check(health_pb2.HealthCheckRequest(service="lvfl.serving.Scoring"), timeout=30)
            return status, body, served_status.status

        def until(ready: bool) -> tuple[float, dict]:
            start = time.monotonic()
            while time.monotonic() < start + 60:
                status, body, served_status = health()
                serving = served_status == health_pb2.HealthCheckResponse.SERVING
                if (status == 200) == ready and serving == ready and body["ready"] == ready:
                    return time.monotonic() - start, body
                time.sleep(0.05)
            raise AssertionError(f"health did not turn {'ready' if ready else 'not ready'} in 60 s: {body}")

        until(True)
        first.process.kill()
        dropped, body = until(False)
        assert body["missing"] == {"party1": "party1 is unreachable (its connection dropped)"}
        second = passive(run)
        second.wait_for("answers party0's contribution requests")
        back, body = until(True)
        assert body["missing"] == {}
        with capsys.disabled():
            print(f"\nhealth: not ready {dropped:.2f} s after the kill, ready {back:.2f} s after the restart's line")
    finally:
        for server in (http, api):
            if server is not None:
                server.stop()
        scorer.close()
        for process in (first, second):
            if process is not None:
                process.stop()
