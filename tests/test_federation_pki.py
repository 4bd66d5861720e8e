"""The test PKI (certificates a party can check) and the federation file (who is where, with which certificate)."""

from __future__ import annotations

import datetime
import re
import stat
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from lvfl.federation import FederationError
from lvfl.federation.federation_file import load_federation, parse_address, write_federation
from lvfl.federation.pki import (
    certificate_fingerprint,
    certificate_names,
    check_ca,
    check_certificate,
    check_key,
    check_party_name,
    issue_certificate,
    load_certificate,
    write_test_pki,
)

NAMES = ["party0", "party1", "party2"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):
    return write_test_pki(tmp_path_factory.mktemp("pki"), NAMES)


def one_line(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------------------------- PKI
def test_writes_a_ca_and_a_certificate_and_key_per_party(pki) -> None:
    assert {p.name for p in pki.directory.iterdir()} == {"ca.pem", "ca.key"} | {
        f"{n}.{ext}" for n in NAMES for ext in ("pem", "key")
    }
    for key in [pki.ca_key, *pki.keys.values()]:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    for name in NAMES:
        certificate = check_certificate(pki.certificates[name], pki.ca_certificate, name)
        common, dns = certificate_names(certificate)
        assert common == [name]
        assert dns == [name, "localhost"]
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
        check_key(pki.keys[name], pki.certificates[name])
    assert check_ca(pki.ca_certificate).extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_key_permissions_are_tightened_over_an_older_file(tmp_path: Path) -> None:
    (tmp_path / "party0.key").write_text("old")
    (tmp_path / "party0.key").chmod(0o644)
    files = write_test_pki(tmp_path, ["party0"])
    assert stat.S_IMODE(files.keys["party0"].stat().st_mode) == 0o600


def test_expired_certificate(pki, tmp_path: Path) -> None:
    pem, _ = issue_certificate(pki.ca_certificate, pki.ca_key, "party1", tmp_path, days=-1)
    with pytest.raises(FederationError) as excinfo:
        check_certificate(pem, pki.ca_certificate, "party1")
    assert re.fullmatch(
        rf"certificate {re.escape(str(pem))} expired on \d{{4}}-\d\d-\d\d \d\d:\d\d UTC", one_line(excinfo)
    )


def test_not_yet_valid_certificate(pki) -> None:
    last_week = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=7)
    with pytest.raises(FederationError, match=r"is not valid before") as excinfo:
        check_certificate(pki.certificates["party0"], pki.ca_certificate, "party0", now=last_week)
    assert str(pki.ca_certificate) in one_line(excinfo)  # the CA itself is checked first: not valid yet either


def test_certificate_from_another_ca(pki, tmp_path: Path) -> None:
    other = write_test_pki(tmp_path, ["party1"])
    with pytest.raises(FederationError) as excinfo:
        check_certificate(other.certificates["party1"], pki.ca_certificate, "party1")
    assert one_line(excinfo) == (
        f"certificate {other.certificates['party1']} is not signed by the CA in {pki.ca_certificate}"
    )


def test_certificate_of_another_party(pki) -> None:
    with pytest.raises(FederationError) as excinfo:
        check_certificate(pki.certificates["party2"], pki.ca_certificate, "party1")
    assert one_line(excinfo).endswith(
        "is issued to CN=party2 with DNS names ['party2', 'localhost'], not to party 'party1'"
    )


def test_a_party_certificate_is_not_a_ca(pki) -> None:
    with pytest.raises(FederationError, match="is not a CA certificate"):
        check_ca(pki.certificates["party0"])


def test_key_of_another_party_and_unreadable_files(pki, tmp_path: Path) -> None:
    with pytest.raises(FederationError, match=r"private key .*party2.key does not belong to certificate .*party1.pem"):
        check_key(pki.keys["party2"], pki.certificates["party1"])
    with pytest.raises(FederationError, match=r"private key .*missing.key: cannot read it"):
        check_key(tmp_path / "missing.key", pki.certificates["party1"])
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(FederationError, match=r"certificate .*junk.pem is not a PEM X.509 certificate"):
        load_certificate(tmp_path / "junk.pem")
    (tmp_path / "junk.pem").chmod(0o600)  # its owner's alone: refused for what it holds
    with pytest.raises(FederationError, match="is not an unencrypted PEM private key"):
        check_key(tmp_path / "junk.pem", pki.certificates["party1"])


