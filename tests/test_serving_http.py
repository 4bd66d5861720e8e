"""The scoring API's HTTP endpoint on uvicorn: the limits it states hold against a misbehaving client.

A stand-in scorer answers (the endpoint's own behaviour needs no fitted run): every request below either reaches it
with what was sent, or is refused before it is read whole, in one line.
"""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest
from served_runs import free_port

from lvfl.serving import http_endpoint
from lvfl.serving.http_endpoint import HttpEndpoint
from lvfl.serving.scorer import Scored


class _Party:
    party, id_column, identity = "party0", "customer_id", {"id": "e1"}


class StandIn:
    """A scorer that answers each ID with one fixed row and remembers what it was asked."""

    party, order = _Party(), ["party1"]

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def score(self, ids, rows=None, columns=None, deadline=None, request_id=None) -> Scored:
        order = [*ids, *(k for k in rows or {} if k not in ids)]
        self.asked.append(order)
        answers = [{"id": k, "prediction": "good", "prob_good": 1.0, "path": "vfl", "reason": ""} for k in order]
        return Scored(request_id or "r", answers, ["good"])


@pytest.fixture
def endpoint():
    served = HttpEndpoint(StandIn(), f"127.0.0.1:{free_port()}").start()
    yield served
    served.stop()


def _raw(endpoint: HttpEndpoint, data: bytes, timeout: float = 30) -> bytes:
    """Send `data` as is on a fresh connection; everything the server answers until it closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=timeout) as s:
        s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
            if b"\r\n\r\n" in got and b"\n" in got.partition(b"\r\n\r\n")[2]:
                break
        return got


def _post(endpoint: HttpEndpoint, body: bytes) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=30)
    connection.request("POST", "/score", body, {"Content-Type": "application/json"})
    reply = connection.getresponse()
    status, data = reply.status, reply.read()
    connection.close()
    return status, json.loads(data)


def test_a_request_is_answered_and_health_routes_and_methods_are_named(endpoint) -> None:
    status, body = _post(endpoint, json.dumps({"ids": ["a", "b"]}).encode())
    assert status == 200
    assert [a["id"] for a in body["answers"]] == ["a", "b"]
    connection = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=30)
    for method, path, expected in (("GET", "/health", 200), ("GET", "/nowhere", 404), ("GET", "/score", 405)):
        connection.request(method, path)
        reply = connection.getresponse()
        assert (reply.status, method, path) == (expected, method, path)
        reply.read()
    connection.close()


@pytest.mark.parametrize("length", [b"-1", b"12abc", b"1e3"])
def test_a_content_length_that_is_not_a_byte_count_is_refused_before_any_body_is_read(endpoint, length) -> None:
    """`Content-Length: -1` once let a 100 MiB body past the 64 MiB limit; a word there dropped the connection."""
    answer = _raw(endpoint, b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n" + b"{}" * 64)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert not endpoint.scorer.asked


def test_a_body_over_the_limit_is_refused_as_it_is_read(endpoint, monkeypatch) -> None:
    monkeypatch.setattr(http_endpoint, "MAX_HTTP_BYTES", 1000)
    declared = _raw(endpoint, b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + b" " * 100)
    assert declared.startswith(b"HTTP/1.1 413"), declared[:200]
    body = json.dumps({"ids": ["x" * 40] * 50}).encode()  # 2.2 kB, sent in chunks with no length declared
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 500]), body[i : i + 500]) for i in range(0, len(body), 500))
    streamed = _raw(endpoint, b"POST /score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks)
    assert streamed.startswith(b"HTTP/1.1 413"), streamed[:200]
    assert b"over 1000 bytes" in streamed
    assert not endpoint.scorer.asked


def test_json_nested_past_the_recursion_limit_is_a_400_not_a_dropped_connection(endpoint) -> None:
    status, body = _post(endpoint, b"[" * 200_000 + b"]" * 200_000)
    assert (status, body) == (400, {"error": "the request's JSON nests too deeply"})
    status, body = _post(endpoint, b'{"ids": ["a"],')
    assert status == 400
    assert body["error"].startswith("the request is not JSON")


def test_a_connection_that_sends_no_whole_head_is_closed(monkeypatch) -> None:
    """300 idle connections once held 300 threads for ever; now each has `HEAD_SECONDS` to send its head."""
    monkeypatch.setattr(http_endpoint, "HEAD_SECONDS", 0.5)
    served = HttpEndpoint(StandIn(), f"127.0.0.1:{free_port()}").start()
    try:
        silent = socket.create_connection(("127.0.0.1", served.port), timeout=30)
        trickle = socket.create_connection(("127.0.0.1", served.port), timeout=30)
        start, closed = time.monotonic(), False
        while not closed and time.monotonic() < start + 10:  # a byte now and then, never a whole head
            try:
                trickle.sendall(b"P")
                time.sleep(0.1)
            except OSError:  # the server closed it
                closed = True
        assert closed
        assert silent.recv(1) == b""  # closed by the server too
        keep = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
        keep.request("GET", "/health")
        assert keep.getresponse().read()
        time.sleep(1.5)  # idle after its answer: closed too
        keep.sock.settimeout(30)
        assert keep.sock.recv(1) == b""  # the server closed it
        silent.close()
        trickle.close()
    finally:
        served.stop()


def test_connections_past_the_limit_are_answered_503(monkeypatch) -> None:
    monkeypatch.setattr(http_endpoint, "MAX_CONNECTIONS", 3)
    served = HttpEndpoint(StandIn(), f"127.0.0.1:{free_port()}").start()
    try:
        held = [socket.create_connection(("127.0.0.1", served.port), timeout=30) for _ in range(3)]
        time.sleep(0.2)
        answer = _raw(served, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        for s in held:
            s.close()
    finally:
        served.stop()


def test_a_port_in_use_is_refused_in_one_line(endpoint) -> None:
    from lvfl.federation import FederationError

    with pytest.raises(FederationError, match=rf"^--http 127.0.0.1:{endpoint.port}: cannot listen there"):
        HttpEndpoint(StandIn(), f"127.0.0.1:{endpoint.port}").start()


def test_a_request_over_the_id_cap_is_refused_and_the_client_splits_a_longer_batch(monkeypatch) -> None:
    """1M IDs in one request once cost 650 MB at the server; now a request holds at most `MAX_REQUEST_IDS`, and
    `lvfl score --server` sends a longer batch in parts, its answers in one request's order."""
    from lvfl.serving import client, scorer
    from lvfl.serving.api import ScoringService
    from lvfl.serving.client import ScoringClient
    from lvfl.serving.scorer import Scorer

    monkeypatch.setattr(scorer, "MAX_REQUEST_IDS", 4)
    with pytest.raises(ValueError, match="^a request holds at most 4 IDs and rows; this one holds 5: split it"):
        Scorer.__new__(Scorer).score(["a", "b", "c"], rows={"d": [], "e": []})
    monkeypatch.setattr(client, "MAX_REQUEST_IDS", 3)
    stand_in = StandIn()
    service = ScoringService(stand_in, f"127.0.0.1:{free_port()}").start()
    try:
        with ScoringClient(service.address, wait=30) as asking:
            ids = ["a", "b", "c", "d", "a", "e", "f"]
            answered = asking.score(ids, rows={"b": ["1"], "z": ["2"]}, columns=["x"])
    finally:
        service.stop()
    assert [r["id"] for r in answered] == [*ids, "z"]
    assert all(len(asked) <= 3 for asked in stand_in.asked)
    assert sorted(k for asked in stand_in.asked for k in asked) == ["a", "b", "c", "d", "e", "f", "z"]  # once each
