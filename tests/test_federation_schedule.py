"""The message schedule (`lvfl.schedule`, docs/federation.md): who talks to whom is declared once; the simulation
refuses a message on any other link in one line naming the tag, the sender and the receiver; deployed parties greet
along the same links and end in order, each waiting for its peers' word and checking every message it was sent was
taken. Three and four parties with the student, launched, end bit-identical to `lvfl fit`."""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path

import pytest
import torch
from helpers import easter, lvfl, make_trainer
from lightning.pytorch import Callback
from schedule_cases import MATRIX, Case, assert_same_run, party_names, write_new_rows

from lvfl.callbacks import StudentDistillation
from lvfl.datamodules import Digits
from lvfl.federation import FederationError
from lvfl.federation.federation_file import write_federation
from lvfl.federation.pki import write_test_pki
from lvfl.federation.transport import Transport, transports
from lvfl.privacy import DHMasking, Paillier
from lvfl.schedule import Links, Roles, ScheduleError, run_links

# -- the declaration ---------------------------------------------------------------------------------------------


def test_a_star_is_greeted_both_ways_and_a_one_way_link_is_expected():
    links = Links.star("party0", ["party1", "party2"]) | Links([("party2", "party1")])
    assert links.greeted("party0") == ["party1", "party2"]
    assert (links.greeted("party1"), links.expected("party1")) == (["party0"], ["party2"])
    assert (links.greeted("party2"), links.expected("party2")) == (["party0"], [])
    assert links.receivers_from("party2") == ["party0", "party1"]
    assert links.senders_to("party1") == ["party0", "party2"]
    with pytest.raises(ScheduleError, match=r"^party1 sent 'x' to party2 on a link .* declared") as caught:
        links.check("party1", "party2", "x")
    assert "\n" not in str(caught.value)


def test_the_run_declares_the_backends_coordinator_and_the_students_producer():
    roles = Roles("party0", ("party1", "party2", "party3"), coordinator="coordinator")
    module = easter(4, aggregation=Paillier(key_size=2048))
    links = run_links(roles, module, [StudentDistillation()])
    assert links.greeted("coordinator") == ["party0"]
    assert links.expected("party1") == ["coordinator", "party2", "party3"]  # the producer: the first passive party
    assert links.expected("party2") == ["coordinator"]
    assert not links.allows("party1", "coordinator")  # a passive party never writes to the key holder
    producer = run_links(roles, module, [StudentDistillation(producer="party3")])
    assert producer.expected("party3") == ["coordinator", "party1", "party2"]


# -- the simulation checks every message against it --------------------------------------------------------------


class Stray(Callback):
    """Sends one message between two passive parties at the end of the first epoch: a link nobody declared."""

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        pl_module.wire.send("party2", "party1", torch.zeros(3), tag="stray")


def fit_three(tmp_path: Path, *callbacks: Callback) -> None:
    torch.manual_seed(0)
    model = easter(3, aggregation=DHMasking())
    trainer = make_trainer(tmp_path, limit_train_batches=2, limit_val_batches=1, callbacks=list(callbacks))
    trainer.fit(model, datamodule=Digits(num_parties=3, batch_size=32, overlap=0.5))


def test_a_message_on_a_link_nobody_declared_fails_a_simulated_run_in_one_line(tmp_path):
    with pytest.raises(ScheduleError) as caught:
        fit_three(tmp_path, Stray())
    message = str(caught.value)
    assert message.startswith("party2 sent 'stray' to party1 on a link"), message
    assert "\n" not in message


def test_the_student_runs_on_its_declared_links_and_fails_without_them(tmp_path, monkeypatch):
    """The counterfactual of the bug three deployed parties hit: the student's producer receives the other passive
    parties' predictions; without that declaration the simulation fails on the very message a peer refused."""
    student = StudentDistillation(epochs=1)
    fit_three(tmp_path / "declared", student)
    assert student.metrics  # fitted, on the declared links
    monkeypatch.setattr(StudentDistillation, "links", lambda self, roles: Links())
    with pytest.raises(ScheduleError, match=r"^party2 sent 'teacher/predictions' to party1 on a link"):
        fit_three(tmp_path / "undeclared", StudentDistillation(epochs=1))