def test_a_key_others_can_read_is_refused_by_name(pki, tmp_path: Path) -> None:
    """Like ssh: a private key readable or writable by its group or by others is refused, naming it and the fix."""
    copy = tmp_path / "party1.key"
    copy.write_bytes(pki.keys["party1"].read_bytes())
    for mode in (0o644, 0o640, 0o604, 0o620):
        copy.chmod(mode)
        refused = rf"private key .*party1.key is readable by others \(mode 0{mode:o}\)"
        with pytest.raises(FederationError, match=refused):
            check_key(copy, pki.certificates["party1"])
    copy.chmod(0o600)
    assert check_key(copy, pki.certificates["party1"]) == pki.keys["party1"].read_bytes()


def test_fingerprint_of_pem_and_certificate_agree(pki) -> None:
    pem = pki.certificates["party0"].read_bytes()
    assert certificate_fingerprint(pem) == certificate_fingerprint(load_certificate(pki.certificates["party0"]))
    assert certificate_fingerprint(pem) != certificate_fingerprint(pki.certificates["party1"].read_bytes())


@pytest.mark.parametrize("name", ["", "-x", "a b", "party/1", "*", "x" * 64, 3])
def test_party_names_that_cannot_name_a_certificate(name) -> None:
    with pytest.raises(FederationError, match="cannot name a certificate"):
        check_party_name(name)


# ------------------------------------------------------------------------------------------------- federation file
def test_write_and_load_a_federation(pki) -> None:
    federation = write_federation(pki.directory / "fed" / "federation.yaml", NAMES, pki_dir=pki.directory)
    text = yaml.safe_load(federation.path.read_text())
    assert text["ca"] == "../ca.pem"  # relative to the file
    assert federation.ca == pki.directory / "fed" / ".." / "ca.pem"
    assert list(federation.parties) == NAMES
    ports = {party.port for party in federation.parties.values()}
    assert len(ports) == 3
    assert all(party.host == "localhost" for party in federation.parties.values())
    assert federation.party("party1").certificate.resolve() == pki.certificates["party1"].resolve()
    assert federation.key_path("party1") == federation.path.parent / "party1.key"
    with pytest.raises(FederationError, match=r"has no party 'party9' \(parties: \['party0', 'party1', 'party2'\]\)"):
        federation.party("party9")


def test_given_addresses_are_kept(pki) -> None:
    addresses = {"party0": "10.0.0.1:50051", "party1": "[::1]:50052", "party2": "bank.example.org:443"}
    federation = write_federation(pki.directory / "given.yaml", NAMES, addresses=addresses)
    assert {n: p.address for n, p in federation.parties.items()} == addresses
    assert federation.party("party1").host == "::1"


