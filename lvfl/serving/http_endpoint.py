"""`HttpEndpoint`: the scoring API's HTTP/JSON twin, an ASGI application served by uvicorn, with stated limits.

Why uvicorn and not `http.server` (whose documentation says it is not for production): h11 parses each request, so
a malformed, negative or duplicated ``Content-Length`` is answered 400 before any body is read; one event loop holds
every connection, so an idle one costs a socket, not a thread. On top of it lvfl states and enforces:

- `MAX_HTTP_BYTES` of body, counted as it is read (413 before it is held whole), and `MAX_HEAD_BYTES` of head;
- `HEAD_SECONDS` for a connection to send a whole request head (after it opens, or after its previous answer),
  else it is closed, so that connections which send nothing, or a byte now and then, do not pile up;
- `MAX_CONNECTIONS` connections and requests at once (503 beyond);
- the JSON's nesting (a body nested past Python's recursion limit is answered 400), and the IDs and rows of one
  request (`lvfl.serving.service.MAX_REQUEST_IDS`, the `Scorer`'s to refuse, 400).

A scoring request runs on a worker thread (the `Scorer` waits on the passive parties), so the loop keeps answering
`GET /health` meanwhile. Answers are strict JSON (no NaN: the `Scorer` answers a non-finite output with a reason).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from lvfl.federation import FederationError
from lvfl.serving.answer_checks import check_deadline
from lvfl.serving.scorer import Scorer
from lvfl.serving.service import HEALTH_PATH, SCORE_PATH, check_loopback

__all__ = [
    "HEAD_SECONDS",
    "MAX_CONNECTIONS",
    "MAX_HEAD_BYTES",
    "MAX_HTTP_BYTES",
    "HttpEndpoint",
    "parse_json_request",
]

MAX_HTTP_BYTES = 64 * 2**20  #: the largest request body, in bytes
MAX_HEAD_BYTES = 64 * 2**10  #: the largest request head (request line and headers), in bytes
HEAD_SECONDS = 5.0  #: seconds a connection has to send a whole request head
MAX_CONNECTIONS = 64  #: connections and requests at once; more are answered 503


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


class _HeadTimed(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, with `HEAD_SECONDS` for each request head (after opening, after each answer).

    uvicorn's own keep-alive timer starts only after an answer and restarts on any byte, so a connection that never
    sends a whole head would otherwise stay open.
    """

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def _await_head(self) -> None:
        self._head_of = self.cycle  # the cycle before the head awaited: a new one means it came
        self._head_timer = self.loop.call_later(HEAD_SECONDS, self._head_overdue)

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.cycle is self._head_of and not self.transport.is_closing():
            self.transport.close()

    def _cancel_head_timer(self) -> None:
        if getattr(self, "_head_timer", None) is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not self._head_of:
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._cancel_head_timer()
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)


class _Refused(Exception):
    """A request answered with an error status and one line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpEndpoint:
    """`POST /score` and `GET /health` on a loopback address (see the module docstring), answered by `scorer`."""

    def __init__(self, scorer: Scorer, address: str) -> None:
        host, port = check_loopback(address, "--http")
        self.scorer = scorer
        config = uvicorn.Config(
            self.app,
            host=host,
            port=port,
            http=_HeadTimed,
            interface="asgi3",
            lifespan="off",
            log_config=None,  # lvfl's logging stays as it is
            access_log=False,  # the scorer logs one line per request
            limit_concurrency=MAX_CONNECTIONS,
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            timeout_keep_alive=int(HEAD_SECONDS),
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self.address, self.port = address, port

    def start(self) -> HttpEndpoint:
        """Start answering, on a thread of its own; returns once the socket listens."""
        self._thread = threading.Thread(target=self._run, name="lvfl-http", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise FederationError(f"--http {self.address}: cannot listen there (the port is in use?)")
            self._thread.join(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def _run(self) -> None:
        with contextlib.suppress(SystemExit):  # uvicorn's way to say it could not start: `start` says so
            self._server.run()

    def stop(self) -> None:
        """Stop answering and close the socket."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)

    # -- the ASGI application ------------------------------------------------------------------------------------
    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """One request: route it, answer it with JSON."""
        method, path = scope["method"], scope["path"]
        try:
            status = 200
            if path == HEALTH_PATH and method == "GET":
                party, readiness = self.scorer.party, getattr(self.scorer, "readiness", None)
                missing = readiness.missing() if readiness is not None else {}
                body = {"ready": not missing, "missing": missing, "party": party.party, "export": party.identity,
                        "parties": self.scorer.order}  # fmt: skip
                status = 200 if not missing else 503  # degraded: the student answers for the missing parties
            elif path == SCORE_PATH and method == "POST":
                body = await self._score(scope, receive)
            elif path in (HEALTH_PATH, SCORE_PATH):
                raise _Refused(405, f"{method} {path}: GET {HEALTH_PATH}, POST {SCORE_PATH}")
            else:
                raise _Refused(404, f"no {path}: GET {HEALTH_PATH}, POST {SCORE_PATH}")
        except _Refused as refused:
            status, body = refused.status, {"error": str(refused)}
        data = json.dumps(body, allow_nan=False).encode() + b"\n"  # a line, as a terminal and a log expect
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    async def _score(self, scope: dict[str, Any], receive: Any) -> dict[str, Any]:
        raw = await _read_body(scope, receive)
        try:
            request = json.loads(raw or b"null")
        except RecursionError:
            raise _Refused(400, "the request's JSON nests too deeply") from None
        except (ValueError, UnicodeDecodeError) as err:
            raise _Refused(400, f"the request is not JSON: {err}") from None
        try:
            ids, rows, columns, deadline, request_id = parse_json_request(request, self.scorer.party.id_column)
            score = self.scorer.score
            scored = await asyncio.to_thread(score, ids, rows or None, columns or None, deadline, request_id)
        except ValueError as err:
            raise _Refused(400, str(err)) from None
        return {"request_id": scored.request_id, "classes": scored.classes, "answers": scored.rows}


async def _read_body(scope: dict[str, Any], receive: Any) -> bytes:
    """The request body, refused (413) as soon as it passes `MAX_HTTP_BYTES`, whatever its Content-Length said."""
    declared = dict(scope["headers"]).get(b"content-length")
    if declared is not None and int(declared) > MAX_HTTP_BYTES:  # h11 let only a non-negative integer through
        raise _Refused(413, f"the request is {int(declared)} bytes; at most {MAX_HTTP_BYTES}")
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Refused(400, "the client left before its request was read")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_HTTP_BYTES:
            raise _Refused(413, f"the request is over {MAX_HTTP_BYTES} bytes")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)
