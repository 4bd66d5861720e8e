"""Every paper config (configs/paper/) instantiates and fits 2 batches on small files in the dataset's real format.

The runnable configs (`configs/paper/easter/`, `configs/paper/vfedmh/`) each fit 2 batches; EASTER's equal the
composition of the paper's pieces that the paper grids run (`configs/paper/{data,parties}` with the protocol piece).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from helpers import REPO
from test_cli import comparable, quick

from lvfl.commands.bench.quick import STAND_IN_MARK
from lvfl.commands.fit import build_cli
from lvfl.protocols import VFLModule

PAPER = REPO / "configs" / "paper"
PAPER_CONFIGS = sorted(str(p.relative_to(REPO)) for kind in ("easter", "vfedmh") for p in (PAPER / kind).glob("*.yaml"))
#: the parties piece of each dataset's heterogeneous setting (EASTER Table II)
FAMILY = {"mnist": "small", "fmnist": "small", "cifar10": "resnet", "cifar100": "resnet", "cinic10": "resnet"}
FAMILY["criteo"] = "ctr"
#: stated variants of a paper config (`easter/<dataset>_<what>.yaml`): the dataset and the parties piece they use
# a stated variant: (dataset, parties piece, the options it sets beyond the pieces)
VARIANTS = {
    "fmnist_vfedmh_lr": ("fmnist", "small_vfedmh_lr"),
    "fmnist_whole_gradient": ("fmnist", "small", "--model.init_args.encoder_gradient=whole"),
}


def data_class(config: str | Path) -> type:
    """The datamodule class a config file names."""
    import importlib

    module, _, name = yaml.safe_load(Path(config).read_text())["data"]["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)


def stand_in(root: Path, config: str | Path) -> Path:
    """Stand-in files for the config's dataset under `root`, enough rows for a stratified split; returns `root`."""
    cls = data_class(REPO / config)
    cls.write_stand_in(root, 300 if cls.__name__ == "CIFAR100" else 60)  # CIFAR-100: >= 1 val image per class
    return root


def test_paper_configs_exist() -> None:
    names = {Path(c).name for c in PAPER_CONFIGS if "/easter/" in c}
    assert names == {f"{d}.yaml" for d in FAMILY} | {f"{v}.yaml" for v in VARIANTS}
    assert {Path(c).stem for c in PAPER_CONFIGS if "/vfedmh/" in c} == {
        f"{d}_{f}" for d in ("mnist", "fmnist", "cifar10") for f in ("small", "resnet")
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILY) + sorted(VARIANTS))
def test_easter_paper_configs_equal_the_paper_pieces(name: str, tmp_path: Path, monkeypatch) -> None:
    """`configs/paper/easter/<d>.yaml` is data + EASTER's protocol piece + the heterogeneous parties piece; a stated
    variant `<d>_<what>.yaml` the same with its own parties piece and options."""
    monkeypatch.chdir(REPO)
    dataset, family, *options = VARIANTS.get(name, (name, FAMILY.get(name)))
    with tempfile.TemporaryDirectory() as tmp:
        parser = build_cli(
            ["--config", "configs/easter/digits.yaml", f"--trainer.logger.init_args.save_dir={tmp}"], run=False
        ).parser
    pieces = [f"configs/paper/data/{dataset}.yaml", "configs/protocols/easter/default.yaml"]
    pieces.append(f"configs/paper/parties/{family}.yaml")
    whole = parser.parse_args(["--config", f"configs/paper/easter/{name}.yaml", *quick(tmp_path)])
    composed = parser.parse_args([arg for p in pieces for arg in ("--config", p)] + options + quick(tmp_path))
    assert comparable(whole) == comparable(composed)


@pytest.mark.slow
@pytest.mark.parametrize("config", PAPER_CONFIGS)
def test_paper_config_fits_two_batches_on_generated_files(config: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    root = stand_in(tmp_path / "data", config)
    cinic = data_class(REPO / config).__name__ == "CINIC10"  # its validation split is the published valid/
    args = [
        "--config",
        config,
        f"--data.init_args.root={root}",
        "--data.init_args.batch_size=8",
        "--data.init_args.val_fraction=0.34" if not cinic else "--seed_everything=0",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
    ]
    cli = build_cli(args, run=False)
    assert isinstance(cli.model, VFLModule)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.fit_loop.epoch_loop.batch_progress.total.completed == 2  # global_step counts 4 optimizers
    for name, model in cli.model.party_models.items():
        assert all(torch.isfinite(p).all() for p in model.parameters()), name
    specs = cli.datamodule.party_specs
    assert len(specs) == 4
    width = {(1, 28, 7), (3, 32, 8), (10,), (9,)}  # image strips; Criteo's 39 columns over 4 parties
    assert {tuple(s.input_shape) for s in specs} <= width
    assert not (root / STAND_IN_MARK).exists()  # written by the test, not by lvfl bench


def test_the_vflair_setting_is_two_392_32_10_mlps_summed_and_fits_on_generated_files(tmp_path: Path) -> None:
    """`benchmarks/paper/vflair_attacks.py`'s pieces: Fashion-MNIST over 2 parties (392 pixels each), batch 1024, 30
    epochs; each party an MLP 392 -> 32 -> 10 under Adam at lr 0.01, the active party summing the logits (Agg_VFL
    sum)."""
    pieces = ["configs/paper/data/fmnist_vflair.yaml", "configs/protocols/aggvfl/default.yaml"]
    pieces.append("configs/paper/parties/vflair_mlp2.yaml")
    stand_in(tmp_path / "data", pieces[0])
    config = [arg for p in pieces for arg in ("--config", str(REPO / p))]
    parsed = yaml.safe_load((REPO / pieces[0]).read_text())
    assert (parsed["trainer"]["max_epochs"], parsed["data"]["init_args"]["batch_size"]) == (30, 1024)
    cli = build_cli([*config, *quick(tmp_path, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"),
                     f"--data.init_args.root={tmp_path / 'data'}",
                     "--data.init_args.batch_size=8", "--data.init_args.val_fraction=0.34"], run=False)  # fmt: skip
    assert cli.model.aggregate == "sum"
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert [tuple(s.input_shape) for s in cli.datamodule.party_specs] == [(1, 28, 14)] * 2
    for name, model in cli.model.party_models.items():
        linear = [tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert linear == [(32, 392), (10, 32)], name
    for optimizer in cli.trainer.optimizers:
        assert isinstance(optimizer, torch.optim.Adam)
        assert optimizer.param_groups[0]["lr"] == 0.01
