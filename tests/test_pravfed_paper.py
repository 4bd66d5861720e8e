"""PraVFed's paper settings (configs/paper/pravfed/): the models of its Sec. V-A2 layer by layer, the settings of
Sec. V-A1/A4, the random 80/20 split, and every piece fitting on small files in the datasets' real formats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import REPO
from test_cli import comparable, quick
from torch import nn

from lvfl.commands.fit import build_cli
from lvfl.datamodules import CINIC10, Adult, FashionMNIST
from lvfl.models import CNN, MLP, LeNet3
from lvfl.models.dropout import PartyDropout
from lvfl.protocols import PraVFed

PIECES = REPO / "configs" / "paper" / "pravfed"
IMAGE_PARTIES = ["mlp", "cnn", "lenet", "hetero_mlp", "hetero_cnn", "hetero_lenet"]


def layers(model: nn.Module, kind: type) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, kind)]


def test_the_mlp_is_dim_in_to_50_dropout_to_classes_and_matches_a_hand_written_one() -> None:
    """Sec. V-A2's MLP: input -> 50 (ReLU, then dropout) -> classes; the embedding is the dropped-out 50 units."""
    torch.manual_seed(0)
    model = MLP((1, 28, 7), embedding_dim=50, num_outputs=10, hidden=[], embedding_dropout=0.5)
    first, last = layers(model, nn.Linear)
    reference = nn.Sequential(nn.Flatten(), nn.Linear(196, 50), nn.ReLU(), nn.Dropout(0.5), nn.Linear(50, 10))
    reference[1].load_state_dict(first.state_dict())
    reference[4].load_state_dict(last.state_dict())
    x = torch.randn(6, 1, 28, 7)
    model.eval()
    reference.eval()
    assert torch.equal(model.head(model.encoder(x)), reference(x))
    model.train()
    torch.manual_seed(1)
    dropped = model.encoder(x)
    assert (dropped == 0).float().mean() > 0.3  # dropout acts on the embedding in training
    assert [type(m) for m in model.encoder] == [nn.Flatten, nn.Linear, nn.ReLU, nn.Dropout]
    assert layers(MLP((4,), 8, 2, hidden=[]), nn.Dropout) == []  # off by default
    with pytest.raises(ValueError, match="embedding_dropout"):
        MLP((4,), 8, 2, embedding_dropout=1.0)


def test_the_cnn_is_two_1x1_convolutions_then_two_dense_layers_and_matches_a_hand_written_one() -> None:
    """Sec. V-A2's CNN: conv 1 -> 64 -> 32 with 1x1 filters, no pooling, dense to 50, then to the classes."""
    model = CNN((1, 28, 7), embedding_dim=50, num_outputs=10, channels=[64, 32], kernel_size=1, pool=False)
    assert layers(model, nn.MaxPool2d) == []
    convs = layers(model, nn.Conv2d)
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [(1, 64, (1, 1)), (64, 32, (1, 1))]
    assert [tuple(m.weight.shape) for m in layers(model, nn.Linear)] == [(50, 32 * 28 * 7), (10, 50)]
    x = torch.randn(3, 1, 28, 7)
    h = torch.relu(convs[1](torch.relu(convs[0](x)))).flatten(1)
    dense = layers(model, nn.Linear)
    assert torch.allclose(model(x), dense[1](torch.relu(dense[0](h))), atol=1e-6)
    assert len(layers(CNN((1, 28, 7), 16, 10), nn.MaxPool2d)) == 2  # pooling stays the default


def test_lenet3_has_three_convolutions_one_pooling_and_three_dense_layers() -> None:
    """Sec. V-A2's LeNet, by its counts; the widths are LeNet-5's (6, 16, 120 channels; 84 units)."""
    model = LeNet3((1, 28, 7), embedding_dim=50, num_outputs=10)
    assert [c.out_channels for c in layers(model, nn.Conv2d)] == [6, 16, 120]
    assert len(layers(model, nn.MaxPool2d)) == 1
    assert [tuple(m.weight.shape) for m in layers(model, nn.Linear)] == [(84, 120 * 14 * 4), (50, 84), (10, 50)]
    assert model.encoder(torch.randn(2, 1, 28, 7)).shape == (2, 50)
    assert LeNet3((1, 8, 1), 50, 10)(torch.randn(2, 1, 8, 1)).shape == (2, 10)  # the thinnest strip still runs


