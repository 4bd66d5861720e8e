"""What makes a run repeat and what identifies it: derived seeds, run fingerprints and resume traffic on the ledger.

Three pieces, each a pure function that the datamodule, the callbacks and `VFLModule`'s checkpoint hooks share:

- `derive_seed(seed, purpose, *words)`: a 63-bit seed that is a pure function of its arguments. The training
  loader shuffles epoch e with `derive_seed(seed, "shuffle", e)` and `lvfl.callbacks.checkpoint.ExactResume` reseeds
  torch's global RNG (dropout, ...) at the start of epoch e, so the randomness of epoch e does not depend on how
  many epochs ran in this process: a run resumed at epoch r replays nothing and continues the run it resumes
  (the data loaders draw their worker seeds from a generator of their own, `derive_seed(seed, "loader")`, not from
  the global RNG, and a resumed fit runs no second sanity check).
- `run_fingerprint(module, datamodule)`: what a checkpoint records about the run that wrote it (protocol, backend
  and its settings, label mechanism, party models, data split with a digest of the sample IDs of every split), and
  `check_fingerprint`, which refuses to load a checkpoint into a run whose fingerprint differs, naming what differs.
- `RESUME_TAG_PREFIX`: a process that loads a checkpoint written by another process (a resume, or
  `lvfl test --ckpt_path last`) has already done its own set-up on the wire (the backend's fresh key exchange).
  That traffic really happens again, so it stays on the ledger, under the tag `resume/<tag>` (`resume/keys`): the
  ledger without `resume/*` tags is exactly the ledger of the uninterrupted run.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from lvfl.moved_modules import current_path

__all__ = [
    "RESUME_TAG_PREFIX",
    "digest_json",
    "RUNTIME_ONLY_SETTINGS",
    "CheckpointMismatchError",
    "check_fingerprint",
    "class_path",
    "data_fingerprint",
    "derive_seed",
    "digest_array",
    "describe_object",
    "fingerprint_differences",
    "resume_rows",
    "run_fingerprint",
    "seeded_generator",
    "split_resume_traffic",
]

#: Tag prefix of the set-up traffic a process sent before loading a checkpoint of another process (see module doc).
RESUME_TAG_PREFIX = "resume/"

#: Settings recorded in a fingerprint but not compared: they change how fast a run goes (threads, worker processes)
#: or how its data is batched, not which run it is (`lvfl test --ckpt_path last --data.init_args.batch_size=512`
#: tests the same run).
RUNTIME_ONLY_SETTINGS = frozenset({"batch_size", "num_workers", "workers", "n_threads"})

#: Settings added after checkpoints were written without them, with the value those runs had: a checkpoint that
#: lacks one is compared as having that value (DHMasking's ring was Z_2^64 before `ring_bits` existed).
ADDED_SETTINGS = {"ring_bits": 64, "stratify": "auto"}

_PURPOSES = {"shuffle": 0x5F0FF1E, "global_rng": 0x61DB41, "loader": 0x10AD, "dropout": 0xD120}
_MAX_DIFFERENCES = 8  # differences listed in an error message
_DEPTH = 4  # nesting followed when describing settings that are objects
_NOT_SET = "<not set>"
_MAYBE_UNKNOWN = frozenset({"parties", "data"})  # sections a run may not know yet when it loads a checkpoint


class CheckpointMismatchError(ValueError):
    """A checkpoint was written by a run whose configuration differs from the run loading it."""


# ---------------------------------------------------------------------------------------------------- seeds
def derive_seed(seed: int, purpose: str, *words: int) -> int:
    """A 63-bit seed that depends only on (`seed`, `purpose`, `words`), e.g. (run seed, "shuffle", epoch).

    Numpy's `SeedSequence` mixes the words (any non-negative or negative Python ints), so nearby inputs give
    unrelated streams; `purpose` keeps the data order and the global RNG independent even for the same epoch.

    Example:
        >>> derive_seed(0, "shuffle", 1) == derive_seed(0, "shuffle", 1) != derive_seed(0, "shuffle", 2)
        True
    """
    if purpose not in _PURPOSES:
        raise ValueError(f"unknown seed purpose {purpose!r}; known: {sorted(_PURPOSES)}")
    entropy = [int(w) % 2**64 for w in (seed, _PURPOSES[purpose], *words)]
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def seeded_generator(seed: int, purpose: str, *words: int) -> torch.Generator:
    """A CPU `torch.Generator` seeded with `derive_seed(seed, purpose, *words)`."""
    return torch.Generator().manual_seed(derive_seed(seed, purpose, *words))


# ---------------------------------------------------------------------------------------------------- fingerprints
def class_path(obj_or_cls: Any) -> str:
    """`module.QualName` of a class or of an object's class."""
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    return f"{cls.__module__}.{cls.__qualname__}"


