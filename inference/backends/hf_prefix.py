"""Automatic prefix reuse for :meth:`HFBackend.generate` (``prefix_cache`` rows; 0: off).

A prompted agent (:class:`methods.transcript.ChatTranscript`) resends its whole transcript every
turn: instructions, earlier turns, observations. With ``prefix_cache=N`` the backend keeps the KV
cache of the last ``N`` finished rows (prompt + completion, in an
:class:`~inference.backends.hf_session.HFSession`). A new single-sample request whose prompt
continues one of them (holds that row's whole prompt, give or take :data:`BOUNDARY_SLACK` tokens
re-tokenised differently at its end; a chat template re-rendering the growing assistant message
does that) takes the row over; a request that only shares a beginning with a row (another
question's first turn: the same instructions and worked example) starts from a copy of the
shared part. Either way only the tokens after the common prefix run. Results are those
of ``generate`` (the same sampling, stop strings and accounting), up to the floating-point noise of
a different batch layout; concurrent questions never take each other's rows.

The least recently used rows beyond ``N`` are dropped; each costs ``layers x 2 x kv_heads x
head_dim x 4`` bytes per token (about 46 kB for SmolLM2-135M, 36 kB for Gemma 3 270M), so ``N``
of about the run's concurrency
holds every question in flight.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

from inference.backends.chat import prompt_token_ids
from inference.backends.hf_session import HFSession, _Parked
from methods.llm import GenerationRequest, GenerationResult

BOUNDARY_SLACK = 2  # tokens at the end of a row's prompt that a continuation may re-tokenise differently
MIN_SHARED = 32  # shorter common prefixes are run again rather than copied


def shared_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the common prefix of two 1-d token tensors."""
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) if len(differ) else n


class PrefixCache:
    def __init__(self, backend: Any, rows: int):
        if rows < 1:
            raise ValueError("prefix_cache needs at least one row")
        self.backend = backend
        self.rows = rows
        self.session = HFSession(backend)
        self._recent: OrderedDict[int, tuple[torch.Tensor, int]] = OrderedDict()  # key -> (cached ids, prompt
        # length), oldest first
        self._next_key = 0
        self._lock = threading.Lock()

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """``backend.generate(requests)``, single-sample requests continuing cached rows."""
        with self._lock:
            prompts = [self._ids(r) if r.n == 1 else None for r in requests]
            single = [i for i, ids in enumerate(prompts) if ids is not None]
            others = [i for i, ids in enumerate(prompts) if ids is None]
            results: list[GenerationResult | None] = [None] * len(requests)
            single_prompts = [ids for ids in prompts if ids is not None]  # in the order of single
            if single:
                keys = self._assign(single_prompts)
                for i, result in zip(single, self.session.generate([requests[i] for i in single], keys)):
                    results[i] = result
                self._remember(keys, [len(ids) for ids in single_prompts])
            if others:
                for i, result in zip(others, self.backend.generate_rows([requests[i] for i in others])):
                    results[i] = result
            finished = [result for result in results if result is not None]
            assert len(finished) == len(results)  # each request is single or other
            return finished

    def _ids(self, request: GenerationRequest) -> list[int] | None:
        try:
            return prompt_token_ids(self.backend.tokenizer, request.prompt)
        except Exception:  # the backend's own path reports a prompt it cannot tokenise
            return None

    def _assign(self, prompts: list[list[int]]) -> list[int]:
        """A key per prompt. A prompt that continues a cached row (holds all of that row's prompt,
        give or take :data:`BOUNDARY_SLACK` tokens) takes the row over, longest row first; any
        other prompt that shares at least :data:`MIN_SHARED` tokens with a cached row (the same
        instructions) gets a new row holding a copy of the shared part; the rest start empty."""
        tensors = [torch.tensor(ids) for ids in prompts]
        matches = []  # (shared, prompt index, key)
        for p, ids in enumerate(tensors):
            for key, (cached, prompt_length) in self._recent.items():
                shared = shared_prefix(cached, ids)
                if shared >= min(MIN_SHARED, prompt_length - BOUNDARY_SLACK) and shared > 0:
                    matches.append((shared, p, key))
        keys: list[int | None] = [None] * len(prompts)
        taken: set[int] = set()
        for shared, p, key in sorted(matches, reverse=True):
            cached, prompt_length = self._recent[key]
            continues = shared >= prompt_length - BOUNDARY_SLACK and len(tensors[p]) > len(cached)
            if keys[p] is None and key not in taken and continues:
                keys[p] = key
                taken.add(key)
        best = {}
        for shared, p, key in sorted(matches):  # the longest match of each prompt wins
            best[p] = (shared, key)
        for p in range(len(prompts)):
            if keys[p] is None:
                new_key = keys[p] = self._new_key()
                if p in best and best[p][1] not in taken and best[p][0] >= MIN_SHARED:
                    self._fork(best[p][1], new_key, best[p][0])
        assigned = [key for key in keys if key is not None]
        assert len(assigned) == len(keys)  # every prompt got a key above
        return assigned

    def _new_key(self) -> int:
        self._next_key += 1
        return self._next_key

    def _fork(self, source: int, key: int, length: int) -> None:
        """Park under ``key`` a copy of row ``source``'s first ``length`` cached tokens."""
        parked = self.session.parked[source]
        layers = [(k[:, :length].clone(), v[:, :length].clone()) for k, v in parked.layers]
        self.session.parked[key] = _Parked(parked.ids[:length], layers)

    def _remember(self, keys: list[int], prompt_lengths: list[int]) -> None:
        """Mark these rows most recent (those the session parked again) and drop the oldest beyond ``rows``."""
        for key, length in zip(keys, prompt_lengths):
            self._recent.pop(key, None)
            parked = self.session.parked.get(key)
            if parked is not None:
                self._recent[key] = (torch.tensor(parked.ids), length)
        while len(self._recent) > self.rows:
            oldest, _ = self._recent.popitem(last=False)
            self.session.release([oldest])
