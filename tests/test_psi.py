"""Private set intersection: RFC 9380 hashing, the intersection, the ledger, and what a passive party receives."""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import gmpy2
import numpy as np
import pytest
from helpers import each_in_a_thread

from lvfl.alignment import kkrt, message_bytes, parts, private_intersection
from lvfl.alignment.matching import match_positions
from lvfl.alignment.parts import send_in_parts
from lvfl.crypto import oprf
from lvfl.crypto.ecdh_blinding import DST, PARALLEL_FROM, POINT_BYTES, PSIKey, secret_permutation, split_points
from lvfl.crypto.hash_to_curve import (
    P,
    _add,
    _map_projective,
    _sum_of_maps,
    _sum_u,
    hash_to_curve,
    hash_to_u,
    map_to_curve_elligator2,
)
from lvfl.federation import FederationError
from lvfl.federation.rehearsal import MemoryCarrier
from lvfl.wire import Absent, Wire, payload_nbytes

# RFC 9380 Appendix J.4.1, curve25519_XMD:SHA-512_ELL2_RO_ (P.x, P.y as printed there)
SHUFFLE = {"retailer": bytes(range(100, 132)), "insurer": bytes(range(140, 172)), "shop": bytes(range(1, 33))}
RFC_DST = b"QUUX-V01-CS02-with-curve25519_XMD:SHA-512_ELL2_RO_"
RFC_VECTORS = [
    (
        b"",
        "2de3780abb67e861289f5749d16d3e217ffa722192d16bbd9d1bfb9d112b98c0",
        "3b5dc2a498941a1033d176567d457845637554a2fe7a3507d21abd1c1bd6e878",
    ),
    (
        b"abc",
        "2b4419f1f2d48f5872de692b0aca72cc7b0a60915dd70bde432e826b6abc526d",
        "1b8235f255a268f0a6fa8763e97eb3d22d149343d495da1160eff9703f2d07dd",
    ),
    (
        b"abcdef0123456789",
        "68ca1ea5a6acf4e9956daa101709b1eee6c1bb0df1de3b90d4602382a104c036",
        "2a375b656207123d10766e68b938b1812a4a6625ff83cb8d5e86f58a4be08353",
    ),
]


@pytest.mark.parametrize(("msg", "x", "y"), RFC_VECTORS)
def test_hash_to_curve_matches_the_rfc_vectors(msg: bytes, x: str, y: str) -> None:
    assert hash_to_curve(msg, RFC_DST) == (int(x, 16), int(y, 16))


