"""`Scorer`: the active party's side of serving: a prediction for every requested ID, from the passive parties' answers.

For one request (IDs, and optionally rows of new features for the active party's own columns):

1. the active party's own features of each ID: the request's row for it, else its table's (`FeatureSource`); an ID
   in neither is answered with a reason (`UNKNOWN_ID`, as `lvfl predict` writes it);
2. every passive party is asked at once (over mutual TLS, pinned certificates), which of the IDs it holds, by their
   blinded points (`Members`; `lvfl.serving.membership`: it does not see the IDs it does not hold), then for its
   contributions to the IDs every passive party holds, in the clear (`Contribute`); both rounds within the
   request's deadline;
3. an ID every passive party holds is answered by the VFL model: `completion.pt` on the active party's features and
   the contributions, in the export's `contribution_order`, decoded as party.json's `serving.output` says (path
   `vfl`); any other ID by `student.pt` when the export has one (path `student`), else with a reason.

In oblivious mode (`oblivious=True`) step 2's second round is an oblivious lookup per requested ID and passive
party instead (`lvfl.serving.oblivious`): the row at the position the membership round found, or a random one where
the party does not hold the ID; no ID is sent in the clear. The lookups' key sets are prepared ahead, on a thread of
their own (`prepare_ahead` per passive party), and inline, within the deadline, when a request needs more.

A passive party that is down, misses the deadline, or serves another export does not hold a request up: its IDs are
answered by the student (or get a reason), and the `reason` column names the party and what happened. Nothing is
remembered of a failure: the next request asks that party again, so it is used as soon as it is back (gRPC
reconnects within a second of a restart). Every answer has `lvfl predict`'s columns (`lvfl.prediction_rows`).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from lvfl.federation import FederationError
from lvfl.federation.channels import pinned_channel, pinned_fingerprints
from lvfl.federation.expectations import printable
from lvfl.federation.federation_file import Federation
from lvfl.federation.pki import check_key
from lvfl.prediction_rows import BY_THE_STUDENT, NO_STUDENT, NO_STUDENT_IN_PLACE, UNKNOWN_ID, prediction_row
from lvfl.serving import serving_pb2 as pb
from lvfl.serving.answer_checks import check_deadline, failure, finite, not_finite
from lvfl.serving.export_folder import ExportedParty
from lvfl.serving.feature_source import FeatureSource
from lvfl.serving.membership import Memberships
from lvfl.serving.oblivious import (
    MAX_BATCH,
    KeySet,
    KeySetPool,
    open_answer,
    query,
    serving_layout,
    split_answers,
)
from lvfl.serving.readiness import Readiness
from lvfl.serving.service import (
    CONTRIBUTE,
    CONTRIBUTION_DTYPE,
    GREET,
    LOOKUP,
    MAX_LOOKUPS,
    MAX_MESSAGE_BYTES,
    MAX_REQUEST_IDS,
    MEMBERS,
    OFFER,
    PREPARE,
    TABLE,
    Method,
    contributions_of,
    mode_name,
)

__all__ = ["DEFAULT_DEADLINE", "ExportMismatch", "Scored", "Scorer", "check_deadline"]

log = logging.getLogger("lvfl.serve")

DEFAULT_DEADLINE = 1.0  #: seconds a request may wait for the passive parties
PREPARE_AHEAD = 1024  #: oblivious mode: key sets a server keeps ready per passive party
TABLE_SECONDS = 120.0  #: the most a passive party's changed table may take to fetch, beyond any request's deadline


class ExportMismatch(FederationError):
    """A passive party serves another export, or in another mode, than the active party (named in the message)."""


@dataclass
class Scored:
    """A request's answers: one row per requested ID, in the order asked, with `lvfl predict`'s columns."""

    request_id: str
    rows: list[dict[str, Any]]
    classes: list[str]  # the probabilities' label names; empty for a regression
    paths: dict[str, int] = field(default_factory=dict)  # rows per path ("" for unanswered)
    failures: dict[str, str] = field(default_factory=dict)  # per passive party that did not answer: why
    seconds: float = 0.0


class Scorer:
    """The active party's scoring (see the module docstring).

    Args:
        federation: the federation (the passive parties' addresses and pinned certificates).
        party: the active party's export.
        source: the active party's table.
        key_path: its private key (it presents its certificate to the passive parties).
        deadline: the default seconds a request waits for the passive parties.
        rows_per_call: the most rows one TorchScript call takes (the export's own limit wins when smaller).
        metrics: a `lvfl.serving.metrics.ServingMetrics` to count requests, rows, latency and failures in.
        blind_ahead: blind every ID of the active party's table at start, on a thread of its own, so a request
            finds its IDs blinded (a server); False: each ID when first requested (one batch).
        oblivious: fetch the passive parties' contributions by oblivious lookups (they must serve so too).
        prepare_ahead: oblivious mode: key sets kept ready per passive party, prepared on a thread of their own;
            0: prepared within each request only.
    """

    def __init__(
        self,
        federation: Federation,
        party: ExportedParty,
        source: FeatureSource,
        key_path: str | Path,
        deadline: float = DEFAULT_DEADLINE,
        rows_per_call: int = 4096,
        metrics: Any = None,
        blind_ahead: bool = True,
        oblivious: bool = False,
        prepare_ahead: int = PREPARE_AHEAD,
    ) -> None:
        if party.role != "active":
            raise ValueError(f"{party.party} is a passive party: lvfl serve answers the active party's requests there")
        if not deadline > 0:
            raise ValueError(f"--deadline must be a positive number of seconds, got {deadline}")
        self.federation, self.party, self.source, self.deadline = federation, party, source, float(deadline)
        self.metrics = metrics
        self.me = federation.party(party.party).name
        self.order: list[str] = list(party.serving["contribution_order"])
        for peer in self.order:
            federation.party(peer)  # one line naming the party the federation file lacks
        pinned_fingerprints(federation)
        certificate = federation.party(self.me).certificate
        key_pem = check_key(key_path, certificate)
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]  # fmt: skip
        self._channels = {
            peer: pinned_channel(federation, peer, key_pem, certificate.read_bytes(), options) for peer in self.order
        }
        self._greet = self._stubs(GREET)
        self._contribute = self._stubs(CONTRIBUTE)
        self._members_call = self._stubs(MEMBERS)
        self._table_call = self._stubs(TABLE)
        self._offer_call = self._stubs(OFFER)
        self._prepare_call = self._stubs(PREPARE)
        self._lookup_call = self._stubs(LOOKUP)
        if prepare_ahead < 0:
            raise ValueError(f"prepare_ahead must be >= 0 key sets, got {prepare_ahead}")
        self.oblivious, self.prepare_ahead = bool(oblivious), int(prepare_ahead)
        self.pools: dict[str, KeySetPool] = {}  # oblivious mode: per passive party, from its greeting
        self._wanted = threading.Event()  # the key sets ran low: the preparing thread tops them up
        self._closing = threading.Event()
        self._refreshing: dict[str, threading.Thread] = {}  # per passive party, the reading of its changed table
        self._refresh_failures: dict[str, str] = {}  # per passive party, why its last reading failed
        self._refresh_lock = threading.Lock()
        self.readiness: Readiness | None = None  # set by `watch`
        self._preparing: threading.Thread | None = None
        self.memberships = Memberships()
        if blind_ahead:  # its own table's IDs blinded once, on a thread of their own (a request blinds what is not yet)
            threading.Thread(target=self.memberships.blind, args=(source.ids,), daemon=True, name="lvfl-blind").start()
        self.shapes = {k: tuple(party.serving["contributions"][k]["output_shape"]) for k in self.order}
        output = party.serving["output"]
        self.regression = output["kind"] == "regression"
        self.classes: list[str] = [] if self.regression else list(output["label_names"])
        self._output = output
        limit = party.serving.get("max_rows_per_call")
        self.rows_per_call = min(rows_per_call, limit) if limit else rows_per_call
        party.warm_up()

    def _stubs(self, method: Method) -> dict[str, Any]:
        """One callable per passive party for `method` of the Contributions service, on its pinned channel."""
        return {peer: method.stub(channel) for peer, channel in self._channels.items()}

    def close(self) -> None:
        """Stop watching and preparing key sets; close the channels to the passive parties."""
        if self.readiness is not None:
            self.readiness.close()
        self._closing.set()
        self._wanted.set()
        if self._preparing is not None:
            self._preparing.join(30)
        for channel in self._channels.values():
            channel.close()

    # -- the greeting ----------------------------------------------------------------------------------------------
    def watch(self, greeted: dict[str, str]) -> Readiness:
        """Watch the passive parties from now on (`readiness`, for health checks), after the start-up `greet`."""

        def again(peer: str) -> str:
            try:
                return self.greet(timeout=5.0, peers=[peer])[peer]
            except ExportMismatch as err:
                return str(err)

        self.readiness = Readiness(self._channels, again, greeted)
        return self.readiness

    def greet(self, timeout: float = 5.0, peers: Sequence[str] | None = None) -> dict[str, str]:
        """Greet every passive party (or `peers`): {party: "" if it serves this export, else why not}.

        Each greeting waits up to `timeout` seconds for its party to come up (a party started at the same time).

        Raises:
            ExportMismatch: a passive party serves another export (named, with both exports).
        """
        mine = pb.Greeting(party=self.me, export=json.dumps(self.party.identity), mode=mode_name(self.oblivious))
        calls = {peer: self._greet[peer].future(mine, timeout=timeout, wait_for_ready=True)
                 for peer in (self.order if peers is None else peers)}  # fmt: skip
        status = {}
        for peer, call in calls.items():
            try:
                reply = call.result()
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    raise ExportMismatch(printable(err.details() or "")) from None
                status[peer] = failure(peer, err, timeout)
                continue
            try:
                theirs = json.loads(reply.export)
            except json.JSONDecodeError:
                theirs = {}
            if reply.party != peer or not isinstance(theirs, dict) or theirs.get("id") != self.party.export_id:
                raise ExportMismatch(
                    f"{peer} serves {self.party.describe(theirs if isinstance(theirs, dict) else {})}, {self.me} "
                    f"serves {self.party.describe()}: export the same run for every party and serve those folders"
                )
            if (reply.mode or "plain") != mine.mode:
                raise ExportMismatch(f"{peer} serves in {printable(reply.mode[:16])} mode, {self.me} asks in "
                                     f"{mine.mode} mode: start every party with --oblivious, or none")  # fmt: skip
            status[peer] = ""
            try:
                if self.oblivious:
                    serving_layout(0, reply.bucket_size, self.shapes[peer])  # N: a power of two, not too large
                    if peer not in self.pools or self.pools[peer].bucket_size != reply.bucket_size:
                        self.pools[peer] = KeySetPool(reply.bucket_size)
                self._learn_table(peer, timeout)
            except (grpc.RpcError, ValueError) as err:
                status[peer] = failure(peer, err, timeout) if isinstance(err, grpc.RpcError) else f"{peer}: {err}"
        if self.oblivious and self.prepare_ahead and self._preparing is None:
            self._preparing = threading.Thread(target=self._prepare_ahead, daemon=True, name="lvfl-key-sets")
            self._preparing.start()
        self._wanted.set()
        return status

    # -- oblivious mode's key sets -------------------------------------------------------------------------------
    def _prepare(self, peer: str, count: int, timeout: float) -> None:
        """Prepare `count` key sets with `peer` (two calls: its offer, then the OTs)."""
        offer = self._offer_call[peer](pb.PrepareRequest(export_id=self.party.export_id, count=count), timeout=timeout)
        self._same_export(peer, offer.export_id)
        pending, points = self.pools[peer].choose(offer.batch, offer.point, count)
        request = pb.PrepareRequest(export_id=self.party.export_id, batch=offer.batch, points=points)
        reply = self._prepare_call[peer](request, timeout=timeout)
        self._same_export(peer, reply.export_id)
        self.pools[peer].finish(pending, reply.first, reply.ciphertexts)

    def _prepare_ahead(self) -> None:
        """Keep `prepare_ahead` key sets ready per passive party, topped up whenever a request took some."""
        while not self._closing.is_set():
            self._wanted.wait(5.0)
            self._wanted.clear()
            for peer, pool in list(self.pools.items()):
                while not self._closing.is_set() and pool.available < self.prepare_ahead:
                    try:
                        self._prepare(peer, min(MAX_BATCH, 256, self.prepare_ahead - pool.available), 10.0)
                    except Exception as err:  # noqa: BLE001 - a party down: a request will say so; try again later
                        log.debug("%s: preparing key sets with %s failed: %s", self.me, peer, err)
                        break

    def _key_sets(self, peer: str, count: int, left: Any) -> list[KeySet]:
        """`count` ready key sets for `peer`, prepared now (within the deadline) where too few are ready."""
        pool = self.pools[peer]
        while (taken := pool.take(count)) is None:
            self._prepare(peer, min(MAX_BATCH, max(count - pool.available, 64)), left())
        return taken

    def _learn_table(self, peer: str, timeout: float) -> None:
        """Fetch `peer`'s blinded table and keep it re-blinded (`Memberships.learn_table`)."""
        reply = self._table_call[peer](pb.TableRequest(export_id=self.party.export_id), timeout=timeout)
        self._same_export(peer, reply.export_id)
        self.memberships.learn_table(peer, reply.table, reply.points)

    def _refresh_table(self, peer: str, version: str, wait: float) -> str:
        """Read `peer`'s changed table on a thread of its own, waiting at most `wait` seconds; "" once it is held.

        Else why not (this request's reason); the reading goes on. Reading a table grows with its size, so no
        request waits past its deadline: a party that sends a new version with every answer costs each request its
        deadline, not more, and one reading per party runs at a time.
        """
        with self._refresh_lock:
            reading = self._refreshing.get(peer)
            if reading is None or not reading.is_alive():
                self._refresh_failures.pop(peer, None)
                reading = threading.Thread(target=self._read_table, args=(peer,), daemon=True, name=f"lvfl-{peer}")
                self._refreshing[peer] = reading
                reading.start()
        reading.join(wait)
        if reading.is_alive():
            return f"{peer}'s table changed, and reading it again did not end within the deadline ({wait:g} s left)"
        if peer in self._refresh_failures:
            return self._refresh_failures[peer]
        if self.memberships.version(peer) != version:
            return f"{peer}'s table changed again while it was read"
        return ""

    def _read_table(self, peer: str) -> None:
        """`_learn_table` for `_refresh_table`'s thread: a failure is kept as words, for the request's reason."""
        try:
            self._learn_table(peer, TABLE_SECONDS)
        except grpc.RpcError as err:
            self._refresh_failures[peer] = failure(peer, err, TABLE_SECONDS)
        except ValueError as err:
            self._refresh_failures[peer] = f"{peer} sent a malformed table ({err})"

    def _same_export(self, peer: str, export_id: str) -> None:
        """Refuse a reply for another export (a `ValueError` naming both)."""
        if export_id != self.party.export_id:
            raise ValueError(f"{peer} answered for export {printable(export_id[:32])}, not {self.party.export_id}")

    # -- a request -------------------------------------------------------------------------------------------------
    def score(
        self,
        ids: Sequence[str],
        rows: Mapping[str, Sequence[str]] | None = None,
        columns: Sequence[str] | None = None,
        deadline: float | None = None,
        request_id: str | None = None,
    ) -> Scored:
        """The answers for `ids` and the IDs of `rows` (see the module docstring).

        Args:
            ids: the IDs to answer from the active party's table.
            rows: {ID: its raw values of `columns`}: new features of the active party's own columns, answered for
                those IDs in place of its table's (after `ids`, in their order).
            columns: the names of `rows`' values; default the export's columns in order. Every column the export
                reads must be among them (others are ignored).
            deadline: seconds to wait for the passive parties; default the scorer's.
            request_id: the request's name in every party's log; default a fresh one.

        Raises:
            ValueError: `columns` lacks a column the active party's model reads, a row has another count of values
                (named), the deadline is not a finite positive number of seconds, or the request holds more than
                `MAX_REQUEST_IDS` IDs and rows.
        """
        start = time.perf_counter()
        if len(ids) + len(rows or {}) > MAX_REQUEST_IDS:
            raise ValueError(f"a request holds at most {MAX_REQUEST_IDS:,} IDs and rows; this one holds "
                             f"{len(ids) + len(rows or {}):,}: split it")  # fmt: skip
        deadline = self.deadline if deadline is None else check_deadline(deadline)
        request_id = request_id or uuid.uuid4().hex[:12]
        given = set(ids)
        order = [*ids, *(k for k in (rows or {}) if k not in given)]
        unique = list(dict.fromkeys(order))
        own, reasons = self._own_features(unique, rows or {}, columns)
        known = [k for k in unique if k in own]
        answers: dict[str, tuple[torch.Tensor | None, str, str]] = {k: (None, "", reasons[k]) for k in reasons}
        failures: dict[str, str] = {}
        held_by_all = np.ones(len(known), dtype=bool)
        contributions: dict[str, torch.Tensor] = {}
        if known and self.order:
            held_by_all, contributions, failures = self._ask(known, request_id, deadline)
        features = torch.stack([own[k] for k in known]) if known else None
        vfl = np.flatnonzero(held_by_all)
        if len(vfl):
            logits = self._run(self.party.completion, [features[vfl], *(contributions[k] for k in self.order)])
            answers |= {known[i]: finite(out, "vfl", "") for i, out in zip(vfl, self._decode(logits), strict=True)}
        rest = np.flatnonzero(~held_by_all)
        if len(rest):
            why = "; ".join(failures.values())
            if self.party.student is not None:
                logits = self._run(self.party.student, [features[rest]])
                reason = why + BY_THE_STUDENT if why else ""
                answers |= {
                    known[i]: finite(out, "student", reason) for i, out in zip(rest, self._decode(logits), strict=True)
                }
            else:
                reason = why + NO_STUDENT_IN_PLACE if why else NO_STUDENT
                answers |= {known[i]: (None, "", reason) for i in rest}
        table = [prediction_row(k, *answers[k], self.classes) for k in order]
        paths: dict[str, int] = {}
        for row in table:
            paths[row["path"]] = paths.get(row["path"], 0) + 1
        seconds = time.perf_counter() - start
        log.info(
            "%s: request %s: %d rows, %s, %.1f ms%s",
            self.me,
            printable(request_id),
            len(order),
            ", ".join(f"{n} {p or 'unanswered'}" for p, n in sorted(paths.items())),
            seconds * 1e3,
            "".join(f"; {why}" for why in failures.values()),
        )
        if self.metrics is not None:
            self.metrics.request(seconds, paths)
            for peer, why in failures.items():
                self.metrics.failure(peer, why)
        return Scored(request_id, table, self.classes, paths, failures, seconds)

    def _own_features(
        self, keys: Sequence[str], rows: Mapping[str, Sequence[str]], columns: Sequence[str] | None
    ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """The active party's encoded features per ID it can answer, and a reason for every other."""
        own: dict[str, torch.Tensor] = {}
        reasons: dict[str, str] = {}
        from_table = [k for k in keys if k not in rows]
        found = self.source.lookup(from_table)
        for k, x in zip([k for k, held in zip(from_table, found.held, strict=True) if held], found.features,
                        strict=True):  # fmt: skip
            own[k] = x
        reasons |= {k: UNKNOWN_ID for k, held in zip(from_table, found.held, strict=True) if not held}
        if rows:
            names = list(columns) if columns is not None else self.party.columns
            missing = [c for c in self.party.columns if c not in names]
            if missing:
                raise ValueError(f"the rows of new features lack the column {missing[0]!r} (the active party's model "
                                 f"reads {self.party.columns})")  # fmt: skip
            at = [names.index(c) for c in self.party.columns]
            for key in keys:
                if key not in rows:
                    continue
                values = rows[key]
                if len(values) != len(names):
                    raise ValueError(f"the row of ID {key!r} has {len(values)} values for {len(names)} columns")
                try:
                    own[key] = self.party.encode([[str(values[j]).strip() for j in at]], [f"the row of ID {key!r}"])[0]
                except ValueError as err:
                    reasons[key] = f"its features cannot be encoded: {err}"
        return own, reasons

    def _ask(
        self, keys: list[str], request_id: str, deadline: float
    ) -> tuple[np.ndarray, dict[str, torch.Tensor], dict[str, str]]:
        """Ask every passive party at once: which IDs all of them hold, their contributions for those, and failures."""
        points = self.memberships.blind(keys)  # this party's own work: not counted against the deadline
        end = time.monotonic() + deadline

        def left() -> float:
            return max(end - time.monotonic(), 1e-3)

        # 1. which IDs each holds, by their blinded points
        request = pb.MembershipRequest(request_id=request_id, export_id=self.party.export_id, points=points)
        calls = {peer: self._members_call[peer].future(request, timeout=left()) for peer in self.order}
        held_by_all = np.ones(len(keys), dtype=bool)
        failures: dict[str, str] = {}
        positions: dict[str, list[int | None]] = {}
        for peer, call in calls.items():
            try:
                reply = call.result()
                self._same_export(peer, reply.export_id)
                if reply.table != self.memberships.version(peer):  # its table changed, or was never fetched
                    why = self._refresh_table(peer, reply.table, left())
                    if why:
                        failures[peer] = why
                        continue
                positions[peer] = self.memberships.positions(peer, reply.points, len(keys))
                held_by_all &= np.asarray([p is not None for p in positions[peer]], dtype=bool)
            except grpc.RpcError as err:
                failures[peer] = failure(peer, err, deadline)
            except ValueError as err:
                failures[peer] = f"{peer} sent a malformed reply ({err})"
        if failures:
            return np.zeros(len(keys), dtype=bool), {}, failures
        if self.oblivious:
            return self._look_up(positions, held_by_all, request_id, left, deadline)
        # 2. the contributions to the IDs every passive party holds, those IDs in the clear
        chosen = [keys[i] for i in np.flatnonzero(held_by_all)]
        request = pb.ContributionRequest(request_id=request_id, export_id=self.party.export_id, ids=chosen)
        calls = {peer: self._contribute[peer].future(request, timeout=left()) for peer in self.order}
        answered = np.ones(len(chosen), dtype=bool)
        received: dict[str, tuple[np.ndarray, torch.Tensor]] = {}
        for peer, call in calls.items():
            try:
                reply = call.result()
            except grpc.RpcError as err:
                failures[peer] = failure(peer, err, deadline)
                continue
            problem = self._check_reply(peer, reply, len(chosen))
            if problem:
                failures[peer] = problem
                continue
            held = np.frombuffer(reply.held, dtype=np.uint8).astype(bool)
            values = contributions_of(reply.values, reply.shape)
            if not bool(torch.isfinite(values).all()):
                failures[peer] = not_finite(peer)
                continue
            received[peer] = (held, values)
            answered &= held  # a row its table lost since the first round (read again in between)
        if failures:
            return np.zeros(len(keys), dtype=bool), {}, failures
        contributions = {}
        for peer, (held, values) in received.items():
            position = np.cumsum(held) - 1  # each held ID's row among the peer's values
            contributions[peer] = values[torch.from_numpy(position[answered])]
        result = np.zeros(len(keys), dtype=bool)
        result[np.flatnonzero(held_by_all)[answered]] = True
        return result, contributions, failures

    def _look_up(
        self,
        positions: dict[str, list[int | None]],
        held_by_all: np.ndarray,
        request_id: str,
        left: Any,
        deadline: float,
    ) -> tuple[np.ndarray, dict[str, torch.Tensor], dict[str, str]]:
        """Oblivious mode's second round: one lookup per ID and passive party (a dummy where it lacks the ID)."""
        failures: dict[str, str] = {}
        sent: dict[str, tuple[Any, list, list]] = {}  # peer -> (layout, pending queries, calls)
        for peer in self.order:
            layout = serving_layout(self.memberships.size(peer), self.pools[peer].bucket_size, self.shapes[peer])
            per_call = max(1, min(MAX_LOOKUPS, MAX_MESSAGE_BYTES // 2 // layout.answer_bytes))
            pending, calls = [], []
            try:
                for at in range(0, len(positions[peer]), per_call):  # key sets taken call by call: a large request
                    chunk = positions[peer][at : at + per_call]  # holds no more of them at the passive party
                    taken = self._key_sets(peer, len(chunk), left)
                    made = [query(layout, key_set, p) for key_set, p in zip(taken, chunk, strict=True)]
                    request = pb.LookupRequest(
                        request_id=request_id,
                        export_id=self.party.export_id,
                        table=self.memberships.version(peer),
                        queries=b"".join(m for m, _ in made),
                    )
                    calls.append(self._lookup_call[peer].future(request, timeout=left()))
                    pending += [p for _, p in made]
            except grpc.RpcError as err:
                failures[peer] = failure(peer, err, deadline)
                continue
            except Exception as err:  # noqa: BLE001 - a malformed preparation: this request's reason
                failures[peer] = f"{peer} could not prepare oblivious lookups ({err})"
                continue
            sent[peer] = (layout, pending, calls, per_call)
        values: dict[str, list[torch.Tensor | None]] = {}
        for peer, (layout, pending, calls, per_call) in sent.items():
            try:
                answers = []
                for at, call in zip(range(0, len(pending), per_call), calls, strict=True):
                    reply = call.result()
                    self._same_export(peer, reply.export_id)
                    answers += split_answers(layout, reply.answers, len(pending[at : at + per_call]))
                values[peer] = [open_answer(layout, p, a) for p, a in zip(pending, answers, strict=True)]
                if not all(v is None or bool(torch.isfinite(v).all()) for v in values[peer]):
                    failures[peer] = not_finite(peer)
            except grpc.RpcError as err:
                failures[peer] = failure(peer, err, deadline)
            except Exception as err:  # noqa: BLE001 - an answer that does not open: this request's reason
                failures[peer] = f"{peer} sent answers that do not open ({type(err).__name__}: {err})"
            if peer in failures:
                self.pools[peer].clear()  # its key sets may be lost with it (a restart): prepare afresh
        self._wanted.set()
        if failures:
            return np.zeros(len(held_by_all), dtype=bool), {}, failures
        answered = held_by_all & np.asarray([all(values[k][i] is not None for k in self.order)
                                             for i in range(len(held_by_all))], dtype=bool)  # fmt: skip
        chosen = np.flatnonzero(answered)
        contributions = {k: torch.stack([values[k][i] for i in chosen]) if len(chosen) else
                         torch.zeros(0, *self.shapes[k]) for k in self.order}  # fmt: skip
        return answered, contributions, failures

    def _check_reply(self, peer: str, reply: pb.ContributionReply, count: int) -> str:
        """Why a passive party's reply cannot be used ("" if it can): another export, or counts that disagree."""
        if reply.export_id != self.party.export_id:
            return f"{peer} answered for export {printable(reply.export_id[:32])}, not {self.party.export_id}"
        held = sum(reply.held)
        shape = tuple(reply.shape)
        if len(reply.held) != count or set(reply.held) - {0, 1} or shape != (held, *self.shapes[peer]):
            return f"{peer} sent a malformed reply (shape {shape} for {held} of {count} IDs held)"
        if len(reply.values) != CONTRIBUTION_DTYPE.itemsize * math.prod(shape):
            return f"{peer} sent a malformed reply ({len(reply.values)} bytes for shape {shape})"
        return ""

    def _run(self, model: torch.jit.ScriptModule, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat(
                [
                    model(*(x[start : start + self.rows_per_call] for x in inputs))
                    for start in range(0, len(inputs[0]), self.rows_per_call)
                ]
            )

    def _decode(self, logits: torch.Tensor) -> list[torch.Tensor]:
        """Per row what `lvfl predict` writes: the class probabilities, or the value in the target's units."""
        if self.regression:
            values = logits.reshape(-1) * self._output["target_scale"] + self._output["target_mean"]
            return list(values)
        return list(logits.softmax(-1))
