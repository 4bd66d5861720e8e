"""Every party's view of a run in one process: the federation's code path without the sockets (docs/federation.md).

A party's view is the protocol module as that party's own process holds it: its own model real, every other
party's model on the meta device (a shadow), its wire a party view (`Wire(here=party, carrier=...)`). The views
of one run exchange messages through a `MemoryCarrier`, each view in its own thread, so a test can run the same
`training_step` as every party at once and compare the result with the simulation, bit for bit, at a fraction of
the cost of one process per party.
"""

from __future__ import annotations

import copy
import queue
import random
import threading
from collections import deque
from typing import Any

import numpy as np
import torch

from lvfl.crypto.signing import SimulatedIdentities
from lvfl.federation import FederationError
from lvfl.federation.expectations import check_step, conform
from lvfl.federation.link import template
from lvfl.parties import VFLBatch
from lvfl.schedule import ScheduleError
from lvfl.wire import Wire, is_shadow, shadow


class MemoryCarrier:
    """Mailboxes for every (src, dst, tag) of one run, shared by the parties' views in one process (a `Carrier`).

    A message is copied on `post` (as serializing it would), and `take` checks it against the receiver's shadow as
    the socket transport does (`lvfl.federation.expectations.conform`): a tensor of another dtype or shape, or a
    message sent at another step, is refused with one line naming the sender and the tag.
    """

    def __init__(self, timeout: float = 30.0) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.timeout = timeout
        self._boxes: dict[tuple[str, str, str], queue.Queue] = {}
        self.identities = SimulatedIdentities()  # one throw-away identity per party, shared by the views
        self._lock = threading.Lock()

    def _box(self, src: str, dst: str, tag: str) -> queue.Queue:
        with self._lock:
            return self._boxes.setdefault((src, dst, tag), queue.Queue())

    def post(self, src: str, dst: str, tag: str, step: int, payload: Any) -> None:
        """Leave a copy of `payload` in the (src, dst, tag) mailbox, stamped with `step`."""
        self._box(src, dst, tag).put((step, _copy(payload)))

    def take(self, src: str, dst: str, tag: str, step: int, expected: Any) -> Any:
        """The next (src, dst, tag) message, within the timeout, checked against `step` and `expected`."""
        try:
            sent_at, payload = self._box(src, dst, tag).get(timeout=self.timeout)
        except queue.Empty:
            raise FederationError(f"{src} did not send {tag!r} to {dst} within {self.timeout:g} s") from None
        check_step(src, dst, tag, sent_at, step)
        conform(payload, template(expected), sender=src, tag=tag)
        return payload


def _copy(payload: Any) -> Any:
    if isinstance(payload, torch.Tensor):
        return payload.detach().clone()
    if isinstance(payload, dict):
        return {k: _copy(v) for k, v in payload.items()}
    if isinstance(payload, list | tuple):
        return type(payload)(_copy(v) for v in payload)
    return copy.deepcopy(payload)


def party_view(module: Any, party: str, carrier: Any) -> Any:
    """`party`'s view of a built protocol `module`: a copy in which every other party's parameters are shadows.

    Who owns a parameter is what the protocol already declares for its optimizers (`party_parameters`: a party's
    model, and e.g. the active party's top model or aggregation weights); a module's buffers go with its
    parameters. The copy starts from `module`'s weights (the public initialisation) and keeps no key material
    (backends drop keys when copied): run `view.aggregation.setup(view.party_specs, view.active, view.wire)` in it.
    """
    view = copy.deepcopy(module)
    view.wire = Wire(here=party, carrier=carrier)
    view.hold_only(party)
    return view


def party_batch(batch: VFLBatch, party: str, active: str) -> VFLBatch:
    """`batch` as `party` holds it: its own features, the labels only at the active party, the rest shadows."""
    features = {k: (x if k == party else shadow(x)) for k, x in batch.features.items()}
    labels = batch.labels if party == active or batch.labels is None else shadow(batch.labels)
    return VFLBatch(ids=batch.ids, features=features, labels=labels)


