"""Data-parallel evaluation: several processes, each on its shard of the questions, one run folder.

    accelerate launch --multi_gpu --num_processes 8 -m inference.evaluate --model.name vllm:/models/qwen ...
    torchrun --nproc-per-node 8 -m inference.evaluate ...          # the same, with torch's launcher
    python -m inference.evaluate --run.shard 3/8 ...                    # one job of an array, by hand
    python -m inference.evaluate --merge --run.output_dir RUN                  # merge and score, if ever needed

Process ``rank`` of ``world`` takes questions ``rank, rank + world, ...`` of the run's question
list and appends its predictions to ``<out>/shards/part-<rank>-of-<world>.jsonl`` (durably, line
by line: :class:`inference.predictions.PredictionWriter`). A question already answered in any
file of the folder (``predictions.jsonl`` or any shard, of any world size) is skipped, so a
killed launch resumes, with the same or another number of processes or a single one. The process
that finishes last finds every question answered and merges, under a file lock: it writes
``predictions.jsonl`` atomically (the question list's order), removes the shards and computes
``metrics.json`` over the question list (``questions.json``), the same numbers a single
process gives.

No process group is created: ranks never talk to each other, only through the folder. Under a
launcher (``RANK``/``WORLD_SIZE`` set by torchrun or ``accelerate launch``) each process is given
its own GPUs (:func:`pin_devices`) and the launcher's rendezvous variables are removed, so that the
LLM engine it builds (vLLM, HF) is an ordinary single-process one.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from envs.atomic import write_json_atomic, write_jsonl_atomic
from envs.question_match import QuestionMismatchError, check_same_questions, record_digests
from inference.predictions import PredictionsFileError, load_predictions

T = TypeVar("T")
SHARD_DIR = "shards"
PLAN_FILE = "questions.json"
# set by torchrun / accelerate launch; removed once read so the engine does not join a process group
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")


@dataclass(frozen=True)
class Shard:
    """Which part of the questions this process runs: ``rank`` of ``world``; ``local_rank`` of
    ``local_world`` processes on this machine (for the GPU each one gets)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"shard {self.rank}/{self.world}: need 0 <= rank < world")

    @property
    def sharded(self) -> bool:
        return self.world > 1

    def take(self, items: Sequence[T]) -> list[T]:
        """This shard's items: every ``world``-th one from ``rank`` (deterministic, balanced)."""
        return list(items[self.rank::self.world])

    def __str__(self) -> str:
        return f"{self.rank}/{self.world}"


def parse_shard(spec: str) -> Shard:
    """``"i/n"`` (0-based ``i``) -> :class:`Shard`; ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec)
    if not match:
        raise ValueError(f"--run.shard expects i/n, e.g. 0/4, not {spec!r}")
    return Shard(int(match[1]), int(match[2]))


def resolve_shard(spec: str | None, environ: MutableMapping[str, str] | None = None) -> Shard:
    """``--run.shard i/n`` when given, else the launcher's ``RANK``/``WORLD_SIZE`` (and ``LOCAL_RANK``/
    ``LOCAL_WORLD_SIZE``), else the one shard of a single process."""
    environ = os.environ if environ is None else environ
    launched = int(environ.get("WORLD_SIZE", "1") or 1)
    if spec:
        if launched > 1:
            raise ValueError(f"--run.shard {spec} under a launcher of {launched} processes: use one or the other")
        return parse_shard(spec)
    if launched <= 1:
        return Shard()
    rank = int(environ.get("RANK", "0"))
    local_world = int(environ.get("LOCAL_WORLD_SIZE", launched))
    return Shard(rank, launched, int(environ.get("LOCAL_RANK", rank % local_world)), local_world)


def _gpu_ids(environ: MutableMapping[str, str]) -> list[str]:
    """The GPUs this machine shows the process: ``CUDA_VISIBLE_DEVICES``, else the driver's list
    (read without initialising CUDA, which must happen after the choice)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    driver = Path("/proc/driver/nvidia/gpus")
    return [str(i) for i in range(len(list(driver.iterdir())))] if driver.is_dir() else []


