"""The embeddings file: a float32 ``(n, dim)`` ``.npy`` array, row i = corpus row i, read and
written with ``pread``/``pwrite`` (:class:`EmbeddingsFile`), and the row sources the index build
reads from (:func:`as_row_source`: that file, a path to one, or any 2-d array).

``pread``/``pwrite`` rather than a memory map: pages of a writable map count in the process's
resident set (a 64 GB file would show up as 64 GB RSS), while pages reached through
``pread``/``pwrite`` live only in the kernel's page cache. Searchers still open the file with
``np.load(..., mmap_mode="r")``. The streamed, resumable writing of it is
:mod:`envs.retrieval.index_embed`.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class EmbeddingsFile:
    """A float32 ``(n, dim)`` ``.npy`` file read and written with ``pread``/``pwrite``.

    ``read(start, stop)`` and ``take(rows)`` return new arrays; ``write(start, rows)`` stores a
    block; ``sync()`` makes written rows durable. Safe for several processes writing disjoint
    rows. Also accepted wherever the build reads rows (see :func:`as_row_source`).
    """

    def __init__(self, path: str | os.PathLike, writable: bool = False):
        self.path = Path(path)
        with open(self.path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
            self.offset = handle.tell()
        if dtype != np.dtype("<f4") or fortran or len(shape) != 2:
            raise ValueError(f"{self.path} holds {dtype} {shape} (fortran={fortran}), not a float32 matrix")
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(np.float32)
        self.row_bytes = 4 * self.shape[1]
        self._fd: int | None = os.open(self.path, os.O_RDWR if writable else os.O_RDONLY)

    def _open_fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        return self._fd

    @classmethod
    def create(cls, path: str | os.PathLike, shape: tuple[int, int]) -> EmbeddingsFile:
        """A new (sparse, zero-filled) file of ``shape``, opened for writing."""
        memmap = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=tuple(shape))
        del memmap  # only the header and the file size were written
        return cls(path, writable=True)

    def __len__(self) -> int:
        return self.shape[0]

    def _check(self, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= self.shape[0]:
            raise IndexError(f"rows [{start}, {stop}) outside {self.path} with {self.shape[0]} rows")

    def write(self, start: int, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[1] != self.shape[1]:
            raise ValueError(f"rows of shape {rows.shape} do not fit {self.path} {self.shape}")
        self._check(start, start + len(rows))
        view, position = rows.data.cast("B"), self.offset + start * self.row_bytes
        while len(view):
            written = os.pwrite(self._open_fd(), view, position)
            view, position = view[written:], position + written

    def _read_into(self, out: np.ndarray, start: int) -> None:
        view, position = out.data.cast("B"), self.offset + start * self.row_bytes
        while len(view):
            got = os.preadv(self._open_fd(), [view], position)
            if got == 0:
                raise EOFError(f"{self.path} is shorter than its header says")
            view, position = view[got:], position + got

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a new float32 array."""
        stop = min(stop, self.shape[0])
        self._check(start, stop)
        out = np.empty((stop - start, self.shape[1]), dtype=np.float32)
        if len(out):
            self._read_into(out, start)
        return out

    def take(self, rows: Sequence[int]) -> np.ndarray:
        """The given rows (sorted ascending: runs of consecutive rows are read in one call)."""
        index = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(index), self.shape[1]), dtype=np.float32)
        if not len(index):
            return out
        if np.any(np.diff(index) <= 0) or index[0] < 0 or index[-1] >= self.shape[0]:
            raise ValueError("take() needs distinct, ascending rows inside the file")
        breaks = np.flatnonzero(np.diff(index) != 1) + 1
        for first, last in zip(np.r_[0, breaks], np.r_[breaks, len(index)]):
            self._read_into(out[first:last], int(index[first]))
        return out

    def sync(self) -> None:
        os.fdatasync(self._open_fd()) if hasattr(os, "fdatasync") else os.fsync(self._open_fd())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> EmbeddingsFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()


def as_row_source(embeddings):
    """An object with ``shape``, ``read(start, stop)`` and ``take(sorted_rows)`` over
    ``embeddings``: an :class:`EmbeddingsFile`, a path to a ``.npy`` file, or any 2-d array."""
    if isinstance(embeddings, (EmbeddingsFile, _ArraySource)):
        return embeddings
    if isinstance(embeddings, (str, os.PathLike)):
        return EmbeddingsFile(embeddings)
    return _ArraySource(embeddings)


class _ArraySource:
    def __init__(self, array):
        self.array, self.shape = array, tuple(array.shape)

    def read(self, start: int, stop: int) -> np.ndarray:
        return np.ascontiguousarray(self.array[start:stop], dtype=np.float32)

    def take(self, rows) -> np.ndarray:
        return np.ascontiguousarray(self.array[np.asarray(rows)], dtype=np.float32)
