"""Micro-batching for the retrieval server: the searches of concurrent requests, one call.

:class:`MicroBatcher` queues each caller's queries; one worker thread takes everything waiting
and answers it with one ``retriever.search`` call per distinct ``k`` (normally one).
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from envs.types import Hit


@dataclass
class _Job:
    queries: list[str]
    k: int
    done: threading.Event = field(default_factory=threading.Event)
    hits: list[list[Hit]] | None = None
    error: BaseException | None = None


class MicroBatcher:
    """Merges the searches of concurrent callers into one ``retriever.search`` call per batch.

    ``search(queries, k)`` blocks until the worker has answered it. A batch holds whole requests
    (at least one, more while the total stays within ``max_batch`` queries) and makes one
    ``retriever.search`` call per distinct ``k`` among them: normally exactly one, since every
    env asks for its ``top_k``. (Searching once with the largest ``k`` and cutting would save a
    call for mixed ``k``, but FAISS orders tied scores, e.g. of duplicate passages, differently
    for different ``k``, and a remote search must equal the local one.) Each request gets
    exactly its own rows. ``max_batch`` may be changed while the worker runs.
    """

    def __init__(self, retriever, max_batch: int = 256, max_wait_ms: float = 5.0):
        self.retriever = retriever
        self.max_batch = int(max_batch)
        self.max_wait_ms = float(max_wait_ms)
        self.batches = 0  # retriever calls made
        self.batched_queries = 0
        self.largest_batch = 0
        self.failed_batches = 0
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._carry: _Job | None = None  # a job that did not fit the previous batch
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="retrieval-batcher", daemon=True)
        self._thread.start()

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if self._closed:
            raise RuntimeError("the retrieval server is shutting down")
        job = _Job(list(queries), int(k))
        self._queue.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.hits

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=10)

    def stats(self) -> dict:
        return {"batches": self.batches, "batched_queries": self.batched_queries,
                "largest_batch": self.largest_batch, "failed_batches": self.failed_batches,
                "mean_batch": round(self.batched_queries / self.batches, 2) if self.batches else 0.0}

    # -- worker ---------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            jobs, stop = self._take_batch()
            if jobs:
                self._serve(jobs)
            if stop:
                break
        while True:  # fail whatever arrived after close()
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.error = RuntimeError("the retrieval server is shutting down")
                job.done.set()

    def _take_batch(self) -> tuple[list[_Job], bool]:
        """Everything waiting, up to ``max_batch`` queries; waits up to ``max_wait_ms`` for more."""
        first, self._carry = self._carry, None
        if first is None:
            first = self._queue.get()
            if first is None:
                return [], True
        jobs, size = [first], len(first.queries)
        deadline = time.monotonic() + self.max_wait_ms / 1000
        while size < self.max_batch:
            remaining = deadline - time.monotonic()
            try:
                job = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            if size + len(job.queries) > self.max_batch:
                self._carry = job  # first in the next batch
                break
            jobs.append(job)
            size += len(job.queries)
        return jobs, False

    def _serve(self, jobs: list[_Job]) -> None:
        by_k: dict[int, list[_Job]] = {}
        for job in jobs:
            by_k.setdefault(job.k, []).append(job)
        for k, group in by_k.items():
            queries = [q for job in group for q in job.queries]
            try:
                results = self.retriever.search(queries, k)
                if len(results) != len(queries):
                    raise RuntimeError(f"retriever returned {len(results)} result lists for {len(queries)} queries")
                start = 0
                for job in group:
                    job.hits = results[start : start + len(job.queries)]
                    start += len(job.queries)
            except Exception as err:  # every caller of the batch gets the error; the worker lives on
                self.failed_batches += 1
                for job in group:
                    job.error = err
            finally:
                self.batches += 1
                self.batched_queries += len(queries)
                self.largest_batch = max(self.largest_batch, len(queries))
                for job in group:
                    job.done.set()