# -- the orderly end of a deployed run ---------------------------------------------------------------------------


@pytest.fixture
def pair(tmp_path: Path):
    names = ["party0", "party1"]
    write_test_pki(tmp_path, names)
    federation = write_federation(tmp_path / "federation.yaml", names)
    with transports(*(Transport(name, federation, run_id="end", timeout=60) for name in names)) as made:
        yield made


def both(a_body, b_body) -> list:
    """Run the two parties' ends at once, each in a thread (as two processes would); their results, or the errors
    they raised, in order."""
    out: list = [None, None]

    def run(index, body):
        try:
            out[index] = body()
        except Exception as err:  # noqa: BLE001 - returned to the test
            out[index] = err

    threads = [threading.Thread(target=run, args=item) for item in enumerate((a_body, b_body))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads)
    return out


def greet(a: Transport, b: Transport) -> None:
    both(lambda: a.hello(["party1"]), lambda: b.hello(["party0"]))


def test_parties_end_in_order_once_each_took_every_message(pair):
    a, b = pair
    greet(a, b)
    a.send("party1", "embeddings", 0, torch.ones(4), wait=False)  # still queued on a's stream when a says goodbye
    b.send("party0", "gradients", 0, torch.ones(2), wait=False)
    got = both(
        lambda: (a.receive("party1", "gradients", 0), a.goodbye(["party1"], ["party1"]))[1],
        lambda: (b.receive("party0", "embeddings", 0), b.goodbye(["party0"], ["party0"]))[1],
    )
    assert got == [[], []]  # nobody gone, nothing left untaken


def test_a_message_nobody_took_fails_the_end_in_one_line_naming_its_tag(pair):
    a, b = pair
    greet(a, b)
    a.send("party1", "embeddings", 0, torch.ones(4), wait=False)
    a.send("party1", "stray", 0, torch.ones(1), wait=False)  # party1's code never takes it
    results = both(
        lambda: a.goodbye(["party1"], ["party1"]),
        lambda: (b.receive("party0", "embeddings", 0), b.goodbye(["party0"], ["party0"]))[1],
    )
    (error,) = [r for r in results if isinstance(r, BaseException)]
    assert isinstance(error, FederationError)
    assert str(error) == (
        "party0 sent 'stray' to party1 1 times and party1 took 0: 1 never taken (the parties' code disagrees about "
        "the message schedule)"
    )


@pytest.mark.slow
def test_a_peer_gone_after_its_work_is_done_is_no_error(pair):
    a, b = pair
    greet(a, b)
    b.send("party0", "gradients", 0, torch.ones(2), wait=False)
    b.flush()
    b.close()  # gone without a word, after delivering everything
    a.receive("party1", "gradients", 0)
    a.timeout = 2.0  # nothing answers there: found in one round
    assert a.goodbye([], ["party1"]) == ["party1"]


# -- deployed: the matrix's cases as processes over sockets --------------------------------------------------------

#: the cases launched as processes (tests/schedule_cases.py): 3 and 4 parties with the student, an attack, an HE
#: coordinator of each kind, every protocol; the whole matrix runs rehearsed in tests/test_rehearsal.py
DEPLOYED = [case for case in MATRIX if case.name in {
    "EASTER DHMasking 3 parties, student", "EASTER DHMasking 4 parties, student, attack", "EASTER Paillier 3 parties",
    "EASTER CKKS 2 parties, student", "PraVFed DHMasking 3 parties, student", "SplitNN DHMasking 4 parties",
    "CVFL Plain 3 parties, student", "AggVFL Paillier 2 parties, student",
}]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("case", DEPLOYED, ids=[case.name for case in DEPLOYED])
def test_every_deployed_case_ends_as_lvfl_fit(tmp_path, case: Case):
    args = case.args(tmp_path)
    fit = lvfl("fit", *args, f"--trainer.logger.init_args.save_dir={tmp_path / 'fit'}", timeout=900)
    assert fit.returncode == 0, fit.stderr[-3000:]
    launch = lvfl(
        "launch", "--pki", str(tmp_path / "pki"), "--timeout", "120", "--allow_public_seeds", *args,
        f"--trainer.logger.init_args.save_dir={tmp_path / 'launch'}", timeout=1800,
    )  # fmt: skip
    assert launch.returncode == 0, launch.stdout[-2000:] + launch.stderr[-3000:]
    assert_same_run(case, tmp_path / "fit", {k: tmp_path / "launch" / k for k in party_names(case)})
    for name in party_names(case)[1:]:  # the student is the active party's alone
        assert not list((tmp_path / "launch" / name).glob("*/version_*/checkpoints/student.*"))
    assert not re.search(r"never taken|was gone", launch.stdout + launch.stderr)


