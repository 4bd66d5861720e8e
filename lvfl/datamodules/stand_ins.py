"""Small files in the papers' datasets' real formats, filled with random content: "stand-ins".

Where the real data cannot be had (CI, a machine without network), `lvfl bench GRID --stand-ins DIR --max-rows N`
runs a paper grid end to end on these: the readers (torchvision's own for the image sets), the party partition,
the models, the wire and the report run exactly as on the published files; only the accuracies mean nothing. The
tests write the same files to check that each loader reads the real format.

A datamodule that reads files is `FileBacked`: it says how to write its stand-in (`write_stand_in`), which is what
`lvfl bench --stand-ins` calls for each file-backed dataset of a grid.
"""

from __future__ import annotations

import gzip
import pickle
import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = [
    "FileBacked",
    "random_images",
    "write_adult",
    "write_cifar",
    "write_criteo_tsv",
    "write_idx",
    "write_image_folder",
]


class FileBacked(ABC):
    """A datamodule that reads published files under its `root` option, and can write random stand-ins of them."""

    @classmethod
    @abstractmethod
    def write_stand_in(cls, root: str | Path, rows: int, seed: int = 0) -> None:
        """Write random files in the dataset's real format under `root` (the `root` option that then reads them).

        Args:
            root: the folder to write into (created if missing).
            rows: rows (images, lines) per published split; small sets need at least a few per class for the
                stratified validation split (CIFAR-100: 1,000 rows for 100 classes at val_fraction 0.1).
            seed: the random content's seed.
        """


def random_images(n: int, shape: tuple[int, ...], seed: int, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """`n` uint8 images of `shape` and int64 labels covering the classes evenly, in a seeded random order."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % classes).astype(np.int64)
    return rng.integers(0, 256, size=(n, *shape), dtype=np.uint8), labels


def write_idx(folder: Path, prefix: str, x: np.ndarray, y: np.ndarray, gz: bool = True) -> None:
    """MNIST's idx3-ubyte images and idx1-ubyte labels (big-endian header), gzipped as published or extracted."""
    folder.mkdir(parents=True, exist_ok=True)
    img = struct.pack(">IIII", 2051, len(x), x.shape[1], x.shape[2]) + np.ascontiguousarray(x).tobytes()
    lab = struct.pack(">II", 2049, len(y)) + y.astype(np.uint8).tobytes()
    for name, data in ((f"{prefix}-images-idx3-ubyte", img), (f"{prefix}-labels-idx1-ubyte", lab)):
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)


