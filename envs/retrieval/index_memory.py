"""A build plan that fits a memory budget, and the byte sizes and resident-set readings it uses.

Index types and their resident sizes are in :mod:`envs.retrieval.index_types` (re-exported here).

Memory budget
-------------
:func:`plan_build` turns a budget ``B`` (bytes; ``"8GB"``, ``"512MiB"``, see :func:`parse_bytes`)
into the sizes a build uses, so that its peak resident set stays within ``B`` whatever the
corpus size (only the finished index itself grows with n):

- ``R0`` = the process's resident set when the build starts (interpreter, libraries, encoder
  weights, corpus offsets), ``H`` = headroom = max(64 MiB, B/16) for allocator slack and
  FAISS/Python temporaries, and ``W = B - R0 - H`` is the working budget.
- index while it is filled: ``I = fixed + n * per_vector`` (flat code arrays and inverted lists
  are reserved at their final size before the first add, so they never grow by doubling) plus
  ``4n`` for IVF types (each row's list number, int32, used to reserve the lists exactly) plus
  the growth slack of parts FAISS cannot reserve (HNSW links, fast-scan blocks).
- add chunk ``C = min(add_chunk, (W - I) / (3 * 4d))``: a chunk is read from disk and FAISS
  holds up to two more float copies (pre-transform output, residuals) while adding it.
  **Refused** (before anything is encoded) when ``I`` plus a chunk of min(n, 64) rows does not
  fit ``W``: the message names the estimate and the compressed types that would fit.
- training sample ``T = min(train_size, n, (W - fixed) / (4 * 4d))``: the sample, FAISS's
  k-means subsample, the residuals and the pre-transformed copy; OPQ adds 5 more copies of at
  most 65,536 rows. Refused when ``T`` is below what the type must train on (nlist, 2^nbits).
- encode batch ``P = min(batch_size, W / (16 KiB + 8d))`` per process (passage text, tokens,
  output rows). With k encoder processes each one is assumed to cost another ``R0`` (its own
  encoder copy); a plan that exceeds the budget that way is warned about, not refused, since
  those processes hold the model rather than the build. The encoder's forward pass itself is
  outside the plan: on CUDA it lives in device memory, on CPU its activations scale with the
  encoder batch size (``--encoder-batch-size``).
- after encoding, the train/add sizes are planned again from the resident set at that point
  (encoders grow: caches, a CUDA context); if the index no longer fits, the build stops there
  with the embeddings stored, and a fresh process resumes from them without encoding.

Example: B = 8 GB, R0 = 2 GB, 21M x 768: Flat (64.6 GB) is refused and the message suggests
``opq-ivfpq`` / ``ivfpq`` with ``--rerank``; ``opq-ivfpq`` trains on ~360,000 rows (W = 5.5 GB)
and adds 65,536-row chunks, peaking near R0 + 1.7 GB + 0.6 GB.

Embeddings are written and read with ``pwrite``/``pread`` (not through a memory map), so the
rows a build touches sit in the page cache rather than in the process's resident set.
"""
from __future__ import annotations

import re
import resource
import sys
import warnings
from dataclasses import asdict, dataclass

from envs.retrieval.index_types import (  # noqa: F401  (re-exported)
    INDEX_NAMES,
    LIST_OVERHEAD,
    IndexSize,
    estimate_index_bytes,
    estimate_index_size,
    index_name,
    resolve_index_type,
)

MiB = 1 << 20
HEADROOM_MIN = 64 * MiB
HEADROOM_FRACTION = 16  # headroom = max(HEADROOM_MIN, budget // HEADROOM_FRACTION)
ADD_COPIES = 3  # float copies of an add chunk alive at once
TRAIN_COPIES = 4  # float copies of the training sample alive at once
OPQ_COPIES = 5  # extra copies OPQ training makes of (at most) OPQ_TRAIN_ROWS rows
OPQ_TRAIN_ROWS = 65_536  # faiss.OPQMatrix.max_train_points
ENCODE_BYTES_PER_PASSAGE = 16 << 10  # text, Passage object, formatted string, token ids
MIN_ADD_CHUNK = 64


class MemoryBudgetError(ValueError):
    """The index (or the build's working set) cannot fit the memory budget."""


# ----- sizes and budgets ----------------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(i?)(b?)\s*$", re.IGNORECASE)


