"""The command line: every shipped config instantiates, bad configs fail naming the option, runs resume."""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path

import pytest
import torch
from helpers import REPO, split_ledger

from lvfl.commands.fit import build_cli, main
from lvfl.privacy import DHMasking, Plain
from lvfl.protocols import VFLModule

PIECES = ("data", "parties", "protocols")  # configs/README.md: pieces run only composed, data -> protocol -> parties
# every runnable config (grid files for `lvfl bench` live in configs/bench/ and are tested in test_bench.py)
CONFIGS = sorted(
    str(p.relative_to(REPO))
    for p in (REPO / "configs").rglob("*.yaml")
    if p.relative_to(REPO / "configs").parts[0] not in (*PIECES, "bench", "paper")  # paper: test_paper_configs.py
)
DATASETS = sorted(p.stem for p in (REPO / "configs" / "data").glob("*.yaml"))
PROTOCOLS = sorted(p.name for p in (REPO / "configs" / "protocols").iterdir() if p.is_dir())


def composed(protocol: str, dataset: str) -> list[str]:
    """The `--config` arguments of a protocol on a dataset from pieces, as `lvfl bench` composes them."""
    own = REPO / "configs" / "protocols" / protocol / f"{dataset}.yaml"
    piece = own if own.is_file() else own.with_name("default.yaml")
    configs = [f"configs/data/{dataset}.yaml", str(piece.relative_to(REPO)), f"configs/parties/{dataset}.yaml"]
    return [arg for config in configs for arg in ("--config", config)]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def quick(tmp_path: Path, *extra: str) -> list[str]:
    return [
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
        "--trainer.num_sanity_val_steps=0",
        *extra,
    ]


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS)
def test_every_config_instantiates(config, tmp_path):
    cli = build_cli(["--config", config, *quick(tmp_path)], run=False)
    assert isinstance(cli.model, VFLModule)
    specs, _ = cli.datamodule.describe()
    parties = cli.model.party_configs
    assert len(parties) in (1, len(specs)), f"{config}: {len(parties)} party entries for {len(specs)} parties"


def test_every_dataset_has_both_pieces_and_every_protocol_a_default():
    assert sorted(p.stem for p in (REPO / "configs" / "parties").glob("*.yaml")) == DATASETS
    assert all((REPO / "configs" / "protocols" / p / "default.yaml").is_file() for p in PROTOCOLS)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("dataset", DATASETS)
def test_every_composition_instantiates(protocol, dataset, tmp_path):
    """Every protocol piece on every dataset's data and parties pieces, in the order `lvfl bench` uses."""
    cli = build_cli([*composed(protocol, dataset), *quick(tmp_path)], run=False)
    assert type(cli.model).__name__.lower() == protocol
    specs, _ = cli.datamodule.describe()
    assert len(cli.model.party_configs) in (1, len(specs))


def comparable(config) -> dict:
    """The parsed configuration without what differs by design: the config file names and the log folder name."""
    import importlib

    def canonical(value):  # a class_path by the module that defines the class: `lvfl.protocols.EASTER` is one
        if isinstance(value, dict):
            value = {k: canonical(v) for k, v in value.items()}
            if isinstance(value.get("class_path"), str):
                module, _, name = value["class_path"].rpartition(".")
                cls = getattr(importlib.import_module(module), name)
                value["class_path"] = f"{cls.__module__}.{cls.__qualname__}"
            return value
        return [canonical(v) for v in value] if isinstance(value, list) else value

    config = config.as_dict()
    config.pop("config", None)
    config["trainer"]["logger"]["init_args"].pop("name", None)
    return canonical(config)


WHOLE = [
    (config, protocol, dataset)
    for config in CONFIGS
    for protocol, dataset in [Path(config).with_suffix("").parts[-2:]]
    if protocol in PROTOCOLS and dataset in DATASETS
]


@pytest.fixture(scope="module")
def parser():
    """The `lvfl fit` parser, built once: comparing configurations needs parsing, not instantiating (both sides are
    instantiated by `test_every_config_instantiates` and `test_every_composition_instantiates`)."""
    with tempfile.TemporaryDirectory() as tmp:
        return build_cli(["--config", WHOLE[0][0], f"--trainer.logger.init_args.save_dir={tmp}"], run=False).parser


