"""A column-major feature table whose rows give their memory back once they are copied out.

Why: a party's encoded table is written column by column into one column-major array (`PartyTables.load`), then
cut into its splits' row-major slices (`lvfl.datamodules.scaling.scaled_slices`). Held whole until the last slice is
cut, the table and its slices would take twice the table's memory at once. Backed by an anonymous memory map
instead of the allocator, the table gives back each run of rows, in every column, as soon as those rows are copied
into a slice (`release_rows`), so that the two together stay about one table. Pages never written (another party's
columns in a party's own process) are never backed at all, as with `np.zeros`.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

import numpy as np

__all__ = ["column_major_zeros", "is_releasable", "release_rows"]


def column_major_zeros(rows: int, width: int, dtype: np.dtype | type = np.float32) -> np.ndarray:
    """Zeros of shape (rows, width) in column-major order, on memory that `release_rows` can give back."""
    dtype = np.dtype(dtype)
    count = rows * width
    if not hasattr(mmap, "MAP_PRIVATE"):  # Windows: no private map to give back; the allocator's zeros
        return np.zeros((rows, width), dtype=dtype, order="F")
    # private and anonymous: zero-filled, backed when first written, and a released page is freed (a shared map's
    # pages would live on in the shared memory behind it)
    buffer = mmap.mmap(-1, max(count * dtype.itemsize, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape((rows, width), order="F")


def _map_of(x: np.ndarray) -> mmap.mmap | None:
    """The memory map under `x` when `x` is a whole array from `column_major_zeros`, else None."""
    buffer = x.base
    while isinstance(buffer, np.ndarray):
        buffer = buffer.base
    if isinstance(buffer, memoryview):  # what `np.frombuffer` keeps of the map
        buffer = buffer.obj
    if not isinstance(buffer, mmap.mmap) or x.ndim != 2 or not x.flags.f_contiguous or x.nbytes != len(buffer):
        return None
    return buffer


def is_releasable(x: np.ndarray) -> bool:
    """Whether `release_rows` can give back `x`'s memory (a whole array from `column_major_zeros`)."""
    return _map_of(x) is not None


def release_rows(x: np.ndarray, columns: Sequence[int], start: int, stop: int) -> None:
    """Give back the memory of rows [start, stop) of `x`'s `columns`, which must never be read again.

    Rows [start, stop) of a column lie together in a column-major table: the pages wholly inside them are released
    (reading them afterwards gives zeros); a page shared with the rows around them stays until those are released.
    Nothing happens to an array that `is_releasable` refuses.
    """
    buffer = _map_of(x)
    if buffer is None:
        return
    page, rows, size = mmap.PAGESIZE, x.shape[0], x.itemsize
    for column in columns:
        low = -(-(column * rows + start) * size // page) * page
        high = (column * rows + stop) * size // page * page
        if high > low:
            buffer.madvise(mmap.MADV_DONTNEED, low, high - low)
