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
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from helpers import REPO

from lvfl.federation import FederationError
from lvfl.federation.federation_file import Federation, write_federation
from lvfl.federation.pki import PKIFiles, issue_certificate, write_test_pki
from lvfl.federation.transport import Transport

pytestmark = pytest.mark.slow  # party processes

NAMES = ["party0", "party1", "party2"]
FINGERPRINT = "model=1,data=2,seed=3,trainer=4"  # the victim's (tests/federation_victim.py's default)
SHORT = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
DIGITS = ["--config", "configs/easter/digits.yaml", *SHORT]


def lvfl(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m lvfl ARGS` from the repository root, output captured."""
    return subprocess.run(  # noqa: S603 - our own command
        [sys.executable, "-m", "lvfl", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


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
        kwargs.setdefault("timeout", 10.0)
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