def test_split_random_pools_the_published_files_into_a_stratified_80_20_split(tmp_path: Path) -> None:
    FashionMNIST.write_stand_in(tmp_path, 100)
    published = FashionMNIST(root=str(tmp_path), num_parties=4, batch_size=8, seed=0)
    pooled = FashionMNIST(root=str(tmp_path), num_parties=4, batch_size=8, seed=0, split="random", test_fraction=0.2)
    for dm in (published, pooled):
        dm.setup("fit")
    assert sorted(published.test_set.ids.tolist()) == list(range(100, 200))  # the published test file's rows
    test_ids = pooled.test_set.ids.numpy()
    assert len(test_ids) == 40  # 20% of the 200 pooled images
    assert (test_ids < 100).any()  # drawn from the training file
    assert (test_ids >= 100).any()  # and from the test file
    every = torch.cat([pooled.train_set.labels, pooled.val_set.labels, pooled.test_set.labels]).numpy()
    share = np.bincount(pooled.test_set.labels.numpy(), minlength=10) / np.bincount(every, minlength=10)
    assert np.abs(share - 0.2).max() <= 0.15  # stratified: each class near its 20% (stand-in classes are small)
    with pytest.raises(ValueError, match="split must be 'published'"):
        FashionMNIST(root=str(tmp_path), split="shuffled")
    with pytest.raises(ValueError, match="Adult: split must be"):
        Adult(root=str(tmp_path), split="shuffled")


def test_the_paper_settings_are_those_sec_v_a_states() -> None:
    fmnist = yaml.safe_load((PIECES / "data/fmnist.yaml").read_text())
    adult = yaml.safe_load((PIECES / "data/adult.yaml").read_text())
    for piece in (fmnist, adult):
        init = piece["data"]["init_args"]
        assert (init["num_parties"], init["split"], init["test_fraction"]) == (4, "random", 0.2)
        assert piece["trainer"]["max_epochs"] == 20
    epsilon = {}
    for dataset in ("fmnist", "adult"):
        protocol = yaml.safe_load((PIECES / f"protocol/{dataset}.yaml").read_text())["model"]
        assert protocol["class_path"] == "lvfl.protocols.PraVFed"
        assert protocol["init_args"]["label_mechanism"]["class_path"] == "lvfl.privacy.LaplaceLabels"
        epsilon[dataset] = protocol["init_args"]["label_mechanism"]["init_args"]["epsilon"]
    assert epsilon == {"fmnist": 1.0, "adult": 0.5}  # simple image datasets 1.0, tabular 0.5


def fit_two_batches(tmp_path: Path, data: str, parties: str, extra: list[str]) -> object:
    pieces = [f"data/{data}.yaml", f"protocol/{data}.yaml", f"parties/{parties}.yaml"]
    config = [arg for p in pieces for arg in ("--config", str(PIECES / p))]
    cli = build_cli(
        [*config, *quick(tmp_path, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"),
         f"--data.init_args.root={tmp_path / 'data'}", "--data.init_args.batch_size=8",
         "--data.init_args.val_fraction=0.2", "--model.init_args.local_epochs=1", *extra],
        run=False,
    )  # fmt: skip
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli


@pytest.mark.slow
@pytest.mark.parametrize("parties", IMAGE_PARTIES)
def test_every_fmnist_piece_fits_pravfed_on_generated_files(parties: str, tmp_path: Path) -> None:
    FashionMNIST.write_stand_in(tmp_path / "data", 60)
    cli = fit_two_batches(tmp_path, "fmnist", parties, [])
    model = cli.model
    assert isinstance(model, PraVFed)
    assert model.label_mechanism.epsilon == 1.0
    assert [tuple(s.input_shape) for s in cli.datamodule.party_specs] == [(1, 28, 7)] * 4
    kinds = [type(m).__name__ for m in model.party_models.values()]
    theta = {"mlp": "MLP", "cnn": "CNN", "lenet": "LeNet3"}
    if parties.startswith("hetero_"):
        assert kinds == [theta[parties.removeprefix("hetero_")], "MLP", "CNN", "LeNet3"]
    else:
        assert kinds == [theta[parties]] * 4
    for name, party in model.party_models.items():
        assert party.encoder(torch.zeros(2, 1, 28, 7)).shape == (2, 50), name
    (optimizer,) = cli.trainer.optimizers  # only the active party's steps during the federated epochs
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.95)  # one epoch of the exponential decay
    assert sum(model.passive_weights.values()) == pytest.approx(1.0, abs=1e-6)  # Eq. 9: w_k = acc_k / sum acc