@pytest.mark.slow
def test_three_parties_launched_predict_new_rows_as_lvfl_predict(tmp_path):
    """`lvfl launch predict` of new customers, each organisation's own file of them, aligned by a PSI of their own:
    the bank writes the file `lvfl predict` writes (the VFL model for those every party holds, the student else)."""
    case = next(case for case in MATRIX if case.name == "EASTER DHMasking 3 parties, student")
    args = case.args(tmp_path)
    new_rows, everyone, bank_only = write_new_rows(tmp_path, case)
    for command, save_dir in ((["fit"], "fit"), (["launch", "--timeout", "120"], "launch")):
        done = lvfl(*command, *args, f"--trainer.logger.init_args.save_dir={tmp_path / save_dir}", timeout=900)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    asked = [*args, "--config", str(new_rows), "--ckpt_path", "best"]
    for command, save_dir in ((["predict"], "fit"), (["launch", "predict", "--timeout", "120"], "launch")):
        done = lvfl(*command, *asked, f"--trainer.logger.init_args.save_dir={tmp_path / save_dir}", "--output",
                    str(tmp_path / f"new_{save_dir}.csv"), timeout=900)  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    written = (tmp_path / "new_fit.csv").read_text()
    assert written.count(",vfl,") == everyone, written
    assert written.count(",student,") == bank_only, written
    assert (tmp_path / "new_launch.csv").read_text() == written


def test_a_launched_party_that_fails_after_training_says_resuming_would_not_help():
    """The resume hint is for a fit stopped part-way; `_resume_hint` words the end of a finished one otherwise."""
    from lvfl.commands.fit import VFLCLI

    class Loop:
        done = True

    class Keeper:
        last_model_path = __file__  # a file that exists stands for the last checkpoint

    class Trainer:
        fit_loop = Loop()
        checkpoint_callbacks = [Keeper()]
        ckpt_path = None

    cli = VFLCLI.__new__(VFLCLI)
    cli.trainer = Trainer()
    assert cli._resume_hint("fit").startswith("training itself had ended, so resuming would not redo it")
    Loop.done = False
    assert cli._resume_hint("fit").startswith("resume every party with --ckpt_path last")
    assert cli._resume_hint("predict") == "run every party's lvfl predict again"


@pytest.mark.slow
def test_lvfl_score_says_it_waits_for_a_server_that_is_starting_and_its_refusal_names_wait(tmp_path):
    """Nothing listens at the port (a server still starting, as far as the client can tell): `lvfl score` says it
    waits, for how long and by which option, and gives up in one line that names `--wait`."""
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{port.getsockname()[1]}"
    port.close()
    (tmp_path / "ids.csv").write_text("id\nCUST-00312\n")
    done = lvfl("score", "--server", address, "--ids", str(tmp_path / "ids.csv"), "--output",
                str(tmp_path / "scored.csv"), "--wait", "3")  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"lvfl score: waiting up to 3 s (--wait) for lvfl serve at {address} to answer" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"lvfl: error: --server {address}: no lvfl serve answered there within 3 s; if it is still starting (a "
        "loaded machine takes longer), give it more with --wait SECONDS"
    )
    assert not (tmp_path / "scored.csv").exists()
