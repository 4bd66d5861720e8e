"""The aggregation-backend interface: how passive embeddings are protected on the wire and combined.

A backend is a recipe (see STYLE.md): it holds keys and counters and calls the pure primitives in `lvfl.crypto`.
Protocols call exactly three methods, in this order:

1. `setup(parties, active, wire, rank)` once before training: key agreement / key distribution, every byte on `wire`.
2. `protect(party, tensor, step, index)` at a passive party: the share that party puts on the wire.
3. `combine(active_tensor, shares)` at the active party: `active_tensor + sum_k unprotect(shares[k])`
   (the *sum*, not the mean; the protocol divides by C).

`step` is the protocol's mask step counter (restored from checkpoints) and `index` numbers the tensors protected
within one step, so that no mask stream is ever used twice.

Capabilities. Every backend declares, as class attributes, what it guarantees, so that protocols decide what they
accept from the declaration (`VFLModule.require_backend`) rather than from the backend's class, and one contract
suite (tests/test_backend_contract.py) checks each declaration against the behaviour:

* `reveals_shares`: the active party sees each passive tensor in the clear (`Plain`). Every backend can combine a
  *sum*; anything else a protocol wants from the shares (a concatenation, a per-party weighting or score, one
  model per site) needs each tensor, so it needs `reveals_shares=True`.
* `refuses_nonfinite`: `protect` refuses NaN/inf with a `ValueError` naming the party (a masked or encrypted NaN
  would poison the sum without saying whose it was). `Plain` passes such values through, as the plain sum would.
* `refuses_reused_step`: the masks derive from `(step, index)`, so `protect` refuses a pair a party already used
  (`DHMasking`); the HE backends draw fresh randomness on every call, so a repeated step is harmless there.
* `error_bound(num_parties)`: the largest |combine - exact sum| per value, for float64 inputs.

Each backend declares all three itself (the contract suite checks that it does); the base's defaults are the
cautious reading of an undeclared one: it protects its shares, so a protocol that needs each tensor refuses it.

No weights. `combine` has no `weights`: a weighted sum `sum_k w_k E_k` (PraVFed Eq. 7, 9) is computed by weighting
*before* `protect` (party k protects `w_k E_k`), which every backend supports unchanged; a ring (`DHMasking`) has
no product by a real weight, and no protocol needed the weighted combine that `CKKS` alone once offered.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import torch

from lvfl.parties import PartySpec
from lvfl.schedule import Links, Roles
from lvfl.wire import Wire


class AggregationBackend(ABC):
    """Protects passive parties' tensors on the wire and combines them at the active party."""

    #: name of the party that holds secret keys for decryption (HE backends); None when no such party exists
    coordinator: str | None = None
    #: the active party sees each passive party's tensor in the clear (so it can do more than sum them)
    reveals_shares: ClassVar[bool] = False
    #: `protect` refuses NaN/inf with a ValueError naming the party
    refuses_nonfinite: ClassVar[bool] = True
    #: masks derive from (step, index), so `protect` refuses a pair the party already used
    refuses_reused_step: ClassVar[bool] = False

    def links(self, roles: Roles) -> Links:
        """The links this backend adds to the protocol's star (`lvfl.schedule`).

        With a `coordinator`: both ways between it and the active party (the aggregate up, its decryption down), and
        from it to every passive party (its public key: the passive parties never write back).
        """
        if self.coordinator is None:
            return Links()
        c = self.coordinator
        return Links([(roles.active, c), (c, roles.active), *((c, k) for k in roles.passive)])

    def setup(self, parties: Sequence[PartySpec], active: str, wire: Wire, rank: int = 0) -> None:
        """Agree on keys among `parties` (passive ones protect, `active` combines); bytes go on `wire`."""
        self.parties = list(parties)
        self.active = active
        self.wire = wire
        self.rank = rank

    @abstractmethod
    def protect(self, party: str, tensor: torch.Tensor, step: int, index: int = 0) -> Any:
        """The share passive `party` sends for `tensor` at mask step `step` (tensor number `index` in the step)."""

    @abstractmethod
    def combine(self, active_tensor: torch.Tensor, shares: Mapping[str, Any]) -> torch.Tensor:
        """`active_tensor` plus the sum of the tensors behind `shares` (one share per passive party)."""

    def combine_in_clear(
        self, active_tensor: torch.Tensor, tensors: Mapping[str, torch.Tensor], order: Sequence[str]
    ) -> torch.Tensor:
        """What `combine` returns for these tensors, from the tensors themselves (no share, key or message).

        For a prediction whose passive contributions reach the active party in the clear (`lvfl export`'s
        completion, `lvfl serve`, the oblivious router), so that it equals the run's own `lvfl predict` bit for bit:
        the same rounding where the backend rounds. Default: `active_tensor + sum`, in `order` (Plain's arithmetic;
        an approximate backend such as CKKS is then within its `error_bound` of its own `combine`).
        """
        out = active_tensor
        for name in order:
            out = out + tensors[name].to(active_tensor)
        return out

    @abstractmethod
    def error_bound(self, num_parties: int | None = None) -> float:
        """Largest |combine - exact sum| per value for float64 inputs and `num_parties` passive parties.

        Defaults to this backend's passive parties (after `setup`). Every backend states one; the contract suite
        holds it to it.
        """

    def check_roles(self, parties: Sequence[PartySpec], active: str) -> tuple[str, ...]:
        """Check names and roles before any key is made; returns the passive parties' names.

        Names must be unique and `active` must be the active party. A backend with a `coordinator` (it holds the
        secret key and could decrypt every share) needs it to be a separate party: absent from `parties`, or listed
        as the only party of role "coordinator".
        """
        names = [p.name for p in parties]
        if len(set(names)) != len(names):
            raise ValueError(f"party names must be unique, got {names}")
        roles = {p.name: p.role for p in parties}
        if roles.get(active) != "active":
            raise ValueError(f"active={active!r} is not an active party among {names}")
        if self.coordinator is not None:
            cls = type(self).__name__
            role = roles.get(self.coordinator, "coordinator")
            if role != "coordinator":
                raise ValueError(
                    f"{cls}: the coordinator {self.coordinator!r} is the {role} party; it holds the secret key and "
                    f"could decrypt every share, so it must be a separate party (rename it with {cls}(coordinator=...))"
                )
            others = [p.name for p in parties if p.role == "coordinator" and p.name != self.coordinator]
            if others:
                raise ValueError(f"{cls}: the coordinator is {self.coordinator!r}, but {others} also have that role")
        return tuple(p.name for p in parties if p.role == "passive")

    @staticmethod
    def check_one_per_party(
        given: Mapping[str, Any], passive: Sequence[str], what: str = "share", why: str = ""
    ) -> None:
        """Refuse `given` unless it holds exactly one `what` per passive party; the message names the culprits."""
        if set(given) != set(passive):
            missing = sorted(set(passive) - set(given))
            unknown = sorted(set(given) - set(passive))
            raise ValueError(
                f"combine needs exactly one {what} per passive party {list(passive)}: missing {missing}, "
                f"unknown {unknown}{why}"
            )

    @contextlib.contextmanager
    def off_the_record(self) -> Iterator[None]:
        """Protect and combine inside, then forget they ran: for a harness measuring on a recording wire.

        A measurement (a backdoor's, `lvfl.attacks.backdoor`) runs the protocol's inference on altered batches with
        the wire recording, so no party receives those messages, and restores the run's step counter afterwards. A
        backend that refuses a reused (step, index) (`refuses_reused_step`) must then forget the pairs the
        measurement used, or the run's next step would be refused; the refusal still guards every message that
        is sent. Default: nothing to forget.
        """
        yield

    def state_dict(self) -> dict[str, Any]:
        """Non-secret state to checkpoint. Private keys are never included."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check a checkpoint's settings (its `state_dict`) against this backend's; live keys are left alone.

        A checkpoint never changes the configuration: this run's settings (command line, config) stand, and a
        checkpoint made with other ones (say another `frac_bits`) is refused with a message naming the setting and
        both values, rather than silently replacing them (which could also change an encoding under keys already
        made). Backends whose state is more than settings override this.
        """
        check_saved_settings(type(self).__name__, self.state_dict(), state)


def check_saved_settings(name: str, current: Mapping[str, Any], saved: Mapping[str, Any]) -> None:
    """Refuse a checkpoint's backend settings unless they equal this run's; the message names each difference."""
    unknown = sorted(set(saved) - set(current))
    if unknown:
        raise ValueError(f"{name}: the checkpoint holds unknown backend settings {unknown}")
    differ = [key for key in current if key in saved and _normal(saved[key]) != _normal(current[key])]
    if differ:
        what = ", ".join(f"{key}={saved[key]!r} in the checkpoint but {current[key]!r} in this run" for key in differ)
        raise ValueError(
            f"{name}: the checkpoint was made with other settings: {what}; run with the checkpoint's settings, or "
            "start a new run (a checkpoint never replaces this run's settings)"
        )


def _normal(value: Any) -> Any:
    return tuple(value) if isinstance(value, list | tuple) else value
