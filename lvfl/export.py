"""`lvfl export`: one folder per party holding only that party's part of a fitted run.

A checkpoint holds every party's weights, which suits the simulation but not a deployment: there each organisation
gets its own part and nothing of the others'. `lvfl export --config C --ckpt_path P --out DIR` rebuilds the run
from its config, loads the checkpoint, and writes `DIR/<party>/`:

- `state_dict.pt`: the tensors the party owns, under their names in the protocol (`party_models.<party>.*`; the
  active party also owns e.g. SplitNN's top model and AggVFL's aggregation weights: every tensor of the checkpoint
  goes to exactly one party, by `VFLModule.party_parameters` and the modules those parameters belong to);
- TorchScript files traced on the party's own input: `encoder.pt` (features -> embedding) and `head.pt` (embedding
  -> logits) where its model has both, else `model.pt`; the active party of a top-model protocol also gets `top.pt`;
- `party.json`: its name and role, input shape, categorical cardinalities, model config, the standardization
  fitted on its training rows (`VerticalDataModule.scaling`), and, with `PartyTables`, its column encoders and (the
  active party) the label names; the active party's also holds the task (`TaskInfo`: its kind and classes, or a
  regression's target mean and scale, which turn the model's standardized output into the target's units).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["export_parties", "main", "owned_keys"]


def owned_keys(model: Any) -> dict[str, list[str]]:
    """Each party's state-dict keys: its parameters and the buffers of modules whose parameters are all its own.

    Raises:
        ValueError: a tensor no party owns (it would be dropped from the export) or one two parties claim.
    """
    params = {party: {id(p) for p in model.party_parameters(party)} for party in model.party_names}
    owner_of_module: dict[str, str] = {}
    for name, module in model.named_modules():
        own = [id(p) for p in module.parameters(recurse=False)]
        if own:
            owners = [party for party, ids in params.items() if set(own) <= ids]
            if len(owners) == 1:
                owner_of_module[name] = owners[0]
    keys: dict[str, list[str]] = {party: [] for party in model.party_names}
    for key, tensor in model.state_dict(keep_vars=True).items():
        owners = [party for party, ids in params.items() if id(tensor) in ids]
        if not owners:  # a buffer: the party that owns its module's parameters
            module = key.rsplit(".", 1)[0] if "." in key else ""
            owners = [owner_of_module[module]] if module in owner_of_module else []
        if len(owners) != 1:
            raise ValueError(f"lvfl export: the tensor {key!r} belongs to {owners or 'no party'}; cannot place it")
        keys[owners[0]].append(key)
    return keys


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value if isinstance(value, str | int | float | bool | type(None)) else repr(value)


def export_parties(model: Any, datamodule: Any, config: dict[str, Any], out: str | Path) -> dict[str, Path]:
    """Write every party's folder (see the module docstring) for a built, loaded `model`; returns the folders."""
    out = Path(out)
    state = model.state_dict()
    keys = owned_keys(model)
    specs = {s.name: s for s in datamodule.party_specs}
    batch = datamodule.on_after_batch_transfer(datamodule.train_set.gather(torch.arange(2)), 0)
    party_configs = (config.get("model", {}).get("init_args", {}) or {}).get("parties", [])
    folders = {}
    for index, party in enumerate(model.party_names):
        folder = out / party
        folder.mkdir(parents=True, exist_ok=True)
        torch.save({k: state[k] for k in keys[party]}, folder / "state_dict.pt")
        party_model: nn.Module = model.party_models[party]
        example = batch.features[party]
        with torch.no_grad(), warnings.catch_warnings():
            # torch 2.9+ marks TorchScript deprecated in favour of torch.export; TorchScript files still load in
            # any C++ or Python runtime without lvfl, which is what a party handed its model needs
            warnings.filterwarnings("ignore", message=r".*torch\.jit\.trace.* is deprecated", category=FutureWarning)
            if hasattr(party_model, "encoder") and hasattr(party_model, "head"):
                embedding = party_model.encoder(example)
                torch.jit.trace(party_model.encoder, example).save(str(folder / "encoder.pt"))
                torch.jit.trace(party_model.head, embedding).save(str(folder / "head.pt"))
            else:
                torch.jit.trace(party_model, example).save(str(folder / "model.pt"))
            top = getattr(model, "top", None)
            if party == model.active and isinstance(top, nn.Module):
                width = top.input_shape[0] if hasattr(top, "input_shape") else None
                if width is not None:
                    torch.jit.trace(top, torch.zeros(2, width)).save(str(folder / "top.pt"))
        spec = specs[party]
        entry = party_configs[index] if len(party_configs) > 1 else (party_configs[0] if party_configs else {})
        info = {
            "party": party,
            "role": spec.role,
            "input_shape": list(spec.input_shape),
            "categories": list(spec.categories),
            "model": _jsonable(entry),
            "embedding_dim": getattr(model, "embedding_dim", None),
            "scaling": _jsonable(getattr(datamodule, "scaling", {}).get(party)),
            "state_dict_keys": keys[party],
        }
        encoders = getattr(datamodule, "encoders", {}).get(party)
        if encoders is not None:
            info["encoders"] = _jsonable(encoders)
            info["feature_names"] = datamodule.feature_names[party]
        if spec.role == "active" and model.task is not None:  # what the outputs mean: classes, or target units
            info["task"] = _jsonable(model.task)
        if spec.role == "active" and getattr(datamodule, "label_names", None):
            info["label_names"] = list(datamodule.label_names)
        (folder / "party.json").write_text(json.dumps(info, indent=1))
        folders[party] = folder
    return folders


def main(argv: Sequence[str]) -> None:
    """`lvfl export --config C [overrides] --ckpt_path P --out DIR`."""
    import argparse

    from lvfl.cli import build_cli
    from lvfl.errors import quiet_third_party

    parser = argparse.ArgumentParser(prog="lvfl export", description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt_path", required=True, help="the fitted run's checkpoint (a path, or 'last')")
    parser.add_argument("--out", required=True, help="the folder to write one sub-folder per party into")
    args, rest = parser.parse_known_args(list(argv))
    with quiet_third_party():
        cli = build_cli(rest, run=False)
    model, datamodule, trainer = cli.model, cli.datamodule, cli.trainer
    path = args.ckpt_path
    if path == "last":
        from lvfl.callbacks import ExperimentCheckpoint

        (keeper,) = [cb for cb in trainer.callbacks if isinstance(cb, ExperimentCheckpoint)]
        found = sorted(keeper._find_last_checkpoints(trainer))
        path = found[-1]
    trainer.datamodule = datamodule
    model.trainer = trainer
    datamodule.setup("predict")
    model.setup("predict")
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(checkpoint["state_dict"])
    config = cli.config.as_dict() if hasattr(cli.config, "as_dict") else dict(cli.config)
    folders = export_parties(model, datamodule, config, args.out)
    for party, folder in folders.items():
        print(f"lvfl export: {party} -> {folder}")
