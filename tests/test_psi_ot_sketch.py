"""The OT-based PSI sketch of `benchmarks/psi_ot_sketch.py`: its intersection is the plain one, its matrix rows are
the bitwise transposes of its PRG columns, and its cuckoo table holds every ID once, in one of its bins."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import psi_ot_sketch as sketch  # noqa: E402 - a benchmark's protocol sketch, tested here


def test_the_sketch_finds_the_plain_intersection_and_each_ids_position() -> None:
    rng = np.random.default_rng(0)
    active = [f"a{i}".encode() for i in rng.permutation(3000)]
    passive = [f"a{i}".encode() for i in rng.permutation(np.arange(1800, 5000))]
    (found, order), _, wire = sketch.run(active, passive)
    shared = set(active) & set(passive)
    assert {active[r] for r in np.flatnonzero(found >= 0)} == shared
    assert all(passive[order[found[r]]] == active[r] for r in np.flatnonzero(found >= 0))
    assert wire > np.ceil(sketch.LOAD * len(active)) * sketch.CODE_BYTES


def test_prg_rows_are_the_bitwise_transpose_of_the_seeds_keystreams() -> None:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    seeds, bins = [os.urandom(16) for _ in range(sketch.CODE_BITS)], 1000
    rows = sketch.prg_rows(seeds, bins)
    for j in (0, 7, 300, 511):  # column j, bit by bit, against its own keystream
        stream = Cipher(algorithms.AES(seeds[j]), modes.CTR(bytes(16))).encryptor().update(bytes(125))
        column = [(stream[b // 8] >> (b % 8)) & 1 for b in range(bins)]
        assert [(rows[b, j // 8] >> (j % 8)) & 1 for b in range(bins)] == column


def test_cuckoo_puts_every_id_in_one_of_its_bins_once() -> None:
    digest = sketch.digests([str(i).encode() for i in range(5000)], bytes(16))
    bins = int(np.ceil(sketch.LOAD * 5000))
    candidates = sketch.candidate_bins(digest, bins)
    table, function = sketch.cuckoo(candidates, bins)
    held = table[table >= 0]
    assert sorted(held.tolist()) == list(range(5000))
    for b in np.flatnonzero(table >= 0):
        assert candidates[table[b], function[b]] == b
