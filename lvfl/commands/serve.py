"""`lvfl serve`: one party's serving process, answering from its own `lvfl export` folder and its own table.

    lvfl serve --party party1 --federation federation.yaml --model exported/party1 --table retailer.csv
    lvfl serve --party party0 --federation federation.yaml --model exported/party0 --table bank.csv \
        --api 127.0.0.1:8500 --http 127.0.0.1:8080

A passive party answers the active party's contribution requests at its federation address (mutual TLS,
`lvfl.serving.ContributionServer`). The active party greets each passive party (a different export is refused in
one line, naming both), then answers its applications' scoring requests on this machine (`--api`: gRPC,
`--http`: JSON; `lvfl.serving.api`), asking the passive parties for every request (`lvfl.serving.Scorer`). Every
request is one log line at every party. SIGINT or SIGTERM stops the process (exit 0); `--stop_after` bounds it.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from lvfl.commands.errors import OneLineParser, debug_requested, reported_errors

__all__ = ["main", "serve_parser"]

DESCRIPTION = (
    "Serve one party of a fitted federation from its own lvfl export folder and its own table: a passive party "
    "answers the active party's contribution requests; the active party answers scoring requests (--api, --http)."
)


def serve_parser() -> argparse.ArgumentParser:
    """`lvfl serve`'s options."""
    parser = OneLineParser(prog="lvfl serve", description=DESCRIPTION)
    parser.add_argument("--party", required=True, help="this party's name in the federation file")
    parser.add_argument("--federation", type=Path, required=True, help="the federation file (lvfl pki writes one)")
    parser.add_argument("--model", type=Path, required=True, help="this party's lvfl export folder (exported/NAME)")
    parser.add_argument(
        "--table", type=Path, required=True, help="this party's table: CSV, Parquet or a folder of parts"
    )
    parser.add_argument("--encoding", default="utf-8", help="the table's text encoding (CSV; default utf-8)")
    parser.add_argument("--key", type=Path, default=None, help="this party's private key (default NAME.key beside "
                        "the federation file)")  # fmt: skip
    parser.add_argument("--listen", default=None, help="a passive party: where to listen (default: its address in the "
                        "federation file)")  # fmt: skip
    parser.add_argument("--api", default=None, metavar="HOST:PORT", help="the active party: its gRPC scoring API, on "
                        "this machine (e.g. 127.0.0.1:8500)")  # fmt: skip
    parser.add_argument("--http", default=None, metavar="HOST:PORT", help="the active party: its HTTP/JSON scoring "
                        "endpoint, on this machine (e.g. 127.0.0.1:8080)")  # fmt: skip
    parser.add_argument("--deadline", type=float, default=1.0, help="the active party: seconds a request waits for "
                        "the passive parties before the student answers (default 1)")  # fmt: skip
    parser.add_argument("--wait", type=float, default=10.0, help="the active party: seconds to wait at start for "
                        "each passive party to come up (default 10); one still down is asked per request")  # fmt: skip
    parser.add_argument("--metrics", default=None, metavar="HOST:PORT", help="serve Prometheus metrics there "
                        "(requests, rows by path, latency, passive parties' failures; counts only)")  # fmt: skip
    parser.add_argument("--oblivious", action="store_true", help="every party: the active party fetches "
                        "contributions by oblivious lookups, so a passive party learns of each requested ID only "
                        "a bucket of its rows, not which customer (all parties serve one mode)")  # fmt: skip
    parser.add_argument("--bucket_size", type=int, default=None, help="a passive party with --oblivious: the rows "
                        "of a bucket, a power of two (default 64); larger hides more, costs more")  # fmt: skip
    parser.add_argument("--check_every", type=float, default=1.0, help="seconds between checks whether the table's "
                        "files changed (default 1)")  # fmt: skip
    parser.add_argument("--stop_after", type=float, default=None, help="stop after this many seconds (default: run "
                        "until SIGINT or SIGTERM)")  # fmt: skip
    return parser