def parse_bytes(value: int | float | str | None) -> int | None:
    """Bytes in ``value``: an int, or a string such as ``"8GB"``, ``"512MiB"``, ``"8g"``.

    ``KB/MB/GB/TB`` are powers of 1000, ``KiB/MiB/GiB/TiB`` and bare ``k/m/g/t`` (as in Docker
    and Java) powers of 1024. ``None`` stays ``None``.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"a memory size must be positive, not {value!r}")
        return int(value)
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"cannot read {value!r} as a size; write e.g. 8GB, 512MiB or 1073741824")
    number, prefix, binary, byte = match.groups()
    power = "kmgtp".find(prefix.lower()) + 1 if prefix else 0
    if binary and not prefix:
        raise ValueError(f"cannot read {value!r} as a size")
    base = 1024 if (binary or not byte) else 1000
    size = int(float(number) * base ** power)
    if size <= 0:
        raise ValueError(f"a memory size must be positive, not {value!r}")
    return size


def format_bytes(size: float) -> str:
    """``size`` in decimal units: ``"64.6 GB"``, ``"983.0 kB"``, ``"512 B"``."""
    size = float(size)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError


def current_rss_bytes() -> int:
    """Resident set size of this process now (Linux ``/proc``; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * resource.getpagesize()
    except (OSError, IndexError, ValueError):
        return peak_rss_bytes()


def peak_rss_bytes(children: bool = False) -> int:
    """Peak resident set size of this process over its life so far, in bytes; with ``children``,
    of the largest waited-for child process (``getrusage``).

    On Linux the process's own peak is ``VmHWM`` from ``/proc/self/status``: ``getrusage``'s
    ``ru_maxrss`` survives ``exec``, so a process started by a big parent (e.g. a test runner)
    would report the parent's peak as its own.
    """
    if not children:
        try:
            with open("/proc/self/status") as handle:
                for line in handle:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, IndexError, ValueError):
            pass
    usage = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return int(usage.ru_maxrss) * (1 if sys.platform == "darwin" else 1024)


# ----- build plan -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildPlan:
    """Sizes one build uses; see the module docstring for how a budget sets them."""

    factory: str
    rows: int
    dim: int
    budget_bytes: int | None
    baseline_rss_bytes: int
    headroom_bytes: int
    working_bytes: int | None
    index_bytes: int  # finished index, resident
    bytes_per_vector: float
    fill_bytes: int  # index + fill bookkeeping at the end of the add phase
    train_rows: int
    add_chunk: int
    encode_batch: int
    encode_processes: int
    encode_bytes: int  # estimated encode-phase resident set, all processes

    def as_dict(self) -> dict:
        return asdict(self)


def _train_rows_within(avail: int, row_bytes: int, opq: bool) -> int:
    """Largest T with TRAIN_COPIES*T*row + (OPQ_COPIES*min(T, OPQ_TRAIN_ROWS)*row if opq) <= avail."""
    if avail <= 0:
        return 0
    if not opq:
        return avail // (TRAIN_COPIES * row_bytes)
    capped = OPQ_COPIES * OPQ_TRAIN_ROWS * row_bytes
    if avail >= (TRAIN_COPIES * OPQ_TRAIN_ROWS * row_bytes) + capped:
        return (avail - capped) // (TRAIN_COPIES * row_bytes)
    return avail // ((TRAIN_COPIES + OPQ_COPIES) * row_bytes)


def _suggestions(n_rows: int, dim: int, working: int, baseline: int, headroom: int) -> str:
    """Named compressed types whose fill size fits ``working``, best recall first."""
    fitting = []
    for name, rerank in (("fp16", False), ("sq8", False), ("opq-ivfpq", True), ("ivfpq", True)):
        factory = resolve_index_type(name, n_rows, dim)
        size = estimate_index_size(factory, dim)
        if size.while_filling(n_rows) + ADD_COPIES * min(n_rows, MIN_ADD_CHUNK) * 4 * dim <= working:
            extra = (" with --rerank 100 (exact re-ranking of 100 candidates from embeddings.npy on disk)"
                     if rerank else "")
            fitting.append(f"--index-type {name} ({factory}: ~{format_bytes(size.total(n_rows))}){extra}")
    if fitting:
        return "Choose a compressed type, e.g. " + "; or ".join(fitting[:3])
    smallest = estimate_index_size(resolve_index_type("ivfpq", n_rows, dim), dim).while_filling(n_rows)
    need = smallest + ADD_COPIES * min(n_rows, MIN_ADD_CHUNK) * 4 * dim
    return (f"Even IVF-PQ needs about {format_bytes(need)} with its add chunk; raise the budget to at least "
            f"{format_bytes(budget_for(need, baseline))}")


