"""`Readiness`: whether the active party answers with the VFL model now: every passive party connected and greeted.

`GET /health` and the gRPC health service (`grpc.health.v1`) report it, so a load balancer or an operator sees a
degraded server: which passive party is missing, and why. Each passive party's channel is watched by gRPC's
connectivity callbacks, so no call is made to find out. A party whose process dies drops its connection, and its
channel leaves READY at once. A party that is back is dialled every `RETRY_SECONDS` and, once connected, greeted
again before it counts as ready: the greeting checks that it serves the same export.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping

import grpc

__all__ = ["RETRY_SECONDS", "Readiness"]

RETRY_SECONDS = 0.25  #: how often a passive party that is not connected is dialled again


def _nudge(state: grpc.ChannelConnectivity) -> None:
    """A subscriber for one moment: subscribing it asks the channel to connect (gRPC has no public call for that)."""


class Readiness:
    """The passive parties' state as the active party's server sees it (see the module docstring).

    Args:
        channels: the channel to each passive party.
        greet: greets one passive party: "" when it serves this export, else why not (in words).
        greeted: what the start-up greeting found per party ("" or why not).
    """

    def __init__(
        self, channels: Mapping[str, grpc.Channel], greet: Callable[[str], str], greeted: Mapping[str, str]
    ) -> None:
        self._channels, self._greet = dict(channels), greet
        self._why = {peer: greeted.get(peer, "not greeted yet") for peer in self._channels}
        self._connected = dict.fromkeys(self._channels, False)
        self._changed = threading.Condition()
        self._closing = threading.Event()
        self._listeners: list[Callable[[bool], None]] = []
        self._callbacks = {peer: functools.partial(self._state, peer) for peer in self._channels}
        for peer, channel in self._channels.items():
            channel.subscribe(self._callbacks[peer], try_to_connect=True)
        self._watching = threading.Thread(target=self._watch, daemon=True, name="lvfl-readiness")
        self._watching.start()

    def missing(self) -> dict[str, str]:
        """Each passive party that is not ready, and why; empty when the server is ready."""
        with self._changed:
            return {
                peer: why or f"{peer} is unreachable (its connection dropped)"
                for peer, why in self._why.items()
                if why or not self._connected[peer]
            }

    def ready(self) -> bool:
        """Whether every passive party is connected and serves this export."""
        return not self.missing()

    def listen(self, fn: Callable[[bool], None]) -> None:
        """Call `fn(ready)` now and whenever readiness may have changed (the gRPC health service's status)."""
        self._listeners.append(fn)
        fn(self.ready())

    def close(self) -> None:
        """Stop watching."""
        self._closing.set()
        for peer, channel in self._channels.items():
            channel.unsubscribe(self._callbacks[peer])
        with self._changed:
            self._changed.notify_all()
        self._watching.join(5)

    def _state(self, peer: str, state: grpc.ChannelConnectivity) -> None:
        connected = state == grpc.ChannelConnectivity.READY
        with self._changed:
            if self._connected.get(peer) == connected:
                return
            self._connected[peer] = connected
            if not connected:
                self._why[peer] = ""  # an answer to the next greeting decides, once connected again
            self._changed.notify_all()
        self._tell()

    def _watch(self) -> None:
        """Dial the parties that are not connected; greet those that connected again."""
        greeted = {peer: not why for peer, why in self._why.items()}
        while not self._closing.is_set():
            with self._changed:
                self._changed.wait(RETRY_SECONDS)
                connected = dict(self._connected)
            for peer, channel in self._channels.items():
                if self._closing.is_set():
                    return
                if not connected[peer]:
                    greeted[peer] = False
                    channel.subscribe(_nudge, try_to_connect=True)  # a connection attempt, answered by `_state`
                    channel.unsubscribe(_nudge)
                elif not greeted[peer]:
                    why = self._greet(peer)
                    greeted[peer] = not why
                    with self._changed:
                        self._why[peer] = why
                    self._tell()

    def _tell(self) -> None:
        ready = self.ready()
        for fn in list(self._listeners):
            fn(ready)