def _write(pki, **changes) -> Path:
    """A federation file for `pki` with `changes` applied: key=value at the top, or 'party1.key'=value (None drops)."""
    document = {
        "ca": "ca.pem",
        "parties": {
            name: {"address": f"localhost:{5000 + i}", "certificate": f"{name}.pem"} for i, name in enumerate(NAMES)
        },
    }
    for key, value in changes.items():
        target, _, field = key.replace("__", ".").rpartition(".")
        where = document["parties"][target] if target else document
        if value is None:
            where.pop(field)
        else:
            where[field] = value
    path = pki.directory / "federation.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cas": "ca.pem"}, "unknown key 'cas' (the keys are ['ca', 'parties'])"),
        ({"ca": None}, "no 'ca'"),
        ({"ca": "nothing.pem"}, "ca 'nothing.pem' is not a file"),
        ({"parties": {"party0": {}}}, "'parties' must map at least two party names"),
        ({"party1__port": 5}, "party 'party1' has unknown field 'port' (the fields are ['address', 'certificate'])"),
        ({"party1__address": None}, "party 'party1' has no 'address'"),
        ({"party2__certificate": None}, "party 'party2' has no 'certificate'"),
        ({"party1__certificate": "party9.pem"}, "party 'party1' certificate 'party9.pem' is not a file"),
        ({"party1__certificate": "party0.pem"}, "parties 'party0' and 'party1' have the same certificate file"),
        ({"party1__address": "localhost"}, "party 'party1' address 'localhost' is not 'host:port'"),
        ({"party1__address": "localhost:0"}, "party 'party1' address 'localhost:0' has no port in 1-65535"),
        ({"party1__address": "localhost:70000"}, "has no port in 1-65535"),
        ({"party1__address": "::1:5000"}, "write an IPv6 address in brackets"),
        ({"party1__address": 5000}, "party 'party1' address must be a string 'host:port', got 5000"),
        ({"party1__address": "LOCALHOST:5000"}, "parties 'party0' and 'party1' have the same address 'LOCALHOST:5000'"),
    ],
)
def test_federation_file_refusals_name_the_party_and_field(pki, changes: dict, message: str) -> None:
    path = _write(pki, **changes)
    with pytest.raises(FederationError) as excinfo:
        load_federation(path)
    text = one_line(excinfo)
    assert text.startswith(f"federation file {path}: ")
    assert message in text


def test_federation_file_that_is_not_yaml_or_gives_a_key_twice(pki, tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text("ca: [unclosed\n")
    with pytest.raises(FederationError, match="is not valid YAML"):
        load_federation(path)
    path.write_text("ca: ca.pem\nparties:\n  party0: {address: 'a:1', certificate: x}\n  party0: {}\n")
    with pytest.raises(FederationError) as excinfo:
        load_federation(path)
    assert "key 'party0' given twice" in one_line(excinfo)
    with pytest.raises(FederationError, match="cannot read it"):
        load_federation(tmp_path / "missing.yaml")
    path.write_text("- a list\n")
    with pytest.raises(FederationError, match="expected a mapping"):
        load_federation(path)


def test_bad_party_name_in_the_file(pki) -> None:
    path = pki.directory / "federation.yaml"
    path.write_text(
        yaml.safe_dump(
            {"ca": "ca.pem", "parties": {"party 0": {"address": "a:1", "certificate": "x"}, "b": {}}}, sort_keys=False
        )
    )
    with pytest.raises(FederationError, match="party name 'party 0' cannot name a certificate"):
        load_federation(path)


@pytest.mark.parametrize(
    ("address", "parsed"),
    [("localhost:1", ("localhost", 1)), ("[::1]:65535", ("::1", 65535)), ("10.0.0.7:50051", ("10.0.0.7", 50051))],
)
def test_parse_address(address: str, parsed: tuple[str, int]) -> None:
    assert parse_address(address) == parsed


def test_lvfl_pki_says_where_the_ca_key_went_and_the_repository_ignores_every_key(tmp_path: Path, capsys) -> None:
    """`git add .` in a checkout where someone ran `lvfl pki` takes no private key: .gitignore covers each one."""
    import fnmatch

    from lvfl.commands import pki

    pki.main(["--parties", "bank", "retailer", "--out", str(tmp_path / "pki")])
    said = capsys.readouterr().out
    keys = sorted(tmp_path.rglob("*.key"))
    assert [k.name for k in keys] == ["bank.key", "retailer.key", "pki-ca.key"]
    assert f"the CA's key is {tmp_path / 'pki-ca.key'}, apart" in said
    patterns = [line.strip() for line in (Path(__file__).parents[1] / ".gitignore").read_text().splitlines()]
    patterns = [p for p in patterns if p and not p.startswith("#")]
    for key in keys:
        assert any(fnmatch.fnmatch(key.name, p) for p in patterns), f"{key.name} is not in .gitignore"
