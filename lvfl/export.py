"""One folder per party holding only that party's part of a fitted run, servable without lvfl: `export_parties`.

A checkpoint holds every party's weights, which suits the simulation but not a deployment: there each organisation
gets its own part and nothing of the others'. `export_parties(model, datamodule, config, DIR)` writes, from a
fitted protocol and its set-up datamodule, `DIR/<party>/` (`lvfl export --config C --ckpt_path P --out DIR`,
`lvfl.commands.export`, rebuilds the run from its config and checkpoint first):

- `state_dict.pt`: the tensors the party owns, under their names in the protocol (`party_models.<party>.*`; the
  active party also owns e.g. SplitNN's top model and AggVFL's aggregation weights: every tensor of the checkpoint
  goes to exactly one party, by `VFLModule.party_parameters` and the modules those parameters belong to);
- the party's part of a prediction as TorchScript, traced from the protocol's split-inference hooks, which reproduce
  the active party's `party_logits` (`tests/test_router.py`), so the folders predict what `lvfl test` and
  `lvfl predict` report: a passive party's `contribution.pt` (its encoded, scaled features -> what it sends for a
  prediction, `passive_contribution`); the active party's `completion.pt` (its own features, then every passive
  party's contribution in `serving.contribution_order` -> logits, `complete_prediction`: with a label mechanism
  its private head, the one lvfl scores) and, when the run saved a student (`StudentDistillation`), `student.pt`
  (its features -> logits, for the IDs only it holds). Each file registers only its party's modules, and one whose
  graph holds another party's tensor is refused, so a folder carries nothing of the others';
- `party.json`: its name and role, input shape, categorical cardinalities, model config, the standardization
  fitted on its training rows (`VerticalDataModule.scaling`), and, with `PartyTables`, its ID column, its column
  encoders (with the rules that apply them) and (the active party) the label names; the active party's also holds
  the task (`TaskInfo`). A passive party's `contribution` says what its file computes; the active party's
  `serving` says how the outputs combine: the protocol's own description (`VFLModule.describe_combination`:
  formulas and the values in them, e.g. Agg_VFL's weights), the order of the contributions, the output's kind and
  how to decode it (softmax and label names, or `value * target_scale + target_mean`), and the student. Every
  party's `export` names the fitted model the folder belongs to (`lvfl export`: the run, the checkpoint's epoch and
  step; `id`, their digest, is what serving parties compare: `lvfl serve`).

`examples/serve_exported.py` serves the folders from the parties' raw tables with numpy and torch alone. A folder
holds whole traced contributions, not each module traced on its own: modules wired together by hand would serve the
release-trained head where lvfl reports the private one, and leave the combination to guesswork. The modules'
weights are in `state_dict.pt`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["export_id", "export_parties", "owned_keys"]


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


SERVING_FORMAT = 1  #: the version of party.json's `serving` section

ENCODING_RULES = (
    "Each raw column (encoders, in order; the text of a field stripped of spaces) becomes its encoder's columns, "
    "in order. numeric: the number; a missing value (its text, lower-cased, one of missing_values) becomes `fill` "
    "(refused when fill is null) and, when `indicator`, an extra column is 1.0 for it (else 0.0). categorical: the "
    "value's index in `levels`; a missing value takes `fill_level`, or else the level '<missing>' (refused when "
    "that is not a level); a value not in `levels` takes the last level ('<unseen>'); the index becomes one 0/1 "
    "column per level when `onehot`, else one column holding the index; plus the indicator column when "
    "`indicator`. Then `scaling`: the listed columns (or all) become (x - mean) / scale, as float32."
)


def _owned_parts(model: nn.Module, keys: Sequence[str]) -> dict[str, Any]:
    """The fewest modules (or loose tensors) of `model` holding exactly the state-dict `keys`, by a flat name."""
    state = model.state_dict(keep_vars=True)
    modules = dict(model.named_modules())
    mine, covered = set(keys), set()
    parts: dict[str, Any] = {}
    for key in keys:
        if key in covered:
            continue
        pieces = key.split(".")
        for depth in range(1, len(pieces)):
            prefix = ".".join(pieces[:depth])
            inside = [k for k in state if k.startswith(prefix + ".")]
            if prefix in modules and all(k in mine for k in inside):
                parts[prefix.replace(".", "_")] = modules[prefix]
                covered.update(inside)
                break
        else:  # a tensor of no module the party owns whole, e.g. AggVFL's weight_logits
            parts[key.replace(".", "_")] = state[key]
            covered.add(key)
    return parts


class _PartyView(nn.Module):
    """One party's step of a prediction, with only that party's modules registered.

    Tracing maps every tensor the step reads to a registered parameter or buffer, so the TorchScript file holds the
    party's own tensors; anything else it read would be baked in as a constant (refused, see `_trace`).
    """

    def __init__(self, step: Callable[..., torch.Tensor], parts: Mapping[str, Any]) -> None:
        super().__init__()
        for name, part in parts.items():
            if isinstance(part, nn.Module):
                self.add_module(name, part)
            elif isinstance(part, nn.Parameter):
                self.register_parameter(name, part)
            else:
                self.register_buffer(name, part)
        self.step = step

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The step on `inputs` (the protocol's own code)."""
        return self.step(*inputs)