def _plain(value: Any, depth: int) -> Any:
    """`value` as JSON-like data that is the same in every process (never a repr holding a memory address)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, torch.dtype | torch.device):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v, depth) for k, v in value.items()}
    if isinstance(value, list | tuple | torch.Size):
        return [_plain(v, depth) for v in value]
    if isinstance(value, np.ndarray | torch.Tensor):
        return _digest(np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value))
    if isinstance(value, type):
        return class_path(value)
    if depth > 0 and (isinstance(value, torch.nn.Module) or not callable(value)):
        return describe_object(value, depth - 1)
    return class_path(value)  # a function or an opaque object: its type is all that is stable across processes


def describe_object(obj: Any, depth: int = _DEPTH) -> dict[str, Any]:
    """`obj`'s class path and its settings.

    The settings are every `__init__` argument (of every class in its MRO) that `obj` keeps as an attribute of the
    same name, as scikit-learn's `get_params` reads them; arguments it does not keep are skipped.
    """
    out: dict[str, Any] = {"class": class_path(obj)}
    for klass in type(obj).__mro__:
        init = vars(klass).get("__init__")
        if init is None or klass is object:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            continue
        for p in params:
            if p.name == "self" or p.name in out or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            try:
                value = getattr(obj, p.name)
            except (AttributeError, RuntimeError):  # not kept (or not readable now): not a setting it has
                continue
            out[p.name] = _plain(value, depth)
    return out


def _digest(array: np.ndarray) -> str:
    return _digest_rows([array])


def _digest_rows(parts: list[np.ndarray]) -> str:
    """The digest of `parts` stacked along their first axis, read in place (a million rows are not copied)."""
    parts = [np.ascontiguousarray(p) for p in parts]  # (at least one axis: a scalar reads as one value)
    first = parts[0]
    shape = (sum(len(p) for p in parts), *first.shape[1:])
    digest = hashlib.sha256(f"{first.dtype.str}{shape}".encode())
    for part in parts:
        if part.size:
            digest.update(memoryview(part).cast("B"))
    return digest.hexdigest()[:16]


def digest_json(value: Any) -> str:
    """A short SHA-256 digest of JSON-like `value` (keys sorted): the same in every process."""
    import json

    blob = json.dumps(_plain(value, _DEPTH), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def digest_array(array: np.ndarray | torch.Tensor | list[torch.Tensor]) -> str:
    """A short SHA-256 digest of an array's dtype, shape and bytes; of a list, of its parts stacked (not copied)."""
    parts = array if isinstance(array, list) else [array]
    parts = [p.detach().cpu().numpy() if isinstance(p, torch.Tensor) else np.asarray(p) for p in parts]
    return _digest_rows(parts)


def _ids(ids: torch.Tensor) -> dict[str, Any]:
    values = ids.detach().cpu().to(torch.int64).numpy()
    return {"samples": int(values.size), "ids_sha256": _digest(values)}


def data_fingerprint(datamodule: Any) -> dict[str, Any]:
    """A `VerticalDataModule`'s class, settings and, per split, the count and a digest of the sample IDs.

    Per split both all its samples and the overlap every party holds are digested: two runs with the same data
    fingerprint train, validate and test on the same rows. Datamodules whose rows are files a user hands lvfl
    (`PartyTables`) add `content`: per party, digests of its IDs, its columns, its fitted encoders and scaling and
    its encoded features, so that another table under the same path is refused too.
    """
    out = describe_object(datamodule)
    out.pop("class", None)
    splits = {
        split: {"all": _ids(datamodule.active_set(split).ids), "overlap": _ids(datamodule.overlap_ids(split))}
        for split in ("train", "val", "test")
    }
    fingerprint = {"class": class_path(datamodule), "settings": out, "splits": splits}
    content = datamodule.content_digest() if callable(getattr(datamodule, "content_digest", None)) else {}
    if content:  # only where the datamodule has one, so that other datamodules' fingerprints stay as they were
        fingerprint["content"] = content
    return fingerprint


def run_fingerprint(module: Any, datamodule: Any | None = None) -> dict[str, Any]:
    """What identifies the run of `module` (a `VFLModule`) on `datamodule`; sections it cannot know are None.

    - `protocol`: class and settings (`embedding_dim`, protocol-specific arguments such as PraVFed's `weighting`);
    - `aggregation` and `label_mechanism`: class and settings (None: no label mechanism);
    - `parties` (None until the models are built): per party its role, input shape, model class and settings, and
      the shape of every parameter and buffer;
    - `data` (None without a VerticalDataModule): see `data_fingerprint`.
    """
    parties = None
    if len(getattr(module, "party_models", ())) > 0:
        parties = {}
        for spec in module.party_specs:
            model = module.party_models[spec.name]
            parties[spec.name] = {
                "role": spec.role,
                "input_shape": list(spec.input_shape),
                "model": describe_object(model, depth=1),
                "parameters": {name: list(p.shape) for name, p in model.state_dict().items()},
            }
    protocol = describe_object(module, depth=2)
    for separate in ("aggregation", "label_mechanism"):
        protocol.pop(separate, None)
    mechanism = getattr(module, "label_mechanism", None)
    has_views = datamodule is not None and callable(getattr(datamodule, "active_set", None))
    return {
        "protocol": protocol,
        "aggregation": describe_object(module.aggregation),
        "label_mechanism": None if mechanism is None else describe_object(mechanism),
        "parties": parties,
        "data": data_fingerprint(datamodule) if has_views else None,
    }


