"""Streamed, resumable passage embedding into ``embeddings.npy``: in this process, or in one
process per device over contiguous shards of the corpus.

The file is a float32 ``(n, dim)`` ``.npy`` array; row i is corpus row i. Rows are written with
``pwrite`` and read with ``pread`` (:class:`envs.retrieval.embeddings_file.EmbeddingsFile`, also
importable from here), not through a memory map: pages of a writable map count in the process's
resident set (a 64 GB file would show up as 64 GB RSS), while pages reached through
``pread``/``pwrite`` live only in the kernel's page cache. Searchers still open it with
``np.load(..., mmap_mode="r")``.

Progress is checkpointed after every batch: the rows are written and ``fdatasync``-ed, then a
state file records ``rows_done`` (atomically replaced):

- ``build_state.json``: the whole corpus in this process (``first_row`` 0); once all rows are
  embedded, by either path, it says ``rows_done == n`` and the shard files are removed;
- ``build_state.shard<i>.json``: shard i of k, rows ``[first_row, stop_row)``, written by the
  process that embeds it.

Every state also records the encoder name, its settings, the dimension and the corpus
fingerprint and size; states that do not match the current build are ignored, and whenever the
embeddings file is started afresh every state file is deleted. A resumed range starts after
the longest prefix of it that matching states cover, so a build may be resumed with another
number of devices and still reuse what was done.

Sharded embedding (:func:`embed_corpus` with ``devices=[...]``, two or more) starts one
process per device with the ``spawn`` start method. A child rebuilds the encoder from its name
and settings (:func:`envs.retrieval.encoders.load_encoder`; models are never pickled), reopens the corpus
from its path, checks both against the parent's, and writes its rows straight into the shared
file. The parent shows one progress bar (with ETA) and stops every child if one fails or if it
is interrupted; running the build again resumes each shard.
"""
from __future__ import annotations

import contextlib
import json
import os
import queue as queue_module
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.atomic import write_json_atomic
from envs.retrieval.embeddings_file import EmbeddingsFile, as_row_source  # noqa: F401  (re-exported)

EMBEDDINGS_FILE = "embeddings.npy"
STATE_FILE = "build_state.json"
SHARD_STATE_PATTERN = "build_state.shard{}.json"
AUTO_SHARD_MIN_ROWS = 100_000  # below this, spawning one encoder per GPU costs more than it saves


