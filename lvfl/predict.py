"""What `lvfl predict` does around Lightning's predict loop: which IDs are asked for, which model answers each.

The VFL model answers, in the predict loop, the samples every party holds; the student that `StudentDistillation`
saved beside the checkpoints answers the active party's others; with `--oblivious` every ID goes through the `Router`
(oblivious lookups into each passive party's table of contributions). `PredictionWriter` writes them all, one row per
requested ID, in the order asked for. `lvfl.cli.VFLCLI`'s predict hooks call `before_predict` and `after_predict`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "after_predict",
    "before_predict",
    "checkpoint_folder",
    "load_student",
    "read_ids",
    "requested_samples",
    "routed_answers",
    "student_answers",
]


def before_predict(cli: Any) -> None:
    """`lvfl predict` writes its predictions to a file (`lvfl.callbacks.PredictionWriter`)."""
    from lvfl.callbacks.predictions import PredictionWriter

    config = cli.config.get(str(cli.subcommand), cli.config)
    path = config.get("output") or str(Path(cli.trainer.log_dir or ".") / "predictions.csv")
    cli.prediction_writer = PredictionWriter(path)
    folder = checkpoint_folder(cli, config.get("ckpt_path"))
    cli._routed = None  # (IDs, student) that `after_predict` answers through the Router (`--oblivious`)
    if config.get("oblivious"):
        _route(cli, config, folder)
        return
    new_rows = getattr(cli.datamodule, "new_rows_active_only", None)
    if new_rows is not None:
        cli.datamodule.setup("predict")
        new = new_rows()
        if new is not None and config.get("ids") is not None:
            raise ValueError("--ids and the datamodule's new_rows both say what to predict: give one")
        if new is not None:
            keys, features = new
            answered = student_answers(load_student(folder) if keys else None, keys, features, "new rows")
            answered = {k: (v, "student") for k, v in answered.items()}
            cli.prediction_writer.request(cli.datamodule.new_row_ids(), answered)
    if config.get("ids") is not None:
        keys = read_ids(config["ids"])
        vfl, answered = requested_samples(cli.datamodule, keys, load_student(folder))
        cli.datamodule.predict_ids = vfl
        cli.prediction_writer.request(keys, {k: (v, "student") for k, v in answered.items()})
    cli.trainer.callbacks.append(cli.prediction_writer)
    _quiet_if_no_batch(cli)


def _quiet_if_no_batch(cli: Any) -> None:
    """No predict batch is wanted (every ID is answered outside the loop): Lightning's warning is no news."""
    if cli.datamodule.predict_ids == []:
        import warnings

        warnings.filterwarnings("ignore", message=r"Total length of `DataLoader` across ranks is zero")


def _route(cli: Any, config: Any, folder: Path | None) -> None:
    """`--oblivious`: no predict batch runs; `after_predict` answers the IDs through the `Router`."""
    cli.datamodule.setup("predict")
    new_rows = getattr(cli.datamodule, "new_rows_active_only", None)
    if new_rows is not None and new_rows() is not None:
        raise ValueError(
            "--oblivious answers IDs the parties held at training time (--ids, or the test split); the "
            "datamodule's new_rows are predicted without it: leave one of them out"
        )
    if config.get("ids") is not None:
        keys = read_ids(config["ids"])
    else:
        test = cli.datamodule.active_set("test").ids
        keys = cli.datamodule.business_ids(test) if hasattr(cli.datamodule, "business_ids") else test.tolist()
    cli._routed = ([str(k) for k in keys], load_student(folder))
    cli.datamodule.predict_ids = []  # the trainer still builds the model and loads the checkpoint
    cli.trainer.callbacks.append(cli.prediction_writer)
    _quiet_if_no_batch(cli)


def checkpoint_folder(cli: Any, ckpt_path: str | None) -> Path | None:
    """The folder of the checkpoint `lvfl predict` loads (where a student is saved beside it)."""
    if ckpt_path is None:
        return None
    if ckpt_path != "last":
        return Path(ckpt_path).parent
    from lvfl.callbacks import ExperimentCheckpoint

    keepers = [cb for cb in cli.trainer.callbacks if isinstance(cb, ExperimentCheckpoint)]
    if not keepers:
        return None
    keepers[0]._use_experiment_dir(cli.trainer)
    return Path(keepers[0].dirpath) if keepers[0].dirpath else None


