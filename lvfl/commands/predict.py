"""What `lvfl predict` does around Lightning's predict loop: which rows are asked for, which model answers each.

Every requested row gets an answer or a reason, in the order asked for; none is dropped and no row makes the others
fail. The rows asked for are `--ids`, or the datamodule's `new_rows`, or by default every test sample of the active
party (those every party holds and those it holds alone). Each is answered by

- `vfl`: the federation's model, in Lightning's predict loop, where every party holds the row;
- `student`: the student that `StudentDistillation` saved beside the checkpoints, where only the active party holds
  it (class probabilities, or a regression's value);
- nobody (`path` empty, `prediction` empty, a `reason`): a row only the active party holds when the run saved no
  student, or an ID that is not the active party's.

With `--oblivious` the same rows go through the `Router` instead (oblivious lookups into each passive party's table of
contributions): the same answers, paths and reasons as the plain path. The console says how many rows each path
answered. `lvfl.commands.fit.VFLCLI`'s predict hooks call `before_predict` and `after_predict`;
`PredictionWriter` writes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from lvfl.prediction_rows import NO_STUDENT, UNKNOWN_ID

__all__ = [
    "NO_STUDENT",
    "UNKNOWN_ID",
    "after_predict",
    "before_predict",
    "checkpoint_folder",
    "load_student",
    "read_ids",
    "requested_rows",
    "routed_answers",
    "rows_to_serve",
    "student_answers",
]

#: the wire tag of the rows the active party asks the passive parties to serve (`rows_to_serve`)
PREDICT_IDS_TAG = "predict_ids"

Answer = tuple[Any, str, str]  # (probabilities or value, or None; path; reason)


def before_predict(cli: Any) -> None:
    """Decide the rows and answer those outside the loop; the loop's batches are the rows every party holds."""
    from lvfl.callbacks.predictions import PredictionWriter

    config = cli.config.get(str(cli.subcommand), cli.config)
    datamodule = cli.datamodule
    cli.model.prepare_datamodule(datamodule)  # set up here, before the trainer attaches it
    datamodule.setup("predict")
    cli._routed = None
    if not cli.model.wire.holds(datamodule.active_party_name):  # a passive party's own process (`lvfl party`)
        cli.prediction_writer = None  # the active party decides the rows and writes the file
        if config.get("oblivious"):  # it answers the active party's oblivious queries after the (empty) loop
            cli._routed = ((), None)
            datamodule.predict_ids = []
        elif getattr(datamodule, "new_row_ids", lambda: None)() is None:  # else: the new rows all hold, PSI's order
            datamodule.predict_ids = rows_to_serve(cli.model, datamodule, None)
        return
    path = config.get("output") or str(Path(cli.trainer.log_dir or ".") / "predictions.csv")
    cli.prediction_writer = writer = PredictionWriter(path)
    student = load_student(checkpoint_folder(cli, config.get("ckpt_path")), datamodule.task)
    new_rows = getattr(datamodule, "new_rows_active_only", None)
    new = new_rows() if new_rows is not None else None
    if new is not None and config.get("ids") is not None:
        raise ValueError("--ids and the datamodule's new_rows both say what to predict: give one")
    # (IDs, student) that `after_predict` answers through the Router (`--oblivious`)
    if config.get("oblivious"):
        if new is not None:
            raise ValueError(
                "--oblivious answers IDs the parties held at training time (--ids, or the test split); the "
                "datamodule's new_rows are predicted without it: leave one of them out"
            )
        keys = read_ids(config["ids"]) if config.get("ids") is not None else default_keys(datamodule)
        cli._routed = (keys, student)
        datamodule.predict_ids = []  # no batch: the trainer still builds the model and loads the checkpoint
    elif new is not None:
        keys, features = new
        answered = student_answers(student, keys, features, cli.model.task)
        writer.request(datamodule.new_row_ids(), answered)
    else:
        keys = read_ids(config["ids"]) if config.get("ids") is not None else default_keys(datamodule)
        vfl, answered = requested_rows(datamodule, keys, student, cli.model.task)
        datamodule.predict_ids = rows_to_serve(cli.model, datamodule, vfl)
        writer.request(keys, answered)
    cli.trainer.callbacks.append(writer)
    in_loop = len(datamodule.new_row_ids()) - len(new[0]) if new is not None else len(datamodule.predict_ids or [])
    if not in_loop:
        import warnings  # no batch is wanted (every row is answered outside the loop): Lightning's warning is no news

        warnings.filterwarnings("ignore", message=r"Total length of `DataLoader` across ranks is zero")


