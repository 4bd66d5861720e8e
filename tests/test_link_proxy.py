"""`LinkProxy`: the delayed, paced links `lvfl launch --network` puts between party processes.

Each chunk must arrive no earlier than `lvfl.network`'s model says (the rate of the slower of the sender's uplink and
the receiver's downlink, then both parties' latencies), a party's uplink is shared by everything it sends, both
directions are delayed, and the bytes are counted per direction. Times are checked as lower bounds (the model's,
which the proxy may only exceed by the OS's scheduling) with a generous upper bound, so a slow machine does not fail
them; the benchmark (benchmarks/perf/network_check.py) measures how close the proxy comes.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from lvfl.federation.link_proxy import LinkProxy
from lvfl.network import LinkProfile

SLACK = 0.5  # seconds the OS may add on a busy machine


def sink_server(expected: int, answer: bytes = b"") -> tuple[int, list[float]]:
    """A server on a free port that reads `expected` bytes, notes when the last arrived, and answers `answer`."""
    server = socket.create_server(("127.0.0.1", 0))
    done: list[float] = []

    def serve() -> None:
        connection, _ = server.accept()
        received = 0
        while received < expected:
            data = connection.recv(65536)
            if not data:
                break
            received += len(data)
        done.append(time.monotonic())
        connection.sendall(answer)
        connection.close()
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1], done


def dial(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_a_transfer_takes_the_model_s_time_and_its_answer_crosses_back_delayed() -> None:
    links = {"a": LinkProfile(80.0, 40.0, 10.0), "b": LinkProfile(40.0, 80.0, 5.0)}
    size = 500_000
    port, done = sink_server(size, answer=b"k")
    with LinkProxy(links) as proxy:
        client = dial(proxy.route("a", "b", f"127.0.0.1:{port}"))
        started = time.monotonic()
        client.sendall(b"x" * size)
        assert client.recv(1) == b"k"
        answered = time.monotonic() - started
        arrived = done[0] - started
        time.sleep(0.05)
        counted = dict(proxy.socket_bytes)
    transfer = 8 * size / 80e6  # a's uplink 80, b's downlink 80
    assert transfer + 0.015 <= arrived < transfer + 0.015 + SLACK
    assert transfer + 0.030 <= answered < transfer + 0.030 + SLACK  # the answer: 8 bits at b's 40 up / a's 40 down
    assert counted == {("a", "b"): size, ("b", "a"): 1}


def test_what_a_party_sends_to_two_peers_shares_its_uplink() -> None:
    """Two transfers from `a` at once take the time of both on a's uplink, as the simulator's messages do."""
    links = {
        "a": LinkProfile(40.0, 1000.0, 1.0),
        "b": LinkProfile(1000.0, 1000.0, 1.0),
        "c": LinkProfile(1000.0, 1000.0, 1.0),
    }
    size = 250_000
    (port_b, done_b), (port_c, done_c) = sink_server(size), sink_server(size)
    with LinkProxy(links) as proxy:
        to_b, to_c = (
            dial(proxy.route("a", "b", f"127.0.0.1:{port_b}")),
            dial(proxy.route("a", "c", f"127.0.0.1:{port_c}")),
        )
        started = time.monotonic()
        senders = [threading.Thread(target=s.sendall, args=(b"x" * size,)) for s in (to_b, to_c)]
        for thread in senders:
            thread.start()
        for thread in senders:
            thread.join()
        deadline = time.monotonic() + 10
        while not (done_b and done_c) and time.monotonic() < deadline:
            time.sleep(0.01)
    last = max(done_b[0], done_c[0]) - started
    both = 8 * 2 * size / 40e6  # 0.1 s: the two share a's 40 Mbps uplink
    assert both + 0.002 <= last < both + 0.002 + SLACK


def test_a_route_names_parties_with_links() -> None:
    proxy = LinkProxy({"a": LinkProfile(1.0, 1.0, 0.0)})
    with pytest.raises(ValueError, match=r"party 'b' has no link \(links for \['a'\]\)"):
        proxy.route("a", "b", "127.0.0.1:1")
    proxy.close()


@pytest.mark.slow
def test_jitter_delays_chunks_by_varying_amounts_and_keeps_their_order() -> None:
    """`lvfl launch --jitter_ms` (and the suite's stress mode): each chunk is held a further random 0 to the two ends'
    jitter, never overtaking the one before it: the bytes arrive whole, in order, each reply later than the link's
    own latency by a varying amount."""
    links = {"a": LinkProfile(1e6, 1e6, 0.0, jitter_ms=20.0), "b": LinkProfile(1e6, 1e6, 0.0, jitter_ms=20.0)}
    server = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        connection, _ = server.accept()
        while data := connection.recv(65536):
            connection.sendall(data)
        connection.close()

    threading.Thread(target=echo, daemon=True).start()
    trips = []
    with LinkProxy(links) as proxy:
        client = dial(proxy.route("a", "b", f"127.0.0.1:{server.getsockname()[1]}"))
        stream = bytes(range(256)) * 4
        for k in range(12):  # one small chunk at a time: each crosses alone, both ways
            started = time.monotonic()
            client.sendall(stream[k * 8 : (k + 1) * 8])
            got = b""
            while len(got) < 8:
                got += client.recv(8 - len(got))
            trips.append(time.monotonic() - started)
            assert got == stream[k * 8 : (k + 1) * 8]
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for k in range(64):  # many chunks in flight at once, each its own draw: they come back in order
            client.sendall(stream[k * 16 : (k + 1) * 16])
        got = b""
        while len(got) < len(stream):
            got += client.recv(len(stream) - len(got))
        assert got == stream
        client.close()
    server.close()
    assert max(trips) < 2 * 0.040 + SLACK  # at most 40 ms each way, and the OS's slack
    assert max(trips) - min(trips) > 0.005, trips  # the delays vary: twelve equal draws are all but impossible