def after_predict(cli: Any) -> None:
    """Say where the predictions went."""
    writer = cli.prediction_writer
    if cli._routed is not None:
        from lvfl.wire import Wire

        keys, student = cli._routed
        wire = Wire()
        writer.request(keys, routed_answers(cli.model, cli.datamodule, keys, student, wire))
        if cli.trainer.is_global_zero:
            tags = ", ".join(f"{tag} {n:,} B" for tag, n in sorted(wire.bytes_by_tag().items()))
            print(f"lvfl predict --oblivious: {len(keys)} IDs through oblivious lookups, {tags}")
    if not writer.rows and writer.pending_answers:  # every ID was answered outside the loop: no batch ran
        writer.write_on_epoch_end(cli.trainer, cli.model, [], [])
    if cli.trainer.is_global_zero:
        print(f"lvfl predict: {len(writer.rows)} predictions written to {writer.path}")


def read_ids(path: str) -> list[str]:
    """IDs from a file: one per line, or a .csv's first column below its header; blank lines skipped."""
    import csv

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--ids: {file} does not exist")
    with file.open(newline="") as f:
        rows = [r for r in csv.reader(f)] if file.suffix.lower() == ".csv" else [[line] for line in f]
    ids = [r[0].strip() for r in (rows[1:] if file.suffix.lower() == ".csv" else rows) if r and r[0].strip()]
    if not ids:
        raise ValueError(f"--ids: {file} lists no ID")
    return ids


def load_student(folder: Path | None) -> Any:
    """The student `StudentDistillation` saved beside the checkpoints, or None where there is none."""
    from lvfl.inference.student_file import load_student as load

    return None if folder is None else load(folder)


def requested_samples(datamodule: Any, keys: list[str], student: Any = None) -> tuple[list[int], dict[str, Any]]:
    """What `lvfl predict --ids` answers: the VFL model's samples, and the student's answers for the other IDs.

    Returns (the samples every party holds, for the VFL model; {ID: probabilities} of the IDs only the active party
    holds, answered by the `student` on its features). Without a student such IDs are refused by name rather than
    answered by a model that does not see them; an ID that is no sample of the active party is always refused.
    """
    datamodule.setup("predict")
    try:
        samples = datamodule.sample_ids_for(keys)
    except KeyError as err:
        raise ValueError(f"--ids: {err.args[0]}") from None
    held = set(datamodule.overlap_ids().tolist()) if len(datamodule.participants) > 1 else set(samples)
    vfl = [s for s in samples if s in held]
    only = [(k, s) for k, s in zip(keys, samples, strict=True) if s not in held]
    features = datamodule.active_rows([s for _, s in only]).features[datamodule.active_party_name]
    return vfl, student_answers(student if only else None, [k for k, _ in only], features, "--ids")


def routed_answers(
    model: Any, datamodule: Any, keys: list[str], student: Any, wire: Any, bucket_size: int = 64
) -> dict[str, tuple[Any, str]]:
    """{ID: (probabilities or value, path)} of `keys` answered by a `Router` rebuilt from the loaded run.

    The passive parties' tables come from the checkpoint's models on their own features, the student from
    `student.pt`; the lookups' messages go on `wire`. IDs that only the active party holds need the student and are
    refused by name without one, as is an ID that is no sample of the active party.
    """
    from lvfl.inference.router import Router

    try:
        samples = datamodule.sample_ids_for(keys)
    except KeyError as err:
        raise ValueError(f"--oblivious: {err.args[0]}") from None
    if student is None:
        held = set(datamodule.overlap_ids().tolist()) if len(datamodule.participants) > 1 else set(samples)
        student_answers(None, [k for k, s in zip(keys, samples, strict=True) if s not in held], None, "--oblivious")
    routed = Router(model, datamodule, student, bucket_size=bucket_size, wire=wire).predict(samples)
    task = model.task
    outputs = task.to_target(routed.logits.reshape(-1)) if task.is_regression else routed.logits.softmax(-1)
    return {k: (o, p) for k, o, p in zip(keys, outputs, routed.path, strict=True)}


def student_answers(student: Any, keys: list[str], features: Any, what: str) -> dict[str, Any]:
    """{ID: class probabilities} of the student on the active party's `features` of `keys` (none: {}).

    Raises:
        ValueError: there are such IDs but no student (named): a model that does not see them must not answer.
    """
    import torch

    if not keys:
        return {}
    if student is None:
        raise ValueError(
            f"{what}: {keys[:10]} are held by the active party only; answering them needs the student model that "
            "StudentDistillation saves beside the checkpoints, and this run has none: leave them out"
        )
    student.eval()
    with torch.no_grad():
        probs = student(features).softmax(-1)
    return dict(zip(keys, probs, strict=True))