def test_the_straight_line_map_gives_the_affine_maps_point() -> None:
    rng = np.random.default_rng(5)
    specials = [0, 1, 2, P - 1, P - 2, (P - 1) // 2]
    for u in specials + [int.from_bytes(rng.bytes(32), "little") % P for _ in range(500)]:
        xn, xd, y = _map_projective(gmpy2.mpz(u))
        assert (xn * pow(int(xd), -1, P) % P, int(y)) == map_to_curve_elligator2(u), u


def test_hash_to_u_is_the_u_coordinate_of_the_rfc_point_before_the_cofactor_is_cleared() -> None:
    messages = [msg for msg, _, _ in RFC_VECTORS] + [str(i).encode() for i in range(300)]
    for msg in messages:
        assert int.from_bytes(hash_to_u(msg, RFC_DST), "little") == _sum_of_maps(msg, RFC_DST)[0], msg
    # the same u twice (a doubling) and u against -u (the same point: Elligator 2 maps both there) take the
    # affine reference; opposite points would be the point at infinity, which u-coordinates alone never reach
    u = 123456789
    assert _sum_u(u, u) == _add(map_to_curve_elligator2(u), map_to_curve_elligator2(u))[0]
    assert _sum_u(u, P - u) == _sum_u(u, u)


def test_blinding_commutes_and_clears_the_cofactor() -> None:
    a, b = PSIKey(bytes(range(32))), PSIKey(bytes(range(1, 33)))
    ids = [b"alice", b"bob", b"carol"]
    ab = split_points(b.reblind(a.blind(ids)))
    ba = split_points(a.reblind(b.blind(ids)))
    assert ab == ba
    assert len(set(ab)) == 3
    # X25519's clamped scalar is 8m: blinding H before the cofactor is cleared equals m times the RFC's point
    assert split_points(a.blind(ids))[0] != hash_to_u(b"alice", DST)


def parties(order_seed: int = 0) -> dict[str, list]:
    """Three parties: the bank (active, integer IDs), a retailer and an insurer (string IDs), in shuffled orders."""
    rng = np.random.default_rng(order_seed)
    base = 10_000_000  # 8-digit IDs: their text cannot turn up by chance in a few kB of random bytes
    bank = [int(i) for i in rng.permutation(np.arange(base, base + 900))]
    retailer = [str(i) for i in rng.permutation(np.arange(base + 296, base + 1200))]  # 604 shared with the bank
    insurer = [str(i) for i in rng.permutation(np.arange(base, base + 2000, 3))]
    return {"bank": bank, "retailer": retailer, "insurer": insurer}


def each_in_its_view(
    ids: dict[str, list], keys: dict[str, bytes], transport: Any, protocol: str = "ecdh"
) -> tuple[dict, dict]:
    """Every party's part of the PSI in a thread of its own, on its own wire view over `transport` (as separate
    processes would run it): the views and what each party's part returns."""
    names = list(ids)
    views = {name: Wire(here=name, carrier=transport) for name in names}

    def run(name: str) -> Any:
        return private_intersection(
            {name: ids[name]},
            parties=names,
            active="bank",
            wire=views[name],
            keys=keys,
            shuffle_keys=SHUFFLE,
            protocol=protocol,
        )

    return views, each_in_a_thread(run, names)


@pytest.mark.parametrize("protocol", ["ecdh", "kkrt"])
@pytest.mark.parametrize("names", [("bank", "retailer"), ("bank", "retailer", "insurer")])
def test_the_intersection_is_the_plain_one_and_lines_every_partys_rows_up(names, protocol) -> None:
    ids = {k: v for k, v in parties().items() if k in names}
    wire = Wire()
    alignment = private_intersection(ids, active="bank", wire=wire, protocol=protocol)
    texts = {k: [str(x) for x in v] for k, v in ids.items()}
    expected = sorted(set.intersection(*(set(t) for t in texts.values())))
    assert alignment.ids == expected
    assert len(expected) == (604 if len(names) == 2 else 201)  # the multiples of 3 in 297..897
    for party, rows in alignment.rows.items():
        assert [texts[party][r] for r in rows] == expected, party
    # every message on the wire, exactly: 32 bytes a point, 4 bytes a matched position; for KKRT, 64 bytes a bin
    # of the matrix, 3 values per ID of 8 bytes (40 + 11 + 12 bits at these sizes)
    sizes = {k: len(v) for k, v in ids.items()}
    ledger = message_bytes(sizes, "bank", len(expected), protocol)
    assert wire.bytes_by_tag() == {f"psi/{k}": v for k, v in ledger.items()}
    if protocol == "ecdh":
        assert wire.total_messages() == 4 * (len(names) - 1)
        assert ledger["blinded"] == 32 * 900 * (len(names) - 1)
    else:
        assert wire.total_messages() == 6 * (len(names) - 1)
        assert ledger["matrix"] == 64 * 1143 * (len(names) - 1)
        assert ledger["values"] == 3 * 8 * sum(n for k, n in sizes.items() if k != "bank")


def inbox(wire: Wire, party: str) -> list:
    messages = []
    wire.subscribe(lambda src, dst, tag, payload: messages.append((tag, payload)) if dst == party else None)
    return messages


def test_a_passive_partys_view_holds_none_of_the_partners_other_ids() -> None:
    """The retailer's inbox: no active-party ID in the clear or merely hashed; and, with every key and shuffle
    fixed, replacing the bank's IDs the retailer does not hold leaves its matches message unchanged."""
    keys = {"bank": bytes(range(32)), "retailer": bytes(range(7, 39))}
    ids = parties()
    ids.pop("insurer")
    shared = set(map(str, ids["bank"])) & set(ids["retailer"])
    others = [x for x in ids["bank"] if str(x) not in shared]

    wire = Wire()
    seen = inbox(wire, "retailer")
    private_intersection(ids, active="bank", wire=wire, keys=keys, shuffle_keys=SHUFFLE, protocol="ecdh")
    assert [tag for tag, _ in seen] == ["psi/blinded", "psi/matches"]
    blob = b"".join(payload for _, payload in seen)
    for x in others:
        assert str(x).encode() not in blob
        assert hash_to_u(str(x).encode(), DST) not in blob  # not even the unblinded hash point

    changed = dict(ids, bank=[x if str(x) in shared else x + 100_000 for x in ids["bank"]])  # same count, new IDs
    wire2 = Wire()
    seen2 = inbox(wire2, "retailer")
    private_intersection(changed, active="bank", wire=wire2, keys=keys, shuffle_keys=SHUFFLE, protocol="ecdh")
    assert seen2[1] == seen[1]  # the matches: positions in the retailer's own shuffled list only
    assert len(seen2[0][1]) == len(seen[0][1])  # the blinded points: their count is all that is fixed
    assert seen2[0][1] != seen[0][1]


def test_in_kkrt_neither_party_receives_the_others_ids_nor_their_digests_or_code_words() -> None:
    """KKRT's views. The retailer's inbox (setup, seeds, matrix, matches) holds no bank ID it lacks in the clear, as
    its digest under the public hash key, or as a code word row of U; replacing those IDs (same count) leaves its
    matches unchanged. The bank's inbox (choices, values) holds no retailer ID or digest, and exactly one of the
    retailer's values equals one of the bank's own for each shared ID: the rest match nothing the bank holds."""
    ids = parties()
    ids.pop("insurer")
    shared = set(map(str, ids["bank"])) & set(ids["retailer"])
    others = [str(x).encode() for x in ids["bank"] if str(x) not in shared]
    theirs = [x.encode() for x in ids["retailer"] if x not in shared]

    wire = Wire()
    seen, at_bank = inbox(wire, "retailer"), inbox(wire, "bank")
    private_intersection(ids, active="bank", wire=wire, shuffle_keys=SHUFFLE, protocol="kkrt")
    assert [tag for tag, _ in seen] == ["psi/setup", "psi/seeds", "psi/matrix", "psi/matches"]
    setup, matrix = seen[0][1], seen[2][1]
    hash_key, code_key = setup[33:49], setup[49:65]
    blob = b"".join(payload for _, payload in seen)
    digests = oprf.digests(others, hash_key)
    rows = {matrix[i : i + 64] for i in range(0, len(matrix), 64)}
    for x, digest in zip(others, digests, strict=True):
        assert x not in blob
        assert digest.tobytes() not in blob
    for i in range(oprf.HASHES):
        words = oprf.code_words(digests, np.full(len(others), i), code_key)
        assert not rows & {w.tobytes() for w in words}

    assert [tag for tag, _ in at_bank] == ["psi/choices", "psi/values"]
    inbound = b"".join(payload for _, payload in at_bank)
    for x, digest in zip(theirs, oprf.digests(theirs, hash_key), strict=True):
        assert x not in inbound
        assert digest.tobytes() not in inbound
    width = oprf.value_bytes(oprf.bins_for(900), len(ids["retailer"]))
    values = np.frombuffer(at_bank[1][1], dtype=f"S{width}")
    assert len(values) == 3 * len(ids["retailer"])

    changed = dict(ids, bank=[x if str(x) in shared else x + 100_000 for x in ids["bank"]])  # same count, new IDs
    wire2 = Wire()
    seen2 = inbox(wire2, "retailer")
    private_intersection(changed, active="bank", wire=wire2, shuffle_keys=SHUFFLE, protocol="kkrt")
    assert seen2[3] == seen[3]  # the matches: positions in the retailer's own shuffled list only
    assert [len(p) for _, p in seen2] == [len(p) for _, p in seen]


def test_kkrt_matches_exactly_the_shared_ids_among_the_values(monkeypatch) -> None:
    """The bank's own values (H(b, t_b) of its filled bins) meet the retailer's three lists exactly once per shared
    ID: counted on the values themselves, not through the protocol's matching."""

    own = {}
    real = oprf.prf_values

    def spy(bins, rows, width):
        values = real(bins, rows, width)
        own.setdefault("first", values)  # the bank's own values come first (its OT extension)
        return values

    monkeypatch.setattr(oprf, "prf_values", spy)
    ids = parties()
    ids.pop("insurer")
    wire = Wire()
    at_bank = inbox(wire, "bank")
    alignment = private_intersection(ids, active="bank", wire=wire, shuffle_keys=SHUFFLE, protocol="kkrt")
    width = own["first"].dtype.itemsize
    values = np.frombuffer(at_bank[1][1], dtype=f"S{width}")
    assert int(np.isin(values, own["first"]).sum()) == len(alignment.ids) == 604


def test_duplicate_missing_and_bad_ids_are_refused_by_name() -> None:
    wire = Wire()
    with pytest.raises(ValueError, match=r"party 'shop': ID 'x7' occurs more than once"):
        private_intersection({"bank": [1, 2], "shop": ["x7", "a", "x7"]}, active="bank", wire=wire)
    with pytest.raises(ValueError, match=r"party 'shop' holds no IDs"):
        private_intersection({"bank": [1, 2], "shop": []}, active="bank", wire=wire)
    with pytest.raises(TypeError, match=r"party 'bank': an ID must be a string or an integer, got 1.5"):
        private_intersection({"bank": [1.5], "shop": ["a"]}, active="bank", wire=wire)
    with pytest.raises(ValueError, match=r"the active party 'nobody' is not among"):
        private_intersection({"bank": [1], "shop": ["1"]}, active="nobody", wire=wire)
    with pytest.raises(ValueError, match=r"not a whole number of 32-byte points"):
        PSIKey().reblind(b"\x01" * 33)
    assert wire.total_messages() == 0


@pytest.mark.slow
def test_points_are_matched_as_a_dict_from_point_to_row_would_match_them() -> None:
    """The active party's matching on sorted arrays against the obvious reference, on points made mostly of zero
    bytes (so that many differ in a trailing byte only, where a string comparison could go wrong)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        pool = list(dict.fromkeys(bytes(rng.integers(0, 3, 32, dtype=np.uint8)) for _ in range(80)))
        mine, theirs = ([pool[i] for i in rng.permutation(len(pool))[: rng.integers(0, 50)]] for _ in range(2))
        row_of = {point: row for row, point in enumerate(mine)}
        expected = np.full(len(mine), -1)
        for position, point in enumerate(theirs):
            if point in row_of:
                expected[row_of[point]] = position
        got = match_positions(np.frombuffer(b"".join(mine), "S32"), np.frombuffer(b"".join(theirs), "S32"))
        assert np.array_equal(got, expected)
    repeated = np.frombuffer(bytes(32) * 2, "S32")  # the active party's points must be one per ID
    assert match_positions(repeated, repeated[:1]) is None


@pytest.mark.parametrize("width", [5, 8, 11, 32])
def test_values_matched_by_their_first_word_are_checked_on_the_whole_value(width) -> None:
    """The fast path (pseudorandom values, no two of the active party's with the same first 8 bytes) against a dict:
    values of `theirs` that share a first word with one of `mine` but differ after it must not match, and a value
    `theirs` repeats matches at its last position."""
    rng = np.random.default_rng(width)
    for _ in range(50):
        mine = list(dict.fromkeys(rng.bytes(width) for _ in range(int(rng.integers(1, 60)))))
        shared = [mine[i] for i in rng.permutation(len(mine))[: len(mine) // 2]]
        near = [m[:8] + bytes(b ^ 1 for b in m[8:]) for m in mine[:5] if width > 8]  # the same first word only
        theirs = [*shared, *near, *(rng.bytes(width) for _ in range(20)), *shared[:2]]  # two repeated
        theirs = [theirs[i] for i in rng.permutation(len(theirs))]
        row_of = {value: row for row, value in enumerate(mine)}
        expected = np.full(len(mine), -1)
        for position, value in enumerate(theirs):
            if value in row_of:
                expected[row_of[value]] = position
        got = match_positions(np.frombuffer(b"".join(mine), f"S{width}"), np.frombuffer(b"".join(theirs), f"S{width}"))
        assert np.array_equal(got, expected)


@pytest.mark.slow
def test_large_lists_run_on_worker_processes_with_the_same_result() -> None:
    n = 30_000  # above PARALLEL_FROM: two spawned workers
    ids = {"bank": list(range(n)), "shop": [str(i) for i in range(n // 2, n + n // 2)]}
    keys = {"bank": bytes(range(32)), "shop": bytes(range(3, 35))}
    one = private_intersection(
        ids, active="bank", wire=Wire(), keys=keys, shuffle_keys=SHUFFLE, workers=1, protocol="ecdh"
    )
    two = private_intersection(
        ids, active="bank", wire=Wire(), keys=keys, shuffle_keys=SHUFFLE, workers=2, protocol="ecdh"
    )
    assert one.ids == two.ids == sorted(str(i) for i in range(n // 2, n))
    assert all(np.array_equal(one.rows[p], two.rows[p]) for p in ids)


def libtorch_mapped(pid: int) -> bool:
    """Whether process `pid` has PyTorch's library in its memory (Linux: /proc)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.slow
def test_a_worker_process_loads_no_pytorch() -> None:
    """A worker runs `lvfl.crypto.psi_batches` (about 30 MB), not PyTorch (about 500 MB a worker).

    Read from the worker's memory map: this process maps libtorch (the positive control), the worker must not.
    """
    assert libtorch_mapped(os.getpid())
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        key = PSIKey(bytes(range(32)), pool=pool)
        ids = [str(i).encode() for i in range(PARALLEL_FROM)]
        assert key.blind(ids) == PSIKey(bytes(range(32))).blind(ids)  # ran on the worker, same points
        worker = pool.submit(os.getpid).result()
        assert worker != os.getpid()
        assert not libtorch_mapped(worker)


def test_the_secret_permutation_is_keyed_and_uniform() -> None:
    """Reproducible with its key only; without one, fresh from the OS each time; every position equally likely."""
    key = bytes(range(32))
    assert np.array_equal(secret_permutation(50, key), secret_permutation(50, key))
    assert sorted(secret_permutation(50, key).tolist()) == list(range(50))
    assert not np.array_equal(secret_permutation(50, key), secret_permutation(50, bytes(range(1, 33))))
    assert not np.array_equal(secret_permutation(50), secret_permutation(50))
    # where element 0 lands over 4,000 keys: uniform over 8 positions (chi-square, 7 dof: 24.3 is its 0.1% tail)
    landing = np.bincount([int(np.flatnonzero(secret_permutation(8) == 0)[0]) for _ in range(4000)], minlength=8)
    chi2 = float(((landing - 500.0) ** 2 / 500.0).sum())
    assert chi2 < 24.3, landing
    with pytest.raises(ValueError, match="a shuffle key is 32 bytes"):
        secret_permutation(3, b"short")


def recovered_rows(
    ids: dict, active_key: bytes, guess: np.ndarray, shuffle_keys: dict | None = None
) -> tuple[int, int, np.ndarray, np.ndarray]:
    """The active party's attack on a passive party's row order (the review's): from its own inbox and key, which ID
    sits at each position of the retailer's message 3, then `guess[position]` as that ID's row in the retailer's file.

    Returns (correct guesses, shared IDs, the true rows, the guessed rows)."""
    wire = Wire()
    seen = inbox(wire, "bank")
    private_intersection(
        ids, active="bank", wire=wire, keys={"bank": active_key}, shuffle_keys=shuffle_keys, protocol="ecdh"
    )
    reblinded = dict(seen)["psi/reblinded"]  # b·a·H(x) for the bank's IDs, in the bank's order
    peer = dict(seen)["psi/peer"]  # b·H(y) for the retailer's IDs, in its secret order
    mine = PSIKey(active_key)
    id_of = {point: str(x) for point, x in zip(split_points(reblinded), ids["bank"], strict=True)}
    at = {id_of[p]: pos for pos, p in enumerate(split_points(mine.reblind(peer))) if p in id_of}
    truth_row = {str(y): row for row, y in enumerate(ids["retailer"])}
    true = np.asarray([truth_row[x] for x in at])
    guessed = np.asarray([int(guess[pos]) for pos in at.values()])
    return int((true == guessed).sum()), len(at), true, guessed


def test_the_active_party_cannot_recover_a_passive_partys_row_order_from_the_config_seed() -> None:
    """The review's attack: the shuffle seeded by the public config seed (0) let the active party recover the
    retailer's row of 604/604 shared customers, and so any private column the file is sorted by. With the shuffle keyed
    from the OS, guessing with the seed's permutation is right at chance (604 guesses, each right with probability
    1/750: 0.8 expected, 9 or more with probability below 1e-6), and the guessed rows carry no information about the
    true ones (rank correlation ~ N(0, 0.04^2))."""
    ids = {k: v for k, v in parties().items() if k in ("bank", "retailer")}
    n = len(ids["retailer"])
    seeded = np.random.default_rng(0).permutation(n)  # what `seed: 0` gave before
    correct, shared, true, guessed = recovered_rows(ids, bytes(range(32)), seeded)
    assert shared == 604
    assert correct <= 8, f"{correct} of {shared} rows recovered"
    rank = np.corrcoef(np.argsort(np.argsort(true)), np.argsort(np.argsort(guessed)))[0, 1]
    assert abs(rank) < 0.2
    # control: the same attack recovers every row when it knows the shuffle (as it did knowing the seed)
    known = secret_permutation(n, SHUFFLE["retailer"])
    correct, shared, _, _ = recovered_rows(ids, bytes(range(32)), known, shuffle_keys=SHUFFLE)
    assert correct == shared == 604


def test_party_tables_shuffle_is_not_drawn_from_the_config_seed(tmp_path, monkeypatch) -> None:
    """The review's finding, end to end: `PartyTables(seed=0)` ran the PSI with the passive shuffle seeded by the
    config's seed, so the active party, from its own key and inbox, recovered the retailer's row of every shared
    customer. Through the datamodule now, the seed's permutation guesses right at chance."""
    import csv

    import lvfl.alignment.setup_exchange as setup_exchange
    from lvfl.datamodules import PartyTable, PartyTables

    ids = {k: v for k, v in parties().items() if k in ("bank", "retailer")}
    files = {}
    for party, values in ids.items():
        files[party] = tmp_path / f"{party}.csv"
        with files[party].open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["id", "x", "y"] if party == "bank" else ["id", "x"])
            writer.writerows([[v, i % 7, i % 2] if party == "bank" else [v, i % 5] for i, v in enumerate(values)])
    active_key = bytes(range(32))  # the attacker's own key, which it knows
    real = setup_exchange.private_intersection
    monkeypatch.setattr(
        setup_exchange, "private_intersection", lambda *a, **kw: real(*a, **{**kw, "keys": {"party0": active_key}})
    )
    dm = PartyTables(
        [PartyTable(str(files["bank"]), "id", label_column="y"), PartyTable(str(files["retailer"]), "id")],
        seed=0,
        psi="ecdh",  # the attack reads ECDH's points; KKRT's PSI takes its shuffle key from the same place
    )
    dm.setup("fit")
    inbox_of_active = {tag: payload for src, dst, payload, tag in dm.setup_messages() if dst == "party0"}
    mine = PSIKey(active_key)
    id_of = {p: str(x) for p, x in zip(split_points(inbox_of_active["psi/reblinded"]), ids["bank"], strict=True)}
    at = {id_of[p]: pos for pos, p in enumerate(split_points(mine.reblind(inbox_of_active["psi/peer"]))) if p in id_of}
    assert len(at) == 604
    truth_row = {str(y): row for row, y in enumerate(ids["retailer"])}
    seeded = np.random.default_rng(0).permutation(len(ids["retailer"]))  # the shuffle `seed: 0` gave before
    correct = sum(truth_row[x] == seeded[pos] for x, pos in at.items())
    assert correct <= 8, f"{correct} of 604 rows recovered from the config seed"


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["ecdh", "kkrt"])
def test_each_party_in_its_own_view_runs_only_its_part_and_learns_what_the_docstring_says(protocol) -> None:
    """Every party in its own wire view (threads over a `MemoryCarrier`, as separate processes would be): each
    gets the simulation's rows for itself, nothing for the others; a passive party learns the bank's list size and
    the intersection, not the pairwise counts; each party's ledger is its share of the simulation's."""
    ids = parties()
    names = list(ids)
    keys = {"bank": bytes(range(32)), "retailer": bytes(range(7, 39)), "insurer": bytes(range(9, 41))}
    whole = Wire()
    expected = private_intersection(ids, active="bank", wire=whole, keys=keys, shuffle_keys=SHUFFLE, protocol=protocol)
    transport = MemoryCarrier(timeout=60)
    views, results = each_in_its_view(ids, keys, transport, protocol)
    for name in names:
        got = results[name]
        assert list(got.rows) == [name]
        assert np.array_equal(got.rows[name], expected.rows[name]), name
        assert got.ids == expected.ids, name
        for end in (0, 1):  # what it sent, and what it received: its share of the simulation's ledger
            share = {key: n for key, n in whole.bytes.items() if key[end] == name}
            assert {key: n for key, n in views[name].bytes.items() if key[end] == name} == share, (name, end)
    assert results["bank"].sizes == expected.sizes
    assert results["bank"].pairwise == expected.pairwise
    for name in ("retailer", "insurer"):
        assert results[name].sizes == {name: len(ids[name]), "bank": len(ids["bank"])}
        assert results[name].pairwise == {}