def budget_for(working: int, baseline: int) -> int:
    """The smallest budget that leaves ``working`` bytes after ``baseline`` and the headroom."""
    return int(max(baseline + HEADROOM_MIN + working,
                   -(-(baseline + working) * HEADROOM_FRACTION // (HEADROOM_FRACTION - 1))))


def plan_build(factory: str, n_rows: int, dim: int, budget: int | str | None = None, train_size: int = 100_000,
               batch_size: int = 256, add_chunk: int = 65_536, processes: int = 1,
               baseline_rss: int | None = None) -> BuildPlan:
    """Training sample, add chunk and encode batch for building ``factory`` over ``n_rows`` x
    ``dim`` within ``budget`` (None: no limit, the requested sizes as given).

    Raises :class:`MemoryBudgetError` when the index cannot be filled, or the type cannot be
    trained, within the budget. ``baseline_rss`` defaults to the current resident set.
    """
    budget = parse_bytes(budget)
    n_rows, dim, processes = int(n_rows), int(dim), max(1, int(processes))
    row_bytes = 4 * dim
    size = estimate_index_size(factory, dim)
    index_bytes, fill_bytes = size.total(n_rows), size.while_filling(n_rows)
    baseline = current_rss_bytes() if baseline_rss is None else int(baseline_rss)
    passage_bytes = ENCODE_BYTES_PER_PASSAGE + 2 * row_bytes
    if budget is None:
        train_rows = min(train_size, n_rows) if size.min_train_rows else 0
        encode_bytes = baseline * (processes + 1 if processes > 1 else 1) + processes * batch_size * passage_bytes
        return BuildPlan(factory, n_rows, dim, None, baseline, 0, None, index_bytes, size.per_vector, fill_bytes,
                         train_rows, max(1, min(add_chunk, n_rows)), batch_size, processes, encode_bytes)

    headroom = max(HEADROOM_MIN, budget // HEADROOM_FRACTION)
    working = budget - baseline - headroom
    what = f"{factory} over {n_rows:,} x {dim} vectors"
    if working <= 0:
        raise MemoryBudgetError(
            f"the memory budget {format_bytes(budget)} is below what this process already holds "
            f"({format_bytes(baseline)} resident) plus {format_bytes(headroom)} headroom. "
            f"Raise --memory-budget to at least "
            f"{format_bytes(budget_for(fill_bytes + ADD_COPIES * min(n_rows, MIN_ADD_CHUNK) * row_bytes, baseline))} "
            f"for {what}"
        )
    min_chunk = min(n_rows, MIN_ADD_CHUNK)
    if fill_bytes + ADD_COPIES * min_chunk * row_bytes > working:
        raise MemoryBudgetError(
            f"index {what} needs about {format_bytes(index_bytes)} in RAM "
            f"({size.per_vector:,.0f} bytes/vector + {format_bytes(size.fixed)}; about {format_bytes(fill_bytes)} "
            f"while it is filled), but the memory budget {format_bytes(budget)} leaves "
            f"{format_bytes(working)} for it after this process's {format_bytes(baseline)} and "
            f"{format_bytes(headroom)} headroom. "
            + _suggestions(n_rows, dim, working, baseline, headroom)
        )
    chunk = int(max(min_chunk, min(add_chunk, n_rows, (working - fill_bytes) // (ADD_COPIES * row_bytes))))

    train_rows = 0
    if size.min_train_rows:
        train_rows = int(min(train_size, n_rows, _train_rows_within(working - size.fixed, row_bytes, size.opq)))
        if train_rows < size.min_train_rows:
            raise MemoryBudgetError(
                f"training {factory} needs at least {size.min_train_rows:,} sample rows, but the memory budget "
                f"{format_bytes(budget)} leaves room for {train_rows:,} ({format_bytes(working)} working memory, "
                f"{TRAIN_COPIES} float copies of each {row_bytes}-byte row). "
                "Raise --memory-budget or choose a type with fewer lists"
            )

    extra_processes = processes if processes > 1 else 0  # each encoder process holds its own model
    encode_working = (working - extra_processes * baseline) // processes
    encode_batch = int(max(1, min(batch_size, encode_working // passage_bytes))) if encode_working > 0 else 1
    encode_bytes = baseline * (1 + extra_processes) + processes * encode_batch * passage_bytes
    if encode_bytes + headroom > budget:
        warnings.warn(
            f"{processes} encoder processes are expected to hold about {format_bytes(encode_bytes)} "
            f"(each its own encoder, ~{format_bytes(baseline)}), more than the memory budget "
            f"{format_bytes(budget)}; use fewer devices or a larger budget", stacklevel=2,
        )
    return BuildPlan(factory, n_rows, dim, budget, baseline, headroom, working, index_bytes, size.per_vector,
                     fill_bytes, train_rows, chunk, encode_batch, processes, encode_bytes)
