"""`Paillier`: additively homomorphic aggregation with a key-holding coordinator, packed and parallel.

Parties: K passive parties hold embeddings E_k, the active party holds its own embedding and must learn
`sum_k E_k`, and a *coordinator* (a third party, default name "coordinator") holds the Paillier secret key.

Protocol:

1. Setup. The coordinator generates a Paillier key pair (a Blum modulus n = p * q of `key_size` bits, g = n + 1)
   and sends the public key, n as big-endian bytes of its real length, to the active party and every passive party
   (`tag="keys"`, `(K + 1) * key_bytes` in all). The secret key never leaves the coordinator. Each passive party
   then derives its own fixed base from n alone, `h_s = (-x**2)**n mod n**2` with a random x in Z_n^* (Damgard,
   Jurik, Nielsen; `lvfl.crypto.paillier.fixed_base`): public key material that needs no message, since any holder
   of n can make one, and that no other party needs (h_s only randomizes this party's encryptions).
2. Protect (passive party k, public key only). Encode each value to fixed point, `q = round(x * 2**frac_bits)`,
   shift it to a non-negative slot value `u = q + 2**(v - 1)` with `v = int_bits + frac_bits + 1` value bits,
   pack `S` slot values into one plaintext and encrypt it: `c = (1 + m * n) * h_s**r mod n**2` with a fresh
   uniform short exponent `r` in [0, 2**448) at 2048 bits (`short_exponent_bits`). This is a Paillier ciphertext
   of m under the same public key (h_s**r is an n-th residue, as rho**n is), so steps 3-5 are unchanged. The share
   is the list of ciphertexts; the protocol sends it to the active party.
3. Combine (active party). Multiply the K parties' ciphertexts slot-group by slot-group (a product of ciphertexts
   mod n**2 encrypts the sum of the plaintexts, so every slot holds the sum of K slot values), then add a fresh
   uniform mask `r` in Z_n to each aggregate, homomorphically: `c * g**r = c * (1 + r * n) mod n**2`. Send the
   masked aggregates to the coordinator (`tag="he_aggregate"`).
4. Decrypt (coordinator). Decrypt with the CRT (phe's `raw_decrypt`) and send the masked plaintexts
   `m + r mod n` back as fixed-width bytes (`tag="he_decrypted"`).
5. Unmask (active party). Subtract `r` mod n, unpack the slots, check that every slot lies in the range K honest
   encodings can produce (see overflow below), subtract `K * 2**(v - 1)` and decode; return
   `active_tensor + sum_k E_k` (fixed-point rounded), differentiable with respect to `active_tensor`.

Packing layout (see `lvfl.crypto.packing`): value j of a group sits in bits `[j * w, (j + 1) * w)` of the plaintext,
with slot width `w = v + ceil(log2(C))`, `C = K + 1` the number of parties holding embeddings, and
`S = floor((n.bit_length() - 1) / w)` slots per plaintext (so every packed plaintext and every packed sum stays
below `2**(S * w) <= 2**(bits - 1) <= n`). K slot values are each below `2**v`, so their sum is below
`K * 2**v <= 2**w`: it never carries into the next slot (counting C = K + 1 parties, as `DHMasking` does, can
only add margin). The mask r is added to the whole plaintext mod n and removed exactly, so it needs no headroom.
With the default 2048-bit key, `frac_bits=16` and `int_bits=12` (|x| < 4096), v = 29 and a three-party run
(C = 3) packs 66 values per ciphertext; `pack=False` puts one value in each ciphertext (the naive baseline, same
encoding).

Overflow: `protect` refuses NaN, inf and any |x| >= `2**int_bits - 2**-(frac_bits + 1)` (which would round to a
value needing more than v bits), naming the party and the bound. `combine` independently refuses a decrypted slot
outside `[K, K * (2**v - 1)]`, nonzero padding, or a carry out of the top slot: these cannot come from honest
`protect` calls, so they mean a share built another way or a layout with too little headroom.

What each party learns (semi-honest parties; the coordinator does not collude with the active party and does not
see the passive-to-active messages):

- Passive parties: the public key only.
- The active party: K ciphertexts per value group, semantically secure since it has no secret key, under the
  decisional composite residuosity assumption and the short-exponent assumption of the fixed-base encryption (that
  h_s**r with a 448-bit r cannot be told from h_s**r with a full-length r: see `lvfl.crypto.paillier`; 112-bit
  security at 2048 bits, as for the key), and the sum it must learn. It never sees a decryption of anything but the
  masked sum, so it learns no individual E_k (with K = 1 the sum *is* E_1, as for every aggregation backend).
- The coordinator: masked plaintexts `m + r mod n`. For uniform `r` in Z_n and any fixed m in Z_n, `m + r mod n` is
  uniform in Z_n, so the coordinator's view is independent of every embedding and of their sum; it never receives a
  passive party's share, only one aggregate message per `combine`. (With the secret key it can recover the product
  of the encryption randomness, which the passive parties drew independently of their data.) Message sizes reveal
  the tensor shape, as for every backend.

If the coordinator colluded with the active party they could decrypt each passive party's ciphertexts; that is the
trust assumption of coordinator-based HE in vertical FL and it is stated, not defended.

Cost: an encryption is one fixed-base exponentiation `h_s**r mod n**2` whatever the plaintext: 56 multiplications
mod n**2 with a table of h_s's powers (one row of 256 per byte of r, 7.3 MB per passive party at 2048 bits, built
once, about 0.1 s) instead of the 2048-bit exponent of textbook `rho**n` (phe's `encrypt`): about 30 times faster,
over 3,000 encryptions a second per core (`benchmarks/perf/paillier_speed.py`). A party builds its table once it has
encrypted `TABLE_AFTER` ciphertexts; before that each `h_s**r` is one plain exponentiation by the 448-bit r (the
same ciphertexts, no set-up cost for a party that encrypts little). Packing S values divides the passive parties'
work, the ciphertext bytes and the coordinator's (CRT) decryptions by S; the unit costs are measured by
`benchmarks/perf/costs.py` (docs/results.md section 8). Calls of at least `MIN_PARALLEL_CIPHERTEXTS` ciphertexts run
the exponentiations in a `ProcessPoolExecutor` of `workers` processes (reused across calls, work split into a few
chunks per worker, each worker building and keeping its own table of each party's h_s). Decryption stays in the
coordinator's own process.

Worker processes never hold the secret key. A worker receives only public values, n and the party's h_s, and fresh
random exponents r (drawn in the calling process from the OS CSPRNG) and returns `h_s**r mod n**2`; the calling
process multiplies in `1 + m * n`, so a worker sees neither the secret key nor a plaintext. The workers are started
with the "forkserver" method ("spawn" where the platform has no forkserver): they are forked from a server process
that was itself started by `exec` of a fresh interpreter, never forked from this process, so they inherit none of
its memory (the coordinator's key object and primes, which live in the same process in the one-process
simulation, included; across processes, `lvfl party`, the key pair exists only in the coordinator's process:
`setup` and `combine` run each part where `wire.holds` its party). `fork` would copy the whole address space, key
included. The price: starting the pool costs a fresh interpreter once per backend (measured by
`benchmarks/perf/costs.py`), its first task an import of `lvfl.crypto` (torch included, a second or two once per
worker), plus whatever the main script imports, since multiprocessing re-imports the main module in every worker
(scripts must keep their work under `if __name__ == "__main__":`; the `lvfl` console script re-imports its entry
module once per run, `python -m lvfl` and pytest nothing).

Secure defaults: `key_size` >= 2048 bits (112-bit security) with no override; fresh randomness from `secrets` (the
OS CSPRNG) for every fixed base, every ciphertext and every mask; the secret key never enters `state_dict`, pickles
or copies (nor do the fixed bases and tables, which go with the key).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
import torch
from phe import paillier as phe_paillier

from lvfl.checks import check_int
from lvfl.crypto import fixedpoint, packing, paillier, prg
from lvfl.parties import PartySpec
from lvfl.privacy.aggregation.base import AggregationBackend
from lvfl.privacy.aggregation.paillier_share import PaillierShare
from lvfl.wire import Absent, Wire, shadow

#: integer bits accepted; int_bits + frac_bits + 1 <= 53 keeps every encoding exact in float64
MAX_VALUE_BITS = 53
#: fewer ciphertexts than this are encrypted in-process: at about 0.35 ms a fixed-base encryption (2048 bits), two
#: warm workers beat one process from about 32 ciphertexts a call on, and a worker builds its own table (0.1 s) the
#: first time it meets a party
MIN_PARALLEL_CIPHERTEXTS = 32
#: a party raises its fixed base by each r directly until it has encrypted this many ciphertexts, then builds the
#: table, which costs about as much as this many direct exponentiations (14,000 multiplications): a party that
#: encrypts little pays no set-up, and one that encrypts much at most about twice what the table alone would cost
TABLE_AFTER = 64
#: aim for this many chunks per worker, so that a slow worker does not hold up the rest
CHUNKS_PER_WORKER = 4


def _chunks(items: Sequence[int], count: int) -> list[Sequence[int]]:
    size = -(-len(items) // count)
    return [items[i : i + size] for i in range(0, len(items), size)]


def _pool_context() -> multiprocessing.context.BaseContext:
    """A start method whose workers inherit none of this process's memory (so never the secret key).

    "forkserver" forks workers from a server process started by exec of a fresh interpreter (cheap per worker);
    "spawn" (the fallback where there is no forkserver, e.g. Windows) execs a fresh interpreter per worker. Never
    "fork", which would copy the coordinator's key object into every worker.
    """
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _modulus(received: Any, key_size: int, party: str) -> int:
    """The modulus n that `party` received in `keys`: `key_size` bits, odd; anything else is refused by name."""
    if not isinstance(received, bytes):
        raise TypeError(f"Paillier setup: {party} received a {type(received).__name__} as the modulus, not bytes")
    n = int.from_bytes(received, "big")
    if n.bit_length() != key_size or n % 2 == 0:
        raise ValueError(
            f"Paillier setup: {party} received a {n.bit_length()}-bit modulus; this run's key_size is {key_size} bits"
        )
    return n


class Paillier(AggregationBackend):
    """Aggregation of passive embeddings under Paillier encryption, decrypted blind by a coordinator.

    See the module docstring for the protocol, the packing layout and what each party learns. Wire tags: `keys`
    (setup), `he_aggregate` (active -> coordinator) and `he_decrypted` (coordinator -> active); the protocol sends
    the shares themselves (passive -> active).

    Secrets: the coordinator's secret key lives only in this object; it never enters `state_dict`, pickles,
    `copy.copy` or `copy.deepcopy` (see `__getstate__`), so a restored or copied backend must be `setup` again,
    which generates a fresh key pair. The process pool is not pickled either.

    Args:
        key_size: bits of the modulus n; an int >= 2048 and a multiple of 256.
        frac_bits: fractional bits of the fixed-point encoding (resolution 2**-frac_bits), in [1, 40].
        int_bits: integer bits: values must satisfy |x| < 2**int_bits (less half a resolution step), in [0, 52].
            Fewer bits mean narrower slots and more values per ciphertext.
        pack: pack as many values per plaintext as fit (True), or one per plaintext (the naive baseline).
        workers: processes encrypting in parallel; None means `os.cpu_count()`, 1 means in-process.
        coordinator: the name of the key-holding party (a party of role "coordinator" in `setup`, or a name
            distinct from every party's).

    Example:
        >>> import torch
        >>> from lvfl.parties import PartySpec
        >>> from lvfl.wire import Absent, Wire, shadow
        >>> parties = [PartySpec("a", "active", (2,)), PartySpec("p1", "passive", (2,), 1),
        ...            PartySpec("p2", "passive", (2,), 2)]
        >>> backend, wire = Paillier(workers=1), Wire()
        >>> backend.setup(parties, "a", wire)
        >>> wire.bytes_by_tag()
        {'keys': 768}
        >>> x = torch.tensor([0.5, -1.25])
        >>> shares = {p: wire.send(p, "a", backend.protect(p, x, step=0), tag="embeddings") for p in ("p1", "p2")}
        >>> backend.combine(torch.zeros(2), shares)
        tensor([ 1.0000, -2.5000])
        >>> wire.bytes_by_tag()
        {'keys': 768, 'embeddings': 1024, 'he_aggregate': 512, 'he_decrypted': 256}
        >>> backend.close()
    """

    coordinator: str = "coordinator"
    reveals_shares = False
    refuses_nonfinite = True
    refuses_reused_step = False  # every encryption and every mask draws fresh randomness from the OS CSPRNG

    def __init__(
        self,
        key_size: int = paillier.MIN_KEY_SIZE,
        frac_bits: int = 16,
        int_bits: int = 12,
        pack: bool = True,
        workers: int | None = None,
        coordinator: str = "coordinator",
    ) -> None:
        self.key_size = self._validate_key_size(key_size)
        self.frac_bits, self.int_bits = self._validate_bits(frac_bits, int_bits)
        self.pack = bool(pack)
        if workers is None:
            workers = os.cpu_count() or 1
        self.workers = check_int(workers, "Paillier(workers=...)", low=1)  # None: one per CPU
        if not isinstance(coordinator, str) or not coordinator:
            raise ValueError(f"Paillier(coordinator=...) must be a non-empty party name, got {coordinator!r}")
        self.coordinator = coordinator
        self._pool: Executor | None = None
        self._pool_finalizer: weakref.finalize | None = None
        self._forget_keys()

    @staticmethod
    def _validate_key_size(key_size: int) -> int:
        return paillier.check_key_size(key_size, "Paillier(key_size=...)")  # smaller moduli can be factored

    @staticmethod
    def _validate_bits(frac_bits: int, int_bits: int) -> tuple[int, int]:
        fixedpoint.check_frac_bits(frac_bits, "Paillier(frac_bits=...)")
        int_bits = check_int(int_bits, "Paillier(int_bits=...)")
        if not 0 <= int_bits <= MAX_VALUE_BITS - 1 - frac_bits:
            raise ValueError(
                f"Paillier(int_bits=...) must be in [0, {MAX_VALUE_BITS - 1 - frac_bits}] with frac_bits={frac_bits} "
                f"(int_bits + frac_bits + 1 <= {MAX_VALUE_BITS}), got {int_bits}"
            )
        return frac_bits, int_bits

    def _forget_keys(self) -> None:
        self._secret_key: phe_paillier.PaillierPrivateKey | None = None  # the coordinator's; never serialized
        self._public: dict[str, phe_paillier.PaillierPublicKey] = {}  # each party's copy, as received on the wire
        self._fixed_base: dict[str, paillier.FixedBase] = {}  # each passive party's own h_s (and table, once built)
        self._encrypted: dict[str, int] = {}  # ciphertexts each passive party has encrypted (for TABLE_AFTER)
        self._passive: tuple[str, ...] = ()

    def error_bound(self, num_parties: int | None = None) -> float:
        """`K * 2**-(frac_bits + 1)`: each passive value is rounded to fixed point once; the slot sums are exact."""
        k = len(self._passive) if num_parties is None else int(num_parties)
        return k * 2.0 ** -(self.frac_bits + 1)

    # -- 1. setup: the coordinator's key pair, the public key on the wire, each passive party's fixed base -----------
    def setup(self, parties: Sequence[PartySpec], active: str, wire: Wire, rank: int = 0) -> None:
        """Generate a fresh key pair at the coordinator and send the public key to every other party.

        Each passive party then derives its own fixed base h_s from the n it received (no message).

        Raises:
            ValueError: on duplicate party names, an `active` that is not the active party, no passive party, or a
                coordinator that clashes with the parties (another party of role "coordinator", or the name of an
                active or passive party).
        """
        passive = self.check_roles(parties, active)
        if not passive:
            raise ValueError(f"Paillier needs at least one passive party, got none among {[p.name for p in parties]}")
        rank = prg.check_uint(rank, "rank", prg.MAX_RANK)

        super().setup(parties, active, wire, rank)
        self._forget_keys()
        secret = None
        n_bytes: Any = Absent("the coordinator's Paillier modulus")  # where the coordinator is not held
        if wire.holds(self.coordinator):  # the key pair exists in the coordinator's process only
            n, secret = paillier.generate_keypair(self.key_size)
            n_bytes = n.to_bytes(paillier.plaintext_nbytes(n), "big")
            self._public[self.coordinator] = secret.public_key
        for party in (active, *passive):  # coordinator -> every other party: n; g = n + 1 is implied
            received = wire.send(self.coordinator, party, n_bytes, tag="keys")
            if wire.holds(party):
                self._public[party] = phe_paillier.PaillierPublicKey(_modulus(received, self.key_size, party))
        for party in passive:  # at each passive party, from the n it received: h_s = (-x**2)**n mod n**2
            if not wire.holds(party):
                continue
            n_here = self._public[party].n
            h_s = paillier.fixed_base(n_here)
            self._fixed_base[party] = paillier.fixed_base_table(n_here, h_s, window=0)  # the table comes later
            self._encrypted[party] = 0
        self._secret_key = secret
        self._passive = passive

    def _require_setup(self) -> None:
        if not self._public:
            raise RuntimeError(
                "Paillier has no keys: call setup(parties, active, wire, rank) first "
                "(the secret key is never checkpointed or pickled, so a restored backend must be set up again)"
            )

    @property
    def public_key(self) -> phe_paillier.PaillierPublicKey:
        """The public key (n, g = n + 1) that every party received in `setup` (this process's copy of it)."""
        self._require_setup()
        return self._public.get(self.active) or next(iter(self._public.values()))

    @property
    def value_bits(self) -> int:
        """v: bits of one encoded value after the offset, `int_bits + frac_bits + 1`."""
        return self.int_bits + self.frac_bits + 1

    def layout(self) -> tuple[int, int]:
        """(slot width w, values per ciphertext S) for the parties and key of the last `setup`."""
        self._require_setup()
        plaintext_bits = self.public_key.n.bit_length() - 1
        return packing.slot_layout(self.value_bits, len(self._passive) + 1, plaintext_bits, pack=self.pack)

    @property
    def ciphertext_nbytes(self) -> int:
        """Wire size of one ciphertext: an integer mod n**2 at fixed width, `ceil(2 * key_bits / 8)`."""
        return paillier.ciphertext_nbytes(self.public_key.n)

    @property
    def plaintext_nbytes(self) -> int:
        """Wire size of one decrypted (masked) plaintext: an integer mod n at fixed width."""
        return paillier.plaintext_nbytes(self.public_key.n)

    # -- 2. protect: at passive party k, public key only -------------------------------------------------------------
    def protect(self, party: str, tensor: torch.Tensor, step: int, index: int = 0) -> PaillierShare:
        """Encode, pack and encrypt `tensor` under the public key that passive `party` received.

        Raises:
            ValueError: if `party` is not a passive party, or `tensor` holds NaN/inf or values out of range (the
                message names the party and the bound). TypeError: if `tensor` is not floating point.
        """
        self._require_setup()
        if party not in self._passive:
            raise ValueError(f"party {party!r} is not a passive party of this backend; passive: {list(self._passive)}")
        step = prg.check_uint(step, "step", prg.MAX_STEP)
        index = prg.check_uint(index, "index", prg.MAX_INDEX)
        width, slots = self.layout()
        encoded = self._encode(tensor, who=f"party {party!r}")
        plaintexts = packing.pack(encoded, width, slots)
        ciphertexts = self._encrypt(party, plaintexts)
        return PaillierShare(
            ciphertexts=tuple(ciphertexts),
            shape=tuple(tensor.shape),
            width=width,
            slots=slots,
            step=step,
            index=index,
            ciphertext_nbytes=self.ciphertext_nbytes,
        )

    def _encode(self, tensor: torch.Tensor, who: str) -> np.ndarray:
        """Slot values `round(x * 2**frac_bits) + 2**(v - 1)` in [1, 2**v - 1], as a flat uint64 array."""
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            what = f"tensor of dtype {tensor.dtype}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"{who}: Paillier encodes floating-point tensors, got a {what}")
        x = tensor.detach().to("cpu", torch.float64).reshape(-1)  # exact for every float dtype
        offset = 1 << (self.value_bits - 1)
        if x.numel():
            lo, hi = torch.aminmax(x)
            peak = max(-float(lo), float(hi))
            if not math.isfinite(peak):
                raise ValueError(f"{who}: tensor contains NaN or inf (max |value| = {peak}); it cannot be encoded")
            # |x| * 2**f < offset - 1/2 <=> round(|x| * 2**f) <= offset - 1; both sides exact in float64 (v <= 53)
            if math.ldexp(peak, self.frac_bits) >= offset - 0.5:
                bound = math.ldexp(offset - 0.5, -self.frac_bits)
                raise ValueError(
                    f"{who}: max |value| = {peak:.6g} is out of Paillier's encodable range |x| < {bound:.10g} "
                    f"(int_bits={self.int_bits}, frac_bits={self.frac_bits}); normalize or clip the embedding, or "
                    "raise int_bits"
                )
        q = x.mul(2.0**self.frac_bits).round_().to(torch.int64).numpy()  # not in place: x may be the caller's tensor
        return (q + offset).astype(np.uint64)

    # -- fixed-base encryption, in-process or in the pool ------------------------------------------------------------
    def fixed_base(self, party: str) -> paillier.FixedBase:
        """Passive `party`'s fixed base h_s (public), with its table once the party has encrypted `TABLE_AFTER`."""
        self._require_setup()
        if party not in self._fixed_base:
            raise ValueError(f"party {party!r} is not a passive party of this backend; passive: {list(self._passive)}")
        return self._fixed_base[party]

    def _encrypt(self, party: str, plaintexts: list[int]) -> list[int]:
        base = self._fixed_base[party]
        self._encrypted[party] += len(plaintexts)
        if self.workers == 1 or len(plaintexts) < MIN_PARALLEL_CIPHERTEXTS:
            if not base.rows and self._encrypted[party] >= TABLE_AFTER:
                base = self._fixed_base[party] = paillier.fixed_base_table(base.n, base.h_s, base.exponent_bits)
            return paillier.encrypt_fixed_base(base, plaintexts)
        exponents = paillier.short_exponents(base.exponent_bits, len(plaintexts))  # drawn here, from the OS CSPRNG
        pool = self._get_pool()
        chunks = _chunks(exponents, self.workers * CHUNKS_PER_WORKER)
        # public values only (n, h_s) and the exponents; each worker keeps its own table of this h_s
        task, *public = paillier.fixed_base_task(base.n, base.h_s, base.exponent_bits)
        obfuscators: list[int] = []
        try:
            for part in pool.map(task, *([value] * len(chunks) for value in public), chunks):
                obfuscators.extend(part)
        except BrokenProcessPool:
            self.close()  # a worker died (e.g. killed for memory): the next call starts a fresh pool
            raise
        return paillier.finish_encryption(base.n, plaintexts, obfuscators)

    def _get_pool(self) -> Executor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=_pool_context())
            # shuts the pool down when this backend is garbage collected or at interpreter exit, whichever is first
            self._pool_finalizer = weakref.finalize(self, self._pool.shutdown, wait=True, cancel_futures=True)
        return self._pool

    def close(self) -> None:
        """Shut the worker pool down (idempotent); a later `protect` starts a new one if it needs it."""
        if self._pool_finalizer is not None:
            self._pool_finalizer()
        self._pool = None
        self._pool_finalizer = None

    # -- 3.-5. combine: active party, coordinator, active party --------------------------------------------------------
    def combine(self, active_tensor: torch.Tensor, shares: Mapping[str, Any]) -> torch.Tensor:
        """`active_tensor` plus the decrypted sum of the passive shares, in `active_tensor`'s dtype and device.

        Runs steps 3-5 of the protocol: homomorphic sum and masking at the active party, blind decryption at the
        coordinator, unmasking and decoding at the active party. Gradients flow to `active_tensor` only.

        Raises:
            ValueError: if a passive party's share is missing or unknown, shares disagree in shape, layout, step or
                index, or a decrypted slot is out of range (overflow). TypeError: if a share is not a
                `PaillierShare` or `active_tensor` is not floating point.
        """
        self._require_setup()
        if not isinstance(active_tensor, torch.Tensor) or not active_tensor.is_floating_point():
            raise TypeError("combine: active_tensor must be a floating-point tensor")
        at_active_party, at_coordinator_party = self.wire.holds(self.active), self.wire.holds(self.coordinator)
        message: Any = Absent("the masked aggregate")
        if at_active_party:
            self.check_one_per_party(shares, self._passive)
            width, slots = self._check_shares(active_tensor, shares)
            n = int(self._public[self.active].n)
            first = shares[self._passive[0]]
            # 3. active party: homomorphic sum (product of ciphertexts), then + r (times g**r = 1 + r * n)
            columns = zip(*(shares[name].ciphertexts for name in self._passive), strict=True)
            aggregate = [paillier.add(n, column) for column in columns]
            blinded, masks = paillier.blind(n, aggregate)
            masked = tuple(blinded)
            message = PaillierShare(masked, first.shape, width, slots, first.step, first.index, self.ciphertext_nbytes)
        at_coordinator = self.wire.send(self.active, self.coordinator, message, tag="he_aggregate")

        # 4. coordinator: blind decryption (CRT), masked plaintexts back at fixed width
        decrypted: Any = Absent("the masked plaintexts")
        if at_coordinator_party:
            decrypted = self._decrypt(self._check_aggregate(at_coordinator))
        at_active = self.wire.send(self.coordinator, self.active, decrypted, tag="he_decrypted")
        if not at_active_party:  # the coordinator's process: the sum's shadow (it learns nothing of its value)
            return shadow(active_tensor).requires_grad_(active_tensor.requires_grad)

        # 5. active party: unmask, unpack, check the slots, decode
        if not isinstance(at_active, bytes) or len(at_active) != len(masked) * self.plaintext_nbytes:
            got = f"{len(at_active)} bytes" if isinstance(at_active, bytes) else type(at_active).__name__
            raise ValueError(
                f"combine: the coordinator {self.coordinator!r} answered {got}; expected "
                f"{len(masked) * self.plaintext_nbytes} bytes ({len(masked)} plaintexts)"
            )
        plaintexts = paillier.unblind(n, paillier.from_bytes(at_active, self.plaintext_nbytes), masks, as_signed=False)
        total = self._decode(plaintexts, width, slots, first.numel)
        decoded = torch.from_numpy(total).to(torch.float64).mul_(2.0**-self.frac_bits).reshape(first.shape)
        return active_tensor + decoded.to(active_tensor)

    def combine_in_clear(
        self, active_tensor: torch.Tensor, tensors: Mapping[str, torch.Tensor], order: Sequence[str]
    ) -> torch.Tensor:
        """`combine`'s arithmetic on tensors in the clear (see `AggregationBackend.combine_in_clear`).

        Each tensor is rounded in float64 as `_encode` rounds it; the sum (exact: integers below 2**53) is scaled in
        float64 and added in the active tensor's dtype.
        """
        total = None
        for name in order:
            encoded = tensors[name].to(active_tensor.device, torch.float64).mul(2.0**self.frac_bits).round()
            total = encoded if total is None else total + encoded
        if total is None:
            return active_tensor
        return active_tensor + total.mul(2.0**-self.frac_bits).to(active_tensor)

    def _check_shares(self, active_tensor: torch.Tensor, shares: Mapping[str, Any]) -> tuple[int, int]:
        width, slots = self.layout()
        expected_ciphertexts = -(-active_tensor.numel() // slots)
        n2 = self.public_key.nsquare
        reference: tuple | None = None
        for name in self._passive:
            share = shares[name]
            if not isinstance(share, PaillierShare):
                raise TypeError(f"combine: share of party {name!r} must be a PaillierShare from Paillier.protect")
            if share.shape != tuple(active_tensor.shape):
                raise ValueError(
                    f"combine: share of party {name!r} has shape {share.shape}, the active tensor "
                    f"{tuple(active_tensor.shape)}"
                )
            if (share.width, share.slots, share.ciphertext_nbytes) != (width, slots, self.ciphertext_nbytes):
                raise ValueError(
                    f"combine: share of party {name!r} has layout width={share.width}, slots={share.slots}, "
                    f"ciphertext_nbytes={share.ciphertext_nbytes}; this backend's key and parties give width={width}, "
                    f"slots={slots}, ciphertext_nbytes={self.ciphertext_nbytes} (a share from another setup?)"
                )
            if len(share.ciphertexts) != expected_ciphertexts:
                raise ValueError(
                    f"combine: share of party {name!r} has {len(share.ciphertexts)} ciphertexts, expected "
                    f"{expected_ciphertexts} for shape {share.shape}"
                )
            if not all(0 < c < n2 for c in share.ciphertexts):
                raise ValueError(f"combine: share of party {name!r} holds a ciphertext outside (0, n**2)")
            if reference is None:
                reference = (share.step, share.index)
            elif (share.step, share.index) != reference:
                raise ValueError(
                    f"combine: share of party {name!r} is for step {share.step} index {share.index}, the share of "
                    f"party {self._passive[0]!r} for step {reference[0]} index {reference[1]}"
                )
        return width, slots

    def _check_aggregate(self, message: Any) -> tuple[int, ...]:
        """The coordinator's check of what the active party sent it: ciphertexts mod n**2, nothing else."""
        if not isinstance(message, PaillierShare):
            what = type(message).__name__
            raise TypeError(f"combine: the coordinator got a {what}, not the active party's aggregate")
        n2 = self.public_key.nsquare
        if not all(isinstance(c, int) and 0 < c < n2 for c in message.ciphertexts):
            raise ValueError("combine: the aggregate the coordinator got holds a ciphertext outside (0, n**2)")
        return message.ciphertexts

    def _decrypt(self, ciphertexts: Sequence[int]) -> bytes:
        """The coordinator's step: CRT decryption, each plaintext as `plaintext_nbytes` big-endian bytes."""
        secret = self._secret_key
        return paillier.to_bytes((paillier.decrypt(secret, c) for c in ciphertexts), self.plaintext_nbytes)

    def _decode(self, plaintexts: list[int], width: int, slots: int, count: int) -> np.ndarray:
        """Slot sums minus K offsets, as int64, after checking every slot is in the range K encodings can reach."""
        parties = len(self._passive)
        try:
            sums = packing.unpack(plaintexts, width, slots)
        except ValueError as err:
            raise ValueError(
                f"combine: overflow in the decrypted sum ({err}); shares were not made by protect"
            ) from None
        used, padding = sums[:count], sums[count:]
        low, high = parties, parties * ((1 << self.value_bits) - 1)
        if used.size and (int(used.min()) < low or int(used.max()) > high):
            raise ValueError(
                f"combine: overflow: a decrypted slot holds {int(used.min())}..{int(used.max())}, outside [{low}, "
                f"{high}] that {parties} passive parties' encodings can sum to (a share not made by protect, or too "
                "little headroom)"
            )
        if padding.any():
            raise ValueError("combine: overflow: a padding slot of the decrypted sum is nonzero")
        offsets = np.uint64(parties << (self.value_bits - 1))
        return (used - offsets).view(np.int64)  # |sum| < K * 2**(v - 1) <= 2**63: exact two's complement

    # -- checkpoints and pickling: never the secret key, never the pool ------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Non-secret configuration only; `setup` generates a fresh key pair after a restore."""
        return {"key_size": self.key_size, "frac_bits": self.frac_bits, "int_bits": self.int_bits, "pack": self.pack}

    def __getstate__(self) -> dict[str, Any]:
        """Pickle (and copy) without the secret key, the public keys and fixed bases that go with it, or the pool."""
        state = self.__dict__.copy()
        state.update(
            _secret_key=None, _public={}, _fixed_base={}, _encrypted={}, _passive=(), _pool=None, _pool_finalizer=None
        )
        return state

    def __repr__(self) -> str:
        ready = "set up" if self._public else "not set up"
        return (
            f"Paillier(key_size={self.key_size}, frac_bits={self.frac_bits}, int_bits={self.int_bits}, "
            f"pack={self.pack}, workers={self.workers}, coordinator={self.coordinator!r}) [{ready}]"
        )
