"""`DHMasking`: pairwise Diffie-Hellman masks over fixed-point values, which cancel exactly in the sum.

Protocol (VFedMH Eq. 5, with the static float blinding factor replaced by fresh per-step masks in Z_2^64):

1. Setup. Each passive party k draws an X25519 key pair and sends its 32-byte public key to the active party
   (`tag="keys"`), which forwards every other passive party's public key to k, one message per key. Each pair
   (k, j) derives a pair key `HKDF-SHA256(X25519(sk_k, pk_j), info=sorted names)`. The active party relays public
   keys only and learns no pair key. Key bytes on the wire: `K * 32 + K * (K - 1) * 32` for K passive parties.
2. Protect. Passive party k encodes its embedding E_k to fixed point and adds, for every other passive party j,
   `+PRG(key_kj, step, rank, index)` if k precedes j in the party list and `-PRG(...)` otherwise. Every mask is
   added once and subtracted once, so the masks sum to zero over all passive parties.
3. Combine. The active party sums the shares in the ring (exact, wrapping mod 2**64), where the masks cancel,
   decodes, and adds its own float embedding.

What the active party learns: the sum of the passive embeddings (which the protocol needs), not the individual
ones, provided at least two passive parties do not collude with it and it is *semi-honest*. The public keys are
relayed by the active party and not authenticated, so an active party that deviates from the protocol and swaps
them (a man in the middle: it gives each passive party a public key of its own) shares a pair key with every
passive party and unmasks every embedding. The guarantee therefore holds against a semi-honest active party only;
against a malicious one the keys would need authenticating (e.g. signed by long-term keys the parties exchanged out
of band). With a single passive party there is no mask at all, so the "share" is that party's embedding;
`DHMasking` refuses that unless `allow_insecure=True`. Masking protects shares on their way up, not what the
protocol sends down: EASTER's global embedding E tells a passive party k the sum of the other parties' embeddings,
C*E - E_k (with C = 2, the active party's E_a itself).

The masks are fresh per (step, rank, index): reusing one would reveal the difference of two embeddings of the same
party (the flaw of a static blinding factor), so `protect` refuses a (step, index) a party has already used.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lvfl.crypto import fixedpoint, keys, prg
from lvfl.parties import PartySpec
from lvfl.privacy.base import AggregationBackend
from lvfl.wire import Wire


class DHMasking(AggregationBackend):
    """Secure aggregation of passive embeddings by pairwise X25519 + AES-CTR masks in Z_2^64.

    Shares are int64 tensors (ring elements), so a masked share costs 8 bytes per element on the wire, twice a
    float32 embedding: that is the honest price of exact cancellation.

    Secrets: private keys are discarded as soon as the pair keys are derived, and pair keys never enter
    `state_dict`, pickles, `copy.copy` or `copy.deepcopy` (see `__getstate__`); a restored or copied backend must
    be `setup` again, which agrees on fresh keys.

    Args:
        frac_bits: fractional bits of the fixed-point encoding (resolution 2**-frac_bits), in [1, 40].
        allow_insecure: allow fewer than two passive parties, where masking hides nothing (warns).

    Example:
        >>> import torch
        >>> from lvfl.parties import PartySpec
        >>> from lvfl.wire import Wire
        >>> parties = [PartySpec("a", "active", (4,)), PartySpec("p1", "passive", (4,), 1),
        ...            PartySpec("p2", "passive", (4,), 2)]
        >>> backend, wire = DHMasking(), Wire()
        >>> backend.setup(parties, "a", wire)
        >>> wire.bytes_by_tag()
        {'keys': 128}
        >>> x = torch.tensor([0.5, -1.25])
        >>> shares = {p: backend.protect(p, x, step=0) for p in ("p1", "p2")}
        >>> backend.combine(torch.zeros(2), shares)
        tensor([ 1.0000, -2.5000])
    """

    reveals_shares = False
    refuses_nonfinite = True
    refuses_reused_step = True  # masks derive from (step, rank, index): see `_claim_stream`

    def __init__(self, frac_bits: int = fixedpoint.DEFAULT_FRAC_BITS, allow_insecure: bool = False) -> None:
        self.frac_bits = fixedpoint.check_frac_bits(frac_bits, "DHMasking(frac_bits=...)")
        self.allow_insecure = bool(allow_insecure)
        self._forget_keys()

    def _forget_keys(self) -> None:
        # party -> ((pair key, add?), ...) for every other passive party: add if the party precedes the peer
        self._peers: dict[str, tuple[tuple[bytes, bool], ...]] | None = None
        self._passive: tuple[str, ...] = ()
        self._num_parties = 0
        # party -> (latest step, indices used at that step): refuses to reuse a mask stream
        self._used: dict[str, tuple[int, set[int]]] = {}

    def error_bound(self, num_parties: int | None = None) -> float:
        """`K * 2**-(frac_bits + 1)`: each passive value is rounded to fixed point once; the ring sum is exact."""
        k = len(self._passive) if num_parties is None else int(num_parties)
        return k * 2.0 ** -(self.frac_bits + 1)

    # -- 1. setup: key agreement, every byte on the wire -----------------------------------------------------------
    def setup(self, parties: Sequence[PartySpec], active: str, wire: Wire, rank: int = 0) -> None:
        """Agree on pair keys among the passive parties, relayed by `active`; fresh keys on every call.

        Raises:
            ValueError: on duplicate party names, an `active` that is not the active party, a rank outside
                [0, 2**16), or fewer than two passive parties without `allow_insecure=True`.
        """
        passive = self.check_roles(parties, active)
        rank = prg.check_uint(rank, "rank", prg.MAX_RANK)
        if len(passive) < 2:
            why = (
                f"DHMasking needs at least two passive parties, got {len(passive)} ({list(passive)}): with one "
                "passive party there is no peer to share a mask with, so its share is its own embedding in the clear "
                "(and the sum the active party must learn equals that embedding anyway)"
            )
            if not self.allow_insecure:
                raise ValueError(why + "; pass allow_insecure=True to run unprotected on purpose")
            warnings.warn(why + "; running anyway because allow_insecure=True", UserWarning, stacklevel=2)

        super().setup(parties, active, wire, rank)
        self._forget_keys()
        private = {}
        public_at_active = {}
        for k in passive:  # each passive party -> active: its public key
            private[k], public = keys.generate_keypair()
            public_at_active[k] = wire.send(k, active, public, tag="keys")
        public_at = {k: {} for k in passive}
        for k in passive:  # active -> each passive party: every other passive party's public key, one per message
            for j in passive:
                if j != k:
                    public_at[k][j] = wire.send(active, k, public_at_active[j], tag="keys")
        peers = {}
        for pos_k, k in enumerate(passive):  # each party derives its own copy of each pair key
            peers[k] = tuple(
                (keys.shared_pair_key(private[k], public_at[k][j], keys.pair_info(k, j)), pos_k < pos_j)
                for pos_j, j in enumerate(passive)
                if j != k
            )
        del private  # no longer needed: nothing below can leak it
        self._peers = peers
        self._passive = passive
        self._num_parties = len(passive) + 1  # C: the active party and the passive ones hold embeddings

    def _require_setup(self) -> None:
        if self._peers is None:
            raise RuntimeError(
                "DHMasking has no keys: call setup(parties, active, wire, rank) first "
                "(keys are never checkpointed or pickled, so a restored backend must be set up again)"
            )

    # -- 2. protect: at passive party k --------------------------------------------------------------------------
    def protect(self, party: str, tensor: torch.Tensor, step: int, index: int = 0) -> torch.Tensor:
        """The masked fixed-point share of `tensor` that passive `party` sends at mask step `step` (VFedMH Eq. 5).

        Returns:
            An int64 tensor (ring elements) of `tensor`'s shape on `tensor`'s device.

        Raises:
            ValueError: if `party` is not a passive party, `tensor` holds NaN/inf or values out of range (the
                message names the party), or this party already used this (step, index).
        """
        self._require_setup()
        peers = self._peers.get(party)
        if peers is None:
            raise ValueError(f"party {party!r} is not a passive party of this backend; passive: {list(self._passive)}")
        step = prg.check_uint(step, "step", prg.MAX_STEP)
        index = prg.check_uint(index, "index", prg.MAX_INDEX)
        encoded = fixedpoint.encode(tensor, self.frac_bits, headroom_parties=self._num_parties, who=f"party {party!r}")
        self._claim_stream(party, step, index)
        share = prg.add_masks_(encoded.to("cpu").contiguous(), peers, step, self.rank, index)
        return share.to(tensor.device)

    def _claim_stream(self, party: str, step: int, index: int) -> None:
        latest, indices = self._used.get(party, (-1, set()))
        if step < latest or (step == latest and index in indices):
            raise ValueError(
                f"party {party!r}: mask step {step} index {index} was already used (latest step {latest}); reusing a "
                "mask would reveal the difference of two embeddings to the active party. Advance the step counter "
                "or use a new index"
            )
        if step > latest:
            self._used[party] = (step, {index})
        else:
            indices.add(index)

    # -- 3. combine: at the active party --------------------------------------------------------------------------
    def combine(self, active_tensor: torch.Tensor, shares: Mapping[str, Any]) -> torch.Tensor:
        """`active_tensor` plus the decoded ring sum of the shares, in `active_tensor`'s dtype and device.

        The ring sum is exact, so the masks cancel exactly and the result equals the active tensor plus the sum of
        the fixed-point-rounded passive tensors. Gradients flow to `active_tensor` only.

        Raises:
            ValueError: if a passive party's share is missing (the masks would not cancel) or unknown, or a share
                has the wrong shape. TypeError: if a share is not an int64 tensor.
        """
        self._require_setup()
        if not isinstance(active_tensor, torch.Tensor) or not active_tensor.is_floating_point():
            raise TypeError("combine: active_tensor must be a floating-point tensor")
        self.check_one_per_party(shares, self._passive, why=" (without every share the masks do not cancel)")
        if not self._passive:
            return active_tensor
        for name in self._passive:
            share = shares[name]
            if not isinstance(share, torch.Tensor) or share.dtype != torch.int64:
                raise TypeError(f"combine: share of party {name!r} must be an int64 tensor from DHMasking.protect")
            if share.shape != active_tensor.shape:
                raise ValueError(
                    f"combine: share of party {name!r} has shape {tuple(share.shape)}, "
                    f"the active tensor {tuple(active_tensor.shape)}"
                )
        total = fixedpoint.ring_sum(shares[name].to("cpu") for name in self._passive)
        decoded = fixedpoint.decode(total, self.frac_bits, dtype=active_tensor.dtype)
        return active_tensor + decoded.to(active_tensor.device)

    # -- checkpoints and pickling: never any key material --------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Non-secret configuration only; keys are agreed afresh by `setup` after a restore."""
        return {"frac_bits": self.frac_bits}

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without pair keys (and without the stream bookkeeping that goes with them)."""
        state = self.__dict__.copy()
        state.update(_peers=None, _passive=(), _num_parties=0, _used={})
        return state

    def __repr__(self) -> str:
        ready = "set up" if self._peers is not None else "not set up"
        return f"DHMasking(frac_bits={self.frac_bits}, allow_insecure={self.allow_insecure}) [{ready}]"