def held_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of `module` that holds data (not a shadow), by name: what a view really holds."""
    items = list(module.named_parameters()) + list(module.named_buffers())
    return {name: t for name, t in items if not is_shadow(t)}


class Turns:
    """Every party's view of a whole run in one process, taking turns: a deployment without sockets or timing.

    Why: a message that one party's process sends and its receiver's process never takes, or a receive whose
    sender never sends, shows in a deployment only as a hang or a broken stream, and only on a busy machine. Here
    each party's view (`lvfl.commands.rehearse`) runs in its own thread, but only one runs at a time: a view runs
    until it must take a message that is not there yet, and then the next view in the config's order that can go on
    gets the turn. Each view keeps its own global random state across turns (torch's, numpy's and Python's), as
    each party's process has its own. So a rehearsal is deterministic, needs no timeout, and:

    - a take that no message can ever satisfy (every view waits, or has finished) fails at once, in one line naming
      what each party waits for (`ScheduleError`);
    - once every view has finished, a message left in a mailbox, sent and never taken, fails the run in one line
      naming the tag, the sender and the receiver;
    - a view that fails stops the others with its reason, as a deployed party's abort does.

    It is the carrier of every view (through its `TurnLink`: `post`, `take`); a message is copied on `post` and
    checked against the receiver's shadow on `take` (`lvfl.federation.expectations.conform`), with the step it was
    sent at.
    """

    def __init__(self, parties: list[str]) -> None:
        self.parties = list(parties)
        self.identities = SimulatedIdentities()  # one throw-away identity per party, shared by the views
        self._cond = threading.Condition()
        self._turn: str | None = None
        self._state = dict.fromkeys(self.parties, "ready")  # ready | waiting | done
        self._waits: dict[str, tuple[str, str]] = {}  # a waiting party: the (sender, tag) it waits for
        self._boxes: dict[tuple[str, str, str], deque] = {}
        self._randomness = dict.fromkeys(self.parties, _randomness())  # each view starts as a fresh process would
        self.failure: str | None = None  # why every view stops: a view's error, or a deadlock
        self._error: ScheduleError | None = None  # a deadlock, raised by `run`

    # -- the carrier ---------------------------------------------------------------------------------------------
    def post(self, src: str, dst: str, tag: str, step: int, payload: Any) -> None:
        """Leave a copy of `payload` in the (src, dst, tag) mailbox, stamped with `step`; `src` goes on."""
        with self._cond:
            self._boxes.setdefault((src, dst, tag), deque()).append((step, _copy(payload)))

    def take(self, src: str, dst: str, tag: str, step: int, expected: Any) -> Any:
        """The next (src, dst, tag) message, once there: meanwhile the other views have their turns."""
        with self._cond:
            box = self._boxes.get((src, dst, tag))
            while not box:
                self._raise_failure()
                self._state[dst], self._waits[dst] = "waiting", (src, tag)
                self._pass_turn(dst)
                self._await_turn(dst)
                box = self._boxes.get((src, dst, tag))
            sent_at, payload = box.popleft()
        check_step(src, dst, tag, sent_at, step)
        conform(payload, template(expected), sender=src, tag=tag)
        return payload

    # -- the turns -----------------------------------------------------------------------------------------------
    def run(self, bodies: dict[str, Any], timeout: float = 3600.0) -> dict[str, Any]:
        """Run `bodies[party]()` for every party, each in a thread, in turns; their results by party.

        Raises:
            ScheduleError: a take that no message can satisfy, or a message never taken.
            BaseException: the first view's own error (the others stop with its reason).
        """
        results: dict[str, Any] = {}
        errors: list[BaseException] = []  # a view's own error (not the stop every other view then raises)

        def one(party: str) -> None:
            try:
                with self._cond:
                    self._await_turn(party)
                results[party] = bodies[party]()
            except BaseException as err:  # noqa: BLE001 - re-raised by `run`
                with self._cond:
                    if self.failure is None:
                        self.failure = f"{party} stopped: " + (" ".join(str(err).split()) or type(err).__name__)
                        errors.append(err)
                    elif self._error is None and str(self.failure) not in str(err):
                        errors.append(err)  # not the stop it was told: its own
            finally:
                with self._cond:
                    self._state[party] = "done"
                    self._pass_turn(party)

        threads = [threading.Thread(target=one, args=(p,), name=f"lvfl-rehearsal-{p}") for p in bodies]
        with self._cond:
            self._turn = self.parties[0]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout)
        if any(thread.is_alive() for thread in threads):
            raise RuntimeError(f"a rehearsal's view ran over {timeout:g} s")
        if self._error is not None:
            raise self._error
        if errors:
            raise errors[0]
        left = sorted((key, len(box)) for key, box in self._boxes.items() if box)
        if left:
            (src, dst, tag), count = left[0]
            raise ScheduleError(
                f"{src} sent {tag!r} to {dst} and {dst} never took it ({count} message{'s' * (count > 1)} left; "
                f"{len(left)} mailbox{'es' * (len(left) > 1)} not emptied): the parties' code disagrees about the "
                "message schedule"
            )
        return results

    def fail(self, reason: str) -> None:
        """Stop every view with `reason` (a view's abort)."""
        with self._cond:
            self.failure = self.failure or reason
            self._cond.notify_all()

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise FederationError(self.failure)

    def _runnable(self, party: str) -> bool:
        state = self._state[party]
        if state == "ready":
            return True
        if state == "waiting":
            src, tag = self._waits[party]
            return bool(self._boxes.get((src, party, tag)))
        return False

    def _pass_turn(self, party: str) -> None:
        """Give the turn to the next view after `party` that can go on; none and not all done: a deadlock."""
        self._randomness[party] = _randomness()
        start = self.parties.index(party)
        order = self.parties[start + 1 :] + self.parties[: start + 1]
        nxt = next((p for p in order if self._runnable(p)), None)
        if nxt is None and any(s != "done" for s in self._state.values()) and self.failure is None:
            waits = "; ".join(
                f"{p} waits for {tag!r} from {src}" + (" (done)" if self._state[src] == "done" else "")
                for p, (src, tag) in sorted(self._waits.items())
                if self._state[p] == "waiting"
            )
            self.failure = f"no party can go on: {waits}; no such message was sent"
            self._error = ScheduleError(self.failure)
        self._turn = nxt
        self._cond.notify_all()

    def _await_turn(self, party: str) -> None:
        while self._turn != party and self.failure is None:
            self._cond.wait()
        self._raise_failure()
        self._state[party] = "ready"
        _restore(self._randomness[party])


def _randomness() -> tuple[Any, Any, Any]:
    """This process's global random states (a party's process has its own)."""
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _restore(state: tuple[Any, Any, Any]) -> None:
    torch.set_rng_state(state[0])
    np.random.set_state(state[1])
    random.setstate(state[2])


class TurnLink:
    """One view's link over `Turns`, as `lvfl.federation.link.SocketLink` is over a socket transport.

    It makes this party's sends and takes (a `Carrier`), at the step its protocol passes.
    """

    def __init__(self, turns: Turns, party: str) -> None:
        self.turns, self.party = turns, party
        self.identities = turns.identities

    def post(self, src: str, dst: str, tag: str, step: int, payload: Any) -> None:
        """Send as this party."""
        if src != self.party:
            raise ValueError(f"party {self.party!r} cannot send a message as {src!r}")
        self.turns.post(src, dst, tag, step, payload)

    def take(self, src: str, dst: str, tag: str, step: int, expected: Any) -> Any:
        """Take as this party."""
        if dst != self.party:
            raise ValueError(f"party {self.party!r} cannot receive a message for {dst!r}")
        return self.turns.take(src, dst, tag, step, expected)
