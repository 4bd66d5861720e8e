"""`ServingMetrics`: what a serving party counts for a Prometheus scraper (`lvfl serve --metrics HOST:PORT`).

Per party: the requests answered, the rows by path (`vfl`, `student`, `unanswered` at the active party;
`contributed` at a passive party), the latency of each request, and, at the active party, each passive party's
failures by kind (`unreachable`, `deadline`, `refused`). Counts only: no ID, feature or prediction is exported. The
registry is the process's own (not prometheus_client's global one), so two servers in one process do not share it.
"""

from __future__ import annotations

from typing import Any

from lvfl.federation.federation_file import parse_address
from lvfl.serving.service import check_loopback

__all__ = ["ServingMetrics", "metrics_reach"]

#: request latency buckets, seconds: a millisecond to a deadline's worth
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


def metrics_reach(address: str) -> str:
    """Nothing for metrics on this machine; else the words that say other hosts can read them, and what they hold.

    Metrics are counts only (no ID, feature or prediction), which a scraper on another host may read; unlike the
    scoring API's, such an address is allowed, but never silently (`lvfl serve` prints it at start).
    """
    try:
        parse_address(address)
    except ValueError as err:
        raise ValueError(f"--metrics {err}") from None
    try:
        check_loopback(address, "--metrics")
    except ValueError:
        return (" (readable from other hosts: counts only, no ID, feature or prediction; limit who may connect "
                "with your network's rules)")  # fmt: skip
    return ""


class ServingMetrics:
    """The counters and the latency histogram of one serving party, served over HTTP by `start`.

    Args:
        party: the party's name (the `party` label of every series).
    """

    def __init__(self, party: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.party = party
        self.registry = CollectorRegistry()
        self.requests = Counter("lvfl_serve_requests", "Requests answered.", ["party"], registry=self.registry)
        self.rows = Counter("lvfl_serve_rows", "Rows answered, by path.", ["party", "path"], registry=self.registry)
        self.latency = Histogram(
            "lvfl_serve_request_seconds", "Seconds per request.", ["party"], buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.failures = Counter(
            "lvfl_serve_peer_failures", "A passive party's failed answers, by kind.", ["party", "peer", "kind"],
            registry=self.registry,
        )  # fmt: skip
        self._server: Any = None

    def request(self, seconds: float, paths: dict[str, int]) -> None:
        """Count one request of `seconds`, with its rows per path ("" for unanswered)."""
        self.requests.labels(self.party).inc()
        self.latency.labels(self.party).observe(seconds)
        for path, count in paths.items():
            self.rows.labels(self.party, path or "unanswered").inc(count)

    def failure(self, peer: str, why: str) -> None:
        """Count a passive party's failed answer, its kind read from the reason's words."""
        kind = "deadline" if "deadline" in why else "unreachable" if "unreachable" in why else "refused"
        self.failures.labels(self.party, peer, kind).inc()

    def start(self, address: str) -> int:
        """Serve the metrics at `address` (host:port) over HTTP; returns the port."""
        from prometheus_client import start_http_server

        try:
            host, port = parse_address(address)
        except ValueError as err:
            raise ValueError(f"--metrics {err}") from None
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        return self._server.server_port

    def stop(self) -> None:
        """Stop serving the metrics."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