@contextmanager
def _tracing(model: nn.Module) -> Iterator[None]:
    """Eval mode, no autograd, and every parameter marked as requiring grad, for the duration of a trace.

    Tracing refuses to bake a tensor that requires grad into a graph as a constant, so with every parameter marked
    a step that reads a parameter its party does not own fails instead of copying it into the party's file.
    """
    flags = [(p, p.requires_grad) for p in model.parameters()]
    training = model.training
    model.eval()
    try:
        for p, _ in flags:
            p.requires_grad_(True)
        with torch.no_grad(), warnings.catch_warnings():
            # torch 2.9+ marks TorchScript deprecated in favour of torch.export; TorchScript files still load in
            # any C++ or Python runtime without lvfl, which is what a party handed its model needs. Tracer warnings
            # (Python values in the graph) are checked for real by `_trace` on another number of rows.
            warnings.filterwarnings("ignore", message=r".*torch\.jit\.trace.* is deprecated", category=FutureWarning)
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(training)


def _trace(
    what: str,
    step: Callable[..., torch.Tensor],
    parts: Mapping[str, Any],
    example: Sequence[torch.Tensor],
    check: Sequence[torch.Tensor],
    foreign: Sequence[torch.Tensor],
) -> torch.jit.ScriptModule:
    """`step` traced on `example` as a module holding `parts`, checked to be the same function on `check`.

    Raises:
        ValueError: the step reads a tensor outside `parts` (another party's), or the traced graph computes
            something else on another number of rows (it took a Python value from the example, e.g. C-VFL's top-k
            count): either way the file would not be the party's, or not the protocol's prediction.
    """
    try:
        # not `_store_inputs`: the file would keep the example rows, training features and (at the active party)
        # other parties' contributions
        traced = torch.jit.trace(_PartyView(step, parts), tuple(example), check_trace=False, _store_inputs=False)
    except RuntimeError as err:
        if "requires grad as a constant" not in str(err):
            raise
        raise ValueError(f"lvfl export: {what} reads a parameter its party does not own: {err}") from None
    for node in traced.inlined_graph.nodes():
        if node.kind() == "prim::Constant" and node.hasAttribute("value") and node.kindOf("value") == "t":
            value = node.t("value")
            if any(t.shape == value.shape and torch.equal(t, value) for t in foreign):
                raise ValueError(f"lvfl export: {what} reads a tensor of another party (shape {tuple(value.shape)})")
    expected, got = step(*check), traced(*check)
    if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-5, atol=1e-6):
        raise ValueError(
            f"lvfl export: {what} does not trace to TorchScript: on {len(check[0])} rows the traced graph differs "
            f"from the protocol's own code (it took a Python value from the {len(example[0])}-row example, such as "
            "a count that depends on the number of rows), so it cannot be exported"
        )
    return traced


def _output(task: Any, label_names: Sequence[str]) -> dict[str, Any]:
    """What the logits are and how to turn them into `lvfl predict`'s answers (see `PredictionWriter`)."""
    if task.is_regression:
        return {
            "kind": "regression",
            "decode": "logits has shape (rows, 1): the standardized target; prediction = value * target_scale + "
            "target_mean, in the target's units",
            "target_mean": task.target_mean,
            "target_scale": task.target_scale,
        }
    return {
        "kind": "class_logits",
        "decode": "probabilities = softmax(logits) over the last axis (prob_<label_names[j]>); prediction = "
        "label_names[argmax]",
        "label_names": list(label_names) or [str(c) for c in range(task.num_classes)],
    }