class QueueBound:
    """A `MemoryCarrier` that refuses a message as the socket transport's inbox does: when what its sender has
    queued unread at the receiver is not empty and would pass `limit` bytes with it (`Inbox._reserve`)."""

    def __init__(self, limit: int) -> None:
        self.inner, self.limit = MemoryCarrier(timeout=20), limit
        self.identities = self.inner.identities
        self.unread: Counter = Counter()
        self.peak = 0
        self.lock = threading.Lock()

    def post(self, src: str, dst: str, tag: str, step: int, payload: Any) -> None:
        size = payload_nbytes(payload)
        with self.lock:
            queued = self.unread[src, dst]
            if queued and queued + size > self.limit:
                raise FederationError(f"{src} has {queued} bytes unread at {dst} and sent a {size}-byte {tag!r}")
            self.unread[src, dst] += size
            self.peak = max(self.peak, self.unread[src, dst])
        self.inner.post(src, dst, tag, step, payload)

    def take(self, src: str, dst: str, tag: str, step: int, expected: Any) -> Any:
        payload = self.inner.take(src, dst, tag, step, expected)
        with self.lock:
            self.unread[src, dst] -= payload_nbytes(payload)
        return payload


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["ecdh", "kkrt"])
def test_long_messages_go_in_parts_and_a_receiver_holds_at_most_two_unread(monkeypatch, protocol) -> None:
    """Parts of 1,280 bytes: the long messages of three parties' lists in several parts, the result and the ledger
    as one-part messages give, and no receiver holding more than two parts (and a part number) of a peer unread."""
    ids = parties()
    names = list(ids)
    keys = {"bank": bytes(range(32)), "retailer": bytes(range(7, 39)), "insurer": bytes(range(9, 41))}
    whole = private_intersection(ids, active="bank", wire=Wire(), keys=keys, shuffle_keys=SHUFFLE, protocol=protocol)
    monkeypatch.setattr(parts, "PART_BYTES", 40 * POINT_BYTES)
    wire = Wire()
    parted = private_intersection(ids, active="bank", wire=wire, keys=keys, shuffle_keys=SHUFFLE, protocol=protocol)
    assert parted.ids == whole.ids
    assert all(np.array_equal(parted.rows[k], whole.rows[k]) for k in names)
    sizes = {k: len(v) for k, v in ids.items()}
    expected = message_bytes(sizes, "bank", len(whole.ids), protocol)
    assert wire.bytes_by_tag() == {f"psi/{k}": v for k, v in expected.items()}
    if protocol == "ecdh":  # bank's 900 points: 22 full parts and one of 20 to each passive party, so 22 reads back
        assert wire.messages["bank", "retailer", "psi/blinded"] == 23
        assert wire.messages["retailer", "bank", "psi/blinded/read"] == 22
        assert expected["blinded/read"] == 2 * 22 * 4
    else:  # the matrix: 1,143 rows of 64 bytes, 57 full parts and one of 192
        assert wire.messages["bank", "retailer", "psi/matrix"] == 58
        assert wire.messages["retailer", "bank", "psi/matrix/read"] == 57

    bound = 2 * 40 * POINT_BYTES + parts.READ_DTYPE.itemsize  # two parts and a part number
    if protocol == "kkrt":  # and the seeds (32 kB, whole), which the bank sends just before the matrix
        bound += kkrt.SEEDS_BYTES
    transport = QueueBound(limit=bound)
    _, results = each_in_its_view(ids, keys, transport, protocol)
    for name in names:
        assert np.array_equal(results[name].rows[name], whole.rows[name]), name
        assert results[name].ids == whole.ids, name
    assert 40 * POINT_BYTES < transport.peak <= bound


def test_a_part_longer_than_a_part_is_refused_naming_the_sender() -> None:
    transport = MemoryCarrier(timeout=5)
    transport.post("retailer", "bank", "psi/peer", -1, bytes(parts.PART_BYTES + POINT_BYTES))
    with pytest.raises(ValueError, match=r"retailer sent a \d+-byte part of 'psi/peer'; a part is at most"):
        send_in_parts(Wire(here="bank", carrier=transport), "retailer", "bank", Absent("PSI points"), "psi/peer")