def read_json(path: Path) -> dict | None:
    """The JSON object in ``path``, or None if the file is missing."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def encoder_identity(encoder, corpus) -> dict:
    """What must match for stored embeddings to be reused."""
    return {
        "encoder": encoder.name,
        "encoder_settings": dict(getattr(encoder, "settings", {}) or {}),
        "dim": int(encoder.dim),
        "corpus_fingerprint": corpus.fingerprint(),
        "corpus_size": len(corpus),
    }


# ----- states ---------------------------------------------------------------------------------


def state_files(out_dir: Path) -> list[Path]:
    """Every progress state file in ``out_dir``."""
    return sorted([out_dir / STATE_FILE, *out_dir.glob(SHARD_STATE_PATTERN.format("*"))])


def _matching_states(out_dir: Path, identity: dict) -> list[dict]:
    states = []
    for path in state_files(out_dir):
        state = read_json(path)
        if state is not None and {k: state.get(k) for k in identity} == identity:
            states.append(state)
    return states


def done_prefix(start: int, stop: int, states: list[dict]) -> int:
    """End of the longest prefix of rows ``[start, stop)`` that ``states`` record as embedded."""
    spans = [(int(s.get("first_row", 0)), int(s.get("rows_done", 0))) for s in states]
    row, moved = start, True
    while moved and row < stop:
        moved = False
        for first, done in spans:
            if first <= row < done:
                row, moved = done, True
    return min(row, stop)


def shard_bounds(n_rows: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous, near-equal row ranges covering ``[0, n_rows)`` (empty ones dropped)."""
    cuts = [n_rows * i // parts for i in range(parts + 1)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


# ----- embedding ------------------------------------------------------------------------------


def _embed_range(corpus, encoder, file: EmbeddingsFile, done: int, stop: int, batch_size: int,
                 state: dict, state_path: Path, report: Callable[[int, int], None]) -> int:
    """Embed rows ``[done, stop)`` batch by batch, checkpointing each; return rows embedded."""
    dim, embedded = file.shape[1], 0
    for first, passages in corpus.iter_batches(batch_size, start_row=done):
        if first >= stop:
            break
        passages = passages[: stop - first]
        vectors = encoder.encode_passages(passages, show_progress=False)
        if vectors.shape != (len(passages), dim):
            raise ValueError(f"encoder returned shape {vectors.shape}, expected {(len(passages), dim)}")
        file.write(first, vectors)
        file.sync()
        done = first + len(passages)
        write_json_atomic({**state, "rows_done": done}, state_path)
        embedded += len(passages)
        report(len(passages), done)
    if done != stop:
        raise RuntimeError(f"embedded rows up to {done} of [{state.get('first_row', 0)}, {stop}); "
                           "the corpus ended early")
    return embedded


@dataclass
class EmbedResult:
    """What one embedding pass did: rows embedded in this run and, when sharded, per worker
    ``{"shard", "device", "first_row", "stop_row", "rows_embedded", "peak_rss_bytes"}``."""

    path: Path
    rows_embedded: int
    devices: list[str] | None = None
    workers: list[dict] = field(default_factory=list)


def _open_or_create(out_dir: Path, shape: tuple[int, int], identity: dict,
                    resume: bool) -> tuple[EmbeddingsFile, list[dict]]:
    """The writable embeddings file and the matching states, or a fresh file and no states."""
    path = out_dir / EMBEDDINGS_FILE
    states = _matching_states(out_dir, identity) if resume else []
    if states and path.exists():
        with contextlib.suppress(ValueError, OSError):
            file = EmbeddingsFile(path, writable=True)
            if file.shape == shape:
                return file, states
            file.close()
    for stale in state_files(out_dir):  # whatever they described is gone with the old file
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    return EmbeddingsFile.create(path, shape), []


def _finish(out_dir: Path, identity: dict, n_rows: int) -> None:
    write_json_atomic({**identity, "first_row": 0, "rows_done": n_rows}, out_dir / STATE_FILE)
    # .tmp: a killed writer's
    leftovers = [*out_dir.glob(SHARD_STATE_PATTERN.format("*")), *out_dir.glob("build_state*.tmp")]
    for path in leftovers:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def embed_corpus(corpus, encoder, out_dir: str | os.PathLike, batch_size: int = 256, resume: bool = True,
                 on_batch: Callable[[int, int], None] | None = None, show_progress: bool = True,
                 devices: Sequence[str] | None = None, encoder_options: dict | None = None) -> EmbedResult:
    """Embed every passage of ``corpus`` into ``out_dir/embeddings.npy``, resuming where a
    matching earlier run stopped (``resume=False`` starts over).

    ``devices``: two or more -> one spawned process per device, each on a contiguous shard,
    each rebuilding the encoder with ``load_encoder(encoder.name, device=..., **options)`` where
    options are the encoder's dtype, max_length and batch size plus ``encoder_options``;
    otherwise the given ``encoder`` runs here. ``on_batch(rows_done, total)`` is called after
    each checkpoint (progress reporting; tests raise from it to simulate a crash).
    """
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    n, dim = len(corpus), int(encoder.dim)
    identity = encoder_identity(encoder, corpus)
    file, states = _open_or_create(out_dir, (n, dim), identity, resume)
    try:
        devices = list(devices or [])
        bounds = shard_bounds(n, len(devices)) if len(devices) > 1 else [(0, n)]
        starts = [done_prefix(a, b, states) for a, b in bounds]
        done_before = sum(s - a for s, (a, _) in zip(starts, bounds))
        bar = tqdm(total=n, initial=done_before, unit="passage", desc="embedding",
                   disable=not show_progress or done_before >= n, smoothing=0.05)
        progress = {"done": done_before}

        def report(rows: int, _row: int) -> None:
            progress["done"] += rows
            bar.update(rows)
            if on_batch is not None:
                on_batch(progress["done"], n)

        try:
            if len(devices) <= 1:
                state = {**identity, "first_row": 0}
                write_json_atomic({**state, "rows_done": starts[0]}, out_dir / STATE_FILE)
                embedded = _embed_range(corpus, encoder, file, starts[0], n, batch_size, state, out_dir / STATE_FILE,
                                        report)
                result = EmbedResult(out_dir / EMBEDDINGS_FILE, embedded)
            else:
                file.close()
                workers = _run_shards(corpus, encoder, out_dir, identity, devices, bounds, starts, batch_size,
                                      encoder_options or {}, report)
                result = EmbedResult(out_dir / EMBEDDINGS_FILE, sum(w["rows_embedded"] for w in workers),
                                     devices=devices, workers=workers)
        finally:
            bar.close()
    finally:
        file.close()
    _finish(out_dir, identity, n)
    return result


# ----- one process per device -----------------------------------------------------------------


def _child_options(encoder, extra: dict) -> dict:
    settings = dict(getattr(encoder, "settings", {}) or {})
    options: dict[str, Any] = {"show_progress": False}
    if settings.get("dtype"):
        options["dtype"] = settings["dtype"]
    if settings.get("max_length"):
        options["max_length"] = settings["max_length"]
    if getattr(encoder, "batch_size", None):
        options["batch_size"] = int(encoder.batch_size)
    options.update(extra)
    return options


def _run_shards(corpus, encoder, out_dir: Path, identity: dict, devices: list[str], bounds, starts,
                batch_size: int, encoder_options: dict, report: Callable[[int, int], None]) -> list[dict]:
    """Spawn one worker per unfinished shard, relay its progress, return per-worker records."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    messages = ctx.Queue()
    options = _child_options(encoder, encoder_options)
    cpu_threads = max(1, (os.cpu_count() or 1) // len(bounds))
    records, processes = [], {}
    for shard, ((first, stop), start) in enumerate(zip(bounds, starts)):
        state = {**identity, "shard": shard, "shards": len(bounds), "device": devices[shard],
                 "first_row": first, "stop_row": stop}
        state_path = out_dir / SHARD_STATE_PATTERN.format(shard)
        write_json_atomic({**state, "rows_done": start}, state_path)
        records.append({"shard": shard, "device": devices[shard], "first_row": first, "stop_row": stop,
                        "rows_embedded": 0, "peak_rss_bytes": None})
        if start >= stop:
            continue
        job = {
            "shard": shard, "device": devices[shard], "corpus_path": str(corpus.path),
            "corpus_format": getattr(corpus, "fmt", "auto"), "identity": identity,
            "encoder_options": options, "embeddings": str(out_dir / EMBEDDINGS_FILE),
            "state": state, "state_path": str(state_path), "start": start, "stop": stop,
            "batch_size": batch_size, "cpu_threads": cpu_threads,
        }
        processes[shard] = ctx.Process(target=shard_worker, args=(job, messages), name=f"embed-shard{shard}")
    try:
        for process in processes.values():
            process.start()
        pending = set(processes)
        while pending:
            try:
                kind, shard, *payload = messages.get(timeout=0.5)
            except queue_module.Empty:
                dead = [s for s in sorted(pending) if processes[s].exitcode not in (None, 0)]
                if not dead:
                    continue
                try:  # its last words may have arrived just now
                    kind, shard, *payload = messages.get(timeout=1.0)
                except queue_module.Empty:
                    code = processes[dead[0]].exitcode
                    assert code is not None  # dead: it has exited
                    how = (f"was killed by signal {-code} (out of memory?)" if code < 0
                           else f"exited with code {code} before reporting (its output is above)")
                    raise RuntimeError(f"embedding shard {dead[0]} on {devices[dead[0]]} {how}; "
                                       "run the build again to resume") from None
            if kind == "rows":
                report(payload[0], payload[1])
            elif kind == "done":
                records[shard].update(rows_embedded=payload[0], peak_rss_bytes=payload[1])
                pending.discard(shard)
            elif kind == "error":
                raise RuntimeError(f"embedding shard {shard} on {devices[shard]} failed; run the build again "
                                   f"to resume. The worker's error:\n{payload[0]}")
        for process in processes.values():
            process.join()
    finally:
        for process in processes.values():  # an error or an interrupt here: stop the others
            if process.is_alive():
                process.terminate()
        for process in processes.values():
            if process.pid is not None:
                process.join()
        messages.close()
        messages.join_thread()
    return records


def shard_worker(job: dict, messages) -> None:
    """Entry point of one spawned embedding process (see the module docstring)."""
    shard = job["shard"]
    try:
        from envs.retrieval.corpus import load_corpus
        from envs.retrieval.encoders import load_encoder
        from envs.retrieval.index_memory import peak_rss_bytes

        device = job["device"]
        corpus = load_corpus(job["corpus_path"], fmt=job["corpus_format"])
        encoder = load_encoder(job["identity"]["encoder"], device=device, **job["encoder_options"])
        if device == "cpu" and "torch" in sys.modules:  # several CPU workers share the cores
            sys.modules["torch"].set_num_threads(job["cpu_threads"])
        found = encoder_identity(encoder, corpus)
        if found != job["identity"]:
            differ = {k: (job["identity"][k], found[k]) for k in found if found[k] != job["identity"][k]}
            raise RuntimeError(f"shard {shard} on {device} rebuilt a different encoder or corpus: {differ}")
        with EmbeddingsFile(job["embeddings"], writable=True) as file:
            rows = _embed_range(corpus, encoder, file, job["start"], job["stop"], job["batch_size"],
                                job["state"], Path(job["state_path"]),
                                lambda k, done: messages.put(("rows", shard, k, done)))
        messages.put(("done", shard, rows, peak_rss_bytes()))
    except BaseException as err:
        messages.put(("error", shard, traceback.format_exc()))
        messages.close()
        messages.join_thread()
        raise SystemExit(1) from err


def auto_devices(encoder, n_rows: int) -> list[str] | None:
    """Every visible GPU when the encoder runs on CUDA, torch sees two or more GPUs and the
    corpus has at least :data:`AUTO_SHARD_MIN_ROWS` rows; otherwise None (this process)."""
    device = getattr(encoder, "device", None)
    model = getattr(encoder, "model", None)
    if device is None and model is not None:
        device = getattr(model, "device", None)
    if device is None or not str(device).startswith("cuda") or n_rows < AUTO_SHARD_MIN_ROWS:
        return None
    torch = sys.modules.get("torch")
    count = torch.cuda.device_count() if torch is not None else 0
    return [f"cuda:{i}" for i in range(count)] if count > 1 else None

