"""The active party's scoring API for its own business applications: gRPC (`Scoring.Score`) and HTTP/JSON.

Both listen on this machine only (a loopback address): the API answers whoever connects, without TLS, so it is
for the applications beside the active party's serving process, never for the network; the parties' own traffic
is the mutual-TLS `Contributions` service. One request, one answer: the `Scorer`'s rows, `lvfl predict`'s columns.
Its calls and paths are named in `lvfl.serving.service`; its client is `lvfl.serving.client`. This module is the
gRPC service; the HTTP/JSON one is `lvfl.serving.http_endpoint`:

HTTP: ``POST /score`` with ``{"ids": [...], "rows": [{"<id column>": ..., "<column>": ...}], "deadline_s": 0.5,
"request_id": "..."}`` (every key optional but one of ids/rows) answers ``{"request_id": ..., "classes": [...],
"answers": [{"id", "prediction", "prob_<label>"..., "path", "reason"}]}``; ``GET /health`` answers the party and
its export. A bad request is answered 400 with ``{"error": "..."}`` naming the field.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import HealthServicer

from lvfl.federation import FederationError
from lvfl.serving import serving_pb2 as pb
from lvfl.serving.answer_checks import check_deadline
from lvfl.serving.scorer import Scored, Scorer
from lvfl.serving.service import MAX_MESSAGE_BYTES, SCORE, check_loopback

__all__ = ["ScoringService", "reply_of"]

log = logging.getLogger("lvfl.serve")


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
        # grpc.health.v1: SERVING once every passive party is connected and greeted (`Scorer.readiness`)
        self.health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        readiness = getattr(scorer, "readiness", None)
        if readiness is not None:
            readiness.listen(self._set_health)
        else:
            self._set_health(True)
        try:
            self.port = self._server.add_insecure_port(address)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise FederationError(f"--api {address}: cannot listen there (the port is in use?)")

    def _set_health(self, ready: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", SCORE.service):  # the server as a whole, and the scoring service
            self.health.set(service, status)

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
