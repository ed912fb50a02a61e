"""Measurement helpers for scripts/bench_index.py: memory, index size, search timing, recall.

``PeakRss`` reports the peak RSS increase inside a ``with`` block (the kernel's high-water mark,
or a sampling thread where that cannot be reset), ``release_free_memory`` hands freed heap back to
the OS between builds, ``serialised_bytes`` is the RAM figure (serialised index size),
``time_search`` gives QPS at one batch size and ``recall_at_k`` scores results against the truth.
"""
from __future__ import annotations

import ctypes
import gc
import threading
import time
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np

from scripts.bench_index_data import K


def proc_status_kb(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def release_free_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc ``malloc_trim``)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakRss:
    """Peak RSS increase (MB) inside a ``with`` block. Resets the kernel's high-water mark
    (``/proc/self/clear_refs``) and reads ``VmHWM`` at the end; where that is not allowed, a
    thread samples ``VmRSS`` every 5 ms instead."""

    def __enter__(self) -> PeakRss:
        release_free_memory()
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
            self.exact = True
        except OSError:
            self.exact = False
        self.start_kb = proc_status_kb("VmRSS")
        self.sampled_kb = self.start_kb
        self._stop = threading.Event()
        if not self.exact:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.sampled_kb = max(self.sampled_kb, proc_status_kb("VmRSS"))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.exact:
            peak_kb = proc_status_kb("VmHWM")
        else:
            self._thread.join()
            peak_kb = max(self.sampled_kb, proc_status_kb("VmRSS"))
        self.mb = max(peak_kb - self.start_kb, 0) / 1024


def serialised_bytes(index: faiss.Index, scratch: Path) -> int:
    """Size of ``faiss.write_index(index)``, written to a scratch file (no second copy in RAM)."""
    faiss.write_index(index, str(scratch))
    size = scratch.stat().st_size
    scratch.unlink()
    return size


def time_search(search: Callable[[np.ndarray], np.ndarray], queries: np.ndarray, batch: int,
                count: int) -> tuple[float, np.ndarray]:
    """QPS over the first ``count`` queries sent ``batch`` at a time, and the rows found."""
    found = []
    started = time.perf_counter()
    for start in range(0, count, batch):
        found.append(search(queries[start:min(start + batch, count)]))
    seconds = time.perf_counter() - started
    return count / seconds, np.concatenate(found)


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int = K) -> float:
    """Mean fraction of each query's true top-k found in its returned top-k."""
    hits = [len(set(f[:k].tolist()) & set(t[:k].tolist())) for f, t in zip(found, truth)]
    return float(np.mean(hits)) / k