def pin_devices(shard: Shard, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Give this process its share of the machine's GPUs and drop the launcher's variables.

    With ``G`` visible GPUs and ``L`` processes on the machine, local rank ``r`` gets GPUs
    ``r*G/L .. (r+1)*G/L - 1`` (one each with G = L; G/L for a tensor-parallel engine per process);
    with fewer GPUs than processes they are shared round-robin. Returns the GPUs given (none on CPU).
    Call it before anything initialises CUDA.
    """
    environ = os.environ if environ is None else environ
    if "WORLD_SIZE" not in environ:  # not under a launcher: nothing to undo, the user chose the devices
        return []
    for name in LAUNCHER_VARS:
        environ.pop(name, None)
    if shard.local_world <= 1:
        return []
    gpus = _gpu_ids(environ)
    if not gpus:
        return []
    per = len(gpus) // shard.local_world
    mine = gpus[shard.local_rank * per:(shard.local_rank + 1) * per] if per else [
        gpus[shard.local_rank % len(gpus)]]
    environ["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    return mine


# ----- the run folder ----------------------------------------------------------------------------


def predictions_file(out: Path, shard: Shard) -> Path:
    """Where ``shard`` appends its predictions: ``predictions.jsonl`` for a single process."""
    if not shard.sharded:
        return out / "predictions.jsonl"
    return out / SHARD_DIR / f"part-{shard.rank:03d}-of-{shard.world:03d}.jsonl"


def shard_files(out: Path) -> list[Path]:
    return sorted((out / SHARD_DIR).glob("part-*-of-*.jsonl"))


def run_records(out: Path, own: Path | None = None) -> list[dict]:
    """Every prediction in the folder, ``predictions.jsonl`` first, then the shards; one per id
    (the first seen). Only ``own`` (this process's file) has a torn last line cut off: other
    files may be being written by other processes and are read as they are."""
    records: dict[str, dict] = {}
    for path in [out / "predictions.jsonl", *shard_files(out)]:
        loaded = load_predictions(path, repair=own is not None and path == own)
        try:
            check_same_questions(record_digests(records.values()), record_digests(loaded), f"{out}", f"{path}")
        except QuestionMismatchError as err:
            raise PredictionsFileError(str(err)) from err
        for record in loaded:
            records.setdefault(record["id"], record)
    return list(records.values())


def clear_shards(out: Path) -> None:
    """Remove the shard files and the question plan (``--run.overwrite``; after a merge)."""
    for path in shard_files(out):
        path.unlink(missing_ok=True)
    (out / PLAN_FILE).unlink(missing_ok=True)


def write_plan(out: Path, ids: Sequence[str], digests: Mapping[str, str] | None = None) -> None:
    """Record the run's question list (kept after merging) and the digest of each question's text
    (:func:`envs.question_match.question_digest`), so that ``--merge`` needs nothing but the folder
    and checks that each id still names its question."""
    write_json_atomic({"ids": list(ids), **({"digests": dict(digests)} if digests else {})}, out / PLAN_FILE)


def read_plan(out: Path) -> list[str]:
    path = out / PLAN_FILE
    if not path.exists():
        raise FileNotFoundError(f"{out}: no run to merge ({path} is missing)")
    return list(json.loads(path.read_text())["ids"])


def plan_digests(out: Path) -> dict[str, str]:
    """The question digests of the plan (none for a plan written before they were recorded)."""
    path = out / PLAN_FILE
    return dict(json.loads(path.read_text()).get("digests") or {}) if path.exists() else {}


@contextmanager
def run_lock(out: Path) -> Iterator[None]:
    """An exclusive lock on the run folder (merges never overlap)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def merge_run(out: Path, ids: Sequence[str]) -> tuple[list[dict], list[str]]:
    """(the records of ``ids`` in that order, the ids still without a prediction).

    When none is missing and shard files exist, ``predictions.jsonl`` is rewritten atomically with
    every record of the folder (``ids`` first, in order, then any others) and the shards removed.
    """
    with run_lock(out):
        records = {r["id"]: r for r in run_records(out)}
        try:
            check_same_questions(plan_digests(out), record_digests(records.values()), f"{out / PLAN_FILE}",
                                 f"the predictions in {out}")
        except QuestionMismatchError as err:
            raise PredictionsFileError(str(err)) from err
        missing = [i for i in ids if i not in records]
        if not missing and shard_files(out):
            wanted = set(ids)
            merged = [records[i] for i in ids] + [r for i, r in records.items() if i not in wanted]
            write_jsonl_atomic(merged, out / "predictions.jsonl")
            for path in shard_files(out):
                path.unlink()
        return [records[i] for i in ids if i in records], missing
