"""Turning the wire's messages into time: link profiles, device classes and the critical path of a message schedule.

lvfl runs every party in one process and meters every byte; a deployment spreads the parties over networks. This
module answers "how long would this run take over those links" from what the run did, so it models each party's
access link and replays the schedule of messages the Wire carried, in order.

The model (exact: `simulate` is checked against hand-computed schedules in tests/test_network.py):

- Every party p has an access link (`LinkProfile`): uplink and downlink rates (Mbps, 10^6 bit/s) and a one-way
  latency (ms) to the network; a message from s to r takes the path s -> r, so its propagation delay is
  latency(s) + latency(r) (plus, with `jitter_ms`, a uniform draw in [0, jitter) per end from a seeded generator).
- Links are FIFO pipes: a message of b bytes occupies s's uplink and r's downlink together, for 8 b / min(up(s),
  down(r)) seconds, starting when both are free and s is ready; it arrives the propagation delay after its last bit
  leaves. Messages that share neither the sender's uplink nor the receiver's downlink travel in parallel.
- A party acts in program order: before it sends, it waits for every message addressed to it that was sent
  earlier in the schedule (what it needs, conservatively: a party never sends on a message it has not received),
  then computes for its measured compute time (`Message.compute_s`, the wall time the in-process run spent on its
  code since the previous message) scaled by its device class (`DeviceClass.compute_scale`).
- Each message may cost its two ends processing time (`simulate`'s `message_s`: serialization, TLS, the RPC stack):
  the sender spends it before the message enters its uplink (after its compute), the receiver after the message
  arrives, one message at a time, before the message counts as received. 0 by default (the links alone);
  `benchmarks/perf/transport_latency.py` measures lvfl's on a machine (a quarter of its localhost round trip).
- A step is synchronous: every party starts it at 0; after the last message each party waits for its inbox and
  computes the step's tail (the code after the last message: e.g. the parties' optimizer steps, run in parallel);
  the step ends when the last party is done. Its communication time is the same schedule replayed with no compute.

What it ignores: TCP slow start and congestion control, packet loss and retransmission, protocol headers and
framing, fair sharing of a link between concurrent flows (FIFO gives the same finish time for the last of them),
contention inside the network (only the access links are modelled), and overlap of computation with transfers
inside one party (a party computes, then sends). In-process compute times are those of this machine, with every
party sharing its cores; `compute_scale` stretches them for slower devices.

Presets (`LINK_PRESETS`), each a party's access link, so that two parties on one are twice its latency apart: `lan`
(1 Gbps, 0.25 ms: 0.5 ms one way between two parties), `wan` (100 Mbps, 25 ms: 50 ms one way), `100mbps_10ms`,
`50mbps_50ms`, and the EASTER paper's latency
bands at its fixed 50 Mbps (Sec. V-C: low 1-30 ms, medium 30-50 ms, high 50-100 ms; each preset is the band's
midpoint, `paper_low` 15.5 ms, `paper_medium` 40 ms, `paper_high` 75 ms), and `unlimited` (1 Tbps, no latency:
under `lvfl launch --network` it measures what the proxy itself costs). Device classes (`DEVICE_CLASSES`): the
paper's high-performance (high bandwidth, low latency) and low-performance (low bandwidth, high latency) devices of
Table VII, whose rates the paper does not state: lvfl's `high` is 1 Gbps / 5 ms at compute scale 1, `low` 20 Mbps /
80 ms at compute scale 4 (a device four times slower).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "DEVICE_CLASSES",
    "LINK_PRESETS",
    "DeviceClass",
    "LinkProfile",
    "Message",
    "StepTime",
    "simulate",
]


@dataclass(frozen=True)
class LinkProfile:
    """A party's access link: uplink and downlink in Mbps (10^6 bit/s), one-way latency and jitter in ms."""

    up_mbps: float
    down_mbps: float
    latency_ms: float
    jitter_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("up_mbps", "down_mbps"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"LinkProfile.{name} must be a finite rate > 0 (Mbps), got {value!r}")
        for name in ("latency_ms", "jitter_ms"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"LinkProfile.{name} must be a finite time >= 0 (ms), got {value!r}")


@dataclass(frozen=True)
class DeviceClass:
    """A kind of party device: its access link and how much slower than this machine it computes."""

    link: LinkProfile
    compute_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.compute_scale) and self.compute_scale > 0):
            raise ValueError(f"DeviceClass.compute_scale must be a finite factor > 0, got {self.compute_scale!r}")


LINK_PRESETS: dict[str, LinkProfile] = {
    "lan": LinkProfile(1000.0, 1000.0, 0.25),
    "wan": LinkProfile(100.0, 100.0, 25.0),
    "100mbps_10ms": LinkProfile(100.0, 100.0, 10.0),
    "50mbps_50ms": LinkProfile(50.0, 50.0, 50.0),
    "paper_low": LinkProfile(50.0, 50.0, 15.5),
    "paper_medium": LinkProfile(50.0, 50.0, 40.0),
    "paper_high": LinkProfile(50.0, 50.0, 75.0),
    "unlimited": LinkProfile(1e6, 1e6, 0.0),
}

