"""Batch concurrent ``await backend.agenerate(request)`` calls into ``backend.generate(batch)``.

Each caller puts its request in a queue and waits on a future. One drain task per event loop
takes everything queued (up to ``max_batch_size``), runs the synchronous batch call in a worker
thread, and resolves the futures. While a batch runs, new requests pile up and form the next
one, so many questions advance through the model together.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: methods.llm imports this module
    from methods.llm import GenerationRequest, GenerationResult


class RequestBatcher:
    def __init__(
        self,
        generate_batch: Callable[[list[GenerationRequest]], list[GenerationResult]],
        max_batch_size: int = 32,
        gather_s: float = 0.002,
    ):
        self.generate_batch = generate_batch
        self.max_batch_size = max_batch_size
        self.gather_s = gather_s  # a short pause after the first arrival lets siblings join
        self.batch_sizes: list[int] = []  # sizes of the batches run, for tests and logs
        self._pending: list[tuple[GenerationRequest, asyncio.Future]] = []
        self._drainer: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-batch")

    async def submit(self, request: GenerationRequest) -> GenerationResult:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (e.g. a second asyncio.run): start afresh
            self._loop, self._pending, self._drainer = loop, [], None
        future = loop.create_future()
        self._pending.append((request, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            await asyncio.sleep(self.gather_s)
            batch = self._pending[: self.max_batch_size]
            del self._pending[: len(batch)]
            self.batch_sizes.append(len(batch))
            try:
                results = await loop.run_in_executor(self._executor, self.generate_batch, [r for r, _ in batch])
            except Exception as err:  # the callers get the error; the drain goes on for the rest
                for _, future in batch:
                    if not future.done():
                        future.set_exception(err)
                continue
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)

    def close(self) -> None:
        self._executor.shutdown(wait=False)
