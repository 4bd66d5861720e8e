"""One message's round trip between two processes: lvfl's `Transport` beside bare gRPC (sync and asyncio), in one run.

.venv/bin/python -m benchmarks.perf.transport_latency [--messages 400] [--rows 128] [--cols 64] [--repeats 3] [--pin]

Why: a launched EASTER step is a chain of messages (embeddings up, the global embedding down, predictions up,
gradients down), each party waiting on the other's, so a message's latency is paid four times a step. This
measures what one round trip costs on localhost, and what part of it is lvfl's own (its codec, checks and
mailbox) rather than gRPC's and TLS's:

- ``lvfl``: two `lvfl.federation.transport.Transport`s (mutual TLS, one stream per peer, the codec's envelope, every
  check) exchange a float32 tensor of ``rows x cols``: A sends, B receives and sends it back, A receives;
- ``grpc-sync`` and ``grpc-aio``: the same tensor as its raw bytes (no envelope, no checks; taken with
  ``numpy().tobytes()`` and made a writable tensor again on receipt, as lvfl gives it) on the same kind of stream
  (`stream_unary`, one per direction) with the same certificates, gRPC's threaded API and its asyncio API;
- the codec alone: encoding and decoding one such envelope in one process (no gRPC).

The three kinds alternate for `--repeats` rounds (a shared machine's slow spells hit each), each pair of
processes fresh; the medians over the rounds of each round's median round trip are printed side by side, and the
median of the rounds' ratios to bare gRPC (each ratio taken within one round). With ``--pin`` (Linux) process "a"
runs on the first CPU and "b" on the second, as two parties on two machines would each have their own: unpinned on
a 2-CPU machine, a pair's round trips fall into one of two modes, whichever way the scheduler places the threads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KINDS = ("lvfl", "grpc-sync", "grpc-aio")
SERVICE, METHOD = "bench.Echo", "/bench.Echo/Stream"
WARMUP = 20  # round trips not counted: connection set-up, first allocations


def play(kind: str, me: str, federation_path: str, messages: int, rows: int, cols: int) -> list[float] | None:
    """Party `me` ("a" or "b") of one pair; "a" returns its round trips (s)."""
    import torch

    other = "b" if me == "a" else "a"
    if os.environ.get("LVFL_BENCH_PIN"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[0] if me == "a" else cpus[1]})
    tensor = torch.randn(rows, cols)
    if kind == "lvfl":
        from lvfl.federation.transport import Transport

        times = []
        with Transport(me, federation_path, run_id="latency") as transport:
            transport.hello()
            for step in range(messages + WARMUP):
                started = time.perf_counter()
                if me == "a":
                    transport.send(other, "there", step, tensor, wait=False)
                    transport.receive(other, "back", step, expected=tensor)
                else:
                    received = transport.receive(other, "there", step, expected=tensor)
                    transport.send(other, "back", step, received, wait=False)
                times.append(time.perf_counter() - started)
            transport.flush()
            time.sleep(0.5)  # the peer's last answer is on its way: let it land before the server stops
        return times[WARMUP:] if me == "a" else None
    return _bare(kind, me, other, federation_path, tensor, messages)


def _bare(kind: str, me: str, other: str, federation_path: str, tensor, messages: int) -> list[float] | None:  # noqa: ANN001
    """The same exchange on bare gRPC streams with the federation's certificates, no envelope and no checks.

    The payload is the same tensor: its bytes are taken for each message, and a received message becomes a tensor
    the receiver owns (writable, as lvfl's `receive` gives it), as any program sending tensors over gRPC does.
    """
    import grpc
    import numpy
    import torch

    shape = tuple(tensor.shape)

    def to_bytes(t: torch.Tensor) -> bytes:
        return t.numpy().tobytes()

    def to_tensor(data: bytes) -> torch.Tensor:
        return torch.from_numpy(numpy.frombuffer(bytearray(data), dtype=numpy.float32).reshape(shape))

    from lvfl.federation.federation_file import load_federation

    federation = load_federation(federation_path)
    ca = federation.ca.read_bytes()
    certificate = federation.party(me).certificate.read_bytes()
    key = federation.key_path(me).read_bytes()
    server_credentials = grpc.ssl_server_credentials(
        [(key, certificate)], root_certificates=ca, require_client_auth=True
    )
    channel_credentials = grpc.ssl_channel_credentials(ca, key, certificate)
    listen, target = federation.party(me).address, federation.party(other).address
    options = [("grpc.ssl_target_name_override", other)]

    if kind == "grpc-sync":
        inbox: queue.Queue = queue.Queue()
        outbox: queue.Queue = queue.Queue()

        def stream(requests, context):  # noqa: ANN001, ARG001
            for request in requests:
                inbox.put(request)
            return b""

        server = grpc.server(ThreadPoolExecutor(4))
        handler = grpc.stream_unary_rpc_method_handler(stream)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Stream": handler}),))
        server.add_secure_port(listen, server_credentials)
        server.start()
        channel = grpc.secure_channel(target, channel_credentials, options=options)

        def requests():  # noqa: ANN202
            while (item := outbox.get()) is not None:
                yield item

        call = channel.stream_unary(METHOD).future(requests(), wait_for_ready=True)
        times = []
        for _ in range(messages + WARMUP):
            started = time.perf_counter()
            if me == "a":
                outbox.put(to_bytes(tensor))
                to_tensor(inbox.get(timeout=60))
            else:
                outbox.put(to_bytes(to_tensor(inbox.get(timeout=60))))
            times.append(time.perf_counter() - started)
        time.sleep(0.5)
        outbox.put(None)
        call.result(timeout=60)
        server.stop(0.5).wait()
        return times[WARMUP:] if me == "a" else None

    async def run() -> list[float]:
        inbox: asyncio.Queue = asyncio.Queue()

        async def stream(requests, context):  # noqa: ANN001, ARG001
            async for request in requests:
                inbox.put_nowait(request)
            return b""

        server = grpc.aio.server()
        handler = grpc.stream_unary_rpc_method_handler(stream)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Stream": handler}),))
        server.add_secure_port(listen, server_credentials)
        await server.start()
        channel = grpc.aio.secure_channel(target, channel_credentials, options=options)
        call = channel.stream_unary(METHOD)(wait_for_ready=True)
        times = []
        for _ in range(messages + WARMUP):
            started = time.perf_counter()
            if me == "a":
                await call.write(to_bytes(tensor))
                to_tensor(await asyncio.wait_for(inbox.get(), 60))
            else:
                await call.write(to_bytes(to_tensor(await asyncio.wait_for(inbox.get(), 60))))
            times.append(time.perf_counter() - started)
        await asyncio.sleep(0.5)
        await call.done_writing()
        await call
        await server.stop(0.5)
        return times

    times = asyncio.run(run())
    return times[WARMUP:] if me == "a" else None


def pair(kind: str, federation_path: Path, args: argparse.Namespace, out: Path) -> float:
    """Run one pair of processes of `kind`; the median round trip (s) that "a" measured."""
    common = [str(federation_path), str(args.messages), str(args.rows), str(args.cols), str(out)]
    command = [sys.executable, "-m", "benchmarks.perf.transport_latency", "--play", kind]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as in the launch benchmark: one torch thread per process
    if args.pin:
        env["LVFL_BENCH_PIN"] = "1"
    b = subprocess.Popen([*command, "b", *common], cwd=REPO, env=env)  # noqa: S603 - this module
    a = subprocess.run([*command, "a", *common], cwd=REPO, env=env, check=False)  # noqa: S603 - this module
    if a.returncode != 0 or b.wait(timeout=120) != 0:
        raise SystemExit(f"the {kind} pair failed")
    return statistics.median(json.loads(out.read_text()))


def codec_cost(rows: int, cols: int, repeats: int = 2000) -> tuple[float, float]:
    """Microseconds to encode, and to parse and decode, one envelope of a ``rows x cols`` float32 tensor."""
    import torch

    from lvfl.federation.codec import RECORDS, decode_payload, encode_envelope
    from lvfl.federation.envelope_schema import Header
    from lvfl.federation.wire_form import parse_envelope

    tensor, header = torch.randn(rows, cols), Header("latency", "a", "b", "there", 3, 7, "")
    data = encode_envelope(header, tensor, RECORDS)
    started = time.perf_counter()
    for _ in range(repeats):
        encode_envelope(header, tensor, RECORDS)
    encode = (time.perf_counter() - started) / repeats
    started = time.perf_counter()
    for _ in range(repeats):
        _, payload = parse_envelope(data, sender="a")
        decode_payload(payload, sender="a", tag="there", records=RECORDS)
    decode = (time.perf_counter() - started) / repeats
    return encode * 1e6, decode * 1e6


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--play":
        kind, me, federation_path, messages, rows, cols, out = sys.argv[2:9]
        times = play(kind, me, federation_path, int(messages), int(rows), int(cols))
        if times is not None:
            Path(out).write_text(json.dumps(times))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=400, help="round trips measured per pair")
    parser.add_argument("--rows", type=int, default=128, help="the tensor's rows (digits EASTER: the batch, 128)")
    parser.add_argument("--cols", type=int, default=64, help="the tensor's columns (digits EASTER: embedding_dim, 64)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the kinds; medians are reported")
    parser.add_argument("--pin", action="store_true", help="each process of a pair on a CPU of its own (Linux)")
    args = parser.parse_args()
    if args.pin and len(getattr(os, "sched_getaffinity", lambda _: ())(0)) < 2:
        parser.error("--pin needs Linux and at least 2 CPUs this process may run on")
    from benchmarks.common import machine
    from lvfl.federation.federation_file import write_federation
    from lvfl.federation.pki import write_test_pki

    medians: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for kind in KINDS:  # fresh certificates and ports for each pair
                pki = Path(tmp, f"{kind}{i}")
                write_test_pki(pki, ["a", "b"])
                federation = write_federation(pki / "federation.yaml", ["a", "b"])
                medians[kind].append(pair(kind, federation.path, args, pki / "times.json"))
    encode, decode = codec_cost(args.rows, args.cols)
    size = args.rows * args.cols * 4
    print(f"# one round trip of a {args.rows}x{args.cols} float32 tensor ({size:,} bytes) between two processes on "
          f"localhost, mutual TLS; {args.messages} round trips per pair, {args.repeats} rounds, medians"
          + ("; each process on a CPU of its own" if args.pin else ""))  # fmt: skip
    print(f"# {machine()}")
    print()
    base = statistics.median(medians["grpc-sync"])
    print("| | median round trip | each round | over bare gRPC (sync) | paired: median of the rounds' ratios |")
    print("|---|---|---|---|---|")
    for kind in KINDS:
        value = statistics.median(medians[kind])
        each = ", ".join(f"{m * 1e3:.3f}" for m in medians[kind])
        paired = statistics.median(m / b for m, b in zip(medians[kind], medians["grpc-sync"], strict=True))
        print(f"| {kind} | {value * 1e3:.3f} ms | {each} | {value / base:.2f}x | {paired:.2f}x |")
    print()
    print(f"codec alone, one envelope: encode {encode:.1f} us, parse and decode {decode:.1f} us "
          f"(a round trip has two of each: {2 * (encode + decode) / 1e3:.3f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
