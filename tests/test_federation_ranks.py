"""A party as a process group (`lvfl party --devices N`, `lvfl launch` with `trainer.devices: N`): rank r of every
party pairs with rank r of the others, each at its own address, and gradients are reduced inside each party only; the
run ends bit-identical, party by party, to the simulation's DDP run of the same config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml
from federation_parity import assert_parity
from helpers import lvfl
from lightning.pytorch import Trainer

from lvfl.commands.party import config_fingerprint, devices_args, process_group_rank
from lvfl.federation import FederationError
from lvfl.federation.federation_file import load_federation, write_federation
from lvfl.federation.inbox import _differences
from lvfl.federation.pki import write_test_pki

NAMES = ["party0", "party1"]
#: the bank and the retailer (PartyTables: every rank pair runs the PSI, and all of them draw the same split)
BANK = ["--config", "examples/bank_retailer/config.yaml", "--trainer.max_epochs=2", "--trainer.accelerator=cpu"]
TWO_RANKS = ["--trainer.strategy=ddp", "--trainer.devices=2"]


def federation_with(tmp_path, addresses: dict) -> object:
    write_test_pki(tmp_path, NAMES, ca_key=None)
    return write_federation(tmp_path / "federation.yaml", NAMES, addresses=addresses)


def test_a_party_lists_an_address_per_rank_and_each_rank_sees_its_own(tmp_path):
    federation = federation_with(tmp_path, {"party0": ["a:1", "a:2"], "party1": ["b:1", "b:2"]})
    assert federation.parties["party0"].addresses == ("a:1", "a:2")
    for rank in (0, 1):
        view = federation.for_rank(rank, 2)
        assert [p.address for p in view.parties.values()] == [f"a:{rank + 1}", f"b:{rank + 1}"]
        assert [p.certificate for p in view.parties.values()] == [p.certificate for p in federation.parties.values()]
    assert federation_with(tmp_path, {}).for_rank(0, 1).parties["party0"].ranks == ()


def test_ranks_that_do_not_match_the_federation_file_are_refused_by_party(tmp_path):
    single = federation_with(tmp_path, {"party0": "a:1", "party1": "b:1"})
    with pytest.raises(FederationError, match=r"party 'party0' lists 1 address\(es\), but the parties run 2 rank"):
        single.for_rank(0, 2)
    uneven = federation_with(tmp_path, {"party0": ["a:1", "a:2"], "party1": "b:1"})
    with pytest.raises(FederationError, match=r"party 'party1' lists 1 address\(es\), but the parties run 2 rank"):
        uneven.for_rank(1, 2)
    with pytest.raises(FederationError, match=r"party 'party0' lists 2 address\(es\), but the parties run 1 rank"):
        uneven.for_rank(0, 1)


@pytest.mark.parametrize(
    ("addresses", "message"),
    [
        (
            {"party0": ["a:1", "a:1"]},
            r"parties 'party0' \(rank 0\) and 'party0' \(rank 1\) have the same address 'a:1'",
        ),
        (
            {"party0": ["a:1", "b:1"], "party1": "b:1"},
            r"parties 'party0' \(rank 1\) and 'party1' have the same address",
        ),
        ({"party0": []}, r"party 'party0' address must be 'host:port' or a list of them, one per rank, got \[\]"),
        ({"party0": ["a:1", "a"]}, r"party 'party0' address \(rank 1\) 'a' is not 'host:port'"),
    ],
)
def test_a_bad_rank_address_is_refused_naming_party_and_rank(tmp_path, addresses, message):
    write_test_pki(tmp_path, NAMES, ca_key=None)
    document = {
        "ca": "ca.pem",
        "parties": {
            n: {"address": addresses.get(n, f"z:{9 + k}"), "certificate": f"{n}.pem"} for k, n in enumerate(NAMES)
        },
    }
    (tmp_path / "federation.yaml").write_text(yaml.safe_dump(document))
    with pytest.raises(FederationError, match=message):
        load_federation(tmp_path / "federation.yaml")


def test_a_greeting_from_another_rank_names_both_ranks():
    config = {"model": {"class_path": "lvfl.protocols.EASTER"}, "seed_everything": 0}
    ours, theirs = config_fingerprint(config, 0, 2), config_fingerprint(config, 1, 2)
    assert ours.endswith(",rank=0of2")
    assert config_fingerprint(config).endswith(",rank=0of1")  # a party of one process says so too
    assert _differences(theirs, ours) == "the rank section of the config differs (rank 1of2 vs 0of2)"
    other = config_fingerprint({**config, "seed_everything": 1}, 0, 2)
    assert _differences(other, ours) == "the seed section of the config differs"


@pytest.mark.slow
def test_devices_without_an_address_per_rank_is_refused_in_one_line(tmp_path):
    made = lvfl("pki", "--parties", *NAMES, "--out", str(tmp_path / "pki"))
    assert made.returncode == 0, made.stderr
    party = lvfl(
        "party", "--party", "party0", "--federation", str(tmp_path / "pki" / "federation.yaml"), "--devices", "2",
        "--timeout", "10", *BANK, f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
    )  # fmt: skip
    assert party.returncode == 2, party.stdout + party.stderr
    errors = [line for line in party.stderr.splitlines() if line.startswith("lvfl: error:")]
    assert len(errors) == 1
    assert "lists 1 address(es), but the parties run 2 rank(s) each (--devices)" in errors[0]


#: DH masking's pairwise masks, drawn per rank pair (4 parties: DH masking needs two passive ones)
WINE_DH = ["--config", "configs/easter/wine.yaml", "--trainer.max_epochs=2", "--trainer.accelerator=cpu"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "names"), [(BANK, NAMES), (WINE_DH, [f"party{k}" for k in range(4)])], ids=["bank-retailer", "wine-dh"]
)
def test_parties_of_two_ranks_each_end_bit_identical_to_the_simulated_ddp_run(tmp_path, config, names):
    fit = lvfl("fit", *config, *TWO_RANKS, f"--trainer.logger.init_args.save_dir={tmp_path / 'fit'}")
    assert fit.returncode == 0, fit.stderr[-3000:]
    launch = lvfl(
        "launch", "--timeout", "60", *config, *TWO_RANKS, f"--trainer.logger.init_args.save_dir={tmp_path / 'launch'}"
    )
    output = launch.stdout + launch.stderr
    assert launch.returncode == 0, output[-4000:]
    parties = {name: tmp_path / "launch" / name for name in names}
    assert_parity(tmp_path / "fit", parties)  # each party's own tensors equal; the ledgers' union is the fit's
    assert_parity(tmp_path / "fit", parties, which="best")
    assert "summed over 2 ranks" in output  # the active party's meter: its two ranks' messages
    assert output.count("lvfl party: set-up took") == 1  # reported once per party (rank 0), not per rank
    passive = (tmp_path / "launch" / "party1.log").read_text()
    assert "summed over 2 ranks" in passive
    assert "Starting with 2 processes" in passive


def test_a_process_group_is_started_by_lightnings_ddp_launcher_and_refuses_what_it_cannot_pair():
    plain = SimpleNamespace(aggregation=SimpleNamespace(coordinator=None))
    assert process_group_rank(Trainer(accelerator="cpu", devices=1, logger=False), plain) == (0, 1)
    ddp = Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)
    assert process_group_rank(ddp, plain) == (0, 2)
    spawn = Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False)
    with pytest.raises(ValueError, match=r"--devices 2\) with --trainer.strategy=ddp only.*launcher _MultiProcessingL"):
        process_group_rank(spawn, plain)
    paillier = SimpleNamespace(aggregation=SimpleNamespace(coordinator="coordinator"))
    with pytest.raises(ValueError, match=r"coordinator \(the HE backend's key holder\) holds no model .* --devices 1"):
        process_group_rank(ddp, paillier)
    with pytest.raises(ValueError, match=r"--listen 127.0.0.1:5000: a party of 2 ranks listens at each rank's address"):
        process_group_rank(ddp, plain, "127.0.0.1:5000")


def test_devices_stands_for_the_trainer_options_and_refuses_zero():
    assert devices_args(None, []) == []
    assert devices_args(1, []) == ["--trainer.devices=1"]
    assert devices_args(2, []) == ["--trainer.devices=2", "--trainer.strategy=ddp"]
    assert devices_args(2, ["--trainer.strategy=ddp_find_unused_parameters_true"]) == ["--trainer.devices=2"]
    with pytest.raises(ValueError, match="--devices must be at least 1, got 0"):
        devices_args(0, [])
