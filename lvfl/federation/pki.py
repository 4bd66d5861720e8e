"""A throw-away certificate authority for tests and local runs, and the checks every party runs on certificates.

Why a PKI at all: mutual TLS lets each party prove its name to the others with a certificate, so the transport
knows who sent a message from the connection itself rather than from what the message claims. A real deployment
would use certificates from its own CA; `write_test_pki` makes one on the spot.

Layout written by `write_test_pki(out_dir, ["party0", "party1"])`:

- ``ca.pem``: a self-signed CA (ECDSA P-256), allowed to sign party certificates only. Its key goes where
  `ca_key` says (``ca.key`` in the folder by default, for tests that issue more certificates; `lvfl pki` writes it
  apart from the folder, `lvfl launch` never writes it): whoever holds it can mint a certificate for any name.
- ``<party>.pem`` / ``<party>.key``: each party's certificate (subject CN and a DNS SAN equal to the party name,
  plus a SAN for each host that party is reached at, and no other party's; usable for TLS server and client
  authentication) and key.

Every party pins every certificate (the federation file lists them), on both ends of a connection: a server accepts
a client only with the certificate pinned for a party, and a client trusts a server only with the certificate
pinned for the peer it dials (`lvfl.federation.outbox`), so neither another party's certificate nor one freshly
minted with the CA's key passes for a party.

Keys are written with mode 0600, and `check_key` refuses one that others may read. The checks (`check_certificate`,
`check_key`) raise a one-line `FederationError` naming the file and the fault: expired, not yet valid, not signed by
the CA, issued to another name, or a key readable by others.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lvfl.federation import FederationError

__all__ = [
    "CA_CERTIFICATE",
    "CA_KEY",
    "DEFAULT_HOSTS",
    "IN_FOLDER",
    "PKIFiles",
    "certificate_fingerprint",
    "certificate_names",
    "check_ca",
    "check_certificate",
    "check_key",
    "check_party_name",
    "issue_certificate",
    "load_certificate",
    "write_test_pki",
]

CA_CERTIFICATE = "ca.pem"
CA_KEY = "ca.key"
#: the hosts a test certificate is valid for besides the party's own name
DEFAULT_HOSTS = ("localhost", "127.0.0.1")
#: a party name: it becomes a DNS name in the certificate, so letters, digits, '-', '_' and '.' only
_PARTY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def check_party_name(name: str) -> str:
    """Return `name` if it can be a party's certificate name, else raise (one line naming it)."""
    if not isinstance(name, str) or not _PARTY_NAME.fullmatch(name):
        raise FederationError(
            f"party name {name!r} cannot name a certificate: use 1-63 letters, digits, '-', '_' or '.', "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class PKIFiles:
    """Where `write_test_pki` put the CA and each party's certificate and key."""

    directory: Path
    ca_certificate: Path
    ca_key: Path | None  # None: not written (the CA's key existed only while it signed)
    certificates: dict[str, Path]
    keys: dict[str, Path]


#: `write_test_pki`'s default for `ca_key`: ``ca.key`` in the folder it writes
IN_FOLDER = "in-folder"


# ------------------------------------------------------------------------------------------------- writing
def write_test_pki(
    out_dir: str | os.PathLike[str],
    party_names: Sequence[str],
    hosts: Sequence[str] = DEFAULT_HOSTS,
    days: float = 30,
    *,
    party_hosts: Mapping[str, Sequence[str]] | None = None,
    ca_key: str | os.PathLike[str] | None = IN_FOLDER,
) -> PKIFiles:
    """Write a fresh CA and a certificate and key per party into `out_dir` (created if missing).

    Args:
        out_dir: the folder; existing files of the same names are replaced.
        party_names: one certificate each, CN and DNS SAN = the name.
        hosts: extra SANs on every party certificate (DNS names or IP addresses every party is reached at, such as
            localhost on one machine).
        days: validity from now; 0 or less writes party certificates that have already expired (for tests). The CA
            is valid for at least a day either way.
        party_hosts: extra SANs on one party's certificate only, by party name (where that party listens); no
            certificate names another party's host.
        ca_key: where to write the CA's private key (mode 0600): ``ca.key`` in `out_dir` by default, a path, or
            None to write it nowhere (no certificate can be added to this CA later, and none can be forged with it).

    Example:
        >>> import tempfile
        >>> pki = write_test_pki(tempfile.mkdtemp(), ["party0", "party1"], ca_key=None)
        >>> check_certificate(pki.certificates["party1"], pki.ca_certificate, "party1").subject.rfc4514_string()
        'CN=party1'
        >>> pki.ca_key is None
        True
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = [check_party_name(name) for name in party_names]
    if len(set(names)) != len(names):
        raise FederationError(f"party names must be distinct, got {names}")
    unknown = sorted(set(party_hosts or {}) - set(names))
    if unknown:
        raise FederationError(f"party_hosts names {unknown}, which are not among the parties {names}")
    signer = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"lvfl test CA {os.urandom(4).hex()}")])
    since, until = _validity(max(days, 1))
    ca_certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(signer.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(since)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(signer.public_key()), critical=False)
        .sign(signer, hashes.SHA256())
    )
    ca_pem = out / CA_CERTIFICATE
    ca_pem.write_bytes(ca_certificate.public_bytes(serialization.Encoding.PEM))
    ca_key_path = None if ca_key is None else out / CA_KEY if ca_key == IN_FOLDER else Path(ca_key)
    if ca_key_path is not None:
        ca_key_path.parent.mkdir(parents=True, exist_ok=True)
        _write_key(ca_key_path, signer)
    certificates, keys = {}, {}
    for name in names:
        own = [*hosts, *(party_hosts or {}).get(name, ())]
        certificates[name], keys[name] = _issue(ca_certificate, signer, name, out, own, days)
    return PKIFiles(out, ca_pem, ca_key_path, certificates, keys)


def issue_certificate(
    ca_certificate: str | os.PathLike[str],
    ca_key: str | os.PathLike[str],
    name: str,
    out_dir: str | os.PathLike[str],
    hosts: Sequence[str] = DEFAULT_HOSTS,
    days: float = 30,
) -> tuple[Path, Path]:
    """Sign a new key for party `name` with the CA; writes and returns ``<name>.pem`` and ``<name>.key``.

    `days` of 0 or less gives a certificate that expired `-days` days ago (and became valid a day before that),
    which is how the tests make an expired one.
    """
    check_party_name(name)
    ca = load_certificate(ca_certificate)
    signer = serialization.load_pem_private_key(Path(ca_key).read_bytes(), password=None)
    if not isinstance(signer, ec.EllipticCurvePrivateKey):
        raise FederationError(f"CA key {ca_key} is not an ECDSA key")
    return _issue(ca, signer, name, Path(out_dir), hosts, days)


def _issue(
    ca: x509.Certificate, signer: ec.EllipticCurvePrivateKey, name: str, out: Path, hosts: Sequence[str], days: float
) -> tuple[Path, Path]:
    """`issue_certificate` with the CA's certificate and key in memory."""
    check_party_name(name)
    key = ec.generate_private_key(ec.SECP256R1())
    since, until = _validity(days)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(since)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.SubjectAlternativeName(_alt_names(name, hosts)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False)
        .sign(signer, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True)
    pem, key_path = out / f"{name}.pem", out / f"{name}.key"
    pem.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    return pem, key_path


def _validity(days: float) -> tuple[datetime.datetime, datetime.datetime]:
    """(not before, not after): valid from a day ago (clock skew between parties) for `days` from now."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    until = now + datetime.timedelta(days=days)
    return min(now, until) - datetime.timedelta(days=1), until


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _alt_names(name: str, hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.DNSName(name)]
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if host != name:
                names.append(x509.DNSName(host))
    return names


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write `key` as unencrypted PKCS#8 PEM, readable by its owner only (mode 0600, even over an older file)."""
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------------- checking
def load_certificate(path: str | os.PathLike[str]) -> x509.Certificate:
    """The PEM certificate in `path`; a one-line `FederationError` if it is missing or not a certificate."""
    try:
        return x509.load_pem_x509_certificate(Path(path).read_bytes())
    except OSError as err:
        raise FederationError(f"certificate {path}: cannot read it ({err.strerror or err})") from None
    except ValueError:
        raise FederationError(f"certificate {path} is not a PEM X.509 certificate") from None


def _check_dates(certificate: x509.Certificate, path: str | os.PathLike[str], now: datetime.datetime | None) -> None:
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if now > certificate.not_valid_after_utc:
        raise FederationError(f"certificate {path} expired on {certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    if now < certificate.not_valid_before_utc:
        raise FederationError(
            f"certificate {path} is not valid before {certificate.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )


def check_ca(path: str | os.PathLike[str], now: datetime.datetime | None = None) -> x509.Certificate:
    """The CA certificate in `path`, refused if out of its validity period or not a CA."""
    ca = load_certificate(path)
    _check_dates(ca, path, now)
    try:
        constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise FederationError(f"certificate {path} is not a CA certificate (no basicConstraints CA:TRUE)")
    return ca


def certificate_names(certificate: x509.Certificate) -> tuple[list[str], list[str]]:
    """(common names, DNS subject alternative names) of `certificate`."""
    common = [str(a.value) for a in certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = san.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        dns = []
    return common, dns


def check_certificate(
    path: str | os.PathLike[str],
    ca_path: str | os.PathLike[str],
    name: str,
    now: datetime.datetime | None = None,
) -> x509.Certificate:
    """The certificate of party `name` in `path`, refused unless it is valid now, signed by the CA and names it.

    "Names it": the subject's CN is `name` and `name` is among its DNS SANs (the transport matches the SAN when it
    connects, and reads the CN to know who connected).

    Raises:
        FederationError: one line naming `path` and the fault.
    """
    ca = check_ca(ca_path, now)
    certificate = load_certificate(path)
    _check_dates(certificate, path, now)
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise FederationError(f"certificate {path} is not signed by the CA in {ca_path}") from None
    common, dns = certificate_names(certificate)
    if common != [name] or name not in dns:
        raise FederationError(
            f"certificate {path} is issued to CN={','.join(common) or '(none)'} with DNS names {dns}, "
            f"not to party {name!r}"
        )
    return certificate


def check_key(key_path: str | os.PathLike[str], certificate_path: str | os.PathLike[str]) -> bytes:
    """The PEM private key in `key_path`, refused unless it is its owner's alone, unencrypted and the certificate's.

    "Its owner's alone": on a POSIX system, no permission for the group or others (``chmod 600``), as `ssh` refuses
    a private key others can read: a key others can read may have been copied, and the party it names with it.
    """
    try:
        mode = os.stat(key_path).st_mode
    except OSError as err:
        raise FederationError(f"private key {key_path}: cannot read it ({err.strerror or err})") from None
    if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise FederationError(
            f"private key {key_path} is readable by others (mode {stat.S_IMODE(mode):04o}): a key others can read "
            f"may be copied, and whoever holds it is this party to its peers; chmod 600 {key_path}"
        )
    try:
        data = Path(key_path).read_bytes()
        key = serialization.load_pem_private_key(data, password=None)
    except OSError as err:
        raise FederationError(f"private key {key_path}: cannot read it ({err.strerror or err})") from None
    except (ValueError, TypeError):
        raise FederationError(f"private key {key_path} is not an unencrypted PEM private key") from None
    certificate = load_certificate(certificate_path)
    if key.public_key() != certificate.public_key():
        raise FederationError(f"private key {key_path} does not belong to certificate {certificate_path}")
    return data


def certificate_fingerprint(certificate: x509.Certificate | bytes) -> str:
    """SHA-256 of the certificate's DER encoding, in hex: the pin a party's certificate is recognised by.

    Accepts a certificate or its PEM bytes (what gRPC's auth context holds).
    """
    if isinstance(certificate, bytes):
        certificate = x509.load_pem_x509_certificate(certificate)
    return hashlib.sha256(certificate.public_bytes(serialization.Encoding.DER)).hexdigest()