DEVICE_CLASSES: dict[str, DeviceClass] = {
    "high": DeviceClass(LinkProfile(1000.0, 1000.0, 5.0), compute_scale=1.0),
    "low": DeviceClass(LinkProfile(20.0, 20.0, 80.0), compute_scale=4.0),
}


@dataclass(frozen=True)
class Message:
    """One message of a schedule: who sent it to whom, its bytes, and the sender's compute before it (seconds)."""

    src: str
    dst: str
    nbytes: int
    compute_s: float = 0.0


@dataclass(frozen=True)
class StepTime:
    """A simulated step: its duration with compute (`step_s`), with no compute (`comm_s`), and each arrival time."""

    step_s: float
    comm_s: float
    arrivals: tuple[float, ...] = field(default=())


def _replay(
    schedule: Sequence[Message],
    links: Mapping[str, LinkProfile],
    scale: Mapping[str, float],
    tail_s: float,
    compute: bool,
    rng: random.Random | None,
    message_s: float = 0.0,
) -> tuple[float, list[float]]:
    ready: dict[str, float] = {}  # when each party has done its last computation
    inbox: dict[str, float] = {}  # the latest arrival of a message addressed to it
    handled: dict[str, float] = {}  # when each party's receiving end is done with the messages so far
    up_free: dict[str, float] = {}
    down_free: dict[str, float] = {}
    arrivals = []
    for m in schedule:
        for party in (m.src, m.dst):
            if party not in links:
                raise KeyError(f"party {party!r} has no link profile (profiles for {sorted(links)})")
        start_compute = max(ready.get(m.src, 0.0), inbox.get(m.src, 0.0))
        ready[m.src] = start_compute + (m.compute_s * scale.get(m.src, 1.0) if compute else 0.0) + message_s
        rate = min(links[m.src].up_mbps, links[m.dst].down_mbps) * 1e6
        start = max(ready[m.src], up_free.get(m.src, 0.0), down_free.get(m.dst, 0.0))
        done = start + 8.0 * m.nbytes / rate
        up_free[m.src] = down_free[m.dst] = done
        delay = links[m.src].latency_ms + links[m.dst].latency_ms
        if rng is not None:
            delay += rng.uniform(0.0, links[m.src].jitter_ms) + rng.uniform(0.0, links[m.dst].jitter_ms)
        arrival = done + delay / 1e3
        if message_s:  # the receiving end takes the messages one at a time
            arrival = handled[m.dst] = max(arrival, handled.get(m.dst, 0.0)) + message_s
        inbox[m.dst] = max(inbox.get(m.dst, 0.0), arrival)
        arrivals.append(arrival)
    parties = set(ready) | set(inbox)
    end = 0.0
    for party in parties:
        finish = max(ready.get(party, 0.0), inbox.get(party, 0.0))
        if compute:
            finish += tail_s * scale.get(party, 1.0)
        end = max(end, finish)
    if compute and not parties:
        end = tail_s * max(scale.values(), default=1.0)
    return end, arrivals


def simulate(
    schedule: Sequence[Message],
    links: Mapping[str, LinkProfile],
    compute_scale: Mapping[str, float] | None = None,
    tail_s: float = 0.0,
    seed: int | None = None,
    message_s: float = 0.0,
) -> StepTime:
    """The simulated duration of one step's `schedule` over `links` (see the module docstring for the model).

    Args:
        schedule: the step's messages in the order they were sent, each with its sender's compute before it.
        links: every party's access link.
        compute_scale: per party, the factor on its measured compute (its device class; default 1).
        tail_s: the compute after the last message, done by every party in parallel (scaled per party).
        seed: seeds the jitter draws (the same draws for the step's two replays); None: no jitter.
        message_s: each message's processing at each end, in seconds (with compute and without: it is the stack's).

    Returns:
        `StepTime(step_s, comm_s, arrivals)`: with compute, with no compute, and each message's arrival (with compute).
    """
    if not (math.isfinite(message_s) and message_s >= 0):
        raise ValueError(f"message_s must be a finite time >= 0 (s), got {message_s!r}")
    scale = dict(compute_scale or {})
    jitter = seed is not None and any(link.jitter_ms for link in links.values())
    draws = (lambda: random.Random(seed)) if jitter else (lambda: None)  # noqa: S311 - jitter, not secrets
    step, arrivals = _replay(schedule, links, scale, tail_s, True, draws(), message_s)
    comm, _ = _replay(schedule, links, scale, 0.0, False, draws(), message_s)
    return StepTime(step_s=step, comm_s=comm, arrivals=tuple(arrivals))