def _log_to_stderr() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    logger = logging.getLogger("lvfl.serve")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _until_stopped(stop_after: float | None) -> str:
    """Wait for SIGINT, SIGTERM or `stop_after` seconds; what stopped it."""
    stopped = threading.Event()
    why = {"signal": ""}

    def record(signum: int, frame: Any) -> None:
        why["signal"] = signal.Signals(signum).name
        stopped.set()

    previous = {s: signal.signal(s, record) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        stopped.wait(stop_after)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return why["signal"] or f"--stop_after {stop_after:g} s"


def main(argv: list[str]) -> None:
    """`lvfl serve` (see the module docstring)."""
    debug, argv = debug_requested(argv)
    with reported_errors(debug):
        own = serve_parser().parse_args(argv)
        if own.stop_after is not None and not own.stop_after > 0:
            raise ValueError(f"--stop_after must be a positive number of seconds, got {own.stop_after}")
        if not own.wait >= 0:
            raise ValueError(f"--wait must be a number of seconds >= 0, got {own.wait}")
        if not own.check_every >= 0:
            raise ValueError(f"--check_every must be a number of seconds >= 0, got {own.check_every}")
        if own.bucket_size is not None and not own.oblivious:
            raise ValueError("--bucket_size is oblivious mode's: give --oblivious too")
        from lvfl.federation.federation_file import load_federation
        from lvfl.serving import ContributionServer, ExportedParty, FeatureSource

        federation = load_federation(own.federation)
        federation.party(own.party)
        key = own.key if own.key is not None else federation.key_path(own.party)
        party = ExportedParty(own.model, own.party)
        if party.role == "active" and own.listen is not None:
            raise ValueError("--listen is a passive party's; the active party answers on --api and --http")
        if party.role != "active" and (own.api or own.http):
            raise ValueError(f"--api and --http are the active party's; {own.party} is passive (it answers "
                             f"{party.active_party}'s requests at its federation address)")  # fmt: skip
        if party.role == "active" and own.bucket_size is not None:
            raise ValueError(f"--bucket_size is a passive party's (each states its own); {own.party} is active")
        if party.role == "active" and not (own.api or own.http):
            raise ValueError("the active party answers scoring requests: give --api HOST:PORT (gRPC) and/or --http "
                             "HOST:PORT (JSON), on this machine")  # fmt: skip
        _log_to_stderr()
        source = FeatureSource(own.table, party, encoding=own.encoding, check_every=own.check_every)
        metrics = None
        if own.metrics is not None:
            from lvfl.serving.metrics import ServingMetrics, metrics_reach

            metrics = ServingMetrics(own.party)
            print(f"lvfl serve: {own.party}'s metrics at http://{own.metrics}/metrics{metrics_reach(own.metrics)}",
                  flush=True)  # fmt: skip
        about = f"{party.describe()}, {source.rows} rows of {own.table}"
        if party.role != "active":
            from lvfl.serving.oblivious import DEFAULT_BUCKET_SIZE, BucketSizeError

            bucket_size = own.bucket_size if own.bucket_size is not None else DEFAULT_BUCKET_SIZE
            try:
                server = ContributionServer(federation, party, source, key, own.listen, metrics=metrics,
                                            oblivious=own.oblivious, bucket_size=bucket_size).start()  # fmt: skip
            except BucketSizeError as err:
                raise ValueError(f"--bucket_size {bucket_size}: {err}") from None
            if metrics is not None:
                metrics.start(own.metrics)
            seen = (f"oblivious: of each request's IDs only a bucket of {bucket_size} rows is seen here"
                    if own.oblivious else "plain: the IDs of every request are seen here")  # fmt: skip
            print(f"lvfl serve: {own.party} answers {party.active_party}'s contribution requests at {server.listen} "
                  f"({about}); {seen}", flush=True)  # fmt: skip
            try:
                why = _until_stopped(own.stop_after)
            finally:
                server.stop()
                if metrics is not None:
                    metrics.stop()
            print(f"lvfl serve: {own.party} stopped ({why}) after {server.requests} requests", flush=True)
            return
        _serve_active(own, federation, party, source, key, about, metrics)


def _serve_active(
    own: argparse.Namespace, federation: Any, party: Any, source: Any, key: Path, about: str, metrics: Any
) -> None:
    """The active party: greet the passive parties, then answer on --api and --http until stopped."""
    from lvfl.serving import Scorer
    from lvfl.serving.api import ScoringService
    from lvfl.serving.http_endpoint import HttpEndpoint

    scorer = Scorer(federation, party, source, key, deadline=own.deadline, metrics=metrics, oblivious=own.oblivious)
    services: list[Any] = []
    try:
        if metrics is not None:
            metrics.start(own.metrics)
            services.append(metrics)
        status = scorer.greet(timeout=max(own.wait, 1.0))
        for why in status.values():
            if why:
                print(f"lvfl serve: {why}; its customers are answered by the student until it is back", flush=True)
        scorer.watch(status)  # for the health checks: which passive party is missing, and why
        if own.api:
            services.append(ScoringService(scorer, own.api).start())
        if own.http:
            services.append(HttpEndpoint(scorer, own.http).start())
        where = ([f"grpc {own.api}"] if own.api else []) + ([f"http://{own.http}/score"] if own.http else [])
        print(f"lvfl serve: {own.party} scores at {', '.join(where)} ({about}; asks {', '.join(scorer.order)}, "
              f"deadline {own.deadline:g} s, {'oblivious' if own.oblivious else 'plain'})", flush=True)  # fmt: skip
        why = _until_stopped(own.stop_after)
    finally:
        for service in services:
            service.stop()
        scorer.close()
    print(f"lvfl serve: {own.party} stopped ({why})", flush=True)