def _run_checkpoint_folder(model: Any) -> Path | None:
    """The loaded checkpoint's folder (`trainer.ckpt_path`), else the run's, where `StudentDistillation` saves."""
    trainer = getattr(model, "_trainer", None)
    if trainer is None:
        return None
    if getattr(trainer, "ckpt_path", None):  # as `lvfl predict` finds the student: beside the checkpoint it loads
        return Path(trainer.ckpt_path).parent
    from lvfl.checkpoints import resolve_ckpt_path

    try:
        return resolve_ckpt_path(trainer, "last").parent
    except (FileNotFoundError, ValueError):  # no checkpoint callback, or nothing fitted: no student beside one
        return None


def export_parties(
    model: Any,
    datamodule: Any,
    config: dict[str, Any],
    out: str | Path,
    student_folder: str | Path | None = None,
    only: str | None = None,
    identity: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Write every party's folder (see the module docstring) for a built, loaded `model`; returns the folders.

    With `only`, the folder of that party alone, from a model that holds only that party's tensors (a deployed
    run's own checkpoint, `VFLModule.hold_only`): the active party's completion is traced on stand-in
    contributions of the passive parties' output shapes, drawn from a fixed seed, since their models are not here.

    Args:
        model: the protocol, built and with the checkpoint's weights.
        datamodule: its datamodule, set up.
        config: the run's config (each party's model config is copied to its party.json).
        out: the folder to write one sub-folder per party into.
        student_folder: where the run's student is saved; None: beside the checkpoint `model`'s trainer loaded
            (`trainer.ckpt_path`, as `lvfl export` sets it), else in the run's checkpoint folder.
        only: the one party to export (see above); None: every party.
        identity: what identifies the fitted model (`lvfl export`: the run's token, the checkpoint's epoch and
            step); written with its digest as party.json's `export`, by which serving parties refuse a peer serving
            another export. None: the model's run token alone.

    Raises:
        TypeError: the protocol has no split prediction (`describe_combination` names it); nothing is written.
        ValueError: a party's step does not trace to TorchScript faithfully, or reads another party's tensor.
    """
    from lvfl.datamodules.table_encoding import MISSING_LEVEL, UNSEEN
    from lvfl.datamodules.table_files import MISSING
    from lvfl.inference.student_file import load_student

    combination = model.describe_combination()  # before anything is written: a protocol without one fails by name
    out = Path(out)
    state = model.state_dict()
    keys = owned_keys(model)
    specs = {s.name: s for s in datamodule.party_specs}
    active, passive = model.active, list(model.passive)
    rows = len(datamodule.train_set)

    def features(count: int) -> dict[str, torch.Tensor]:
        batch = datamodule.on_after_batch_transfer(datamodule.train_set.gather(torch.arange(min(count, rows))), 0)
        return {k: v if v.is_meta else v.to(model.device) for k, v in batch.features.items()}

    stand_in = torch.Generator().manual_seed(0)

    def contribution(party: str, features: torch.Tensor) -> torch.Tensor:
        """What `party` sends for these rows; a stand-in of its shape where its model is not here (`only`)."""
        out = model.passive_contribution(party, features)
        if not out.is_meta:
            return out
        return torch.randn(out.shape, generator=stand_in, dtype=out.dtype).to(model.device)

    example, check = features(8), features(5)  # traced on one number of rows, checked on another
    folder_of = {party: out / party for party in model.party_names}
    traced: dict[str, torch.jit.ScriptModule] = {}
    shapes: dict[str, list[int]] = {}
    exported = [only] if only is not None else list(model.party_names)
    with _tracing(model):
        for party in exported:
            parts = _owned_parts(model, keys[party])
            foreign = [state[k] for p in model.party_names if p != party for k in keys[p] if not state[k].is_meta]
            if party != active:
                step = _contribution_step(model, party)
                traced[party] = _trace(
                    f"{party}'s contribution ({type(model).__name__}.passive_contribution)",
                    step,
                    parts,
                    (example[party],),
                    (check[party],),
                    foreign,
                )
                shapes[party] = list(step(example[party]).shape[1:])
                continue
            with torch.no_grad():
                ex = (example[party], *(contribution(k, example[k]) for k in passive))
                ch = (check[party], *(contribution(k, check[k]) for k in passive))
            traced[party] = _trace(
                f"{party}'s completion ({type(model).__name__}.complete_prediction)",
                _completion_step(model, passive),
                parts,
                ex,
                ch,
                foreign,
            )
            for k in passive:  # the output shapes the active party's party.json names, where not traced here
                if k not in shapes:
                    shapes[k] = list(model.passive_contribution(k, example[k]).shape[1:])
        saved_in = student_folder if student_folder is not None else _run_checkpoint_folder(model)
        student = load_student(saved_in) if saved_in is not None else None
        student_file = None
        if student is not None:
            student = student.to(model.device).eval()
            student_file = _trace(
                "the student", student.forward, {"student": student}, (example[active],), (check[active],), []
            )

    party_configs = (config.get("model", {}).get("init_args", {}) or {}).get("parties", [])
    tables = getattr(datamodule, "tables", None)
    label_names = list(getattr(datamodule, "label_names", None) or [])
    export = dict(identity) if identity is not None else {"run": getattr(model, "run_token", None)}
    export["id"] = export_id(export)
    folders = {}
    for index, party in enumerate(model.party_names):
        if party not in exported:
            continue
        folder = folder_of[party]
        folder.mkdir(parents=True, exist_ok=True)
        for stale in ("encoder.pt", "head.pt", "model.pt", "top.pt"):  # an earlier export's per-module traces
            (folder / stale).unlink(missing_ok=True)
        torch.save({k: state[k] for k in keys[party]}, folder / "state_dict.pt")
        spec = specs[party]
        entry = party_configs[index] if len(party_configs) > 1 else (party_configs[0] if party_configs else {})
        info: dict[str, Any] = {
            "party": party,
            "role": spec.role,
            "input_shape": list(spec.input_shape),
            "categories": list(spec.categories),
            "model": _jsonable(entry),
            "embedding_dim": getattr(model, "embedding_dim", None),
            "scaling": _jsonable(getattr(datamodule, "scaling", {}).get(party)),
            "state_dict_keys": keys[party],
            "export": export,
        }
        encoders = getattr(datamodule, "encoders", {}).get(party)
        if encoders is not None:
            if tables is not None:
                info["id_column"] = tables[spec.index].id_column
            info["encoders"] = _jsonable(encoders)
            info["feature_names"] = datamodule.feature_names[party]
            info["encoding"] = {
                "missing_values": sorted(MISSING),
                "missing_level": MISSING_LEVEL,
                "unseen_level": UNSEEN,
                "rules": ENCODING_RULES,
            }
        model_input = f"{party}'s features as its model reads them (encoded and scaled), float32 (rows, *input_shape)"
        if party != active:
            traced[party].save(str(folder / "contribution.pt"))
            info["contribution"] = {
                "file": "contribution.pt",
                "input": model_input,
                "output_shape": shapes[party],
                "what": combination.get("contribution"),
                "to": active,
            }
        else:
            (folder / "student.pt").unlink(missing_ok=True)
            traced[party].save(str(folder / "completion.pt"))
            info["task"] = _jsonable(model.task)
            if label_names:
                info["label_names"] = label_names
            if student_file is not None:
                student_file.save(str(folder / "student.pt"))
            info["serving"] = {
                "format": SERVING_FORMAT,
                "protocol": f"{type(model).__module__}.{type(model).__qualname__}",
                "active": active,
                "contribution_order": passive,
                "contributions": {
                    k: {"folder": k, "file": "contribution.pt", "output_shape": shapes[k]} for k in passive
                },
                "completion": {
                    "file": "completion.pt",
                    "inputs": [model_input, *(f"{k}'s contribution (its contribution.pt's output)" for k in passive)],
                    "output": f"logits, float32 (rows, {model.task.num_outputs})",
                },
                "combination": combination,
                "output": _output(model.task, label_names),
                "student": None
                if student_file is None
                else {
                    "file": "student.pt",
                    "input": model_input,
                    "output": "logits, decoded as `output` says",
                    "answers": "the IDs only the active party holds",
                },
                "ids": "completion.pt answers the IDs every party holds (in a deployment the parties find them by "
                "private set intersection); student.pt, when there is one, the IDs only the active party holds",
                "max_rows_per_call": combination.get("max_rows_per_call"),
            }
        (folder / "party.json").write_text(json.dumps(info, indent=1))
        folders[party] = folder
    return folders


def export_id(identity: Mapping[str, Any]) -> str:
    """The digest of an export's identity (its other fields): equal at every party of one export, short to send."""
    fields = {k: v for k, v in identity.items() if k != "id"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _contribution_step(model: Any, party: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Passive `party`'s features -> what it sends for a prediction (`passive_contribution`)."""

    def step(features: torch.Tensor) -> torch.Tensor:
        return model.passive_contribution(party, features)

    return step


def _completion_step(model: Any, order: Sequence[str]) -> Callable[..., torch.Tensor]:
    """The active party's features, then the contributions in `order` -> its logits (`complete_prediction`)."""

    def step(active_features: torch.Tensor, *contributions: torch.Tensor) -> torch.Tensor:
        return model.complete_prediction(active_features, dict(zip(order, contributions, strict=True)))

    return step
