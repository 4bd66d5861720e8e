"""The pipeline a `VerticalDataModule` runs once, and `Prepared`, what it holds afterwards.

`prepare(dm)` runs lazily, through `VerticalDataModule._prepare` (by `setup()` or by the first read of `party_specs` /
`task` / `describe()`):

1. `load()` (the subclass) returns the whole dataset as arrays; sample ID = row index in it, kept everywhere.
2. Checks and columns (`lvfl.datamodules.features`): shapes, each party's columns (the partitioner's), features that
   are numbers and finite per party (the message names the party).
3. A seeded train/val/test split (scikit-learn `train_test_split`; `lvfl.datamodules.splitting`), stratified on the
   labels or label-free (`stratify`); where a passive party cannot compute it itself, the active party sends it
   (`splitting.split_messages`, encoded by `lvfl.datamodules.split`). Then the labels: integer classes in range, or
   finite regression targets standardized with the training rows (`lvfl.datamodules.labels`).
4. Scaling fitted on each party's own training rows only, then applied to every split (`lvfl.datamodules.scaling`).
5. Each party's slice copied once into a contiguous float32 tensor (uint8 pixels for images), held per split by a
   `VerticalTensorDataset` (`lvfl.datamodules.datasets`); batches are made by indexing those tensors with a whole
   batch of indices at a time (`lvfl.datamodules.samplers`), so the data pipeline costs microseconds per step, not
   per sample.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lvfl.datamodules.datasets import VerticalTensorDataset, split_views
from lvfl.datamodules.features import checked_arrays, finite_numbers, party_columns
from lvfl.datamodules.labels import training_labels
from lvfl.datamodules.scaling import pixel_slices, scaled_slices
from lvfl.datamodules.splitting import overlap_masks, split_messages
from lvfl.parties import PartySpec, TaskInfo, party_name
from lvfl.progress import peak_memory_mb
from lvfl.shadows import empty_shadow

__all__ = ["Prepared", "prepare"]


@dataclass(frozen=True)
class Prepared:
    """A datamodule's data once prepared: the parties, the task and every split's views."""

    columns: list[list[int]]
    party_specs: list[PartySpec]
    task: TaskInfo
    splits: dict[str, VerticalTensorDataset]  # VFL views: samples every participating party holds
    active_splits: dict[str, VerticalTensorDataset]  # the active party's slice of every sample of each split
    overlap: dict[str, np.ndarray]  # per split, boolean mask over `active_splits[split]`: held by every party
    image_width: int | None  # the whole image's width (columns) for image data, else None
    split_used_labels: bool = False  # whether the split (and overlap) was stratified on the labels
    messages: tuple[tuple[str, str, Any, str], ...] = ()  # the split message to each passive participant


def prepare(dm: Any) -> Prepared:
    """Load, check, split, scale and partition `dm`'s data (the module docstring's steps).

    `dm` is the `lvfl.datamodules.base.VerticalDataModule` being set up: its options, hooks and `load` are read
    here. It is typed `Any` because that class calls this function: naming it here would tie the two modules in a
    circle, where the pipeline stands below the class that runs it.

    Sets `dm.peak_mb_before_setup` (the process's peak memory before any data) and, per party whose features are
    scaled here, `dm.scaling[party]`.
    """
    dm.peak_mb_before_setup = peak_memory_mb()  # the imports' and the process's own, before any data
    x, y = dm.load()
    x, y, is_image = checked_arrays(x, y, type(dm).__name__)
    num_columns = x.shape[-1]
    columns = party_columns(dm.partitioner, num_columns, dm.num_parties, is_image)
    pixels = is_image and x.dtype == np.uint8  # kept uint8; normalized per batch on the device
    if dm.augmentation is not None and not is_image:
        raise ValueError(
            f"augmentation={dm.augmentation!r} transforms images, but {type(dm).__name__} is tabular "
            f"(features of shape {x.shape}); set augmentation: none"
        )
    cats = None if is_image else dm.categories(num_columns)
    if cats is not None and len(cats) != num_columns:
        raise ValueError(f"categories() gives {len(cats)} entries for {num_columns} feature columns")
    named = {party_name(k): columns[k] for k in dm.participants}  # the participants' columns, by name
    here = dm.parties_held_here()
    held_here = {n: c for n, c in named.items() if here is None or n in here}  # whose columns hold data here
    if not pixels:
        x = finite_numbers(x, held_here)

    rows = dm._split(len(y), dm.split_key(y))
    known = dm.task_from_peers()
    if known is not None:  # a passive party's own process: no labels here (filler, shadowed by `hold_only`)
        labels, task = np.zeros(len(y), dtype=np.float32 if known.is_regression else np.int64), known
    else:  # the labels (or targets) follow from `load()`'s targets and the training rows
        targets = dm.labels_from_targets(y, rows["train"])
        labels, task = training_labels(targets, rows["train"], dm.regression, dm.num_classes)

    held_mask = dm.held_by_every_party(len(y))
    if held_mask is not None and dm.overlap < 1.0:
        raise ValueError(
            f"overlap={dm.overlap} draws which samples every party holds, but {type(dm).__name__} knows it "
            "from the parties' own IDs: leave overlap at 1"
        )
    # stratified by class as the split is; a regression target has no classes (one stratum)
    strata = None if dm.regression or not dm.split_uses_labels else labels
    overlap = overlap_masks(rows, strata, dm.overlap, dm.seed, held_mask)
    shared = {split: idx[overlap[split]] for split, idx in rows.items()}  # the rows every party holds
    vfl_all = len(dm.participants) == 1  # no passive participant: nothing is missing from anyone
    active = party_name(dm.active_party)
    passive = [name for name in named if name != active]
    messages, shared = split_messages(shared, active, passive, dm.split_is_public, dm.shared_order)
    slices: dict[str, dict[str, torch.Tensor]] = {}
    decoders: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    party_cats: dict[str, tuple[int, ...]] = {}
    for name, cols in named.items():  # each party's slice of the rows it holds, scaled by its own training rows
        held = rows if name == active or vfl_all else shared
        if name not in held_here:  # another party's, in a party's own process: shapes only
            slices[name] = {split: empty_shadow((len(idx), len(cols))) for split, idx in held.items()}
            own = None if cats is None else [int(cats[c]) for c in cols]
            party_cats[name] = tuple(own) if own is not None and any(own) else ()
            continue
        if pixels:
            slices[name], decoders[name] = pixel_slices(x, cols, held, dm.scale)
        else:
            own = None if cats is None else [int(cats[c]) for c in cols]
            # x is not read again: each party's columns give their memory back as its slices take them
            slices[name], fitted = scaled_slices(x, cols, held, is_image, dm.scale, own, name, release=True)
            if fitted is not None:
                dm.scaling[name] = fitted
            party_cats[name] = tuple(own) if own is not None and any(own) else ()
    vfl_rows = rows if vfl_all else shared
    splits, active_splits = split_views(rows, vfl_rows, overlap, slices, labels, decoders, active)
    specs = [
        PartySpec(
            name=party_name(k),
            role="active" if k == dm.active_party else "passive",
            input_shape=tuple(splits["train"].stored[party_name(k)].shape[1:]),
            index=k,
            categories=party_cats.get(party_name(k), ()),
        )
        for k in dm.participants
    ]
    return Prepared(
        columns=columns,
        party_specs=specs,
        task=task,
        splits=splits,
        active_splits=active_splits,
        overlap=overlap,
        image_width=num_columns if is_image else None,
        split_used_labels=dm.split_uses_labels,
        messages=tuple(messages),
    )
