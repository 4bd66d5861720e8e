"""The active party's scoring API for its own business applications: gRPC (`Scoring.Score`) and HTTP/JSON.

Both listen on this machine only (a loopback address): the API answers whoever connects, without TLS, so it is
for the applications beside the active party's serving process, never for the network; the parties' own traffic
is the mutual-TLS `Contributions` service. One request, one answer: the `Scorer`'s rows, `lvfl predict`'s columns.

HTTP: ``POST /score`` with ``{"ids": [...], "rows": [{"<id column>": ..., "<column>": ...}], "deadline_s": 0.5,
"request_id": "..."}`` (every key optional but one of ids/rows) answers ``{"request_id": ..., "classes": [...],
"answers": [{"id", "prediction", "prob_<label>"..., "path", "reason"}]}``; ``GET /health`` answers the party and
its export. A bad request is answered 400 with ``{"error": "..."}`` naming the field.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc

from lvfl.federation import FederationError
from lvfl.federation.federation_file import parse_address
from lvfl.serving import serving_pb2 as pb
from lvfl.serving.contributions import MAX_MESSAGE_BYTES
from lvfl.serving.scorer import Scored, Scorer

__all__ = [
    "SCORE",
    "HttpEndpoint",
    "ScoringClient",
    "ScoringService",
    "check_loopback",
    "reply_of",
    "rows_of",
    "score_remote",
]

log = logging.getLogger("lvfl.serve")

SCORE = "/lvfl.serving.Scoring/Score"
MAX_HTTP_BYTES = 64 * 2**20  #: the largest HTTP request body


def check_loopback(address: str, option: str) -> tuple[str, int]:
    """(host, port) of `address`, refused unless the host is this machine's loopback (named by `option`)."""
    try:
        host, port = parse_address(address)
    except ValueError as err:
        raise ValueError(f"{option} {err}") from None
    loopback = host == "localhost"
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
    if not loopback:
        raise ValueError(
            f"{option} {address}: the scoring API answers anyone who connects, without TLS, so lvfl serves it on "
            "this machine only (127.0.0.1, ::1 or localhost); the parties talk over the federation's mutual TLS"
        )
    return host, port


def reply_of(scored: Scored) -> pb.ScoreReply:
    """A `Scored` as the gRPC reply (probabilities in `classes`' order)."""
    answers = []
    for row in scored.rows:
        prediction = row["prediction"]
        answers.append(
            pb.Answer(
                id=row["id"],
                prediction="" if prediction is None else str(prediction),
                probabilities=[]
                if prediction is None or not scored.classes
                else [row[f"prob_{c}"] for c in scored.classes],
                path=row["path"],
                reason=row["reason"],
            )
        )
    return pb.ScoreReply(request_id=scored.request_id, classes=scored.classes, answers=answers)


def rows_of(reply: pb.ScoreReply, regression: bool | None = None) -> list[dict[str, Any]]:
    """A gRPC reply as `lvfl predict`'s file rows (what `lvfl score --server` writes)."""
    classes = list(reply.classes)
    rows = []
    for answer in reply.answers:
        answered = answer.prediction != ""
        row: dict[str, Any] = {"id": answer.id}
        if classes:
            row["prediction"] = answer.prediction if answered else None
            probabilities = list(answer.probabilities) if answered else [None] * len(classes)
            row |= {f"prob_{c}": p for c, p in zip(classes, probabilities, strict=True)}
        else:
            row["prediction"] = float(answer.prediction) if answered else None
        row |= {"path": answer.path, "reason": answer.reason}
        rows.append(row)
    return rows


class ScoringService:
    """`Scoring.Score` over gRPC on a loopback address, answered by `scorer`."""

    def __init__(self, scorer: Scorer, address: str, workers: int = 8) -> None:
        check_loopback(address, "--api")
        self.scorer, self.address = scorer, address
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lvfl-score"),
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        handler = grpc.unary_unary_rpc_method_handler(
            self._score, pb.ScoreRequest.FromString, pb.ScoreReply.SerializeToString
        )
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("lvfl.serving.Scoring", {"Score": handler}),)
        )
        try:
            self.port = self._server.add_insecure_port(address)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise FederationError(f"--api {address}: cannot listen there (the port is in use?)")

    def start(self) -> ScoringService:
        """Start answering."""
        self._server.start()
        return self

    def stop(self, grace: float = 1.0) -> None:
        """Stop answering (calls under way get `grace` seconds)."""
        self._server.stop(grace).wait(grace + 5)

    def _score(self, request: pb.ScoreRequest, context: grpc.ServicerContext) -> pb.ScoreReply:
        rows = {row.id: list(row.values) for row in request.rows}
        try:
            scored = self.scorer.score(
                list(request.ids),
                rows or None,
                list(request.columns) or None,
                request.deadline_s or None,
                request.request_id or None,
            )
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return reply_of(scored)


