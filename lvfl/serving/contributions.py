"""`ContributionServer`: a passive party's serving process, answering the active party's contribution requests.

It listens at the party's address in the federation file with its own certificate (mutual TLS; the caller must
present the certificate pinned for the active party its export sends to: any other party, or a certificate the CA
signed that no party is pinned to, is refused). It holds its own export folder and table and nothing of another
party's. Two calls:

- `Greet`: the active party's export identity against its own; a different export (another run, another epoch or
  step) is refused naming both, so the two never combine outputs of different models;
- `Table` and `Members`: its table's IDs blinded under a key drawn for each version of the table, and its
  re-blinding of a request's blinded IDs, by which the active party finds which of them it holds
  (`lvfl.serving.membership`: ECDH-PSI) without showing it the others;
- `Contribute`: for the IDs the active party then sends in the clear (those every passive party holds), which its
  table holds (one byte each) and its `contribution.pt` on those rows.

In oblivious mode (`oblivious=True`, `lvfl serve --oblivious`) `Contribute` is refused: the active party fetches
each row's contribution by an oblivious lookup instead (`Offer` and `Prepare` set up key sets ahead of requests,
`Lookup` answers a request's queries; `lvfl.serving.oblivious`), on the contributions of its whole table computed
once per version of the table, in the blinded table's shuffled order.

What it learns (plain mode): which of its own customers are scored, and when (its log line of each request says
so: `ids seen`), and how many IDs a request held; of the active party's other customers nothing (blinded points it
cannot open; a repeat of one looks like a repeat). In oblivious mode: how many IDs each request holds, and per ID
the bucket of N rows of its table the ID's row would lie in (a uniformly random one for an ID it does not hold); not
which of its customers are scored. It never receives a label, a prediction or another party's output.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from lvfl.crypto.ecdh_blinding import POINT_BYTES
from lvfl.federation import FederationError
from lvfl.federation.addresses import check_port_free
from lvfl.federation.channels import PinnedCaller, pinned_fingerprints, server_credentials
from lvfl.federation.expectations import printable
from lvfl.federation.federation_file import Federation
from lvfl.serving import serving_pb2 as pb
from lvfl.serving.export_folder import ExportedParty
from lvfl.serving.feature_source import FeatureSource
from lvfl.serving.membership import BlindedTable
from lvfl.serving.oblivious import (
    DEFAULT_BUCKET_SIZE,
    KeySets,
    KeySetSpentError,
    ObliviousRows,
    parse_queries,
    serving_layout,
)
from lvfl.serving.service import (
    CONTRIBUTE,
    CONTRIBUTIONS,
    GREET,
    LOOKUP,
    MAX_LOOKUPS,
    MAX_MESSAGE_BYTES,
    MEMBERS,
    OFFER,
    PREPARE,
    TABLE,
    contribution_bytes,
    mode_name,
)

__all__ = ["MAX_IDS", "ContributionServer"]

log = logging.getLogger("lvfl.serve")

MAX_IDS = 1_000_000  #: the most IDs one contribution request may ask for
MAX_ID_CHARACTERS = 256  #: the longest ID a request may hold (a table's IDs are business keys, not documents)
ROWS_PER_CALL = 4096  #: rows per TorchScript call when a whole table's contributions are computed


class ContributionServer:
    """A passive party's contribution service (see the module docstring).

    Args:
        federation: the federation (addresses, pinned certificates).
        party: this passive party's export.
        source: its table.
        key_path: its private key.
        listen: the address to listen at; default its address in the federation file.
        workers: threads answering requests.
        metrics: a `lvfl.serving.metrics.ServingMetrics` to count requests, rows and latency in.
        oblivious: answer by oblivious lookups only (`Contribute`, the IDs in the clear, is refused).
        bucket_size: oblivious mode's N, the rows of a bucket (a power of two): what a lookup shows of its row.
    """

    def __init__(
        self,
        federation: Federation,
        party: ExportedParty,
        source: FeatureSource,
        key_path: str | Path,
        listen: str | None = None,
        workers: int = 4,
        metrics: Any = None,
        oblivious: bool = False,
        bucket_size: int = DEFAULT_BUCKET_SIZE,
    ) -> None:
        if party.role == "active":
            raise ValueError(f"{party.party} is the active party: it scores (lvfl serve answers its API), it is not "
                             "asked for contributions")  # fmt: skip
        self.federation, self.party, self.source = federation, party, source
        self.me = federation.party(party.party).name
        if party.active_party not in federation.parties:
            raise FederationError(
                f"{party.folder}: the export sends to {party.active_party!r}, which federation file "
                f"{federation.path} does not name"
            )
        self._caller = PinnedCaller(pinned_fingerprints(federation), self.me)
        self.listen = listen or federation.party(self.me).address
        self._credentials = server_credentials(federation, self.me, key_path)
        self._workers = workers
        self.metrics = metrics
        self.oblivious = oblivious
        self.layout = serving_layout(0, bucket_size, tuple(party.output_shape))  # checks N; the rows come later
        self._key_sets = KeySets(self.layout.num_bits)
        self._rows: ObliviousRows | None = None  # oblivious: the contributions of the blinded table's rows
        self._blinded: BlindedTable | None = None
        self._blinded_generation = -1
        self._blinding = threading.Lock()
        self._asked: dict[str, int] = {}  # request ID -> the number of blinded IDs it asked about (for its log line)
        self._server: grpc.Server | None = None
        self.port = 0
        self.requests = 0

    def start(self) -> ContributionServer:
        """Listen; one line naming the address if it cannot."""
        self.party.warm_up()
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix=f"lvfl-serve-{self.me}"),
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self.blinded_table()
        calls = {
            GREET: self._greet,
            TABLE: self._table,
            MEMBERS: self._members,
            CONTRIBUTE: self._contribute,
            OFFER: self._offer,
            PREPARE: self._prepare,
            LOOKUP: self._lookup,
        }
        handlers = {method.name: method.handler(answer) for method, answer in calls.items()}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(CONTRIBUTIONS, handlers),))
        cannot = f"{self.me} cannot serve on {self.listen}"
        check_port_free(self.listen, cannot)
        try:
            self.port = server.add_secure_port(self.listen, self._credentials)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            server.stop(None)
            raise FederationError(f"{cannot}: the port is in use, or the host is not this machine")
        server.start()
        self._server = server
        return self

    def stop(self, grace: float = 1.0) -> None:
        """Stop answering (calls under way get `grace` seconds)."""
        if self._server is not None:
            self._server.stop(grace).wait(grace + 5)
            self._server = None

    def wait(self, timeout: float | None = None) -> None:
        """Block until stopped, or `timeout` seconds."""
        if self._server is not None:
            self._server.wait_for_termination(timeout)

    def blinded_table(self) -> BlindedTable:
        """The table's IDs blinded, for the table as read now (blinded again, under a fresh key, after a change).

        In oblivious mode the contributions of every row, in the blinded table's order, are computed with it.
        """
        return self._tables()[0]

    def _tables(self) -> tuple[BlindedTable, ObliviousRows | None]:
        """The blinded table and (oblivious mode) its rows' contributions, of one reading of the table."""
        self.source.refresh()
        with self._blinding:
            generation = self.source.generation
            if self._blinded is None or self._blinded_generation != generation:
                ids, features = self.source.snapshot()
                blinded = BlindedTable(ids)
                if self.oblivious:
                    self._rows = ObliviousRows(self._contributions(features[blinded.order]), self.layout.bucket_size)
                self._blinded, self._blinded_generation = blinded, generation
            return self._blinded, self._rows

    def _contributions(self, features: torch.Tensor) -> torch.Tensor:
        """`contribution.pt` on every row, in calls of at most `ROWS_PER_CALL` rows."""
        with torch.no_grad():
            parts = [self.party.contribution(features[at : at + ROWS_PER_CALL])
                     for at in range(0, len(features), ROWS_PER_CALL)]  # fmt: skip
        return torch.cat(parts) if parts else torch.zeros(0, *self.party.output_shape)

    # -- the calls -----------------------------------------------------------------------------------------------
    def _check_caller(self, context: grpc.ServicerContext) -> str:
        name, fingerprint = self._caller(context)
        if name is None:
            message = PinnedCaller.refusal(context, fingerprint, self.federation)
            log.warning("%s refused a connection: %s", self.me, message)
            context.abort(grpc.StatusCode.PERMISSION_DENIED, message)
        if name != self.party.active_party:
            message = f"{name} asked {self.me} for contributions; its export answers {self.party.active_party} only"
            log.warning("%s refused a request: %s", self.me, message)
            context.abort(grpc.StatusCode.PERMISSION_DENIED, message)
        return name

    def _greet(self, request: pb.Greeting, context: grpc.ServicerContext) -> pb.Greeting:
        caller = self._check_caller(context)
        mine, theirs_mode = mode_name(self.oblivious), request.mode or "plain"
        if theirs_mode != mine:
            message = (f"{self.me} serves in {mine} mode, {caller} asks in {printable(theirs_mode[:16])} mode: start "
                       "every party with --oblivious, or none")  # fmt: skip
            log.warning("%s refused %s's greeting: %s", self.me, caller, message)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)
        try:
            theirs = json.loads(request.export)
        except json.JSONDecodeError:
            theirs = {}
        if not isinstance(theirs, dict) or theirs.get("id") != self.party.export_id:
            message = (
                f"{self.me} serves {self.party.describe()}, {caller} serves "
                f"{self.party.describe(theirs if isinstance(theirs, dict) else {})}: export the same run for every "
                "party and serve those folders"
            )
            log.warning("%s refused %s's greeting: %s", self.me, caller, printable(message))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, printable(message))
        seen = (f"oblivious: of each request's IDs only the bucket of {self.layout.bucket_size} rows is seen here"
                if self.oblivious else "plain: the IDs of each request are seen here")  # fmt: skip
        log.info("%s: %s greeted, serving %s (%s)", self.me, caller, self.party.describe(), seen)
        return pb.Greeting(party=self.me, export=json.dumps(self.party.identity), mode=mine,
                           bucket_size=self.layout.bucket_size if self.oblivious else 0)  # fmt: skip

    def _check_export(self, export_id: str, request_id: str, caller: str, context: grpc.ServicerContext) -> None:
        if export_id != self.party.export_id:
            message = (
                f"{self.me} serves {self.party.describe()}; request {request_id} is for export "
                f"{printable(export_id[:32])}: export the same run for every party and serve those folders"
            )
            log.warning("%s refused a request of %s: %s", self.me, caller, message)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)

    def _table(self, request: pb.TableRequest, context: grpc.ServicerContext) -> pb.TableReply:
        caller = self._check_caller(context)
        self._check_export(request.export_id, "(table)", caller, context)
        table = self.blinded_table()
        log.info("%s: %s fetched its blinded table (%d IDs, version %s)", self.me, caller, table.size, table.version)
        return pb.TableReply(export_id=self.party.export_id, table=table.version, points=table.points)

    def _members(self, request: pb.MembershipRequest, context: grpc.ServicerContext) -> pb.MembershipReply:
        caller = self._check_caller(context)
        request_id = printable(request.request_id[:64])
        self._check_export(request.export_id, request_id, caller, context)
        count = len(request.points) // POINT_BYTES
        if len(request.points) % POINT_BYTES or count > MAX_IDS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a request holds at most {MAX_IDS} whole 32-byte points")
        table = self.blinded_table()
        try:
            points = table.reblind(request.points)
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        if len(self._asked) > 10_000:  # requests whose contributions never came (the active party's deadline)
            self._asked.clear()
        self._asked[request_id] = count
        return pb.MembershipReply(export_id=self.party.export_id, table=table.version, points=points)

    def _contribute(self, request: pb.ContributionRequest, context: grpc.ServicerContext) -> pb.ContributionReply:
        start = time.perf_counter()
        caller = self._check_caller(context)
        request_id = printable(request.request_id[:64])
        self._check_export(request.export_id, request_id, caller, context)
        if self.oblivious:
            message = f"{self.me} serves in oblivious mode: it takes no IDs in the clear (request {request_id})"
            log.warning("%s refused a request of %s: %s", self.me, caller, message)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)
        ids = list(request.ids)
        if len(ids) > MAX_IDS or any(len(k) > MAX_ID_CHARACTERS for k in ids):
            limit = f"a request holds at most {MAX_IDS} IDs of at most {MAX_ID_CHARACTERS} characters"
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, limit)
        found = self.source.lookup(ids)
        with torch.no_grad():
            values = self.party.contribution(found.features) if len(found.features) else None
        if values is None:
            values = torch.zeros(0, *self.party.output_shape)
        values = values.detach().to(torch.float32).contiguous()
        reply = pb.ContributionReply(
            export_id=self.party.export_id,
            held=bytes(np.asarray(found.held, dtype=np.uint8)),
            shape=list(values.shape),
            values=contribution_bytes(values),
        )
        self.requests += 1
        asked = self._asked.pop(request_id, None)
        if self.metrics is not None:
            self.metrics.request(time.perf_counter() - start, {"contributed": len(values)})
        log.info(
            "%s: request %s from %s: %s IDs asked (blinded), %d of its own scored, %.1f ms, plain (ids seen: %d)",
            self.me,
            request_id,
            caller,
            "?" if asked is None else asked,
            len(values),
            (time.perf_counter() - start) * 1e3,
            len(ids),
        )
        return reply

    # -- oblivious mode ------------------------------------------------------------------------------------------
    def _check_oblivious(self, caller: str, context: grpc.ServicerContext) -> None:
        if not self.oblivious:
            message = f"{self.me} serves in plain mode: it answers no oblivious lookups"
            log.warning("%s refused a request of %s: %s", self.me, caller, message)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)

    def _offer(self, request: pb.PrepareRequest, context: grpc.ServicerContext) -> pb.PrepareReply:
        caller = self._check_caller(context)
        self._check_export(request.export_id, "(preparation)", caller, context)
        self._check_oblivious(caller, context)
        try:
            batch, point = self._key_sets.offer(request.count)
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return pb.PrepareReply(export_id=self.party.export_id, batch=batch, point=point)

    def _prepare(self, request: pb.PrepareRequest, context: grpc.ServicerContext) -> pb.PrepareReply:
        caller = self._check_caller(context)
        self._check_export(request.export_id, "(preparation)", caller, context)
        self._check_oblivious(caller, context)
        try:
            first, ciphertexts = self._key_sets.prepare(request.batch, request.points)
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, printable(str(err)))
        return pb.PrepareReply(export_id=self.party.export_id, batch=request.batch, first=first,
                               ciphertexts=ciphertexts)  # fmt: skip

    def _lookup(self, request: pb.LookupRequest, context: grpc.ServicerContext) -> pb.LookupReply:
        start = time.perf_counter()
        caller = self._check_caller(context)
        request_id = printable(request.request_id[:64])
        self._check_export(request.export_id, request_id, caller, context)
        self._check_oblivious(caller, context)
        blinded, rows = self._tables()
        if request.table != blinded.version:
            message = (f"{self.me}'s table changed since request {request_id} learnt it (version "
                       f"{printable(request.table[:16])}, now {blinded.version})")  # fmt: skip
            context.abort(grpc.StatusCode.ABORTED, message)
        if len(request.queries) > MAX_LOOKUPS * 20:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a lookup call holds at most {MAX_LOOKUPS} queries")
        try:
            queries = parse_queries(rows.layout, request.queries)
            key_sets = [self._key_sets.take(t) for _, t, _ in queries]
        except (ValueError, KeySetSpentError) as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, printable(str(err)))
        answers = b"".join(
            rows.answer(key_set, bucket, shift) for (bucket, _, shift), key_set in zip(queries, key_sets, strict=True)
        )
        self.requests += 1
        asked = self._asked.get(request_id)  # a large request's lookups come in several calls
        seconds = time.perf_counter() - start
        if self.metrics is not None:
            self.metrics.request(seconds, {"looked up": len(queries)})
        log.info(
            "%s: request %s from %s: %s IDs asked (blinded), %d oblivious lookups in buckets of %d rows, %.1f ms, "
            "oblivious (ids seen: 0)",
            self.me,
            request_id,
            caller,
            "?" if asked is None else asked,
            len(queries),
            rows.layout.bucket_size,
            seconds * 1e3,
        )
        return pb.LookupReply(export_id=self.party.export_id, table=blinded.version, answers=answers)
