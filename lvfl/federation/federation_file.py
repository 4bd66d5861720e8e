"""The federation file: who the parties are, where each listens and which certificate is theirs.

Public and identical at every party (it holds no key), so every party pins the same certificate to each name::

    ca: ca.pem                 # the CA that signed every party's certificate
    parties:
      party0: {address: "bank.example.org:50051", certificate: party0.pem}
      party1: {address: "10.0.0.7:50051", certificate: party1.pem}

Paths are relative to the file. A party's private key is not in it: it is handed to that party alone, by default
``<party>.key`` beside the file (`Federation.key_path`). A party that runs as a process group of several ranks
(`lvfl party --devices N`) lists one address per rank, ``address: ["bank:50051", "bank:50052"]``: rank r of every
party talks to rank r of the others (`Federation.for_rank`), under the party's one certificate.
`load_federation` refuses an unknown key, a missing or mistyped field, a bad address, a missing file and two parties
(or ranks) at one address, each in one line naming the party and the field.
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from lvfl.federation import FederationError
from lvfl.federation.pki import CA_CERTIFICATE, check_party_name

__all__ = ["Federation", "Party", "load_federation", "parse_address", "write_federation"]

_TOP_KEYS = ("ca", "parties")
_PARTY_KEYS = ("address", "certificate")


@dataclass(frozen=True)
class Party:
    """One party as the federation file gives it: its name, the address it listens at and its certificate.

    `ranks` are the addresses of its ranks after the first, when it runs as a process group (`address` is rank 0's).
    """

    name: str
    address: str
    certificate: Path
    ranks: tuple[str, ...] = ()

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every rank's address, rank 0's (`address`) first."""
        return (self.address, *self.ranks)

    @property
    def host(self) -> str:
        """The host part of the address (an IPv6 address without its brackets)."""
        return parse_address(self.address)[0]

    @property
    def port(self) -> int:
        """The port part of the address."""
        return parse_address(self.address)[1]


@dataclass(frozen=True)
class Federation:
    """A loaded federation file: the CA and the parties, paths resolved against the file's folder."""

    path: Path
    ca: Path
    parties: Mapping[str, Party]

    def party(self, name: str) -> Party:
        """The party named `name`; one line listing the parties if there is none."""
        if name not in self.parties:
            raise FederationError(f"federation file {self.path} has no party {name!r} (parties: {list(self.parties)})")
        return self.parties[name]

    def key_path(self, name: str) -> Path:
        """Where party `name`'s private key is looked for by default: ``<name>.key`` beside the file."""
        return self.path.parent / f"{check_party_name(name)}.key"

    def for_rank(self, rank: int, ranks: int) -> Federation:
        """The federation as rank `rank` of `ranks` sees it: every party at its rank-`rank` address.

        Why: a party run as a process group of `ranks` ranks (DDP) pairs rank r with rank r of every other party;
        each rank's transport is an ordinary one over this view. Every party must list `ranks` addresses (one line
        naming the first that does not).
        """
        if ranks == 1 and all(not party.ranks for party in self.parties.values()):
            return self
        for party in self.parties.values():
            if len(party.addresses) != ranks:
                raise FederationError(
                    f"federation file {self.path}: party {party.name!r} lists {len(party.addresses)} address(es), "
                    f"but the parties run {ranks} rank(s) each (--devices): list one address per rank, "
                    f"address: [host:port, ...]"
                )
        return replace(
            self,
            parties={
                name: Party(name, party.addresses[rank], party.certificate) for name, party in self.parties.items()
            },
        )


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as (host, port); a `ValueError` saying what is wrong."""
    if not isinstance(address, str):
        raise ValueError(f"must be a string 'host:port', got {address!r}")
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{address!r}: write an IPv6 address in brackets, '[::1]:50051'")
    if not sep or not host or any(c.isspace() for c in host):
        raise ValueError(f"{address!r} is not 'host:port'")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} has no port in 1-65535")
    return host, int(port)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives a key twice (PyYAML would keep the last silently)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _check_keys(
    mapping: dict, allowed: Sequence[str], where: str, noun: str, refuse: Callable[[str], FederationError]
) -> None:
    """Refuse an unknown key of `mapping` (naming the allowed ones), then a missing one."""
    unknown = [key for key in mapping if key not in allowed]
    if unknown:
        raise refuse(f"{where}unknown {noun} {unknown[0]!r} (the {noun}s are {list(allowed)})")
    for key in allowed:
        if key not in mapping:
            raise refuse(f"{where}no {key!r}")


def load_federation(path: str | os.PathLike[str]) -> Federation:
    """Read and check the federation file at `path`.

    Raises:
        FederationError: one line naming the file, the party and the field at fault.
    """
    path = Path(path)
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 (a safe loader, keys unique)
    except OSError as err:
        raise FederationError(f"federation file {path}: cannot read it ({err.strerror or err})") from None
    except yaml.YAMLError as err:
        raise FederationError(f"federation file {path} is not valid YAML: {' '.join(str(err).split())}") from None

    def refuse(what: str) -> FederationError:
        return FederationError(f"federation file {path}: {what}")

    if not isinstance(data, dict):
        raise refuse(f"expected a mapping with keys {list(_TOP_KEYS)}, got {type(data).__name__}")
    _check_keys(data, _TOP_KEYS, "", "key", refuse)
    ca = _file(path, data["ca"], "ca")
    parties_data = data["parties"]
    if not isinstance(parties_data, dict) or len(parties_data) < 2:
        raise refuse("'parties' must map at least two party names to {address, certificate}")
    parties: dict[str, Party] = {}
    addresses: dict[tuple[str, int], str] = {}  # (host, port) -> whose, in words
    for name, entry in parties_data.items():
        try:
            check_party_name(name)
        except FederationError as err:
            raise refuse(str(err)) from None
        if not isinstance(entry, dict):
            raise refuse(f"party {name!r} must be a mapping with {list(_PARTY_KEYS)}, got {entry!r}")
        _check_keys(entry, _PARTY_KEYS, f"party {name!r} has ", "field", refuse)
        given = entry["address"]
        listed = given if isinstance(given, list) else [given]  # a process group: one address per rank
        if not listed:
            raise refuse(f"party {name!r} address must be 'host:port' or a list of them, one per rank, got []")
        for rank, address in enumerate(listed):
            which = f"address (rank {rank}) " if isinstance(given, list) else "address "
            try:
                host, port = parse_address(address)
            except ValueError as err:
                raise refuse(f"party {name!r} {which}{err}") from None
            where, whose = (host.lower(), port), repr(name) + (f" (rank {rank})" if isinstance(given, list) else "")
            if where in addresses:
                raise refuse(f"parties {addresses[where]} and {whose} have the same address {address!r}")
            addresses[where] = whose
        certificate = _file(path, entry["certificate"], f"party {name!r} certificate")
        parties[name] = Party(name, listed[0], certificate, tuple(listed[1:]))
    owners: dict[Path, str] = {}
    for party in parties.values():
        if party.certificate in owners:
            raise refuse(f"parties {owners[party.certificate]!r} and {party.name!r} have the same certificate file")
        owners[party.certificate] = party.name
    return Federation(path, ca, parties)


def _file(path: Path, value: Any, field: str) -> Path:
    """`value` as a path relative to the federation file, refused unless it names an existing file."""
    if not isinstance(value, str) or not value:
        raise FederationError(f"federation file {path}: {field} must be a file path, got {value!r}")
    resolved = path.parent / value
    if not resolved.is_file():
        raise FederationError(f"federation file {path}: {field} {value!r} is not a file ({resolved})")
    return resolved


def write_federation(
    path: str | os.PathLike[str],
    party_names: Sequence[str],
    pki_dir: str | os.PathLike[str] | None = None,
    addresses: Mapping[str, str | Sequence[str]] | None = None,
    host: str = "localhost",
    ranks: int = 1,
) -> Federation:
    """Write a federation file for the certificates of `write_test_pki`, and load it back.

    Args:
        path: the file to write.
        party_names: the parties, each with ``<name>.pem`` in `pki_dir`.
        pki_dir: the folder of ``ca.pem`` and the certificates; the file's own folder by default.
        addresses: "host:port" per party (a list, one per rank, for a process group); a party not in it gets
            `host` and a port per rank that was free when written (found by binding port 0; another process may
            take it before the party listens).
        host: the host of the addresses chosen here.
        ranks: the ranks of each party whose addresses are chosen here (`lvfl party --devices`).
    """
    path = Path(path)
    pki = Path(pki_dir) if pki_dir is not None else path.parent
    listed: dict[str, str | list[str]] = {
        name: a if isinstance(a, str) else list(a) for name, a in (addresses or {}).items()
    }
    missing = [name for name in party_names if name not in listed]
    free = iter(_free_ports(host, len(missing) * ranks))
    for name in missing:
        chosen = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for port in itertools.islice(free, ranks)]
        listed[name] = chosen[0] if ranks == 1 else chosen
    relative = Path(os.path.relpath(pki, path.parent))
    document = {
        "ca": (relative / CA_CERTIFICATE).as_posix(),
        "parties": {
            name: {"address": listed[name], "certificate": (relative / f"{name}.pem").as_posix()}
            for name in party_names
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_federation(path)


def _free_ports(host: str, count: int) -> list[int]:
    """`count` distinct ports free on `host` now: all held open together, so none is handed out twice."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1" if host == "localhost" else host, 0))
            ports.append(sock.getsockname()[1])
        return ports