def parse_json_request(body: Any, id_column: str) -> tuple[list[str], dict[str, list[str]], list[str], Any, Any]:
    """An HTTP request's JSON as (ids, rows, columns, deadline, request id); a `ValueError` naming the bad field."""
    if not isinstance(body, dict):
        raise ValueError("the request must be a JSON object with 'ids' and/or 'rows'")
    unknown = sorted(set(body) - {"ids", "rows", "deadline_s", "request_id"})
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} (the fields are ids, rows, deadline_s, request_id)")
    ids = body.get("ids", [])
    if not isinstance(ids, list) or not all(isinstance(k, str | int) for k in ids):
        raise ValueError("'ids' must be a list of IDs (strings)")
    raw_rows = body.get("rows", [])
    if not isinstance(raw_rows, list) or not all(isinstance(r, dict) for r in raw_rows):
        raise ValueError("'rows' must be a list of objects, each {id column: ID, column: value, ...}")
    columns = sorted({c for r in raw_rows for c in r} - {id_column})
    rows: dict[str, list[str]] = {}
    for r in raw_rows:
        if id_column not in r:
            raise ValueError(f"a row of 'rows' has no {id_column!r} (the active party's ID column)")
        rows[str(r[id_column])] = ["" if r.get(c) is None else str(r[c]) for c in columns]
    if not ids and not rows:
        raise ValueError("give 'ids' or 'rows'")
    deadline = body.get("deadline_s")
    if deadline is not None and not (isinstance(deadline, int | float) and deadline > 0):
        raise ValueError(f"'deadline_s' must be a positive number of seconds, got {deadline!r}")
    request_id = body.get("request_id")
    if request_id is not None and not isinstance(request_id, str):
        raise ValueError("'request_id' must be a string")
    return [str(k) for k in ids], rows, columns, deadline, request_id


class HttpEndpoint:
    """`POST /score` and `GET /health` on a loopback address (see the module docstring), answered by `scorer`."""

    def __init__(self, scorer: Scorer, address: str) -> None:
        host, port = check_loopback(address, "--http")
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
                pass  # the scorer logs one line per request

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode() + b"\n"  # a line, as a terminal and a log expect
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                if self.path != "/health":
                    self._send(404, {"error": f"no {self.path}: GET /health, POST /score"})
                    return
                party = endpoint.scorer.party
                self._send(200, {"party": party.party, "export": party.identity, "parties": endpoint.scorer.order})

            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                if self.path != "/score":
                    self._send(404, {"error": f"no {self.path}: POST /score"})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_HTTP_BYTES:
                    self._send(413, {"error": f"the request is {length} bytes; at most {MAX_HTTP_BYTES}"})
                    return
                try:
                    body = json.loads(self.rfile.read(length) or b"null")
                    ids, rows, columns, deadline, request_id = parse_json_request(body, endpoint.scorer.party.id_column)
                    scored = endpoint.scorer.score(ids, rows or None, columns or None, deadline, request_id)
                except (ValueError, json.JSONDecodeError) as err:
                    self._send(400, {"error": str(err)})
                    return
                self._send(200, {"request_id": scored.request_id, "classes": scored.classes, "answers": scored.rows})

        self.scorer = scorer
        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    def start(self) -> HttpEndpoint:
        """Start answering, on a thread of its own."""
        self._thread = threading.Thread(target=self._server.serve_forever, name="lvfl-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering and close the socket."""
        self._server.shutdown()
        self._server.server_close()


class ScoringClient:
    """A business application's connection to the active party's `lvfl serve --api`: one channel, many requests.

    Args:
        address: the server's --api (this machine).
        wait: seconds to wait for the server to come up (a script may start it just before).
        waiting: called with one line when the server is not up at once and the client waits for it.
    """

    def __init__(self, address: str, wait: float = 0.0, waiting: Callable[[str], None] | None = None) -> None:
        check_loopback(address, "--server")
        self.address = address
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]  # fmt: skip
        self._channel = grpc.insecure_channel(address, options=options)
        if wait > 0:
            ready = grpc.channel_ready_future(self._channel)
            try:
                ready.result(timeout=min(wait, 1.0))
            except grpc.FutureTimeoutError:
                if waiting is not None and wait > 1.0:  # a server that is starting: say so, and wait on
                    waiting(f"waiting up to {wait:g} s (--wait) for lvfl serve at {address} to answer")
                try:
                    ready.result(timeout=max(wait - 1.0, 0.0))
                except grpc.FutureTimeoutError:
                    self._channel.close()
                    raise FederationError(
                        f"--server {address}: no lvfl serve answered there within {wait:g} s; if it is still "
                        "starting (a loaded machine takes longer), give it more with --wait SECONDS"
                    ) from None
        self._score = self._channel.unary_unary(SCORE, pb.ScoreRequest.SerializeToString, pb.ScoreReply.FromString)

    def score(
        self,
        ids: Sequence[str],
        rows: dict[str, list[str]] | None = None,
        columns: Sequence[str] | None = None,
        deadline: float = 0.0,
        timeout: float = 3600.0,
    ) -> list[dict[str, Any]]:
        """The server's answers for `ids` (and `rows` of new features), as `lvfl predict`'s file rows."""
        request = pb.ScoreRequest(
            ids=list(ids),
            columns=list(columns or []),
            rows=[pb.Row(id=k, values=v) for k, v in (rows or {}).items()],
            deadline_s=deadline,
        )
        try:
            reply = self._score(request, timeout=timeout)
        except grpc.RpcError as err:
            where = f"--server {self.address}"
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                raise FederationError(f"{where}: no lvfl serve answers there ({err.details()})") from None
            raise FederationError(f"{where}: {err.code().name}: {err.details()}") from None
        return rows_of(reply)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> ScoringClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def score_remote(
    address: str,
    ids: Sequence[str],
    rows: dict[str, list[str]] | None = None,
    columns: Sequence[str] | None = None,
    deadline: float = 0.0,
    timeout: float = 3600.0,
    wait: float = 0.0,
    waiting: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One request to the active party's `lvfl serve` at `address` (its --api), on a channel of its own."""
    with ScoringClient(address, wait, waiting) as client:
        return client.score(ids, rows, columns, deadline, timeout)