@pytest.mark.slow
@pytest.mark.parametrize(("config", "protocol", "dataset"), WHOLE)
def test_whole_configs_equal_their_composition(config, protocol, dataset, tmp_path, parser):
    """A runnable `configs/<protocol>/<dataset>.yaml` is its pieces, so the README's runs and the bench's agree."""
    whole = parser.parse_args(["--config", config, *quick(tmp_path)])
    pieces = parser.parse_args([*composed(protocol, dataset), *quick(tmp_path)])
    assert comparable(whole) == comparable(pieces)


@pytest.mark.slow
def test_backend_swaps_from_the_command_line(tmp_path):
    config = "configs/easter/digits.yaml"
    assert isinstance(build_cli(["--config", config, *quick(tmp_path)], run=False).model.aggregation, DHMasking)
    cli = build_cli(["--config", config, "--model.aggregation=lvfl.privacy.Plain", *quick(tmp_path)], run=False)
    assert isinstance(cli.model.aggregation, Plain)


def test_unknown_class_path_names_the_option(tmp_path, capsys):
    with pytest.raises(SystemExit):
        build_cli(
            ["--config", "configs/easter/digits.yaml", "--model.aggregation=lvfl.privacy.NoSuchBackend"], run=False
        )
    err = capsys.readouterr().err
    assert "aggregation" in err
    assert "NoSuchBackend" in err


def test_unknown_model_class_in_a_party_names_it(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "configs/easter/digits.yaml").read_text().replace("lvfl.models.LeNet", "lvfl.models.LeNett"))
    with pytest.raises(SystemExit):
        build_cli(["--config", str(bad)], run=False)
    err = capsys.readouterr().err
    assert "parties" in err
    assert "LeNett" in err


@pytest.mark.slow
def test_more_parties_than_columns_names_both_counts(tmp_path):
    with pytest.raises(ValueError, match=r"num_parties=9 exceeds the 8 feature columns"):
        build_cli(["fit", "--config", "configs/easter/digits.yaml", "--data.init_args.num_parties=9", *quick(tmp_path)])


@pytest.mark.slow
def test_fit_then_resume_restores_everything(tmp_path):
    config = "configs/easter/digits_hetero_optim.yaml"  # DHMasking and an LR scheduler on party1
    first = build_cli(["fit", "--config", config, "--trainer.max_epochs=2", *quick(tmp_path)])
    ckpt_path = tmp_path / "easter_digits_hetero_optim" / "version_0" / "checkpoints" / "last.ckpt"
    assert ckpt_path.exists()
    ckpt = torch.load(ckpt_path, weights_only=False)
    steps_per_epoch = len(first.datamodule.train_dataloader()) + len(first.datamodule.val_dataloader())
    assert ckpt["lvfl"]["mask_step"] == first.model.mask_step == 2 * steps_per_epoch
    assert len(ckpt["optimizer_states"]) == 4
    assert ckpt["optimizer_states"][1]["state"], "party1's momentum buffers are saved"
    assert ckpt["lr_schedulers"][0]["last_epoch"] == 2
    # no key material in the checkpoint: every pair key of the run is absent from its bytes
    blob = ckpt_path.read_bytes()
    for peers in first.model.aggregation._peers.values():
        for key, _ in peers:
            assert key not in blob
    assert b"PRIVATE" not in blob
    pickle.dumps(first.model.aggregation)  # pickling is allowed and drops the keys

    fit_bytes = first.model.wire.total_bytes()
    resumed = build_cli(["fit", "--config", config, "--trainer.max_epochs=3", "--ckpt_path=last", *quick(tmp_path)])
    model = resumed.model
    assert resumed.trainer.current_epoch == 3
    assert model.mask_step == 3 * steps_per_epoch  # the counter continued from the checkpoint
    scheduler = resumed.trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == 3
    assert scheduler.get_last_lr()[0] == pytest.approx(0.1 * 0.97**3)
    one_epoch = model.wire.total_bytes() - fit_bytes
    keys = 3 * 96 + 3 * 2 * 96  # the resumed run agreed on fresh keys (each signed: 32 + 64 bytes)
    split = sum(split_ledger(resumed.datamodule).values())  # and got its rows of each split again
    assert split > 0
    assert one_epoch > keys + split
    # the resumed epoch costs what the first run's epochs cost on average (same batches, same tensors)
    assert one_epoch - keys - split == (fit_bytes - keys - split) // 2


