"""The client of the active party's scoring API: a business application's `ScoringClient`, `lvfl score --server`.

It asks `lvfl serve --api` (`lvfl.serving.api.ScoringService`) on this machine, by the call `lvfl.serving.service`
names, and hands each answer back as `lvfl predict`'s file rows (`lvfl.prediction_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from lvfl.federation import FederationError
from lvfl.serving import serving_pb2 as pb
from lvfl.serving.service import MAX_MESSAGE_BYTES, MAX_REQUEST_IDS, SCORE, check_loopback

__all__ = ["ScoringClient", "rows_of", "score_remote"]


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
        self._score = SCORE.stub(self._channel)

    def score(
        self,
        ids: Sequence[str],
        rows: dict[str, list[str]] | None = None,
        columns: Sequence[str] | None = None,
        deadline: float = 0.0,
        timeout: float = 3600.0,
    ) -> list[dict[str, Any]]:
        """The server's answers for `ids` (and `rows` of new features), as `lvfl predict`'s file rows.

        A batch of more than `MAX_REQUEST_IDS` IDs and rows goes in several requests, answered in one list in the
        order one request would have: `ids`, then the IDs of `rows` not among them.
        """
        rows = rows or {}
        if len(ids) + len(rows) <= MAX_REQUEST_IDS:
            return self._request(ids, rows, columns, deadline, timeout)
        given = set(ids)
        order = [*ids, *(k for k in rows if k not in given)]
        plain, new = [k for k in dict.fromkeys(ids) if k not in rows], list(rows.items())
        answers: dict[str, dict[str, Any]] = {}
        for at in range(0, len(plain), MAX_REQUEST_IDS):
            answers |= {r["id"]: r for r in self._request(plain[at : at + MAX_REQUEST_IDS], {}, columns, deadline,
                                                         timeout)}  # fmt: skip
        for at in range(0, len(new), MAX_REQUEST_IDS):
            answers |= {r["id"]: r for r in self._request([], dict(new[at : at + MAX_REQUEST_IDS]), columns,
                                                         deadline, timeout)}  # fmt: skip
        return [answers[k] for k in order]

    def _request(
        self,
        ids: Sequence[str],
        rows: dict[str, list[str]],
        columns: Sequence[str] | None,
        deadline: float,
        timeout: float,
    ) -> list[dict[str, Any]]:
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