@pytest.mark.slow
def test_the_adult_pieces_fit_pravfed_with_the_tabular_mlp(tmp_path: Path) -> None:
    Adult.write_stand_in(tmp_path / "data", 80)
    cli = fit_two_batches(tmp_path, "adult", "tabular", [])
    assert cli.model.label_mechanism.epsilon == 0.5
    for name, party in cli.model.party_models.items():
        widths = [tuple(m.weight.shape)[0] for m in layers(party, nn.Linear)]
        assert widths == [64, 32, 2], name
        assert [m.p for m in layers(party, PartyDropout)] == [0.5], name  # nn.Dropout on the party's own stream


RUNNABLE = {
    "fmnist": ("fmnist", "mlp"),
    "fmnist_momentum": ("fmnist", "mlp_momentum"),
    "adult": ("adult", "tabular"),
}


def parser_and_parsed(tmp_path: Path, files: list[str]) -> dict:
    parser = build_cli(["--config", str(REPO / "configs/easter/digits.yaml"), *quick(tmp_path)], run=False).parser
    return comparable(parser.parse_args([arg for f in files for arg in ("--config", f)] + quick(tmp_path)))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_each_runnable_paper_config_equals_its_pieces(name: str, tmp_path: Path, monkeypatch) -> None:
    """`configs/paper/pravfed/<name>.yaml` is data + protocol + parties, so a single run and the grids agree."""
    monkeypatch.chdir(REPO)
    data, parties = RUNNABLE[name]
    pieces = [str(PIECES / f"data/{data}.yaml"), str(PIECES / f"protocol/{data}.yaml")]
    whole = parser_and_parsed(tmp_path, [str(PIECES / f"{name}.yaml")])
    composed = parser_and_parsed(tmp_path, [*pieces, str(PIECES / f"parties/{parties}.yaml")])
    assert whole == composed


@pytest.mark.parametrize("piece", ["mlp", "tabular"])
def test_a_momentum_variant_changes_only_the_momentum(piece: str) -> None:
    """The stated variants: the paper's settings (Table II θ1, Table III) with SGD momentum 0.9, nothing else."""
    paper = yaml.safe_load((PIECES / f"parties/{piece}.yaml").read_text())
    variant = yaml.safe_load((PIECES / f"parties/{piece}_momentum.yaml").read_text())
    (entry,) = variant["model"]["init_args"]["parties"]
    assert entry["optimizer"]["init_args"].pop("momentum") == 0.9
    assert variant == paper


def test_the_momentum_variant_steps_as_eq_5_with_a_velocity(tmp_path: Path) -> None:
    """The variant's update is Eq. 5 with a velocity, v <- 0.9 v + g, θ <- θ - η v (two steps, closed form)."""
    cli = build_cli(
        ["--config", str(PIECES / "fmnist_momentum.yaml"), *quick(tmp_path), f"--data.init_args.root={tmp_path}"],
        run=False,
    )
    theta = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    optimizer = cli.model.party_configs[0].make_optimizer([theta])
    g1, g2, eta = torch.tensor([0.5, 1.0]), torch.tensor([-1.0, 0.25]), 0.01
    for g in (g1, g2):
        theta.grad = g.clone()
        optimizer.step()
    v2 = 0.9 * g1 + g2
    assert torch.allclose(theta.detach(), torch.tensor([1.0, -2.0]) - eta * g1 - eta * v2)


def test_split_random_pools_cinic10s_three_published_splits(tmp_path: Path) -> None:
    """CINIC-10 publishes train/, valid/ and test/: `split: random` draws over all three (none is kept silently)."""
    CINIC10.write_stand_in(tmp_path, 40)
    published = CINIC10(root=str(tmp_path), num_parties=4, batch_size=8, seed=0)
    pooled = CINIC10(
        root=str(tmp_path), num_parties=4, batch_size=8, seed=0, split="random", test_fraction=0.2, val_fraction=0.2
    )
    for dm in (published, pooled):
        dm.setup("fit")
    assert sorted(published.test_set.ids.tolist()) == list(range(80, 120))  # test/ after train/ and valid/
    assert sorted(published.val_set.ids.tolist()) == list(range(40, 80))
    test_ids = pooled.test_set.ids.numpy()
    assert len(test_ids) == 24  # 20% of the 120 pooled images
    assert len({int(i) // 40 for i in test_ids}) > 1  # drawn from more than one published split
