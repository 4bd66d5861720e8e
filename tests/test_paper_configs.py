"""Every paper config (configs/paper/) instantiates and fits 2 batches on small files in the dataset's real format."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import REPO
from test_vision_datamodules import images, write_cifar, write_idx

from lvfl.cli import build_cli
from lvfl.protocols import VFLModule

PAPER_CONFIGS = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs" / "paper").rglob("*.yaml"))


def write_data(root: Path, config: str) -> Path:
    """Stand-in files for the config's dataset under `root`; returns the `root` option to pass."""
    text = (REPO / config).read_text()
    if "datamodules.Criteo" in text:
        from test_criteo import _write_tsv

        root.mkdir(parents=True)
        _write_tsv(root / "train.txt", 300)
        return root
    if "datamodules.CIFAR10" in text or "datamodules.CIFAR100" in text:
        write_cifar(root, hundred="CIFAR100" in text)
        return root
    if "datamodules.CINIC10" in text:
        from PIL import Image

        for i, split in enumerate(("train", "valid", "test")):
            for c in range(10):
                (root / split / f"class{c}").mkdir(parents=True)
                for j in range(3 if split == "train" else 1):
                    x, _ = images(1, (32, 32, 3), 100 * i + 10 * c + j)
                    Image.fromarray(x[0]).save(root / split / f"class{c}" / f"{j}.png")
        return root
    for cls in ("MNIST", "FashionMNIST"):
        xtr, ytr = images(60, (28, 28), 0)
        xte, yte = images(20, (28, 28), 1)
        write_idx(root / cls / "raw", "train", xtr, ytr, gz=True)
        write_idx(root / cls / "raw", "t10k", xte, yte, gz=True)
    return root


def test_paper_configs_exist() -> None:
    names = {Path(c).name for c in PAPER_CONFIGS}
    assert {"mnist.yaml", "fmnist.yaml", "cifar10.yaml", "cifar100.yaml", "cinic10.yaml", "criteo.yaml"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("config", PAPER_CONFIGS)
def test_paper_config_fits_two_batches_on_generated_files(config: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    root = write_data(tmp_path / "data", config)
    args = [
        "--config",
        config,
        f"--data.init_args.root={root}",
        "--data.init_args.batch_size=8",
        "--data.init_args.val_fraction=0.34" if "CINIC10" not in (REPO / config).read_text() else "--seed_everything=0",
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
