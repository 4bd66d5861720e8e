"""`lvfl pki`: a test certificate authority, a certificate and key per party, and a federation file.

`lvfl pki --parties A B ... --out DIR` writes them for trying a federation across machines
(docs/two-organisations.md); an organisation's real PKI replaces it. The certificates and their checks are
`lvfl.federation.pki`'s; this module is the command's options and wording.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lvfl.commands.errors import OneLineParser, debug_requested, reported_errors
from lvfl.federation.federation_file import write_federation
from lvfl.federation.pki import DEFAULT_HOSTS, write_test_pki

__all__ = ["main", "pki_parser"]


def pki_parser() -> argparse.ArgumentParser:
    """`lvfl pki`'s options."""
    parser = OneLineParser(
        prog="lvfl pki",
        description="Write a test certificate authority, a certificate and key per party, and a federation file.",
    )
    parser.add_argument("--parties", nargs="+", required=True, help="the party names (party0 party1 ...)")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write into")
    parser.add_argument(
        "--address",
        nargs="*",
        default=[],
        metavar="PARTY=HOST:PORT",
        help="where a party listens (default: localhost on a free port); HOST goes on that party's certificate only",
    )
    parser.add_argument(
        "--hosts", nargs="*", default=None, help="extra names or IPs every party certificate is valid for"
    )
    parser.add_argument("--days", type=float, default=30, help="the certificates' validity in days (default 30)")
    parser.add_argument(
        "--ca-key",
        type=Path,
        default=None,
        help="where to write the CA's private key, outside the folder the parties get (default: OUT-ca.key beside "
        "OUT); it mints certificates every party accepts from the CA, so keep it off the parties' machines",
    )
    return parser


def main(argv: list[str]) -> None:
    """`lvfl pki`: the test PKI and federation file for the named parties."""
    debug, argv = debug_requested(argv)
    with reported_errors(debug):
        own = pki_parser().parse_args(argv)
        addresses: dict[str, Any] = {}
        for item in own.address:
            name, sep, address = item.partition("=")
            if not sep or name not in own.parties:
                raise ValueError(f"--address {item!r}: write PARTY=HOST:PORT for one of --parties {own.parties}")
            addresses[name] = address
        ca_key = own.ca_key if own.ca_key is not None else own.out.parent / f"{own.out.name}-ca.key"
        if ca_key.resolve().parent == own.out.resolve():
            raise ValueError(
                f"--ca-key {ca_key}: the CA's key must not go into --out {own.out}, the folder the parties get "
                "their certificates from"
            )
        hosts = [*DEFAULT_HOSTS, *(own.hosts or [])]
        own_hosts = {name: [address.rpartition(":")[0].strip("[]")] for name, address in addresses.items()}
        files = write_test_pki(
            own.out, own.parties, hosts=list(dict.fromkeys(hosts)), days=own.days, party_hosts=own_hosts, ca_key=ca_key
        )
        federation = write_federation(own.out / "federation.yaml", own.parties, addresses=addresses)
        print(f"lvfl pki: wrote the CA {files.ca_certificate}, {len(own.parties)} party certificates and keys, and")
        print(f"  the federation file {federation.path}; give each party its own <party>.key and no other")
        print(f"  the CA's key is {files.ca_key}, apart: it mints certificates for any name; keep it off every party's")
        print("  machine, or delete it once no party is to be added")
