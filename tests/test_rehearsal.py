"""Every party's process, rehearsed in one process in turns (`lvfl.commands.rehearse`, `lvfl launch --rehearse`):
the deployment matrix (tests/schedule_cases.py) ends as `lvfl fit` does, party by party, with every message one party
sent taken by another; a message nobody takes, and a take nobody sends to, fail the run in one line naming the tag."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback
from schedule_cases import MATRIX, Case, assert_same_run, party_names

from lvfl.commands.fit import build_cli
from lvfl.commands.rehearse import rehearse
from lvfl.schedule import ScheduleError
from lvfl.wire import shadow


def fit_in_process(args: list[str], save_dir: Path) -> None:
    build_cli(["fit", *args, f"--trainer.logger.init_args.save_dir={save_dir}"], exit_on_error=False)


#: the case the fast tier rehearses (three parties with the student: the producer hears the other passive party);
#: `make test` rehearses all of them
FAST_CASE = "EASTER DHMasking 3 parties, student"


@pytest.mark.parametrize(
    "case",
    [pytest.param(case, marks=() if case.name == FAST_CASE else pytest.mark.slow) for case in MATRIX],
    ids=[case.name for case in MATRIX],
)
def test_every_case_rehearsed_ends_as_lvfl_fit(tmp_path, case: Case):
    args = case.args(tmp_path)
    fit_in_process(args, tmp_path / "fit")
    rehearse(args, tmp_path / "rehearsed", allow_public_seeds=True)
    assert_same_run(case, tmp_path / "fit", {k: tmp_path / "rehearsed" / k for k in party_names(case)})


class Stray(Callback):
    """party1 sends party0 one message at the end of the epoch that party0's code never takes."""

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if pl_module.wire.holds("party1"):
            pl_module.wire.send("party1", "party0", torch.zeros(2), tag="stray")


class Ghost(Callback):
    """party0 takes a message from party1 at the end of the epoch that party1's code never sends."""

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if pl_module.wire.holds("party0"):
            pl_module.wire.send("party1", "party0", shadow(torch.zeros(2)), tag="ghost")


def with_callback(tmp_path: Path, callback: str) -> list[str]:
    args = Case("EASTER", "Plain", 2).args(tmp_path)
    return [*args, f'--trainer.callbacks+={{"class_path": "test_rehearsal.{callback}"}}']


def test_a_message_nobody_takes_fails_the_run_in_one_line_naming_its_tag(tmp_path):
    with pytest.raises(ScheduleError) as caught:
        rehearse(with_callback(tmp_path, "Stray"), tmp_path / "runs")
    assert str(caught.value).startswith("party1 sent 'stray' to party0 and party0 never took it (1 message left"), (
        caught.value
    )
    assert "\n" not in str(caught.value)


def test_a_take_that_no_party_sends_fails_the_run_in_one_line_naming_its_tag(tmp_path):
    with pytest.raises(ScheduleError) as caught:
        rehearse(with_callback(tmp_path, "Ghost"), tmp_path / "runs")
    assert str(caught.value) == (
        "no party can go on: party0 waits for 'ghost' from party1 (done); no such message was sent"
    )
