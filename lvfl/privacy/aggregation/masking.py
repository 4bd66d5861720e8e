"""`DHMasking`: pairwise Diffie-Hellman masks over fixed-point values, which cancel exactly in the sum.

Protocol (VFedMH Eq. 5, with the static float blinding factor replaced by fresh per-step masks in the ring
Z_2^R, R = `ring_bits`: 32 by default, 64 on request):

1. Setup. Each passive party k draws an X25519 key pair and sends its 32-byte public key, signed with its identity key
   (64 bytes, ECDSA P-256: `lvfl.crypto.signing`), to the active party (`tag="keys"`), which forwards every other
   passive party's signed key to k, one message per key. The signature covers the key, its owner's name, the run (the
   identities' `session`: in a federation the run ID every party is started with), the round of this key set-up and the
   rank. k checks each signature against that party's identity (in a federation, the certificate pinned for it in the
   federation file) and refuses a key that does not carry it, or that was signed for another run, round or rank. Each
   pair (k, j) derives a pair key `HKDF-SHA256(X25519(sk_k, pk_j), info=sorted names)`. The active party relays public
   keys only and learns no pair key. Key bytes on the wire: `K * 96 + K * (K - 1) * 96` for K passive parties.
2. Protect. Passive party k checks that its embedding E_k is in range (refusing, naming k, otherwise), encodes it
   to fixed point in Z_2^R and adds, for every other passive party j, `+PRG(key_kj, step, rank, index)` if k
   precedes j in the party list and `-PRG(...)` otherwise. Every mask is added once and subtracted once, so the
   masks sum to zero over all passive parties.
3. Combine. The active party sums the shares in the ring (exact, wrapping mod 2**R), where the masks cancel,
   decodes, and adds its own float embedding.

What the active party learns: the sum of the passive embeddings (which the protocol needs), not the individual ones,
provided at least two passive parties do not collude with it. The public keys are relayed by the active party and
signed by their owners, so an active party that swaps them (a man in the middle: it gives each passive party a
public key of its own) is caught: the passive party refuses the key, naming the relay, and derives no pair key; so
is one that replays a key its owner signed in another run (whose pair key it might know from that run's traffic).
Within one run ID a relay could replay a key from an earlier attempt of the same run: give every attempt its own
run ID (`lvfl launch` draws one; `lvfl party --run_id`). In a
federation the signing keys are the parties' TLS keys, certified by the federation's CA; in simulation they are
throw-away keys per party (one process holds every party anyway). With a single passive party there is no mask at
all, so the "share" is that party's embedding; `DHMasking` refuses that unless `allow_insecure=True`. Masking
protects shares on their way up, not what the protocol sends down: EASTER's global embedding E tells a passive party
k the sum of the other parties' embeddings, C*E - E_k (with C = 2, the active party's E_a itself).

The masks are fresh per (step, rank, index): reusing one would reveal the difference of two embeddings of the same
party (the flaw of a static blinding factor), so `protect` refuses a (step, index) a party has already used.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from lvfl.crypto import fixedpoint, keys, prg, signing
from lvfl.parties import PartySpec
from lvfl.privacy.aggregation.base import AggregationBackend
from lvfl.wire import Absent, Wire

#: what a passive party's signature of its X25519 public key binds it to (`lvfl.crypto.signing.signed_message`),
#: with the run's session, the key set-up's round and the rank
KEY_CONTEXT = b"lvfl/dh-masking/public-key/v2"
#: bytes of one key message: the 32-byte X25519 public key and its 64-byte signature
SIGNED_KEY_BYTES = keys.PUBLIC_KEY_BYTES + signing.SIGNATURE_BYTES


class DHMasking(AggregationBackend):
    """Secure aggregation of passive embeddings by pairwise X25519 + AES-CTR masks in Z_2^32 (or Z_2^64).

    The ring. With `ring_bits=32` (the default) shares are int32 tensors, 4 bytes per element on the wire: exactly
    a float32 embedding, so masking costs no bandwidth beyond the one-off key exchange. With `ring_bits=64` they
    are int64 tensors, 8 bytes per element, with far more range. Either way cancellation is exact: the masks are
    uniform in the ring and the ring sum wraps.

    The range. A value v is encoded as `round(v * 2**frac_bits)`, and the sum of the encodings must not wrap. With
    C parties (the K passive ones and the active one; the ring sums K encodings, the one party of slack keeps the
    rule the same as in Z_2^64 and in Paillier's slots) every passive value must satisfy

    * Z_2^32: `|v| < ((2**31 - 1) // C + 1/2) / 2**frac_bits`, about `2**(31 - frac_bits) / C`. The default
      `frac_bits=16` gives a resolution of 2**-16 ~ 1.5e-5 and `|v| < 32768 / C`: 10,922 for 2 passive parties,
      8,192 for 3, 2,978 for 10; far above embeddings after ReLU/tanh/normalization layers (|v| < 100 typically).
    * Z_2^64: `|v| < 2**(63 - frac_bits) / C` (2**47 / C at frac_bits=16).

    `protect` checks this at each passive party *before* masking and raises a ValueError naming the party, its
    largest |value|, the bound and the options; nothing is ever clipped or wrapped silently. Choose
    `ring_bits=64` for embeddings that may grow large (unnormalized activations, sums of many features, early
    training with a large learning rate), or for more resolution (a larger `frac_bits`) than Z_2^32 leaves room
    for; or lower `frac_bits` (each bit fewer doubles the bound, at twice the rounding error). A `frac_bits` that
    leaves Z_2^32 less than |v| < 1 for the parties at hand is refused when the backend is built or set up.
    The sum is within `error_bound() = K * 2**-(frac_bits + 1)` of the exact one in both rings.

    Secrets: private keys are discarded as soon as the pair keys are derived, and pair keys never enter
    `state_dict`, pickles, `copy.copy` or `copy.deepcopy` (see `__getstate__`); a restored or copied backend must
    be `setup` again, which agrees on fresh keys.

    Args:
        frac_bits: fractional bits of the fixed-point encoding (resolution 2**-frac_bits), in [1, 40]; with
            `ring_bits=32` at most 29 (and less the more parties there are: see above).
        allow_insecure: allow fewer than two passive parties, where masking hides nothing (warns).
        ring_bits: 32 (int32 shares, Z_2^32, 4 bytes per element) or 64 (int64 shares, Z_2^64, 8 bytes).

    Example:
        >>> import torch
        >>> from lvfl.parties import PartySpec
        >>> from lvfl.wire import Wire
        >>> parties = [PartySpec("a", "active", (4,)), PartySpec("p1", "passive", (4,), 1),
        ...            PartySpec("p2", "passive", (4,), 2)]
        >>> backend, wire = DHMasking(), Wire()
        >>> backend.setup(parties, "a", wire)
        >>> wire.bytes_by_tag()  # two signed public keys up, each relayed to the other passive party
        {'keys': 384}
        >>> x = torch.tensor([0.5, -1.25])
        >>> shares = {p: backend.protect(p, x, step=0) for p in ("p1", "p2")}
        >>> shares["p1"].dtype
        torch.int32
        >>> backend.combine(torch.zeros(2), shares)
        tensor([ 1.0000, -2.5000])
        >>> round(backend.max_abs_value(), 2)  # |v| < 10922.67 per passive value: 2 passive parties, frac_bits=16
        10922.67
    """

    reveals_shares = False
    refuses_nonfinite = True
    refuses_reused_step = True  # masks derive from (step, rank, index): see `_claim_stream`

    def __init__(
        self, frac_bits: int = fixedpoint.DEFAULT_FRAC_BITS, allow_insecure: bool = False, ring_bits: int = 32
    ) -> None:
        self.frac_bits = fixedpoint.check_frac_bits(frac_bits, "DHMasking(frac_bits=...)")
        self.ring_bits = fixedpoint.check_ring_bits(ring_bits, "DHMasking(ring_bits=...)")
        self.allow_insecure = bool(allow_insecure)
        self._check_capacity(2)  # the fewest parties there can be (one passive party, allow_insecure)
        self._rounds = 0  # key set-ups run so far: each signature binds its round
        self._forget_keys()

    def _check_capacity(self, num_parties: int) -> None:
        """Refuse a ring and `frac_bits` that leave less than |v| < 1 for `num_parties` parties' sum."""
        bound = fixedpoint.max_abs_value(self.frac_bits, num_parties, self.ring_bits)
        if bound < 1.0:
            most = fixedpoint.max_frac_bits(num_parties, self.ring_bits)
            raise ValueError(
                f"DHMasking(ring_bits={self.ring_bits}, frac_bits={self.frac_bits}) leaves no room for the integer "
                f"part: summed over {num_parties} parties, values would have to satisfy |v| < {bound!r}, less than 1. "
                f"Pass ring_bits=64 (8 bytes per element instead of 4), or frac_bits <= {most}"
            )

    def max_abs_value(self, num_parties: int | None = None) -> float:
        """The bound every passive |value| must stay strictly below, for this ring and `frac_bits`.

        `num_parties` is the number of passive parties K (default: this backend's, after `setup`); the bound
        leaves room for C = K + 1 encodings (see the class docstring).
        """
        k = len(self._passive) if num_parties is None else int(num_parties)
        return fixedpoint.max_abs_value(self.frac_bits, k + 1, self.ring_bits)

    def _forget_keys(self) -> None:
        # party -> ((pair key, add?), ...) for every other passive party: add if the party precedes the peer
        self._peers: dict[str, tuple[tuple[bytes, bool], ...]] | None = None
        self._passive: tuple[str, ...] = ()
        self._num_parties = 0
        self._range_remedy = ""  # the options an out-of-range error names (see `_remedy`)
        # party -> (latest step, indices used at that step): refuses to reuse a mask stream
        self._used: dict[str, tuple[int, set[int]]] = {}

    def error_bound(self, num_parties: int | None = None) -> float:
        """`K * 2**-(frac_bits + 1)` in either ring: each passive value is rounded once; the ring sum is exact."""
        k = len(self._passive) if num_parties is None else int(num_parties)
        return k * 2.0 ** -(self.frac_bits + 1)

    # -- 1. setup: key agreement, every byte on the wire -----------------------------------------------------------
    def setup(self, parties: Sequence[PartySpec], active: str, wire: Wire, rank: int = 0) -> None:
        """Agree on pair keys among the passive parties, relayed by `active`; fresh keys on every call.

        Raises:
            ValueError: on duplicate party names, an `active` that is not the active party, a rank outside
                [0, 2**16), fewer than two passive parties without `allow_insecure=True`, or a `frac_bits` that
                leaves this ring less than |v| < 1 with these parties.
        """
        passive = self.check_roles(parties, active)
        rank = prg.check_uint(rank, "rank", prg.MAX_RANK)
        self._check_capacity(len(passive) + 1)
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
        binding = (wire.identities.session, self._rounds.to_bytes(8, "big"), rank.to_bytes(2, "big"))
        self._rounds += 1
        private = {}
        public_at_active = {}
        for k in passive:  # each passive party -> active: its signed public key (a view draws only its own)
            if wire.holds(k):
                private[k], public = keys.generate_keypair()
                signature = wire.identities.sign(k, signing.signed_message(KEY_CONTEXT, k, public, *binding))
                signed = {"key": public, "signature": signature}
            else:
                signed = {"key": Absent("an X25519 public key"), "signature": Absent("its signature")}
            public_at_active[k] = wire.send(k, active, signed, tag="keys")
        public_at = {k: {} for k in passive}
        for k in passive:  # active -> each passive party: every other passive party's public key, one per message
            for j in passive:
                if j != k:
                    public_at[k][j] = wire.send(active, k, public_at_active[j], tag="keys")
        peers = {}
        for pos_k, k in enumerate(passive):  # each party checks the relayed keys, then derives its pair keys
            if not wire.holds(k):
                continue
            for j in passive:
                if j != k:
                    self._check_signed(wire, k, j, active, public_at[k][j], binding)
            peers[k] = tuple(
                (keys.shared_pair_key(private[k], public_at[k][j]["key"], keys.pair_info(k, j)), pos_k < pos_j)
                for pos_j, j in enumerate(passive)
                if j != k
            )
        del private  # no longer needed: nothing below can leak it
        self._peers = peers
        self._passive = passive
        self._num_parties = len(passive) + 1  # C: the active party and the passive ones hold embeddings
        self._range_remedy = self._remedy()

    @staticmethod
    def _check_signed(
        wire: Wire, receiver: str, owner: str, active: str, signed: Any, binding: tuple[bytes, ...]
    ) -> None:
        """Refuse a relayed public key without its owner's signature for this run and round (a man in the middle)."""
        ok = isinstance(signed, dict) and set(signed) == {"key", "signature"}
        ok = ok and isinstance(signed["key"], bytes) and isinstance(signed["signature"], bytes)
        if not ok or not wire.identities.verify(
            owner, signing.signed_message(KEY_CONTEXT, owner, signed["key"], *binding), signed["signature"]
        ):
            raise ValueError(
                f"DHMasking: {receiver} received {owner}'s X25519 public key, relayed by the active party {active}, "
                f"without a valid signature by {owner}'s identity for this run: the relayed key was changed (a man in "
                "the middle), is not the one it signed, or was signed for another run (a replay); no pair key is "
                "derived from it"
            )

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
            An int32 (ring_bits=32) or int64 (ring_bits=64) tensor of ring elements, of `tensor`'s shape on
            `tensor`'s device.

        Raises:
            ValueError: if `party` is not a passive party, `tensor` holds NaN/inf or values out of range (the
                message names the party, its largest |value|, the bound and the options), or this party already
                used this (step, index). A refused call consumes no mask stream.
        """
        self._require_setup()
        peers = self._peers.get(party)
        if peers is None:
            raise ValueError(f"party {party!r} is not a passive party of this backend; passive: {list(self._passive)}")
        step = prg.check_uint(step, "step", prg.MAX_STEP)
        index = prg.check_uint(index, "index", prg.MAX_INDEX)
        encoded = fixedpoint.encode(
            tensor,
            self.frac_bits,
            headroom_parties=self._num_parties,
            who=f"party {party!r}",
            ring_bits=self.ring_bits,
            remedy=self._range_remedy,
        )
        self._claim_stream(party, step, index)
        share = prg.add_masks_(encoded.to("cpu").contiguous(), peers, step, self.rank, index)
        return share.to(tensor.device)

    def _remedy(self) -> str:
        """The options to name when a value is out of range."""
        smaller = f"a smaller frac_bits (now {self.frac_bits}; each bit fewer doubles the bound)"
        if self.ring_bits == 64:
            return f"pass {smaller}, or normalize the embedding"
        wide = fixedpoint.max_abs_value(self.frac_bits, self._num_parties, 64)
        return f"pass ring_bits=64 (|x| < {wide:.6g} at this frac_bits, 8 bytes per element), or {smaller}"

    @contextlib.contextmanager
    def off_the_record(self) -> Iterator[None]:
        """Forget the (step, index) pairs claimed inside (see `AggregationBackend.off_the_record`)."""
        saved = {party: (latest, set(indices)) for party, (latest, indices) in self._used.items()}
        try:
            yield
        finally:
            self._used = saved

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
                has the wrong shape. TypeError: if a share is not a tensor of this ring's dtype (int32 or int64).
        """
        self._require_setup()
        if not isinstance(active_tensor, torch.Tensor) or not active_tensor.is_floating_point():
            raise TypeError("combine: active_tensor must be a floating-point tensor")
        self.check_one_per_party(shares, self._passive, why=" (without every share the masks do not cancel)")
        if not self._passive:
            return active_tensor
        ring_dtype = fixedpoint.RING_DTYPES[self.ring_bits]
        for name in self._passive:
            share = shares[name]
            if not isinstance(share, torch.Tensor) or share.dtype != ring_dtype:
                got = share.dtype if isinstance(share, torch.Tensor) else type(share).__name__
                raise TypeError(
                    f"combine: share of party {name!r} must be an {str(ring_dtype).removeprefix('torch.')} tensor "
                    f"from DHMasking(ring_bits={self.ring_bits}).protect, got {got}"
                )
            if share.shape != active_tensor.shape:
                raise ValueError(
                    f"combine: share of party {name!r} has shape {tuple(share.shape)}, "
                    f"the active tensor {tuple(active_tensor.shape)}"
                )
        total = fixedpoint.ring_sum(shares[name].to("cpu") for name in self._passive)
        return fixedpoint.add_decoded(active_tensor, total, self.frac_bits)

    def combine_in_clear(
        self, active_tensor: torch.Tensor, tensors: Mapping[str, torch.Tensor], order: Sequence[str]
    ) -> torch.Tensor:
        """`combine`'s arithmetic on tensors in the clear (see `AggregationBackend.combine_in_clear`).

        Each tensor is rounded as `protect` encodes it, and the integer sum decoded and added as
        `fixedpoint.add_decoded` adds it (no wrap: `protect` refuses values out of range).
        """
        total = None
        for name in order:
            x = tensors[name].to(active_tensor.device)
            work = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
            encoded = x.to(work).mul(2.0**self.frac_bits).round().to(torch.int64)
            total = encoded if total is None else total + encoded
        if total is None:
            return active_tensor
        if active_tensor.dtype not in (torch.float32, torch.float64):
            return active_tensor + total.to(torch.float64).mul(2.0**-self.frac_bits).to(active_tensor.dtype)
        return torch.add(active_tensor, total.to(active_tensor.dtype), alpha=2.0**-self.frac_bits)

    # -- checkpoints and pickling: never any key material --------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Non-secret configuration only; keys are agreed afresh by `setup` after a restore."""
        return {"frac_bits": self.frac_bits, "ring_bits": self.ring_bits}

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without pair keys (and without the stream bookkeeping that goes with them)."""
        state = self.__dict__.copy()
        state.update(_peers=None, _passive=(), _num_parties=0, _range_remedy="", _used={})
        return state

    def __repr__(self) -> str:
        ready = "set up" if self._peers is not None else "not set up"
        return (
            f"DHMasking(frac_bits={self.frac_bits}, allow_insecure={self.allow_insecure}, "
            f"ring_bits={self.ring_bits}) [{ready}]"
        )
