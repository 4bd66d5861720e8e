"""The active party's scoring API for its own business applications: gRPC (`Scoring.Score`) and HTTP/JSON.

Both listen on this machine only (a loopback address): the API answers whoever connects, without TLS, so it is
for the applications beside the active party's serving process, never for the network; the parties' own traffic
is the mutual-TLS `Contributions` service. One request, one answer: the `Scorer`'s rows, `lvfl predict`'s columns.
Its calls and paths are named in `lvfl.serving.service`; its client is `lvfl.serving.client`.

HTTP: ``POST /score`` with ``{"ids": [...], "rows": [{"<id column>": ..., "<column>": ...}], "deadline_s": 0.5,
"request_id": "..."}`` (every key optional but one of ids/rows) answers ``{"request_id": ..., "classes": [...],
"answers": [{"id", "prediction", "prob_<label>"..., "path", "reason"}]}``; ``GET /health`` answers the party and
its export. A bad request is answered 400 with ``{"error": "..."}`` naming the field.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc

from lvfl.federation import FederationError
from lvfl.serving import serving_pb2 as pb
from lvfl.serving.scorer import Scored, Scorer, check_deadline
from lvfl.serving.service import HEALTH_PATH, MAX_MESSAGE_BYTES, SCORE, SCORE_PATH, check_loopback

__all__ = ["HttpEndpoint", "ScoringService", "parse_json_request", "reply_of"]

log = logging.getLogger("lvfl.serve")

MAX_HTTP_BYTES = 64 * 2**20  #: the largest HTTP request body


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
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SCORE.service, {SCORE.name: SCORE.handler(self._score)}),)
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
            if request.deadline_s:  # 0: not set (proto3)
                check_deadline(request.deadline_s)
            scored = self.scorer.score(
                list(request.ids),
                rows or None,
                list(request.columns) or None,
                request.deadline_s or None,  # 0: not set (proto3), the server's --deadline
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
    if deadline is not None:
        check_deadline(deadline)
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
                data = json.dumps(body, allow_nan=False).encode() + b"\n"  # a line, as a terminal and a log expect
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                if self.path != HEALTH_PATH:
                    self._send(404, {"error": f"no {self.path}: GET {HEALTH_PATH}, POST {SCORE_PATH}"})
                    return
                party = endpoint.scorer.party
                self._send(200, {"party": party.party, "export": party.identity, "parties": endpoint.scorer.order})

            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                if self.path != SCORE_PATH:
                    self._send(404, {"error": f"no {self.path}: POST {SCORE_PATH}"})
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