@pytest.mark.slow
def test_tensorboard_logger_works(tmp_path):
    pytest.importorskip("tensorboard", reason="the `tensorboard` extra (installed by `make test`)")
    build_cli(
        [
            "fit",
            "--config",
            "configs/easter/wine.yaml",
            "--trainer.max_epochs=1",
            "--trainer.logger=lightning.pytorch.loggers.TensorBoardLogger",
            f"--trainer.logger.save_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
        ]
    )
    events = list(tmp_path.rglob("events.out.tfevents.*"))
    assert events, "TensorBoard wrote no event file"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "val/acc/party0" in tags
    assert "train/comm/epoch_bytes" in tags


@pytest.mark.slow
def test_csv_logs_hold_comm_and_party_metrics(tmp_path):
    build_cli(["fit", "--config", "configs/easter/breast_cancer.yaml", "--trainer.max_epochs=2", *quick(tmp_path)])
    (metrics_csv,) = list(tmp_path.rglob("metrics.csv"))
    header = metrics_csv.read_text().splitlines()[0].split(",")
    for key in (
        "train/comm/bytes",
        "train/comm/bytes/embeddings",
        "train/comm/bytes/party1_to_party0",
        "train/comm/epoch_bytes",
        "train/comm/epoch_bytes/gradients",
        "train/comm/epoch_bytes/party0_to_party3",
        "train/loss/party3",
        "val/acc/party2",
        "val/acc/mean",
        "val/auroc/party1",
    ):
        assert key in header, key


# ---------------------------------------------------------------------------------------------------- default callbacks
def callback_types(cli) -> list[str]:
    return [type(c).__name__ for c in cli.trainer.callbacks]


@pytest.mark.slow
def test_a_config_with_its_own_callbacks_keeps_lvfls_defaults(tmp_path):
    """configs/easter/breast_cancer_student.yaml lists callbacks: lvfl's checkpoint must survive (no duplicates)."""
    cli = build_cli(["--config", "configs/easter/breast_cancer_student.yaml", *quick(tmp_path)], run=False)
    types = callback_types(cli)
    for name in ("CommunicationMeter", "ExactResume", "ExperimentCheckpoint", "StudentDistillation"):
        assert types.count(name) == 1, (name, types)


@pytest.mark.slow
def test_a_configured_default_callback_replaces_lvfls_own(tmp_path):
    meter = '{"class_path": "lvfl.callbacks.CommunicationMeter", "init_args": {"print_summary": false}}'
    best = '{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"monitor": "val/acc/mean"}}'
    args = ["--config", "configs/easter/wine.yaml", f"--trainer.callbacks=[{meter}, {best}]", *quick(tmp_path)]
    cli = build_cli(args, run=False)
    (configured,) = [c for c in cli.trainer.callbacks if type(c).__name__ == "CommunicationMeter"]
    assert configured.print_summary is False
    (checkpoint,) = cli.trainer.checkpoint_callbacks
    assert checkpoint.monitor == "val/acc/mean", "a configured ModelCheckpoint takes checkpointing over"


@pytest.mark.slow
def test_default_callbacks_can_be_switched_off(tmp_path):
    config = "configs/easter/breast_cancer_student.yaml"
    cli = build_cli(["--config", config, "--default_callbacks=false", *quick(tmp_path)], run=False)
    types = callback_types(cli)
    assert "ExactResume" not in types
    assert "ExperimentCheckpoint" not in types
    no_checkpoints = build_cli(
        ["--config", config, "--trainer.enable_checkpointing=false", *quick(tmp_path)], run=False
    )
    assert not no_checkpoints.trainer.checkpoint_callbacks, "no checkpoint callback where checkpointing is off"
    assert "CommunicationMeter" in callback_types(no_checkpoints)