def write_cifar(
    root: Path, hundred: bool, train_rows: int, test_rows: int, seed: int = 0, classes: int | None = None
) -> tuple[np.ndarray, ...]:
    """CIFAR's python pickle batches: `data` (N, 3072) uint8 rows in CHW order and the labels, plus the meta file.

    CIFAR-10 spreads its training rows over `data_batch_1..5` and has `test_batch`; CIFAR-100 has `train` and
    `test` with `fine_labels` (0..99) and `coarse_labels` (0..19). The labels cover `classes` classes (default all
    of the set's; fewer lets a few rows still hold every label twice). Returns (x_train, y_train, x_test, y_test),
    images (N, 3, 32, 32).
    """
    classes = classes or (100 if hundred else 10)
    folder = root / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    folder.mkdir(parents=True, exist_ok=True)
    if hundred:
        train = [("train", train_rows)]
    else:
        sizes = np.diff(np.linspace(0, train_rows, 6).round().astype(int))
        train = [(f"data_batch_{i + 1}", int(n)) for i, n in enumerate(sizes)]
    splits = []
    for names in (train, [("test" if hundred else "test_batch", test_rows)]):
        x, y = random_images(sum(n for _, n in names), (3, 32, 32), seed + len(splits), classes)
        start = 0
        for name, n in names:
            batch = {"data": x[start : start + n].reshape(n, -1), "filenames": [f"{name}_{i}.png" for i in range(n)]}
            labels = y[start : start + n]
            if hundred:
                batch |= {"fine_labels": labels.tolist(), "coarse_labels": (labels // 5).tolist()}
            else:
                batch |= {"labels": labels.tolist(), "batch_label": name}
            with open(folder / name, "wb") as f:
                pickle.dump(batch, f)
            start += n
        splits += [x, y]
    meta = {"fine_label_names": [f"class{i}" for i in range(100)]} if hundred else {"label_names": list("0123456789")}
    with open(folder / ("meta" if hundred else "batches.meta"), "wb") as f:
        pickle.dump(meta, f)
    return tuple(splits)


def write_image_folder(root: Path, sizes: dict[str, int], seed: int = 0, classes: int = 10) -> None:
    """An ImageFolder tree `<root>/<split>/<class>/<i>.png` of random 32x32 RGB PNGs (CINIC-10's layout)."""
    from PIL import Image

    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    names = names if classes == len(names) else [f"class{c}" for c in range(classes)]
    for i, (split, n) in enumerate(sizes.items()):
        x, y = random_images(n, (32, 32, 3), seed + i, classes)
        for c in names:
            (root / split / c).mkdir(parents=True, exist_ok=True)
        for j, (image, label) in enumerate(zip(x, y, strict=True)):
            Image.fromarray(image).save(root / split / names[label] / f"{split}_{j}.png")


def write_criteo_tsv(path: Path, rows: int, seed: int = 0) -> list[list[str]]:
    """Criteo's TSV: label, 13 integers (some empty or negative), 26 hex hashes (some empty, some seen once)."""
    rng = np.random.default_rng(seed)
    common = [[f"{rng.integers(2**32):08x}" for _ in range(6)] for _ in range(26)]
    lines = []
    for i in range(rows):
        fields = [str(int(rng.random() < 0.3))]
        for _ in range(13):
            r = rng.random()
            fields.append("" if r < 0.15 else str(-int(rng.integers(1, 4))) if r < 0.2 else str(rng.integers(0, 500)))
        for j in range(26):
            r = rng.random()
            if r < 0.1:
                fields.append("")
            elif r < 0.2:
                fields.append(f"{(i * 26 + j) * 7919 % 2**32:08x}")  # rare: seen once
            else:
                fields.append(common[j][int(rng.integers(0, 6)) if j % 2 else int(rng.integers(0, 3)) * 2])
        lines.append(fields)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(f) + "\n" for f in lines))
    return lines


#: a few published levels per categorical Adult feature ("?" where the published files have missing values)
ADULT_LEVELS = {
    "workclass": ["Private", "Self-emp-not-inc", "State-gov", "?"],
    "education": ["Bachelors", "HS-grad", "Masters", "11th"],
    "marital-status": ["Never-married", "Married-civ-spouse", "Divorced"],
    "occupation": ["Exec-managerial", "Adm-clerical", "Sales", "?"],
    "relationship": ["Husband", "Wife", "Own-child", "Not-in-family"],
    "race": ["White", "Black", "Asian-Pac-Islander"],
    "sex": ["Male", "Female"],
    "native-country": ["United-States", "Mexico", "India", "?"],
}


def write_adult(
    root: Path, features: Sequence[tuple[str, bool]], train_rows: int, test_rows: int, seed: int = 0
) -> None:
    """UCI Adult's `adult.data` and `adult.test`: ", "-separated, `?` for missing values.

    The test file opens with its `|1x3 Cross validator` line and ends its labels with a period, as published.
    `features` are the file's (name, is categorical) columns in order (`lvfl.datamodules.adult.FEATURES`).
    """
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for name, n in (("adult.data", train_rows), ("adult.test", test_rows)):
        lines = ["|1x3 Cross validator"] if name == "adult.test" else []
        for _ in range(n):
            values = [
                str(rng.choice(ADULT_LEVELS[f])) if categorical else str(int(rng.integers(0, 100)))
                for f, categorical in features
            ]
            label = ">50K" if rng.random() < 0.25 else "<=50K"
            lines.append(", ".join([*values, label + ("." if name == "adult.test" else "")]))
        (root / name).write_text("\n".join(lines) + "\n\n")
