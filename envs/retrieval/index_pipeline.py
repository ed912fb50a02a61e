"""Building an index directory: :func:`build_index` and its steps, the directory's file names,
the atomic write of ``index.faiss`` and the build lock.

:func:`build_index` runs the build top to bottom: under the lock it reuses a complete matching
index, else plans the build (refusing a type that cannot fit the memory budget before anything is
encoded), streams the embeddings (:mod:`envs.retrieval.index_embed`), plans again from the memory
the encoder left, trains and fills the index (:mod:`envs.retrieval.index_build`) and writes
``meta.json`` last. The layout of the directory and the memory model are described in
:mod:`envs.retrieval.index`, which re-exports the public names here; the searcher is
:class:`envs.retrieval.index.DenseIndex`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import faiss
import numpy as np

from envs.atomic import write_json_atomic
from envs.retrieval.embeddings_file import EmbeddingsFile
from envs.retrieval.encoders import Encoder
from envs.retrieval.index_build import train_and_fill
from envs.retrieval.index_embed import EMBEDDINGS_FILE, auto_devices, encoder_identity, read_json
from envs.retrieval.index_embed import embed_corpus as embed_to_file
from envs.retrieval.index_memory import (
    BuildPlan,
    MemoryBudgetError,
    current_rss_bytes,
    format_bytes,
    parse_bytes,
    peak_rss_bytes,
    plan_build,
)
from envs.retrieval.index_types import resolve_index_type

INDEX_FILE = "index.faiss"
META_FILE = "meta.json"
LOCK_FILE = "build.lock"
FORMAT_VERSION = 1


# ----- small file helpers ---------------------------------------------------------------------


def write_index_atomic(index: faiss.Index, path: Path) -> None:
    """``faiss.write_index`` to a temp file, fsync, then rename over ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        faiss.write_index(index, str(tmp))
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def build_lock(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``out_dir`` so two processes never build into it at once
    (the second waits, then finds the index complete). A no-op where ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(out_dir / LOCK_FILE, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ----- build ----------------------------------------------------------------------------------


def embed_corpus(corpus, encoder: Encoder, out_dir: Path, batch_size: int = 256, resume: bool = True,
                 on_batch: Callable[[int, int], None] | None = None, show_progress: bool = True,
                 devices: Sequence[str] | None = None, encoder_options: dict | None = None) -> np.memmap:
    """Stream passage embeddings into ``out_dir/embeddings.npy`` (resumable; one process per
    device with two or more ``devices``); return the file as a read-only memmap. See
    :func:`envs.retrieval.index_embed.embed_corpus`."""
    result = embed_to_file(corpus, encoder, out_dir, batch_size, resume, on_batch, show_progress,
                           devices=devices, encoder_options=encoder_options)
    return np.load(result.path, mmap_mode="r")


def _search_settings(rerank: int | None, nprobe: int | None) -> dict:
    settings = {}
    if rerank is not None:
        if int(rerank) < 0:
            raise ValueError(f"rerank must be >= 0 (0: off), not {rerank}")
        settings["rerank"] = int(rerank)
    if nprobe is not None:
        if int(nprobe) < 1:
            raise ValueError(f"nprobe must be >= 1, not {nprobe}")
        settings["nprobe"] = int(nprobe)
    return settings


def build_index(corpus, encoder: Encoder, out_dir: str | os.PathLike, index_type: str = "Flat",
                batch_size: int = 256, resume: bool = True, train_size: int = 100_000,
                on_batch: Callable[[int, int], None] | None = None, show_progress: bool = True, *,
                memory_budget: int | str | None = None, devices: Sequence[str] | None = None,
                rerank: int | None = None, nprobe: int | None = None, add_chunk: int = 65_536,
                encoder_options: dict | None = None) -> Path:
    """Embed ``corpus`` with ``encoder`` and build a FAISS index in ``out_dir``; return ``out_dir``.

    With ``resume`` (the default) a complete index with the same corpus, encoder and type is
    reused as is (only ``rerank``/``nprobe`` are updated when given), stored embeddings are
    reused for a new index type, and an interrupted embedding pass continues from its last
    batch. ``resume=False`` starts from scratch.

    ``memory_budget`` (bytes or ``"8GB"``/``"512MiB"``): peak RAM to stay within; the training
    sample (at most ``train_size``), the add chunk (at most ``add_chunk``) and the encode batch
    (at most ``batch_size``) are derived from it, and :class:`MemoryBudgetError` is raised
    before encoding when the index cannot fit (:func:`envs.retrieval.index_memory.plan_build`).
    ``devices``: e.g. ``["cuda:0", "cuda:1"]``: one encoder process per device over contiguous
    shards (``["cpu", "cpu"]`` works too); None: every GPU when the encoder runs on CUDA, several
    exist and the corpus has at least 100,000 rows, else this process. ``encoder_options``: extra
    ``load_encoder`` keywords for those processes (e.g. ``trust_remote_code``).
    ``rerank`` (K' candidates re-ranked exactly, 0 off) and ``nprobe`` are stored in meta.json
    as the defaults of :meth:`envs.retrieval.index.DenseIndex.load`.
    """
    if len(corpus) == 0:
        raise ValueError(f"corpus {corpus.path} is empty; nothing to index")
    budget = parse_bytes(memory_budget)
    search_settings = _search_settings(rerank, nprobe)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with build_lock(out_dir):
        n_rows, dim = len(corpus), int(encoder.dim)
        factory = resolve_index_type(index_type, n_rows, dim)
        identity = {**encoder_identity(encoder, corpus), "factory": factory}
        if _reuse_complete_index(out_dir, identity, search_settings, resume):
            return out_dir
        devices = _encode_devices(encoder, n_rows, devices)
        sizes = {"train_size": train_size, "batch_size": batch_size, "add_chunk": add_chunk}
        encode_plan = _plan_encoding(factory, n_rows, dim, budget, sizes, devices)
        with contextlib.suppress(FileNotFoundError):
            (out_dir / META_FILE).unlink()  # the directory is incomplete until meta.json returns
        embedded = embed_to_file(corpus, encoder, out_dir, encode_plan.encode_batch, resume, on_batch, show_progress,
                                 devices=devices, encoder_options=encoder_options)
        embedded_at = time.perf_counter()
        plan = _plan_indexing(encode_plan, budget, sizes, out_dir)
        ntotal, trained_on = _train_fill_and_write(out_dir, factory, plan, show_progress)
        write_json_atomic({
            **identity,
            **_index_record(index_type, corpus, ntotal, trained_on, search_settings),
            **_memory_record(memory_budget, budget, plan, encode_plan),
            "embedded_rows_this_run": embedded.rows_embedded,
            "encode_devices": embedded.devices,
            "encode_workers": embedded.workers,
            "index_seconds": round(time.perf_counter() - embedded_at, 3),
            "build_seconds": round(time.perf_counter() - started, 3),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }, out_dir / META_FILE)
    return out_dir


# ----- build_index's steps, in the order it takes them ----------------------------------------


def _reuse_complete_index(out_dir: Path, identity: dict, search_settings: dict, resume: bool) -> bool:
    """With ``resume``, whether ``out_dir`` holds a complete index of ``identity`` (encoder, corpus,
    factory); its meta.json then takes the search settings given."""
    meta = read_json(out_dir / META_FILE)
    if resume and meta and (out_dir / INDEX_FILE).exists() and all(meta.get(k) == v for k, v in identity.items()):
        if any(meta.get(k) != v for k, v in search_settings.items()):
            write_json_atomic({**meta, **search_settings}, out_dir / META_FILE)
        return True
    return False


def _encode_devices(encoder: Encoder, n_rows: int, devices: Sequence[str] | None) -> list[str] | None:
    """The devices to encode on: those given, else :func:`auto_devices`'s choice (None: this process)."""
    if devices is None:
        devices = auto_devices(encoder, n_rows)
    return list(devices) if devices else None


def _plan_encoding(factory: str, n_rows: int, dim: int, budget: int | None, sizes: dict,
                   devices: list[str] | None) -> BuildPlan:
    """The plan for one encoder process per device (or this one); a type that cannot fit the
    budget is refused here, before anything is encoded."""
    processes = len(devices) if devices and len(devices) > 1 else 1
    try:
        return plan_build(factory, n_rows, dim, budget, **sizes, processes=processes)
    except MemoryBudgetError as err:
        raise MemoryBudgetError(f"{err}. Nothing was encoded.") from None


def _plan_indexing(encode_plan: BuildPlan, budget: int | None, sizes: dict, out_dir: Path) -> BuildPlan:
    """With a budget, the train/add sizes planned again from this process's resident set now (the
    encoder may have grown: caches, a CUDA context), keeping the encode figures; else ``encode_plan``."""
    if budget is None:
        return encode_plan
    try:
        plan = plan_build(encode_plan.factory, encode_plan.rows, encode_plan.dim, budget, **sizes)
    except MemoryBudgetError as err:
        raise MemoryBudgetError(
            f"after encoding, this process holds {format_bytes(current_rss_bytes())} (it held "
            f"{format_bytes(encode_plan.baseline_rss_bytes)} before: the encoder's memory). {err}. The "
            f"embeddings are stored in {out_dir / EMBEDDINGS_FILE}: run the build again (a fresh process "
            "reuses them without encoding) with a larger budget or another type"
        ) from None
    return dataclasses.replace(plan, encode_batch=encode_plan.encode_batch, encode_bytes=encode_plan.encode_bytes)


def _train_fill_and_write(out_dir: Path, factory: str, plan: BuildPlan, show_progress: bool) -> tuple[int, int]:
    """Train and fill ``factory`` from the stored embeddings as ``plan`` says and write ``index.faiss``;
    return (vectors in it, rows it was trained on). The index is freed on return."""
    with EmbeddingsFile(out_dir / EMBEDDINGS_FILE) as source:
        index, trained_on = train_and_fill(source, factory, plan.train_rows, plan.add_chunk, show_progress)
    write_index_atomic(index, out_dir / INDEX_FILE)
    return int(index.ntotal), trained_on


def _index_record(index_type: str, corpus, ntotal: int, trained_on: int, search_settings: dict) -> dict:
    """meta.json's account of the index: format, type, corpus, size, search defaults, files."""
    return {
        "format_version": FORMAT_VERSION,
        "index_type": index_type,
        "corpus_path": str(Path(corpus.path).resolve()),
        "ntotal": ntotal,
        "trained_on_rows": trained_on,
        "rerank": search_settings.get("rerank", 0),
        "nprobe": search_settings.get("nprobe"),
        "faiss_version": faiss.__version__,
        "embeddings_file": EMBEDDINGS_FILE,
        "index_file": INDEX_FILE,
    }


def _memory_record(memory_budget: int | str | None, budget: int | None, plan: BuildPlan,
                   encode_plan: BuildPlan) -> dict:
    """meta.json's memory figures: the budget, this process's peak so far, the plan it built by."""
    return {
        "memory_budget": None if memory_budget is None else str(memory_budget),
        "memory_budget_bytes": budget,
        "peak_rss_bytes": peak_rss_bytes(),
        "estimated_index_bytes": plan.index_bytes,
        "bytes_per_vector": plan.bytes_per_vector,
        "build_plan": plan.as_dict(),
        "rss_before_encoding_bytes": None if budget is None else encode_plan.baseline_rss_bytes,
    }