@pytest.mark.slow
def test_ckpt_path_last_without_a_checkpoint_names_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no last checkpoint in any .*easter_wine/version_\*/checkpoints"):
        build_cli(["test", "--config", "configs/easter/wine.yaml", "--ckpt_path=last", *quick(tmp_path)])
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        build_cli(["fit", "--config", "configs/easter/wine.yaml", "--ckpt_path=last", *quick(tmp_path)])


@pytest.mark.slow
def test_own_callbacks_then_test_last_loads_the_fitted_weights(tmp_path):
    """A config with its own `callbacks:` list still writes last.ckpt, and `test --ckpt_path last` loads it."""
    config = tmp_path / "own_callbacks.yaml"
    text = (REPO / "configs/easter/wine.yaml").read_text()
    own = "trainer:\n  callbacks:\n    - class_path: lvfl.callbacks.CommunicationMeter\n"
    config.write_text(text.replace("trainer:\n", own))
    common = ["--config", str(config), *quick(tmp_path)]
    fitted = build_cli(["fit", *common, "--trainer.max_epochs=1"])
    last = tmp_path / "easter_wine" / "version_0" / "checkpoints" / "last.ckpt"
    assert last.exists()
    tested = build_cli(["test", *common, "--ckpt_path=last"])
    assert Path(tested.trainer.ckpt_path) == last
    for name, value in fitted.model.state_dict().items():
        assert torch.equal(tested.model.state_dict()[name], value), name


@pytest.mark.slow
def test_lvfl_test_last_without_a_checkpoint_exits_naming_the_directory(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["test", "--config", "configs/easter/wine.yaml", "--ckpt_path=last", *quick(tmp_path)])
    assert info.value.code != 0, "testing an untrained model is not a success"
    assert str(tmp_path / "easter_wine" / "version_*" / "checkpoints") in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["easter", "aggvfl", "splitnn", "cvfl"])
def test_homogeneous_configs_take_any_party_count(protocol, tmp_path):
    """One `parties` entry serves every party: `--data.init_args.num_parties=6` needs no other change.

    EASTER from its runnable config (the README's command), the others composed from pieces.
    """
    easter = ["--config", "configs/easter/digits_homo.yaml"]
    configs = easter if protocol == "easter" else composed(protocol, "digits_homo")
    cli = build_cli(
        [
            "fit",
            *configs,
            "--data.init_args.num_parties=6",
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=1",
            *quick(tmp_path),
        ]
    )
    assert cli.model.party_names == [f"party{i}" for i in range(6)]
    assert cli.trainer.global_step > 0


def test_front_door_lists_every_subcommand_and_dispatches_bench(capsys):
    from lvfl.commands.entry import SUBCOMMANDS
    from lvfl.commands.entry import main as lvfl

    lvfl(["--help"])
    out = capsys.readouterr().out
    names = ("fit", "validate", "test", "predict", "bench", "export", "party", "launch", "pki", "serve", "score",
             "attack-score")  # fmt: skip
    assert all(f"  {name} " in out for name in names)
    assert set(SUBCOMMANDS) == set(names)
    with pytest.raises(SystemExit) as bare:
        lvfl([])
    assert bare.value.code == 2
    with pytest.raises(SystemExit) as bench_help:
        lvfl(["bench", "--help"])
    assert bench_help.value.code == 0
    assert "usage: lvfl bench" in capsys.readouterr().out
    with pytest.raises(SystemExit) as export_help:
        lvfl(["export", "--help"])
    assert export_help.value.code == 0
    assert "usage: lvfl export" in capsys.readouterr().out


def test_cli_and_bench_do_not_import_each_other_at_module_level():
    import ast

    modules = [(REPO / "lvfl" / "commands" / "fit.py", "lvfl.commands.bench")]
    modules += [(path, "lvfl.commands.entry") for path in sorted((REPO / "lvfl" / "commands" / "bench").glob("*.py"))]
    for path, other in modules:
        tree = ast.parse(path.read_text())
        imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not any(m == other or m.startswith(other + ".") for m in imported), f"{path} imports {other}"
