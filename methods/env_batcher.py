"""Batch env steps of concurrently running questions into one retrieval call.

Each question's coroutine awaits :meth:`EnvStepBatcher.step`; a drain task prepares all queued
actions, sends every search query of that round to the retriever in ONE call, and completes
the steps (the same split :class:`envs.vector_env.SearchVectorEnv` uses).

:meth:`EnvStepBatcher.retrieve` queues bare queries (several sub-queries of one question, e.g.
MAPS's parallel directions) into the same round's call; their hits are then handed to
:meth:`EnvStepBatcher.step` as ``hits=``, so those search steps need no retrieval of their own.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict

from envs.search_env import PendingStep, SearchEnv, prefetch_opened_pages

Lookup = tuple[list[str], int, asyncio.Future]  # bare queries, k, their hits' future
Owner = int | tuple[Lookup, int]  # a query's owner: a step's index in the batch, or (lookup, query index)


class EnvStepBatcher:
    def __init__(self, retriever, gather_s: float = 0.0):
        self.retriever = retriever
        self.gather_s = gather_s
        self.retrieval_calls = 0
        self._pending: list[tuple[SearchEnv, str, asyncio.Future, list | None]] = []
        self._lookups: list[Lookup] = []  # bare retrievals queued
        self._drainer: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _loop_future(self) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._pending, self._lookups, self._drainer = loop, [], [], None
        return loop.create_future()

    def _wake(self) -> None:
        if self._drainer is None or self._drainer.done():
            assert self._loop is not None  # set by _loop_future, which every caller runs first
            self._drainer = self._loop.create_task(self._drain())

    async def step(self, env: SearchEnv, action: str, hits: list | None = None):
        """``env.step(action)`` with its retrieval batched with the other questions' steps.

        ``hits``: results already retrieved for this action's query (from :meth:`retrieve`);
        the step then makes no retrieval call.
        """
        future = self._loop_future()
        self._pending.append((env, action, future, hits))
        self._wake()
        return await future

    async def retrieve(self, queries: list[str], k: int) -> list[list]:
        """Top-``k`` hits for each of ``queries``, in the same retriever call as this round's steps."""
        future = self._loop_future()
        self._lookups.append((list(queries), k, future))
        self._wake()
        return await future

    async def _drain(self) -> None:
        while self._pending or self._lookups:
            await asyncio.sleep(self.gather_s)  # let every runnable question queue its step
            batch, self._pending = self._pending, []
            lookups, self._lookups = self._lookups, []
            prepared: list[PendingStep | None] = []
            for env, action, future, _ in batch:
                try:
                    prepared.append(env.prepare(action))
                except Exception as err:  # e.g. stepping a finished episode: that caller's error
                    prepared.append(None)
                    future.set_exception(err)
            hits = self._retrieve(batch, prepared, lookups)
            opening = [(env, step, given if given is not None else hits.get(i))
                       for i, ((env, _, _, given), step) in enumerate(zip(batch, prepared))]
            prefetch_opened_pages(self.retriever, opening)
            for i, ((env, _, future, given), pending) in enumerate(zip(batch, prepared)):
                if pending is None or future.done():
                    continue
                try:
                    future.set_result(env.complete(pending, given if given is not None else hits.get(i)))
                except Exception as err:
                    future.set_exception(err)

    def _retrieve(self, batch, prepared, lookups) -> dict[int, list]:
        """One retriever call per distinct ``k`` among this round's searches and lookups (normally one)."""
        by_k: dict[int, list[tuple[str, Owner]]] = defaultdict(list)  # k -> [(query, step index | lookup)]
        for i, ((env, _, _, given), pending) in enumerate(zip(batch, prepared)):
            if pending is not None and pending.query is not None and given is None:
                by_k[env.config.candidates_per_search].append((pending.query, i))
        for lookup in lookups:
            queries, k, _ = lookup
            by_k[k].extend((q, (lookup, j)) for j, q in enumerate(queries))
        hits: dict[int, list] = {}
        lookup_hits: dict[int, list] = {}  # id(lookup) -> hits per query
        for k, entries in by_k.items():
            try:
                results = self.retriever.search([q for q, _ in entries], k)
            except Exception as err:
                for _, owner in entries:
                    future = batch[owner][2] if isinstance(owner, int) else owner[0][2]
                    if not future.done():
                        future.set_exception(err)
                continue
            self.retrieval_calls += 1
            for (_, owner), result in zip(entries, results):
                if isinstance(owner, int):
                    hits[owner] = result
                else:
                    lookup, j = owner
                    lookup_hits.setdefault(id(lookup), [None] * len(lookup[0]))[j] = result
        for lookup in lookups:
            future = lookup[2]
            if not future.done():
                future.set_result(lookup_hits.get(id(lookup), [[] for _ in lookup[0]]) if lookup[0] else [])
        return hits
