"""Batch env steps of concurrently running questions into one retrieval call.

Each question's coroutine awaits :meth:`EnvStepBatcher.step`; a drain task prepares all queued
actions, sends every search query of that round to the retriever in ONE call, and completes
the steps (the same split :class:`envs.vector_env.SearchVectorEnv` uses).
"""
from __future__ import annotations

import asyncio
from collections import defaultdict

from envs.search_env import SearchEnv


class EnvStepBatcher:
    def __init__(self, retriever, gather_s: float = 0.0):
        self.retriever = retriever
        self.gather_s = gather_s
        self.retrieval_calls = 0
        self._pending: list[tuple[SearchEnv, str, asyncio.Future]] = []
        self._drainer: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def step(self, env: SearchEnv, action: str):
        """``env.step(action)`` with its retrieval batched with the other questions' steps."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._pending, self._drainer = loop, [], None
        future = loop.create_future()
        self._pending.append((env, action, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(self.gather_s)  # let every runnable question queue its step
            batch, self._pending = self._pending, []
            prepared = []
            for env, action, future in batch:
                try:
                    prepared.append(env.prepare(action))
                except Exception as err:  # e.g. stepping a finished episode: that caller's error
                    prepared.append(None)
                    future.set_exception(err)
            hits = self._retrieve(batch, prepared)
            for i, ((env, _, future), pending) in enumerate(zip(batch, prepared)):
                if pending is None or future.done():
                    continue
                try:
                    future.set_result(env.complete(pending, hits.get(i)))
                except Exception as err:
                    future.set_exception(err)

    def _retrieve(self, batch, prepared) -> dict[int, list]:
        """One retriever call per distinct ``top_k`` among this round's searches (normally one)."""
        by_k: dict[int, list[int]] = defaultdict(list)
        for i, ((env, _, _), pending) in enumerate(zip(batch, prepared)):
            if pending is not None and pending.query is not None:
                by_k[env.config.top_k].append(i)
        hits: dict[int, list] = {}
        for k, slots in by_k.items():
            try:
                results = self.retriever.search([prepared[i].query for i in slots], k)
            except Exception as err:
                for i in slots:
                    batch[i][2].set_exception(err)
                continue
            self.retrieval_calls += 1
            hits.update(zip(slots, results))
        return hits
