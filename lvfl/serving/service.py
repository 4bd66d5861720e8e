"""Serving's calls by name: the gRPC services and methods, the HTTP paths, and what both ends of a call agree on.

`lvfl/serving/serving.proto` is the schema; this module names its calls once, each with its request and reply
messages (`Method`), so a server and its clients build them from one place and neither imports the other's module:

- `Contributions`: a passive party's service (`contributions.ContributionServer`), called by the active party's
  `scorer.Scorer` over mutual TLS;
- `Scoring`: the active party's scoring API (`api.ScoringService`), called by its applications and
  `lvfl score --server` (`client.ScoringClient`); its HTTP/JSON twin (`http_endpoint.HttpEndpoint`) answers
  `SCORE_PATH` and `HEALTH_PATH`.

Both ends share the message size limit, the most lookups one call holds, the mode a greeting states, the layout of
a contribution reply's values (`contribution_bytes`, `contributions_of`), and the rule that the scoring API is
served and asked on this machine only (`check_loopback`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import torch
from google.protobuf.message import Message

from lvfl.federation.federation_file import parse_address
from lvfl.serving import serving_pb2 as pb

__all__ = [
    "CONTRIBUTE",
    "CONTRIBUTIONS",
    "CONTRIBUTION_DTYPE",
    "GREET",
    "HEALTH_PATH",
    "LOOKUP",
    "MAX_LOOKUPS",
    "MAX_MESSAGE_BYTES",
    "MAX_REQUEST_IDS",
    "MEMBERS",
    "OFFER",
    "PREPARE",
    "SCORE",
    "SCORE_PATH",
    "SCORING",
    "TABLE",
    "Method",
    "check_loopback",
    "contribution_bytes",
    "contributions_of",
    "mode_name",
]

CONTRIBUTIONS = "lvfl.serving.Contributions"  #: a passive party's service, between the parties (mutual TLS)
SCORING = "lvfl.serving.Scoring"  #: the active party's scoring API, on its machine only
SCORE_PATH = "/score"  #: the HTTP endpoint's scoring path (POST)
HEALTH_PATH = "/health"  #: the HTTP endpoint's health path (GET)
MAX_MESSAGE_BYTES = 256 * 2**20  #: the largest message a serving party receives or sends
MAX_LOOKUPS = 4096  #: the most oblivious queries one Lookup call may hold
MAX_REQUEST_IDS = 100_000  #: the most IDs and rows one scoring request may hold (a client splits a longer batch)
#: the items of `ContributionReply.values`: float32, little-endian (row-major, in `ContributionReply.shape`)
CONTRIBUTION_DTYPE = np.dtype("<f4")


@dataclass(frozen=True)
class Method:
    """One unary call of serving.proto: its service, its name, and its request and reply messages."""

    service: str
    name: str
    request: type[Message]
    reply: type[Message]

    @property
    def path(self) -> str:
        """The call's name on the wire: ``/package.Service/Method``."""
        return f"/{self.service}/{self.name}"

    def stub(self, channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable:
        """A client's callable for this method on `channel`."""
        return channel.unary_unary(self.path, self.request.SerializeToString, self.reply.FromString)

    def handler(self, answer: Callable[[Any, grpc.ServicerContext], Message]) -> grpc.RpcMethodHandler:
        """A server's handler answering this method with `answer(request, context)`."""
        return grpc.unary_unary_rpc_method_handler(answer, self.request.FromString, self.reply.SerializeToString)


GREET = Method(CONTRIBUTIONS, "Greet", pb.Greeting, pb.Greeting)
TABLE = Method(CONTRIBUTIONS, "Table", pb.TableRequest, pb.TableReply)
MEMBERS = Method(CONTRIBUTIONS, "Members", pb.MembershipRequest, pb.MembershipReply)
CONTRIBUTE = Method(CONTRIBUTIONS, "Contribute", pb.ContributionRequest, pb.ContributionReply)
OFFER = Method(CONTRIBUTIONS, "Offer", pb.PrepareRequest, pb.PrepareReply)
PREPARE = Method(CONTRIBUTIONS, "Prepare", pb.PrepareRequest, pb.PrepareReply)
LOOKUP = Method(CONTRIBUTIONS, "Lookup", pb.LookupRequest, pb.LookupReply)
SCORE = Method(SCORING, "Score", pb.ScoreRequest, pb.ScoreReply)


def mode_name(oblivious: bool) -> str:
    """The mode's name in a greeting and a log line."""
    return "oblivious" if oblivious else "plain"


def contribution_bytes(values: torch.Tensor) -> bytes:
    """A passive party's contributions (on the CPU) as `ContributionReply.values`."""
    values = values.detach().to(torch.float32).contiguous()
    return values.numpy().astype(CONTRIBUTION_DTYPE, copy=False).tobytes()


def contributions_of(data: bytes, shape: Sequence[int]) -> torch.Tensor:
    """`ContributionReply.values` as a tensor of `shape`, on memory of its own (the reply's length checked before)."""
    return torch.from_numpy(np.frombuffer(data, dtype=CONTRIBUTION_DTYPE).copy()).reshape(*shape)


def check_loopback(address: str, option: str) -> tuple[str, int]:
    """(host, port) of `address`, refused unless the host is this machine's loopback (named by `option`)."""
    try:
        host, port = parse_address(address)
    except ValueError as err:
        raise ValueError(f"{option} {err}") from None
    loopback = host == "localhost"
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
    if not loopback:
        raise ValueError(
            f"{option} {address}: the scoring API answers anyone who connects, without TLS, so lvfl serves it on "
            "this machine only (127.0.0.1, ::1 or localhost); the parties talk over the federation's mutual TLS"
        )
    return host, port
