"""Step N search episodes together with ONE retrieval call per step.

Each slot is an ordinary :class:`envs.search_env.SearchEnv` sharing the retriever; a batched
step runs every slot's ``prepare``, sends all their search queries to the retriever at once,
then runs every slot's ``complete``. Results are therefore identical to N single envs.

There is no auto-reset: a rollout runs one episode per slot and calls :meth:`reset` again
for the next batch. Slots whose episode has ended take ``None`` as their action.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from envs.config import EnvConfig
from envs.search_env import SearchBackend, SearchEnv, prefetch_opened_pages
from envs.types import QAExample


class SearchVectorEnv:
    def __init__(
        self,
        retriever: SearchBackend,
        num_envs: int,
        dataset: Sequence[QAExample] | None = None,
        config: EnvConfig | None = None,
        tokenizer: Any | None = None,
    ):
        if num_envs < 1:
            raise ValueError("num_envs must be at least 1")
        self.retriever = retriever
        self.config = config or EnvConfig()
        self.envs = [SearchEnv(retriever, dataset, self.config, tokenizer) for _ in range(num_envs)]
        self.retrieval_calls = 0

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def reset(
        self, *, seed: int | Sequence[int] | None = None, examples: Sequence[QAExample] | None = None
    ) -> tuple[list[str], list[dict]]:
        """Start one episode per slot; ``seed`` may be one int (slot i gets seed + i) or a list."""
        if examples is not None and len(examples) != self.num_envs:
            raise ValueError(f"got {len(examples)} examples for {self.num_envs} envs")
        seeds = _per_slot_seeds(seed, self.num_envs)
        observations, infos = [], []
        for i, env in enumerate(self.envs):
            options = {"example": examples[i]} if examples is not None else None
            obs, info = env.reset(seed=seeds[i], options=options)
            observations.append(obs)
            infos.append(info)
        return observations, infos

    def step(self, actions: Sequence[str | None]):
        """Apply one action per slot (``None`` for finished slots).

        Returns ``(observations, rewards, terminated, truncated, infos)``; the last four are
        arrays / lists of length ``num_envs``. Finished slots return ``""``, 0, True.
        """
        if len(actions) != self.num_envs:
            raise ValueError(f"got {len(actions)} actions for {self.num_envs} envs")
        pending = [None if a is None else env.prepare(a) for env, a in zip(self.envs, actions)]
        queries = [(i, p.query) for i, p in enumerate(pending) if p is not None and p.query is not None]
        hits: dict[int, list] = {}
        if queries:
            results = self.retriever.search([q for _, q in queries], self.config.candidates_per_search)
            self.retrieval_calls += 1
            hits = {i: r for (i, _), r in zip(queries, results)}
        prefetch_opened_pages(self.retriever, [(env, step, hits.get(i))
                                               for i, (env, step) in enumerate(zip(self.envs, pending))])
        observations, infos = [], []
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        for i, (env, p) in enumerate(zip(self.envs, pending)):
            if p is None:
                observations.append("")
                infos.append({"action": "skipped"})
                terminated[i] = True
                continue
            obs, reward, term, trunc, info = env.complete(p, hits.get(i))
            observations.append(obs)
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
            infos.append(info)
        return observations, rewards, terminated, truncated, infos


def _per_slot_seeds(seed: int | Sequence[int] | None, n: int) -> list[int | None]:
    if seed is None:
        return [None] * n
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in range(n)]
    if len(seed) != n:
        raise ValueError(f"got {len(seed)} seeds for {n} envs")
    return list(seed)