def _leaves(value: Any, path: str) -> Iterable[tuple[str, Any]]:
    if isinstance(value, Mapping) and value:
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    else:
        yield path, value


def _current_paths(value: Any) -> Any:
    """`value` with every class path under a moved module (`lvfl.moved_modules`) where its class lives now.

    A checkpoint written before a module moved records the old path; rewritten, it compares as the run it is.
    """
    if isinstance(value, Mapping):
        return {k: _current_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_current_paths(v) for v in value]
    return current_path(value) if isinstance(value, str) else value


def fingerprint_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(setting, checkpoint's value, this run's value) for every compared setting that differs.

    `parties` and `data` are not compared when either side does not know them (None: models not built yet, no
    datamodule attached); settings in `RUNTIME_ONLY_SETTINGS` never are. A setting only one side has differs. Class
    paths are compared where the classes live now (`lvfl.moved_modules.current_path`).
    """
    saved, current = _current_paths(saved), _current_paths(current)
    out = []
    for section in [*saved, *(k for k in current if k not in saved)]:
        a, b = saved.get(section), current.get(section)
        if section in _MAYBE_UNKNOWN and (a is None or b is None):
            continue
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)):  # e.g. a label mechanism on one side only
            if a != b:
                out.append((section, _name(a), _name(b)))
            continue
        left, right = dict(_leaves(a, section)), dict(_leaves(b, section))
        keys = [*left, *(k for k in right if k not in left)]
        # objects of another class: their class is the difference, their settings are not comparable
        other_class = [k[: -len("class")] for k in keys if k.endswith(".class") and left.get(k) != right.get(k)]
        for key in keys:
            if key.rsplit(".", 1)[-1] in RUNTIME_ONLY_SETTINGS:
                continue
            if any(key.startswith(prefix) and not key.endswith(".class") for prefix in other_class):
                continue
            va = left.get(key, ADDED_SETTINGS.get(key.rsplit(".", 1)[-1], _NOT_SET))
            vb = right.get(key, _NOT_SET)
            if va != vb:
                out.append((key, va, vb))
    return out


def check_fingerprint(saved: Mapping[str, Any], current: Mapping[str, Any], where: str = "this checkpoint") -> None:
    """Raise `CheckpointMismatchError` naming every difference (up to a few) between two run fingerprints."""
    diffs = fingerprint_differences(saved, current)
    if not diffs:
        return
    lines = [f"  {key}: checkpoint has {_short(a)}, this run has {_short(b)}" for key, a, b in diffs[:_MAX_DIFFERENCES]]
    if len(diffs) > _MAX_DIFFERENCES:
        lines.append(f"  ... and {len(diffs) - _MAX_DIFFERENCES} more")
    first_key, first_a, first_b = diffs[0]
    data = any(key.startswith("data.") for key, _, _ in diffs)
    raise CheckpointMismatchError(
        f"{where} belongs to another run: it was written with {first_key}={_short(first_a)}, this run has "
        f"{first_key}={_short(first_b)}. Refusing to load it (its weights would silently stand in for this run's"
        + ("; it was trained on other training samples or another split" if data else "")
        + "). Differences:\n"
        + "\n".join(lines)
        + "\nLoad a checkpoint of this configuration, or give runs that differ "
        "their own checkpoint directory (a different `trainer.logger.init_args.name`)."
    )


def _name(value: Any) -> Any:
    return value.get("class", value) if isinstance(value, Mapping) else value


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


# ---------------------------------------------------------------------------------------------------- resume traffic
def resume_rows(rows: Iterable[list], prefix: str = RESUME_TAG_PREFIX) -> list[list]:
    """Ledger rows `[src, dst, tag, n]` with every tag moved under `prefix` (tags already under it stay)."""
    return [[src, dst, tag if tag.startswith(prefix) else prefix + tag, n] for src, dst, tag, n in rows]


def split_resume_traffic(ledger: Mapping[tuple[str, str, str], int]) -> tuple[dict, dict]:
    """A ledger (`Wire.bytes` or `Wire.messages`) split into (the run's own traffic, re-done set-up traffic).

    The first part is what an uninterrupted run would have recorded; the second is keyed by the original tags.
    """
    own, again = {}, {}
    for (src, dst, tag), n in ledger.items():
        if tag.startswith(RESUME_TAG_PREFIX):
            again[(src, dst, tag[len(RESUME_TAG_PREFIX) :])] = n
        elif n:
            own[(src, dst, tag)] = n
    return own, again
