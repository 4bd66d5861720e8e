"""`PartyTables`' set-up messages besides the split: the PSI, a key holder's counts, the task, the input columns.

Each is a value of the codec, checked where it arrives.

The order (`PartyTables.load`): the PSI (`align`, tags `psi/...`); then, from the active party to each passive party
and key holder, its rows of each split (`split`, one byte per shared sample: `lvfl.datamodules.split`) and the
number of classes (`task`, one 8-byte integer, 0 for a regression: `task_message`, `task_from`); a key holder
outside the parties (an HE backend's coordinator, `PartyTables.add_key_holder`), which takes no part in the PSI, is
told first the number of the active party's samples and of the shared ones (`rows`: two 8-byte integers,
`tell_counts`) and, for `lvfl predict`, the number of new rows every party holds (`rows_new`, after their own PSI,
tags `psi_new/...`). Last, every party's encoded columns go to the active party and from it to every passive party
and key holder (`inputs`, `exchange_inputs`), so that every process builds every party's model with the same shapes.

Each message is a tensor, or a dict of tensors by party name, never bytes packed by hand. A receiver in its own
process holds its shadow of the message, the template the codec checks it against
(`lvfl.federation.expectations.conform`: a count's dtype and shape, the names of an `inputs` message); what a
template cannot say (a count below zero, a party's columns as one integer each, none negative) is checked here,
each refusal one line naming the sender.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from lvfl.alignment.intersection import Alignment, private_intersection
from lvfl.parties import TaskInfo
from lvfl.progress import Phase
from lvfl.wire import Absent, Wire

__all__ = [
    "INPUTS_TAG",
    "NEW_ROWS_TAG",
    "ROWS_TAG",
    "TASK_TAG",
    "align",
    "exchange_inputs",
    "psi_counts",
    "split_bytes",
    "task_from",
    "task_message",
    "tell_counts",
]

TASK_TAG = "task"  #: the wire tag of the task message: the number of classes (0: a regression), 8 bytes
INPUTS_TAG = "inputs"  #: the wire tag of the input-columns messages (`exchange_inputs`)
ROWS_TAG = "rows"  #: the wire tag of the counts a key holder is told: the active party's samples, the shared ones
NEW_ROWS_TAG = "rows_new"  #: the wire tag of the number of new rows every party holds, told to a key holder
_COUNT = torch.int64  #: the dtype of every count and column of these messages


def align(
    ids: Mapping[str, Sequence[object]],
    *,
    parties: Sequence[str],
    active: str,
    wire: Wire,
    phase: Callable[..., Phase],
    protocol: str,
    tag: str = "psi",
    paths: Sequence[str] | None = None,
) -> Alignment:
    """The PSI of the tables held here (`ids`: each one's IDs, in its row order), under `tag`.

    Each party's part runs where the wire holds it (`lvfl.alignment.intersection.private_intersection`). With `paths`
    (every table's, in party order), an intersection of no ID is refused naming them: there is no sample to train on.
    """
    alignment = private_intersection(
        ids, parties=parties, active=active, wire=wire, tag=tag, phase=phase, protocol=protocol
    )
    if paths is not None and not alignment.ids:
        raise ValueError(f"the parties' tables share no ID: {list(paths)}")
    return alignment


def psi_counts(alignment: Alignment, names: Sequence[str]) -> dict[str, int]:
    """The PSI's counts as this process learns them: `<party>/ids`, `intersection`, `<party>/shared_with_active`."""
    counts = {f"{n}/ids": alignment.sizes[n] for n in names if n in alignment.sizes}
    counts |= {"intersection": len(alignment.ids)}
    return counts | {f"{n}/shared_with_active": k for n, k in alignment.pairwise.items() if n in names}


def tell_counts(wire: Wire, active: str, holder: str, counts: Sequence[int], tag: str) -> list[int]:
    """The active party tells `holder` the non-negative `counts` under `tag`; returns the counts as known here.

    At the holder's own process, those received (a count below zero, or of the shared rows above the rows', refused);
    anywhere else `counts` as given (where the active party is not held here, placeholders of their number).
    """
    sent = torch.tensor(list(counts), dtype=_COUNT) if wire.holds(active) else _shadow(len(counts))
    got = wire.send(active, holder, sent, tag)
    if not (wire.holds(holder) and not wire.holds(active)):
        return list(counts)
    if not isinstance(got, torch.Tensor) or got.dtype != _COUNT or tuple(got.shape) != (len(counts),):
        raise ValueError(f"{active}'s row counts are not {len(counts)} 8-byte integers")
    values = got.tolist()
    if any(v < 0 for v in values) or (len(values) == 2 and values[1] > values[0]):
        raise ValueError(f"{active} sent row counts that do not add up: {values}")
    return values


def split_bytes(payload: Any, sender: str) -> bytes:
    """The `split` message from `sender` as the bytes `lvfl.datamodules.split.decode_split` reads."""
    if not isinstance(payload, bytes):
        raise ValueError(f"{sender} sent the split as {type(payload).__name__}; it is bytes")
    return payload


def task_message(num_classes: int | None) -> torch.Tensor:
    """The `task` message: the number of classes (0: a regression); None, where it is not held, its template."""
    return _shadow(1) if num_classes is None else torch.tensor([num_classes], dtype=_COUNT)


def task_from(told: torch.Tensor, sender: str, task: str) -> TaskInfo:
    """The task a passive party learns from the active party's `task` message, checked against its own config."""
    num_classes = int(told.reshape(-1)[0])
    regression = task == "regression"
    fits = {"regression": num_classes == 0, "binary": num_classes == 2, "multiclass": num_classes >= 3}
    if not fits.get(task, num_classes != 0):
        raise ValueError(f"{sender} sent a task with {num_classes} classes, but this party's config says task: {task}")
    if regression:
        return TaskInfo(num_classes=0, kind="regression")
    if num_classes < 2:
        raise ValueError(f"{sender} sent a task with {num_classes} classes; a classification has at least 2")
    return TaskInfo(num_classes=num_classes, kind="binary" if num_classes == 2 else "multiclass")


def exchange_inputs(
    wire: Wire,
    active: str,
    passive: Sequence[str],
    own: Mapping[str, list[int]],
    holders: Sequence[str] = (),
) -> dict[str, list[int]]:
    """Every participant's input columns (their cardinalities, 0 numeric), as each party learns them: `inputs`.

    Each passive party tells the active party its own (`{party: columns}`), and the active party tells each passive
    party and key holder (`holders`) every participant's, so that every process builds every party's model with the
    same shapes: the models are initialized in party order from one seeded generator, and a shape another process
    got wrong would change the draws of every party built after it. What it reveals: each party's number of encoded
    columns and the number of levels of each categorical one (the shapes of its model's input), nothing of any
    value; a key holder's process builds the same shadows from them. `own`: the columns of each party held here.
    """
    known = dict(own)
    for name in passive:
        sent = {name: torch.tensor(own[name], dtype=_COUNT)} if name in own else _unknown([name])
        got = wire.send(name, active, sent, INPUTS_TAG)
        if wire.holds(active):
            known[name] = _columns(got, name, [name])[name]
    order = [active, *passive]
    every = {n: torch.tensor(known[n], dtype=_COUNT) for n in order} if wire.holds(active) else _unknown(order)
    for name in [*passive, *holders]:
        got = wire.send(active, name, every, INPUTS_TAG)
        if wire.holds(name) and not wire.holds(active):
            told = _columns(got, active, order)
            if name in own and told[name] != own[name]:
                raise ValueError(f"{active} relayed {name}'s input columns as {told[name]}, not {own[name]}")
            known |= told
    return known


def _columns(payload: Any, sender: str, names: Sequence[str]) -> dict[str, list[int]]:
    """The input columns of `names` off an `inputs` message from `sender` (refused by name when malformed)."""
    bad = ValueError(f"{sender}'s 'inputs' message does not hold the input columns of {len(names)} parties")
    if not isinstance(payload, dict) or set(payload) != set(names):
        raise bad
    out = {}
    for name in names:
        columns = payload[name]
        if not isinstance(columns, torch.Tensor) or columns.dtype != _COUNT or columns.dim() != 1:
            raise bad
        if not columns.numel() or bool((columns < 0).any()):
            raise bad
        out[name] = columns.tolist()
    return out


def _shadow(count: int) -> torch.Tensor:
    """The template of `count` counts, where the message is received: the codec checks its dtype and shape."""
    return torch.empty(count, dtype=_COUNT, device="meta")


def _unknown(names: Sequence[str]) -> dict[str, Absent]:
    """The template of an `inputs` message of `names`: their columns are known only to their sender."""
    return {name: Absent("input columns") for name in names}
