"""A delayed, paced network between party processes on one machine: a TCP proxy for each ordered pair of parties.

Why: localhost has neither latency nor a bandwidth limit, and this kind of machine often has no `netem`, so a launch
on it says nothing of how a run goes between organisations. `LinkProxy` sits between the parties' processes
(`lvfl launch --network wan`): each party dials each peer through a port of its own (one per ordered pair, so the
proxy knows who sends), and the proxy forwards the bytes after the delay and at the rate of the parties' access
links, by `lvfl.network`'s model, so that `NetworkSimulator` can be checked against it:

- every party p has an access link (`LinkProfile`): up and down rates in Mbps, a one-way latency in ms;
- a chunk of b bytes from s to r occupies s's uplink and r's downlink together for 8 b / min(up(s), down(r))
  seconds, from when both are free (FIFO, as the simulator's messages do), and arrives latency(s) + latency(r)
  after its last byte left;
- both directions of a connection cross the links: a message, its answer, HTTP/2's window updates and TLS's
  handshake each pay their way;
- jitter: each chunk is held a further uniform draw in [0, jitter(s) + jitter(r)] ms, never overtaking the chunk
  before it on its connection (TCP's order), so the parties see every message late by a varying amount
  (`lvfl launch --jitter_ms`, and every launch in the test suite's stress mode).

What it does not model: TCP between a party and the proxy is localhost's (no loss, no slow start); a chunk is what
one read returns (at most `CHUNK` bytes), so pacing is per chunk; sleeps are the OS's (tens of microseconds late).
It counts the bytes each direction carried (`socket_bytes`: TLS records, HTTP/2 frames and all).

Threads, not asyncio: `time.sleep` wakes within tens of microseconds where an event loop's timers round to a
millisecond, which is the whole of a LAN's latency. On Linux each writer thread asks for a timer slack of 1 us
(`prctl`; the default, 50 us, is a tenth of a LAN's trip), and a reader hands chunks to its writer through a C
queue. Every loop ends when the proxy closes.
"""

from __future__ import annotations

import contextlib
import ctypes
import queue
import random
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping

from lvfl.network import LinkProfile

__all__ = ["CHUNK", "LinkProxy"]

#: the most bytes read, paced and forwarded at once
CHUNK = 64 * 1024
#: seconds an accept waits before it looks whether the proxy is closing
_POLL = 0.2
#: prctl's option that sets the calling thread's timer slack, in ns (linux/prctl.h)
_PR_SET_TIMERSLACK = 29


def _precise_sleeps() -> None:
    """Ask Linux to wake this thread's sleeps within 1 us of their time (default: 50 us); elsewhere, nothing."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0)


class LinkProxy:
    """Forward each ordered pair's connections with its links' delay and rate (see the module docstring).

    Args:
        links: every party's access link.
        host: where the proxy listens (a loopback address).

    Example:
        >>> with LinkProxy({"a": wan, "b": wan}) as proxy:  # doctest: +SKIP
        ...     via = proxy.route("a", "b", "localhost:50051")  # party a dials b at `via`
    """

    def __init__(self, links: Mapping[str, LinkProfile], host: str = "127.0.0.1") -> None:
        self.links, self.host = dict(links), host
        self.socket_bytes: Counter[tuple[str, str]] = Counter()  # (src, dst) -> bytes forwarded
        self._free: dict[tuple[str, str], float] = {}  # ("up" | "down", party) -> when that link is next free
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._listeners: list[tuple[socket.socket, str, str, tuple[str, int]]] = []
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._started = False

    def route(self, src: str, dst: str, target: str) -> str:
        """Listen for `src`'s connections to `dst`, which is at `target` ("host:port"); the address `src` dials."""
        for party in (src, dst):
            if party not in self.links:
                raise ValueError(f"party {party!r} has no link (links for {sorted(self.links)})")
        host, _, port = target.rpartition(":")
        listener = socket.create_server((self.host, 0))
        listener.settimeout(_POLL)
        self._listeners.append((listener, src, dst, (host.strip("[]"), int(port))))
        if self._started:
            self._spawn(self._accept, *self._listeners[-1])
        return f"{self.host}:{listener.getsockname()[1]}"

    def start(self) -> LinkProxy:
        """Accept on every route, each in a thread of its own (a route added later accepts at once)."""
        self._started = True
        for listener, src, dst, target in self._listeners:
            self._spawn(self._accept, listener, src, dst, target)
        return self

    def close(self) -> None:
        """Stop accepting, drop every connection, and wait for the threads (a second each at most)."""
        self._closing.set()
        for listener, *_ in self._listeners:
            listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(timeout=1.0)

    def __enter__(self) -> LinkProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def delay_s(self, src: str, dst: str) -> float:
        """One-way propagation delay from `src` to `dst`, in seconds."""
        return (self.links[src].latency_ms + self.links[dst].latency_ms) / 1e3

    def jitter_s(self, src: str, dst: str) -> float:
        """The most extra delay a chunk from `src` to `dst` draws, in seconds (0: none)."""
        return (self.links[src].jitter_ms + self.links[dst].jitter_ms) / 1e3

    def rate_bps(self, src: str, dst: str) -> float:
        """The rate of a transfer from `src` to `dst`, in bit/s: the slower of src's uplink and dst's downlink."""
        return min(self.links[src].up_mbps, self.links[dst].down_mbps) * 1e6

    # -- the threads -----------------------------------------------------------------------------------------------
    def _spawn(self, target, *args: object) -> None:  # noqa: ANN001
        thread = threading.Thread(target=target, args=args, daemon=True, name=f"lvfl-proxy-{target.__name__}")
        self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket, src: str, dst: str, target: tuple[str, int]) -> None:
        while not self._closing.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            try:
                upstream = socket.create_connection(target, timeout=5.0)
            except OSError:  # the peer is not up yet: the party's channel retries, as it would across a network
                client.close()
                continue
            for sock in (client, upstream):
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [client, upstream]
            self._spawn(self._pump, client, upstream, src, dst)
            self._spawn(self._pump, upstream, client, dst, src)

    def _pump(self, source: socket.socket, sink: socket.socket, src: str, dst: str) -> None:
        """Read `source` (bytes from `src` to `dst`), pace and delay each chunk, and hand it to a writer."""
        pending: queue.SimpleQueue = queue.SimpleQueue()
        self._spawn(self._write, sink, pending)
        delay, rate, jitter = self.delay_s(src, dst), self.rate_bps(src, dst), self.jitter_s(src, dst)
        draw, last = random.Random(), 0.0  # noqa: S311 - jitter, no secret: seeded from the OS's entropy
        try:
            while not self._closing.is_set():
                data = source.recv(CHUNK)
                if not data:
                    break
                with self._lock:  # the chunk holds src's uplink and dst's downlink together, FIFO
                    up, down = ("up", src), ("down", dst)
                    start = max(time.monotonic(), self._free.get(up, 0.0), self._free.get(down, 0.0))
                    done = self._free[up] = self._free[down] = start + 8.0 * len(data) / rate
                    self.socket_bytes[(src, dst)] += len(data)
                last = max(last, done + delay + (draw.uniform(0.0, jitter) if jitter else 0.0))  # in order
                pending.put((last, data))
        except OSError:  # reset, or closed by `close`
            pass
        finally:
            pending.put(None)

    def _write(self, sink: socket.socket, pending: queue.SimpleQueue) -> None:
        """Deliver each chunk at its time, in order; then end the write side (the peer sees the end of the stream)."""
        _precise_sleeps()
        try:
            while (item := pending.get()) is not None:
                at, data = item
                wait = at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:  # the other end is gone
            pass