def rows_to_serve(model: Any, datamodule: Any, samples: list[int] | None) -> list[int]:
    """The samples the predict loop serves, as each party learns them: the active party's `samples`, sent.

    The active party decides which rows are predicted (from `--ids` or its test split) and tells every passive
    participant their sample IDs (tag `predict_ids`, 8 bytes each, metered in simulation too): a passive party serves
    its features of exactly those rows, so it learns which of the samples it shares are predicted (what answering
    without `--oblivious` reveals). In a passive party's own process `samples` is None and the message is received,
    refused unless it names samples that party holds.
    """
    import numpy as np

    from lvfl.wire import Absent

    wire = model.wire
    active = datamodule.active_party_name
    payload = np.asarray(samples, dtype=">i8").tobytes() if wire.holds(active) else Absent("the rows to predict")
    served = samples
    for party in [s.name for s in datamodule.party_specs if s.name != active]:
        received = wire.send(active, party, payload, PREDICT_IDS_TAG)
        if wire.holds(party) and not wire.holds(active):
            if not isinstance(received, bytes) or len(received) % 8:
                raise ValueError(f"{active} sent {PREDICT_IDS_TAG!r} that is not a list of 8-byte sample IDs")
            served = np.frombuffer(received, dtype=">i8").astype(np.int64).tolist()
            unknown = sorted(set(served) - set(datamodule.overlap_ids().tolist()))
            if unknown:
                raise ValueError(f"{active} asked {party} to predict samples it does not hold: {unknown[:10]}")
    return list(served or [])


def default_keys(datamodule: Any) -> list[str]:
    """Every test sample of the active party (every party's and its own alone), as the file keys them."""
    test = datamodule.active_set("test").ids
    return datamodule.business_ids(test) if hasattr(datamodule, "business_ids") else [str(int(i)) for i in test]


def checkpoint_folder(cli: Any, ckpt_path: str | None) -> Path | None:
    """The folder of the checkpoint `lvfl predict` loads (`last`, `best` or a path): where its student is saved."""
    from lvfl.checkpoints import resolve_ckpt_path

    path = resolve_ckpt_path(cli.trainer, ckpt_path)
    return None if path is None else path.parent


def after_predict(cli: Any) -> None:
    """Answer the `--oblivious` rows through the Router, write what is pending, say how many rows each path answered."""
    writer = cli.prediction_writer
    if writer is None:  # a passive party's own process: it served its features; the active party writes
        if cli._routed is not None:  # --oblivious: it answers the active party's queries, learning no ID
            from lvfl.inference.router import Router

            Router(cli.model, cli.datamodule, None, wire=cli.model.wire).predict(None)
        return
    if cli._routed is not None:
        from lvfl.wire import Wire

        keys, student = cli._routed
        # a party's own process: the lookups go to the passive parties' processes; in simulation, a wire of their own
        wire = cli.model.wire if cli.model.wire.here is not None else Wire()
        before = wire.bytes_by_tag()
        writer.request(keys, routed_answers(cli.model, cli.datamodule, keys, student, wire))
        if cli.trainer.is_global_zero:
            moved = {t: n - before.get(t, 0) for t, n in wire.bytes_by_tag().items() if t.startswith("ot_")}
            tags = ", ".join(f"{tag} {n:,} B" for tag, n in sorted(moved.items()))
            print(f"lvfl predict --oblivious: {len(keys)} IDs through oblivious lookups, {tags}")
    if not writer.rows and writer.pending_answers:  # every ID was answered outside the loop: no batch ran
        writer.write_on_epoch_end(cli.trainer, cli.model, [], [])
    if cli.trainer.is_global_zero:
        print(f"lvfl predict: {len(writer.rows)} rows written to {writer.path}: {summary(writer.rows)}")


def summary(rows: list[dict[str, Any]]) -> str:
    """How many rows each path answered, and how many got a reason instead."""
    paths = Counter(row["path"] or "" for row in rows)
    parts = [f"{paths.get('vfl', 0)} by the VFL model", f"{paths.get('student', 0)} by the student"]
    return ", ".join(parts) + f", {paths.get('', 0)} unanswered (see their reason)"


#: the largest file of IDs read (about 20 million IDs of 20 characters); its size is checked before it is read
MAX_IDS_FILE_BYTES = 512 * 2**20
#: the longest ID, in characters
MAX_ID_CHARS = 1024


