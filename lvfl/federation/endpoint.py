"""`Endpoint`: the state a party's receiving and sending sides share, and the failures each must see of the other.

`lvfl.federation.transport.Transport` is one object with its receiving side's methods (`lvfl.federation.inbox.Inbox`)
and its sending side's (`lvfl.federation.outbox.Outbox`) in modules of their own. The two share one lock and read
each other's failures: a peer this party refused is not sent to, a failed send fails a waiting `receive`, a peer's
abort stops both. What they share is here, declared once; each side declares and sets only what it owns.
"""

from __future__ import annotations

import threading
from collections import Counter

from lvfl.federation import FederationError
from lvfl.federation.codec import RecordRegistry
from lvfl.federation.federation_file import Federation

__all__ = ["Endpoint", "Key"]

Key = tuple[str, str, str]  # (src, dst, tag)


class Endpoint:
    """What both sides of a party's transport share: its name and run, one lock, the ledger and the failures."""

    # -- set by `Transport.__init__` from its arguments ----------------------------------------------------------------
    me: str
    federation: Federation
    peers: tuple[str, ...]
    run_id: str
    fingerprint: str
    records: RecordRegistry
    timeout: float
    max_message_bytes: int

    def _init_endpoint(self) -> None:
        """One lock, an empty ledger, no failure yet."""
        # one lock for both sides: a wait on either wakes on a message, a refusal, a failure, an abort or `close`
        self._cond = threading.Condition()
        self._closed = False
        # the ledger, for both directions: envelope bytes as they crossed the socket (the payload's bytes are the
        # Wire's to count, `lvfl.ledger`), and messages, which the end of a run checks against the peers' counts
        self.envelope_bytes: Counter[Key] = Counter()
        self.messages: Counter[Key] = Counter()
        self._refusals: dict[str, str] = {}  # the first refusal of each peer's messages: nothing more is read or sent
        self._aborted: str | None = None  # a peer's abort: every receive and send fails with it
        self._send_failure: str | None = None  # the first failure of a queued message

    def _raise_failure(self) -> None:
        """Raise a peer's abort, or the failure of a message queued earlier."""
        if self._aborted is not None:  # a peer stopped: sending on would only wait for it
            raise FederationError(self._aborted)
        if self._send_failure is not None:
            raise FederationError(self._send_failure)

    def _check_peer(self, name: str) -> None:
        """Refuse this party itself, or a name that is not a peer in the federation file."""
        if name == self.me:
            raise ValueError(f"party {self.me!r} cannot send to or receive from itself")
        if name not in self.peers:
            raise ValueError(f"there is no party {name!r} in {self.federation.path} (peers: {list(self.peers)})")
