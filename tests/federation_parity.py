"""A deployed run's checkpoints against the simulation's: each party's own tensors equal, the ledgers' union equal."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch
from helpers import checkpoints_of

from lvfl.checkpoints import load_checkpoint


def checkpoint(save_dir: Path, which: str = "last") -> dict:
    """`which`.ckpt of the newest run (version) under `save_dir` (a resumed fit writes a version of its own)."""
    (experiment,) = {p.parent for p in save_dir.glob("*/version_*")}
    return load_checkpoint(checkpoints_of(experiment) / f"{which}.ckpt")


def ledger(state: dict, sent_by: str | None = None) -> Counter:
    """A checkpoint's ledger (`lvfl` section), keyed (src, dst, tag); only what `sent_by` sent, if given."""
    rows = state["lvfl"]["wire"]["bytes"]
    return Counter({(s, d, t): n for s, d, t, n in rows if sent_by is None or s == sent_by})


def assert_parity(
    fit_dir: Path, party_dirs: dict[str, Path], which: str = "last", resumed: bool = False, holds_none=frozenset()
) -> None:
    """Every party's checkpoint holds data for its own parameters only, equal to the fit's; the fit's ledger is
    the union of what the parties sent, tag by tag (a resume's repeated key set-up, `resume/*`, left aside).
    `holds_none`: processes of no party (an HE backend's coordinator), whose checkpoints hold no tensor's data."""
    fit = checkpoint(fit_dir, which)
    sent = Counter()
    owners = set()
    for name, directory in party_dirs.items():
        state = checkpoint(directory, which)
        # the trainer's counts too: a party steps only its own optimizer and counts the others' steps
        assert (state["epoch"], state["global_step"]) == (fit["epoch"], fit["global_step"]), name
        held = {k: t for k, t in state["state_dict"].items() if t.device.type != "meta"}
        assert bool(held) != (name in holds_none), name
        for key, tensor in held.items():
            assert torch.equal(tensor, fit["state_dict"][key]), f"{name}: {key} differs from lvfl fit's"
        assert not owners & set(held), f"{name} holds another party's tensors"
        owners |= set(held)
        sent += ledger(state, sent_by=name)
    assert owners == set(fit["state_dict"]), set(fit["state_dict"]) - owners
    if resumed:
        sent = Counter({key: n for key, n in sent.items() if not key[2].startswith("resume/")})
    assert dict(sent) == dict(ledger(fit)), "the ledgers differ"