def read_ids(path: str) -> list[str]:
    """IDs from a file: one per line, or a .csv's first column below its header; blank lines skipped.

    Raises:
        ValueError: in one line naming the file: over `MAX_IDS_FILE_BYTES` (checked before reading), not UTF-8
            text, an ID over `MAX_ID_CHARS` characters, or no ID at all.
    """
    import csv
    import io

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--ids: {file} does not exist")
    size = file.stat().st_size
    if size > MAX_IDS_FILE_BYTES:
        raise ValueError(f"--ids: {file} is {size:,} bytes; at most {MAX_IDS_FILE_BYTES:,} are read: split it")
    try:
        text = file.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"--ids: {file} is not UTF-8 text (byte {err.start}: {err.reason})") from None
    with io.StringIO(text, newline="") as f:
        rows = [r for r in csv.reader(f)] if file.suffix.lower() == ".csv" else [[line] for line in f]
    long = next((i for i, r in enumerate(rows) if r and len(r[0].strip()) > MAX_ID_CHARS), None)
    if long is not None:
        raise ValueError(f"--ids: {file}, line {long + 1}: an ID of {len(rows[long][0].strip()):,} characters; at most "
                         f"{MAX_ID_CHARS}")  # fmt: skip
    ids = [r[0].strip() for r in (rows[1:] if file.suffix.lower() == ".csv" else rows) if r and r[0].strip()]
    if not ids:
        raise ValueError(f"--ids: {file} lists no ID")
    return ids


def load_student(folder: Path | None, task: Any = None) -> Any:
    """The student `StudentDistillation` saved beside the checkpoints, or None where there is none.

    With `task` (the run's), a student of another task kind or width is refused by name rather than answering wrongly.
    """
    from lvfl.inference.student_file import load_student as load

    return None if folder is None else load(folder, task)


def requested_rows(datamodule: Any, keys: list[str], student: Any, task: Any) -> tuple[list[int], dict[str, Answer]]:
    """Which of `keys` the VFL model answers (their samples, in order) and the answers for all the others.

    Returns (the samples every party holds, for the predict loop; {ID: answer} for the rest: the `student`'s on the
    active party's features where only it holds the row, else a reason).
    """
    samples = datamodule.sample_ids_for(keys, missing="none")
    held = holders(datamodule, samples)
    vfl = [s for s in samples if s is not None and s in held]
    answers: dict[str, Answer] = {k: (None, "", UNKNOWN_ID) for k, s in zip(keys, samples, strict=True) if s is None}
    only = [(k, s) for k, s in zip(keys, samples, strict=True) if s is not None and s not in held]
    if only:
        features = datamodule.active_rows([s for _, s in only]).features[datamodule.active_party_name]
        answers |= student_answers(student, [k for k, _ in only], features, task)
    return vfl, answers


def holders(datamodule: Any, samples: list[int | None]) -> set[int]:
    """The samples of `samples` every participating party holds (all of them when the active party is alone)."""
    if len(datamodule.participants) == 1:
        return {s for s in samples if s is not None}
    return set(datamodule.overlap_ids().tolist())


def routed_answers(
    model: Any, datamodule: Any, keys: list[str], student: Any, wire: Any, bucket_size: int = 64
) -> dict[str, Answer]:
    """{ID: answer} of `keys` answered by a `Router` rebuilt from the loaded run (the same rows as the plain path).

    The passive parties' tables come from the checkpoint's models on their own features, the student from the saved
    student; the lookups' messages go on `wire`. An ID that is not the active party's gets a reason, as does an ID
    only the active party holds when there is no student.
    """
    from lvfl.inference.router import Router

    samples = datamodule.sample_ids_for(keys, missing="none")
    answers: dict[str, Answer] = {k: (None, "", UNKNOWN_ID) for k, s in zip(keys, samples, strict=True) if s is None}
    asked = [(k, s) for k, s in zip(keys, samples, strict=True) if s is not None]
    if asked:
        routed = Router(model, datamodule, student, bucket_size=bucket_size, wire=wire).predict([s for _, s in asked])
        task = model.task
        outputs = task.to_target(routed.logits.reshape(-1)) if task.is_regression else routed.logits.softmax(-1)
        for (key, _), output, path in zip(asked, outputs, routed.path, strict=True):
            answers[key] = (output, path, "") if path != "none" else (None, "", NO_STUDENT)
    return answers


def student_answers(student: Any, keys: list[str], features: Any, task: Any) -> dict[str, Answer]:
    """{ID: answer} of the student on the active party's `features` of `keys`.

    Class probabilities, or a regression's value in the target's units; without a student, every one of them gets the
    reason `NO_STUDENT`.
    """
    import torch

    if not keys:
        return {}
    if student is None:
        return {k: (None, "", NO_STUDENT) for k in keys}
    student.eval()
    with torch.no_grad():
        out = student(features)
    outputs = task.to_target(out.reshape(-1)) if task is not None and task.is_regression else out.softmax(-1)
    return {k: (o, "student", "") for k, o in zip(keys, outputs, strict=True)}
