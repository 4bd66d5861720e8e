"""A federation that holds against its own members: real party processes against rogue servers and clients.

Each test reproduces one finding of the audits (docs/two-organisations.md, "What a member can and cannot do") with
the project's own protobuf, certificates and `Transport` on the rogue side, and a real process on the other: a
party's transport (tests/federation_victim.py), `lvfl party` or `lvfl launch`. Every refusal is one line naming
the peer at fault, and nothing reaches the rogue.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import torch
from helpers import REPO, lvfl

from lvfl.federation import FederationError
from lvfl.federation.federation_file import Federation, write_federation
from lvfl.federation.pki import PKIFiles, issue_certificate, write_test_pki
from lvfl.federation.transport import Transport

pytestmark = pytest.mark.slow  # party processes

NAMES = ["party0", "party1", "party2"]
FINGERPRINT = "model=1,data=2,seed=3,trainer=4"  # the victim's (tests/federation_victim.py's default)
SHORT = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
DIGITS = ["--config", "configs/easter/digits.yaml", *SHORT]


def errors(done: subprocess.CompletedProcess | tuple[str, str]) -> list[str]:
    """The `lvfl: error:` lines a command printed."""
    err = done.stderr if isinstance(done, subprocess.CompletedProcess) else done[1]
    return [line for line in err.splitlines() if line.startswith("lvfl: error:")]


class Victim:
    """tests/federation_victim.py as a process: a party's own transport, up once it said so."""

    def __init__(self, federation: Federation, party: str, *args: str) -> None:
        command = [sys.executable, str(REPO / "tests" / "federation_victim.py"), "--federation", str(federation.path)]
        self.process = subprocess.Popen(  # noqa: S603 - our own script
            [*command, "--party", party, *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        first = self.process.stdout.readline().strip()
        assert first == "listening", first + self.process.stderr.read()

    def result(self, timeout: float = 60) -> dict:
        """Its closing JSON line: ok, the one-line error, its resident and peak memory."""
        out, err = self.process.communicate(timeout=timeout)
        lines = out.strip().splitlines()
        assert lines, err[-3000:]
        return json.loads(lines[-1])


@pytest.fixture
def pki(tmp_path: Path) -> PKIFiles:
    return write_test_pki(tmp_path / "pki", NAMES)


@pytest.fixture
def federation(pki: PKIFiles) -> Federation:
    return write_federation(pki.directory / "federation.yaml", NAMES)


@pytest.fixture
def rogue(federation: Federation) -> Iterator:
    """Make a rogue `Transport` (a member's own, in this process), closed after the test."""
    made: list[Transport] = []

    def make(name: str, **kwargs) -> Transport:
        kwargs.setdefault("run_id", "run-1")
        kwargs.setdefault("timeout", 60.0)  # generous: a loaded machine takes seconds to parse a 40 MB message
        kwargs.setdefault("fingerprint", FINGERPRINT)
        made.append(Transport(name, federation, **kwargs).start())
        return made[-1]

    yield make
    for transport in made:
        transport.close()


class RogueServer:
    """A gRPC server at a party's address holding a certificate that is not the one pinned for that party."""

    def __init__(self, address: str, certificate: Path, key: Path, ca: Path) -> None:
        self.calls = 0
        self._lock = threading.Lock()

        def take(request: bytes, context: grpc.ServicerContext) -> bytes:
            with self._lock:
                self.calls += 1
            return b""

        def take_stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
            for request in requests:
                take(request, context)
            return b""

        handlers = {
            "Deliver": grpc.unary_unary_rpc_method_handler(take),
            "Stream": grpc.stream_unary_rpc_method_handler(take_stream),
        }
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        service = grpc.method_handlers_generic_handler("lvfl.federation.Federation", handlers)
        self.server.add_generic_rpc_handlers((service,))
        credentials = grpc.ssl_server_credentials(
            [(key.read_bytes(), certificate.read_bytes())], root_certificates=ca.read_bytes(), require_client_auth=False
        )
        assert self.server.add_secure_port(address, credentials)
        self.server.start()

    def stop(self) -> None:
        self.server.stop(None)


# ------------------------------------------------------------------------------------------------- the dialing side
@pytest.mark.parametrize("certificate", ["another party's, naming the peer's host", "freshly minted with the CA key"])
def test_a_server_at_a_peers_address_without_its_pinned_certificate_gets_nothing(tmp_path, certificate):
    """Finding 1: the dialing side pins too. A rogue at party0's address, holding party2's certificate (which names
    party0's host, as `lvfl pki --address` once wrote every party's host into every certificate) or a certificate
    for party0 minted with the CA's key: party1's greeting fails the handshake, in one line naming party0, and the
    rogue receives no message."""
    pki = write_test_pki(tmp_path / "pki", NAMES, party_hosts={"party2": ["party0"]})
    federation = write_federation(pki.directory / "federation.yaml", NAMES)
    if certificate.startswith("another"):
        cert, key = pki.certificates["party2"], pki.keys["party2"]
    else:
        cert, key = issue_certificate(pki.ca_certificate, pki.ca_key, "party0", tmp_path / "minted")
    server = RogueServer(federation.party("party0").address, cert, key, pki.ca_certificate)
    try:
        victim = Victim(federation, "party1", "--greet", "party0", "--timeout", "4")
        result = victim.result()
    finally:
        server.stop()
    assert not result["ok"]
    assert "\n" not in result["error"]
    assert result["error"].startswith("party1 could not deliver 'hello' to party0 at ")
    assert "the server there does not hold the certificate pinned for party0 in the federation file" in result["error"]
    assert server.calls == 0


def test_each_certificate_lvfl_pki_writes_names_only_its_own_partys_hosts(tmp_path):
    """`lvfl pki --address`: a party's host goes on that party's certificate, and on no other."""
    from lvfl.federation.pki import certificate_names, load_certificate

    out = tmp_path / "pki"
    done = lvfl("pki", "--parties", "bank", "shop", "--out", str(out), "--address", "bank=bank.example:50051",
                "shop=10.0.0.7:50052")  # fmt: skip
    assert done.returncode == 0, done.stderr
    _, bank_dns = certificate_names(load_certificate(out / "bank.pem"))
    _, shop_dns = certificate_names(load_certificate(out / "shop.pem"))
    assert "bank.example" in bank_dns
    assert "bank.example" not in shop_dns
    shop_text = (out / "shop.pem").read_bytes()
    assert b"bank.example" not in shop_text  # nor anywhere else in it


# ------------------------------------------------------------------------------------------------- keys and greetings
def test_the_ca_key_is_kept_apart_from_the_folder_the_parties_get(tmp_path):
    """Finding 7: `lvfl pki` writes the CA's key beside the folder (0600), never into it; refuses --ca-key inside."""
    out = tmp_path / "pki"
    done = lvfl("pki", "--parties", "party0", "party1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert not (out / "ca.key").exists()
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".key") == ["party0.key", "party1.key"]
    apart = tmp_path / "pki-ca.key"
    assert apart.is_file()
    assert apart.stat().st_mode & 0o777 == 0o600
    assert str(apart) in done.stdout
    inside = lvfl("pki", "--parties", "party0", "party1", "--out", str(tmp_path / "p2"), "--ca-key",
                  str(tmp_path / "p2" / "ca.key"))  # fmt: skip
    assert inside.returncode == 2
    assert errors(inside) == [
        f"lvfl: error: --ca-key {tmp_path / 'p2' / 'ca.key'}: the CA's key must not go into --out {tmp_path / 'p2'}, "
        "the folder the parties get their certificates from"
    ]


def test_a_party_key_others_can_read_is_refused_in_one_line(tmp_path):
    """Finding 7: `lvfl party` with a private key readable by others stops before it listens, naming the key."""
    done = lvfl("pki", "--parties", "party0", "party1", "--out", str(tmp_path / "pki"))
    assert done.returncode == 0, done.stderr
    key = tmp_path / "pki" / "party1.key"
    key.chmod(0o644)
    party = lvfl("party", "--party", "party1", "--federation", str(tmp_path / "pki" / "federation.yaml"),
                 "--timeout", "5", *DIGITS, "--data.init_args.num_parties=2",
                 f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}")  # fmt: skip
    assert party.returncode == 2, party.stderr[-3000:]
    (line,) = errors(party)
    assert f"private key {key} is readable by others (mode 0644)" in line
    assert line.endswith(f"chmod 600 {key}")


def test_a_greeting_without_the_configurations_fingerprint_is_refused(federation, rogue):
    """Finding 8: a peer that greets with an empty fingerprint would skip the configuration check; it is refused,
    in one line naming it, at both ends."""
    victim = Victim(federation, "party0", "--greet", "party1", "--timeout", "5")
    member = rogue("party1", fingerprint="")
    with pytest.raises(FederationError, match="party0 refused 'hello' from party1: party1 greeted party0 without"):
        member.hello(["party0"])
    result = victim.result()
    assert not result["ok"]
    assert result["error"] == (
        "party1 greeted party0 without the configuration's fingerprint, which party0 checks every greeting against"
    )


def test_a_peers_abort_reason_reaches_the_terminal_escaped(federation, rogue):
    """Finding 9: a peer's abort reason with terminal escape sequences is printed escaped, never raw."""
    victim = Victim(federation, "party0", "--greet", "party1", "--receive", "party1:embeddings", "--timeout", "10")
    member = rogue("party1")
    member.hello(["party0"])
    member.abort("\x1b[2J\x1b[31mall is well\x07, \u202eevil")
    result = victim.result()
    assert not result["ok"]
    assert result["error"] == "party1 stopped: \\x1b[2J\\x1b[31mall is well\\x07, \\u202eevil"
    assert not any(not ch.isprintable() for ch in result["error"])


# ------------------------------------------------------------------------------------------------- the run's secrets
def test_privacy_noise_seeded_by_the_public_config_is_refused_in_deployment(tmp_path):
    """Finding 5: a label mechanism's seed in the shared config lets every party regenerate its noise. `lvfl party`
    and `lvfl launch` refuse it, naming the option, unless --allow_public_seeds (parity tests)."""
    seeded = [*DIGITS, "--model.init_args.label_mechanism={'class_path': 'lvfl.privacy.RandomizedResponse', "
              "'init_args': {'epsilon': 1.0, 'seed': 5}}"]  # fmt: skip
    done = lvfl("pki", "--parties", *[f"party{k}" for k in range(4)], "--out", str(tmp_path / "pki"))
    assert done.returncode == 0, done.stderr
    party = lvfl("party", "--party", "party1", "--federation", str(tmp_path / "pki" / "federation.yaml"),
                 "--timeout", "5", *seeded, f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}")  # fmt: skip
    launch = lvfl("launch", *seeded, f"--trainer.logger.init_args.save_dir={tmp_path / 'launch'}")
    for command, done in (("lvfl party", party), ("lvfl launch", launch)):
        assert done.returncode == 2, done.stderr[-3000:]
        assert errors(done) == [
            f"lvfl: error: {command}: model.init_args.label_mechanism.init_args.seed=5: the config fixes the seed of "
            "privacy noise, and every party reads the config, so any party can regenerate that noise and strip it; "
            "leave the seed out (the noise is then drawn from the OS), or pass --allow_public_seeds for a test that "
            "compares runs"
        ]
    assert not (tmp_path / "launch").exists()  # refused before any party started


def test_lvfl_fit_warns_of_privacy_noise_seeded_by_the_config(tmp_path):
    """Finding 5, in simulation: `lvfl fit` runs a seeded label mechanism (tests and reproducible experiments need
    one) but says, naming the option, that a deployment would refuse it."""
    from lvfl.commands.fit import main

    mechanism = "{class_path: lvfl.privacy.RandomizedResponse, init_args: {epsilon: 1.0, seed: 5}}"
    seeded = f"--model.init_args.label_mechanism={mechanism}"
    warned = r"lvfl fit: model.init_args.label_mechanism.init_args.seed=5: the config fixes the seed of privacy noise"
    with pytest.warns(UserWarning, match=warned) as record:
        main(["fit", *DIGITS, seeded, f"--trainer.logger.init_args.save_dir={tmp_path}"])
    (warning,) = [w for w in record if "seed=5" in str(w.message)]
    assert str(warning.message).endswith("lvfl party and lvfl launch refuse it)")


def test_a_signed_key_replayed_from_another_run_is_refused(tmp_path):
    """Finding 4: one federation (the same certificates), two runs. The active party records party2's signed X25519
    key in the first and relays it to party1 in the second. The signature binds the run, so party1 refuses it in one
    line naming the relay, and the run stops."""
    names = [f"party{k}" for k in range(4)]
    done = lvfl("pki", "--parties", *names, "--out", str(tmp_path / "pki"))
    assert done.returncode == 0, done.stderr
    federation, recorded = tmp_path / "pki" / "federation.yaml", tmp_path / "party2.key.json"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    results = {}
    for run_id, mode in (("run-a", "record"), ("run-b", "replay")):
        callback = {"class_path": "federation_rogue.KeyReplay", "init_args": {"file": str(recorded), "mode": mode}}
        processes = {
            name: subprocess.Popen(  # noqa: S603 - our own command
                [sys.executable, "-m", "lvfl", "party", "--party", name, "--federation", str(federation),
                 "--run_id", run_id, "--timeout", "20", *DIGITS, f"--trainer.callbacks+={json.dumps(callback)}",
                 f"--trainer.logger.init_args.save_dir={tmp_path / run_id / name}",
                 "--trainer.enable_progress_bar=false"],  # fmt: skip
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            )
            for name in names
        }  # fmt: skip
        results[mode] = {name: (p.communicate(timeout=240), p.returncode) for name, p in processes.items()}
    assert all(code == 0 for _, code in results["record"].values()), results["record"]
    (out, err), code = results["replay"]["party1"]
    assert code == 2, err[-3000:]
    assert errors((out, err)) == [
        "lvfl: error: DHMasking: party1 received party2's X25519 public key, relayed by the active party party0, "
        "without a valid signature by party2's identity for this run: the relayed key was changed (a man in the "
        "middle), is not the one it signed, or was signed for another run (a replay); no pair key is derived from it"
    ]
    assert all(code != 0 for _, code in results["replay"].values())  # the run stops everywhere


def test_a_launch_leaves_none_of_its_throw_away_keys(tmp_path):
    """Finding 7: `lvfl launch` without --pki writes its PKI into a temporary folder and deletes it, keys and all,
    when it ends; the CA's key is never written."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    two = [
        "validate", "--config", "configs/easter/digits.yaml", "--data.init_args.num_parties=2",
        "--model.init_args.aggregation=lvfl.privacy.Plain", "--trainer.limit_val_batches=1",
        '--model.init_args.parties=[{"model": {"class_path": "lvfl.models.MLP", "init_args": {"hidden": [8]}}}]',
    ]  # fmt: skip
    done = lvfl("launch", *two, f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}", env={"TMPDIR": str(tmp)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "federation " + str(tmp) in done.stdout  # the PKI was written there
    assert list(tmp.iterdir()) == []


# ------------------------------------------------------------------------------------------------- what a peer can fill
MiB = 2**20


def crafted(src: str, dst: str, tag: str, payload: bytes, seq: int = 0) -> bytes:
    """An envelope whose payload's bytes are given as they are (a rogue writes whatever it likes)."""
    from lvfl.federation import envelope_pb2 as pb
    from lvfl.federation.envelope_schema import SCHEMA

    head = pb.EnvelopeHead(schema=SCHEMA, run_id="run-1", src=src, dst=dst, tag=tag, step=0, seq=seq, payload=payload)
    return head.SerializeToString()


def test_a_party_never_greeted_gets_nothing_held(federation, rogue):
    """Finding 3: party2 is pinned but party0 never greets it (a party talks only to its peers). Of its eight 100 MiB
    tensors the first is received and refused on its header, in one line naming party2; the others are refused
    before they are read. party0 holds none of them, and party1's messages still pass. Stated bound: a party never
    greeted costs party0 one envelope's reception (gRPC's and Python's buffers, freed): under 5 times the envelope,
    where keeping all eight took 800 MiB."""
    victim = Victim(federation, "party0", "--greet", "party1", "--receive", "party1:done", "--timeout", "60")
    stranger = rogue("party2")  # greets nobody
    big = torch.zeros(100 * MiB // 4)
    refusals = []
    for i in range(8):
        with pytest.raises(FederationError) as refused:
            stranger.send("party0", f"junk{i}", 0, big)
        refusals.append(str(refused.value))
    why = (
        "party2 sent 'junk0' to party0, which has not greeted it: a party takes nothing but a greeting from a peer it "
        "does not talk to"
    )
    assert refusals == [f"party0 refused 'junk{i}' from party2: {why}" for i in range(8)]  # the first reason, each
    member = rogue("party1")
    member.hello(["party0"])
    member.send("party0", "done", 0, b"")
    result = victim.result()
    assert result["ok"], result
    print(f"party0's peak grew by {result['peak_mb'] - result['start_mb']:.0f} MB")  # pytest -s shows it
    assert result["peak_mb"] - result["start_mb"] < 500, result  # one envelope's reception (measured 3.2 to 3.5x)


def test_a_greeted_peer_cannot_queue_more_than_the_bound(federation, rogue):
    """Finding 3: party1, greeted, sends 100 MiB tensors under a tag party0 never reads. The first is held (a message
    of any accepted size fits an empty queue); the second is refused in one line naming party1, over
    max_queued_bytes (64 MiB), and the rest are refused before they are read. Stated bound: party0's peak grows by
    the one message held, with the copies of decoding it, and one envelope's reception: under 6.5 times the
    message (measured 4.8 to 5.4), however many follow."""
    victim = Victim(federation, "party0", "--greet", "party1", "--receive", "party1:done", "--linger", "8")
    member = rogue("party1")
    member.hello(["party0"])
    member.send("party0", "unread", 0, torch.zeros(100 * MiB // 4))
    refusals = []
    for _ in range(6):
        with pytest.raises(FederationError) as refused:
            member.send("party0", "unread", 0, torch.zeros(100 * MiB // 4))
        refusals.append(str(refused.value))
    assert refusals[0].startswith("party0 refused 'unread' from party1: party1 has 1 messages (104857")
    assert refusals[0].endswith(
        "over what party0 holds for one peer (67108864 bytes, max_queued_bytes, or 65536 messages)"
    )
    assert set(refusals) == {refusals[0]}  # the same line, without reading the rest
    result = victim.result()
    assert not result["ok"]
    assert result["error"] == refusals[0].removeprefix("party0 refused 'unread' from party1: ")
    print(f"party0's peak grew by {result['peak_mb'] - result['start_mb']:.0f} MB")  # pytest -s shows it
    assert result["peak_mb"] - result["start_mb"] < 650, result


def test_many_small_messages_under_unread_tags_stop_at_the_bound(federation, rogue):
    """Finding 3: 300 messages of 1 MiB under tags nobody reads: held up to max_queued_bytes, then refused naming
    party1; party0 grows by about that much, not by all of them."""
    victim = Victim(federation, "party0", "--greet", "party1", "--receive", "party1:done", "--timeout", "60")
    member = rogue("party1")
    member.hello(["party0"])
    sent, refusal = 0, None
    for i in range(300):
        try:
            member.send("party0", f"tag{i}", 0, torch.zeros(MiB // 4))
        except FederationError as err:
            refusal = str(err)
            break
        sent += 1
    assert 60 <= sent < 70
    assert refusal.startswith(f"party0 refused 'tag{sent}' from party1: party1 has {sent} messages")
    result = victim.result()
    assert not result["ok"]
    print(f"party0's peak grew by {result['peak_mb'] - result['start_mb']:.0f} MB")  # pytest -s shows it
    assert result["peak_mb"] - result["start_mb"] < 200, result


def test_a_payload_of_ten_million_values_is_refused_before_it_is_parsed(federation, rogue):
    """Finding 3: a 40 MB list of ten million `None`s cost 7 s and half a gigabyte to decode before its refusal. Its
    values are counted on its bytes first: refused at the millionth, in one line naming party1, within a second of
    party0's time and without the memory."""
    victim = Victim(federation, "party0", "--greet", "party1", "--receive", "party1:done", "--timeout", "60")
    member = rogue("party1")
    member.hello(["party0"])
    nones = b"\x0a\x02\x52\x00" * 10_000_000  # ten million list items, each a Value holding `none`
    payload = b"\x1a" + _varint(len(nones)) + nones  # a Value holding that list
    with pytest.raises(FederationError) as refused:
        member._post("party0", "nones", crafted("party1", "party0", "nones", payload))
    assert str(refused.value) == (
        "party0 refused 'nones' from party1: party1 sent 'nones' with more than 1048576 values (max_nodes); lvfl "
        "sends bulk data as tensors"
    )
    result = victim.result()
    assert (
        result["error"]
        == "party1 sent 'nones' with more than 1048576 values (max_nodes); lvfl sends bulk data as tensors"
    )
    print(f"party0's peak grew by {result['peak_mb'] - result['start_mb']:.0f} MB")  # pytest -s shows it
    assert result["peak_mb"] - result["start_mb"] < 200, result  # the 40 MB received, and a little


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_streams_are_bounded_per_peer_and_a_stranger_holds_none(federation, rogue):
    """Finding 6: idle streams from a party that never talks to party0 used up its server threads. Now a party it
    has not greeted cannot open a stream at all, a greeted one holds one at a time, each refusal names the peer, and
    party1's messages still arrive."""
    from lvfl.federation.outbox import STREAM

    victim = Victim(federation, "party0", "--greet", "party1", "--receive", "party1:done", "--timeout", "60")
    stranger = rogue("party2")
    idle = []
    for _ in range(20):  # as many idle streams as the audit opened, from a party party0 never greets
        call = stranger._channels["party0"].stream_unary(STREAM).future(iter(()), wait_for_ready=True)
        idle.append(call)
    codes = {call.exception(timeout=20).code() for call in idle}
    assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert idle[0].exception().details() == (
        "party2 opened a stream to party0, which has not greeted it (it talks only to its peers)"
    )
    member = rogue("party1")
    member.hello(["party0"])
    blocker = threading.Event()

    def hold() -> Iterator[bytes]:
        blocker.wait(20)
        return
        yield  # pragma: no cover

    first = member._channels["party0"].stream_unary(STREAM).future(hold(), wait_for_ready=True)
    second = member._channels["party0"].stream_unary(STREAM).future(iter(()), wait_for_ready=True)
    assert second.exception(timeout=20).details() == (
        "party1 opened a second stream to party0; a peer streams to it on one at a time"
    )
    blocker.set()
    first.result(timeout=20)
    member.send("party0", "done", 0, b"")
    assert victim.result()["ok"]


def test_failed_handshakes_add_no_log_lines(tmp_path):
    """Finding 10: every failed TLS handshake added a gRPC log line to the party's output (193 from one probe).
    `lvfl` keeps gRPC's own log to its errors: 30 handshakes with a certificate of another CA leave no line."""
    done = lvfl("pki", "--parties", "party0", "party1", "--out", str(tmp_path / "pki"))
    assert done.returncode == 0, done.stderr
    federation = tmp_path / "pki" / "federation.yaml"
    party = subprocess.Popen(  # noqa: S603 - our own command
        # a greeting waits for a late peer as long as set-up may (--setup_timeout): party1 never comes, so 15 s
        [sys.executable, "-m", "lvfl", "party", "--party", "party0", "--federation", str(federation), "--timeout", "15",
         "--setup_timeout", "15", *DIGITS, "--data.init_args.num_parties=2",
         f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    other = write_test_pki(tmp_path / "other", ["party1"])
    credentials = grpc.ssl_channel_credentials(
        other.ca_certificate.read_bytes(), other.keys["party1"].read_bytes(), other.certificates["party1"].read_bytes()
    )
    from lvfl.federation.federation_file import load_federation

    address = load_federation(federation).party("party0").address
    failed = 0
    for _ in range(30):
        channel = grpc.secure_channel(address, credentials, options=[("grpc.ssl_target_name_override", "party0")])
        try:
            grpc.channel_ready_future(channel).result(timeout=1)
        except grpc.FutureTimeoutError:
            failed += 1
        channel.close()
    assert failed == 30
    out, err = party.communicate(timeout=120)
    assert party.returncode == 2
    assert "Handshake failed" not in out + err
    assert len(errors((out, err))) == 1  # its own one line: party1 never came


@pytest.mark.parametrize("numel", [2**40, 750_000_000], ids=["4 TiB", "3 GB"])
def test_a_compressed_tensor_is_rebuilt_only_at_the_shape_the_receiver_expects(tmp_path, rogue, federation, numel):
    """Finding 2: C_VFL's compressed embeddings skipped the receiver's shape check, so a passive party chose what the
    active party rebuilt: a 200-byte message made it allocate 4 TiB (a traceback), another 3 GB. Every field of a
    compressed tensor is now checked against the receiver's shadow of it: party0, a real `lvfl party`, refuses it in
    one line naming party1 and the field, allocating nothing from the declared shape."""
    from lvfl.commands.fit import build_cli
    from lvfl.commands.party import config_fingerprint
    from lvfl.compression import CompressedTensor

    wine = ["--config", "configs/data/wine.yaml", "--config", "configs/protocols/cvfl/default.yaml", "--config",
            "configs/parties/wine.yaml", "--data.init_args.num_parties=2", "--model.init_args.parties="
            '[{"model": {"class_path": "lvfl.models.MLP", "init_args": {"hidden": [8]}}}]',
            "--trainer.max_epochs=1", "--trainer.num_sanity_val_steps=0"]  # fmt: skip
    two = write_federation(federation.path.parent / "two.yaml", ["party0", "party1"])
    fingerprint = config_fingerprint(build_cli(wine, run=False).config.as_dict())
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        party = subprocess.Popen(  # noqa: S603 - our own command
            [sys.executable, "-m", "lvfl", "party", "--party", "party0", "--federation", str(two.path), "--run_id",
             "run-1", "--timeout", "30", *wine, f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"],
            cwd=REPO, stdout=stdout, stderr=stderr,
        )  # fmt: skip
        member = Transport("party1", two, "run-1", timeout=60, fingerprint=fingerprint).start()
        try:
            member.hello(["party0"])
            crafted_tensor = CompressedTensor(
                (numel,), torch.float32, 8, torch.zeros(1, dtype=torch.uint8), torch.tensor(0.0), torch.tensor(1.0),
                torch.tensor([0]),
            )  # fmt: skip
            member.send("party0", "embeddings", 0, crafted_tensor)  # accepted: the form is checked where it is read
            peak_kib = peak_while_running(party.pid)
            _, status, _ = os.wait4(party.pid, 0)
        finally:
            member.close()
    lines = [line for line in err.read_text().splitlines() if line.startswith("lvfl: error:")]
    assert os.waitstatus_to_exitcode(status) == 2, err.read_text()[-3000:]
    assert "Traceback" not in err.read_text()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"lvfl: error: party1 sent 'embeddings' at .shape as ({numel},); expected (")
    assert 0 < peak_kib < 2.5 * 2**20, peak_kib  # KiB: nothing of the declared 3 GB (or 4 TiB) allocated


def peak_while_running(pid: int) -> int:
    """The peak resident memory (VmHWM, KiB) of process `pid` as last read before it exited, polled every 20 ms.

    Read from /proc while it runs, since a child's `ru_maxrss` also counts the parent it was forked from.
    """
    peak = 0
    while True:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return peak
        if "VmHWM:" not in status:  # exited: a zombie until it is waited for
            return peak
        peak = max(peak, int(status.split("VmHWM:")[1].split()[0]))
        time.sleep(0.02)


# ------------------------------------------------------------------------------------------------- what held, kept
def _tensor_value(dtype: str, shape: list[int], data: bytes) -> bytes:
    from lvfl.federation import envelope_pb2 as pb

    return pb.Value(tensor=pb.Tensor(dtype=dtype, shape=shape, data=data)).SerializeToString()


PROBES = {  # what the audits sent and the party refused, each kept: (the bytes party1 posts, the refusal)
    "another sender's name": (
        lambda: crafted("party2", "party0", "x", _tensor_value("float32", [1], b"\0" * 4)),
        "party1 (by its certificate) sent 'x' in an envelope claiming to be from 'party2'",
    ),
    "a pickle": (
        lambda: __import__("pickle").dumps({"payload": [1, 2, 3]}),
        "party1 sent 35 bytes that are not an lvfl envelope",
    ),
    "an unknown dtype": (
        lambda: crafted("party1", "party0", "x", _tensor_value("float128", [1], b"\0" * 16)),
        "party1 sent 'x' with a tensor of unknown dtype 'float128'",
    ),
    "a shape that overflows": (
        lambda: crafted("party1", "party0", "x", _tensor_value("float32", [2**40, 2**40], b"\0" * 4)),
        "party1 sent 'x' with a float32 [1099511627776, 1099511627776] tensor: a shape too large for any tensor",
    ),
    "deep nesting": (
        lambda: crafted("party1", "party0", "x", _nested(40)),
        "party1 sent 'x' with values nested deeper than 16 levels",
    ),
}


def _nested(levels: int) -> bytes:
    from lvfl.federation import envelope_pb2 as pb

    value = pb.Value(none=pb.Null())
    for _ in range(levels):
        value = pb.Value(list=pb.Items(items=[value]))
    return value.SerializeToString()


@pytest.mark.parametrize("probe", list(PROBES), ids=list(PROBES))
def test_the_probes_that_held_are_still_refused_in_one_line(federation, rogue, probe):
    """The audits' probes that held, against a party's own process: each refused in one line naming party1 and the
    fault, before anything is allocated from what the message declares."""
    data, refusal = PROBES[probe]
    victim = Victim(federation, "party0", "--greet", "party1", "--receive", "party1:x", "--timeout", "30")
    member = rogue("party1")
    member.hello(["party0"])
    with pytest.raises(FederationError, match="^party0 refused 'x' from party1: " if probe != "a pickle" else None):
        member._post("party0", "x", data())
    result = victim.result()
    assert not result["ok"]
    assert result["error"].startswith(refusal), result["error"]
    assert "\n" not in result["error"]


def test_a_replayed_message_is_refused_by_the_partys_process(federation, rogue):
    """A message replayed (the same sequence number twice) is refused, naming party1: sequence numbers count each
    (sender, receiver, tag) from 0."""
    victim = Victim(federation, "party0", "--greet", "party1", "--receive", "party1:x", "party1:x", "--timeout", "30")
    member = rogue("party1")
    member.hello(["party0"])
    message = crafted("party1", "party0", "x", _tensor_value("float32", [1], b"\0" * 4))
    member._post("party0", "x", message)
    with pytest.raises(FederationError, match="party1 sent 'x' message #0; party0 expected #1"):
        member._post("party0", "x", message)
    result = victim.result()
    assert result["error"] == "party1 sent 'x' message #0; party0 expected #1 (a message was lost or replayed)"
