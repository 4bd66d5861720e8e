"""`lvfl score`: the active party's batch scoring, written as `lvfl predict` writes its file.

    lvfl score --server 127.0.0.1:8500 --ids ids.csv --output scores.csv          # ask a running lvfl serve
    lvfl score --party party0 --federation federation.yaml --model exported/party0 --table bank.csv \
        --ids ids.csv --output scores.csv                                            # score here, no server

`--ids`: one ID per line, or a .csv's first column below its header (as `lvfl predict --ids`). `--rows`: a table
of new features for the active party's own columns (CSV or Parquet, with its ID column), scored on those features
in place of its table's; both may be given. Each ID gets the prediction and probabilities, the path (`vfl`,
`student`) or a reason, in the order asked (`lvfl.serving.Scorer`, whose passive parties run `lvfl serve`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from lvfl.commands.errors import OneLineParser, debug_requested, reported_errors
from lvfl.commands.predict import read_ids, summary
from lvfl.prediction_rows import BY_THE_STUDENT, NO_STUDENT_IN_PLACE

#: seconds `lvfl score` waits for a server to come up by default: a loaded machine starts `lvfl serve` in about 40
WAIT = 180.0

__all__ = ["main", "score_parser"]


def score_parser() -> argparse.ArgumentParser:
    """`lvfl score`'s options."""
    parser = OneLineParser(
        prog="lvfl score",
        description="Score IDs (and rows of new features) with a served federation; lvfl predict's file out.",
    )
    parser.add_argument("--ids", default=None, help="the IDs to score: one per line, or a .csv's first column")
    parser.add_argument("--rows", type=Path, default=None, help="new features of the active party's own columns "
                        "(CSV or Parquet with its ID column)")  # fmt: skip
    parser.add_argument("--id_column", default=None, help="--rows' ID column (default: the export's, or with "
                        "--server the file's first column)")  # fmt: skip
    parser.add_argument("--output", type=Path, required=True, help="the file to write (.csv or .parquet)")
    parser.add_argument("--deadline", type=float, default=0.0, help="seconds to wait for the passive parties "
                        "(default: the server's --deadline; scoring here, 60: a batch)")  # fmt: skip
    parser.add_argument("--server", default=None, metavar="HOST:PORT", help="a running lvfl serve's --api")
    parser.add_argument("--wait", type=float, default=WAIT, help="seconds to wait for the server (or, without "
                        f"--server, the passive parties) to come up (default {WAIT:g}: a server starting on a "
                        "loaded machine)")  # fmt: skip
    parser.add_argument("--party", default=None, help="without --server: the active party")
    parser.add_argument("--federation", type=Path, default=None, help="without --server: the federation file")
    parser.add_argument("--model", type=Path, default=None, help="without --server: the active party's export folder")
    parser.add_argument("--table", type=Path, default=None, help="without --server: the active party's table")
    parser.add_argument("--key", type=Path, default=None, help="without --server: its private key")
    parser.add_argument("--oblivious", action="store_true", help="without --server: fetch the passive parties' "
                        "contributions by oblivious lookups (they serve with --oblivious); with --server the server's "
                        "mode holds")  # fmt: skip
    return parser


def _say(line: str) -> None:
    print(f"lvfl score: {line}", file=sys.stderr, flush=True)


def _read_rows(path: Path, id_column: str | None) -> tuple[dict[str, list[str]], list[str]]:
    """{ID: values} and the column names of a table of new rows."""
    from lvfl.datamodules.table_files import PartyTable, read_table

    if id_column is None:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            id_column = pq.read_schema(path).names[0]
        else:
            with path.open(newline="", encoding="utf-8-sig") as f:
                id_column = f.readline().split(",")[0].strip().strip('"')
    table = read_table(PartyTable(str(path), id_column), as_text=True)  # values as written
    return dict(zip(table.ids, table.values, strict=True)), table.columns


def fault_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per fault that kept rows from the VFL model: "<fault>: 180 of 180 rows answered by the student".

    The file's reasons say it per row; a batch's caller must not miss it at the end.
    """
    said = {BY_THE_STUDENT: "answered by the student", NO_STUDENT_IN_PLACE: "unanswered (the export has no student)"}
    counts: Counter[tuple[str, str]] = Counter()
    for row in rows:
        for ending in said:
            if row["reason"].endswith(ending):
                counts[row["reason"].removesuffix(ending), ending] += 1
    return [f"{why}: {n} of {len(rows)} rows {said[ending]}" for (why, ending), n in sorted(counts.items())]


def main(argv: list[str]) -> None:
    """`lvfl score` (see the module docstring)."""
    debug, argv = debug_requested(argv)
    with reported_errors(debug):
        own = score_parser().parse_args(argv)
        if not own.wait >= 0:
            raise ValueError(f"--wait must be a number of seconds >= 0, got {own.wait}")
        if own.ids is None and own.rows is None:
            raise ValueError("give --ids FILE and/or --rows FILE: what to score")
        if own.output.suffix.lower() not in (".csv", ".parquet"):
            raise ValueError(f"--output {own.output}: end it in .csv or .parquet (the file's format)")
        local = [name for name in ("party", "federation", "model", "table", "key") if getattr(own, name) is not None]
        if own.server is not None and own.oblivious:
            local.insert(0, "oblivious")
        if own.server is not None and local:
            raise ValueError(f"--server asks a running lvfl serve; --{local[0]} is for scoring here without one")
        if own.server is None and len([n for n in local if n != "key"]) < 4:
            raise ValueError("give --server HOST:PORT (a running lvfl serve's --api), or --party, --federation, "
                             "--model and --table to score here")  # fmt: skip
        ids = read_ids(own.ids) if own.ids is not None else []
        if own.server is not None:
            from lvfl.serving.client import score_remote

            rows, columns = _read_rows(own.rows, own.id_column) if own.rows is not None else ({}, [])
            answers = score_remote(own.server, ids, rows, columns, own.deadline, wait=own.wait, waiting=_say)
        else:
            answers = _score_here(own, ids)
        from lvfl.prediction_rows import write_predictions

        write_predictions(own.output, answers)
        print(f"lvfl score: {len(answers)} rows written to {own.output}: {summary(answers)}", flush=True)
        for line in fault_lines(answers):
            print(f"lvfl score: WARNING: {line}", file=sys.stderr, flush=True)


def _score_here(own: argparse.Namespace, ids: list[str]) -> list[dict[str, Any]]:
    """Score in this process as the active party, asking the passive parties' lvfl serve directly."""
    from lvfl.federation.federation_file import load_federation
    from lvfl.serving import ExportedParty, FeatureSource, Scorer

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    federation = load_federation(own.federation)
    party = ExportedParty(own.model, own.party)
    key = own.key if own.key is not None else federation.key_path(own.party)
    source = FeatureSource(own.table, party)
    rows, columns = _read_rows(own.rows, own.id_column or party.id_column) if own.rows is not None else ({}, None)
    scorer = Scorer(federation, party, source, key, deadline=own.deadline or 60.0, blind_ahead=False,
                    oblivious=own.oblivious, prepare_ahead=0)  # fmt: skip
    try:
        status = scorer.greet(timeout=max(own.wait, 1.0))
        for why in status.values():
            if why:
                print(f"lvfl score: {why}; its customers are answered by the student", file=sys.stderr)
        return scorer.score(ids, rows or None, columns).rows
    finally:
        scorer.close()
