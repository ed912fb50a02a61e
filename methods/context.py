"""What a method sees of one question: the LLM, the env actions, and a trace of both.

Everything a method does goes through a :class:`QuestionContext`, which records it: every LLM
call (prompt, output, tokens, latency, finish reason) and every env step (action, observation,
validity). The runner turns the trace and the env's episode summary into one prediction line.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from envs.protocol import format_answer, format_expand, format_search
from envs.search_env import SearchEnv
from envs.types import Hit, QAExample
from methods.env_batcher import EnvStepBatcher
from methods.guidance import turn_regex
from methods.llm import (
    GenerationRequest,
    GenerationResult,
    LLMBackend,
    Prompt,
)


class EpisodeOver(Exception):
    """Raised when a method acts after the env ended the episode (answer given or limits hit)."""


@dataclass
class StepOutcome:
    """The env's answer to one action, with the candidates of the search it concerns."""

    observation: str
    valid: bool
    reason: str | None = None
    hits: list[Hit] = field(default_factory=list)  # the latest search's candidates (rank order)
    expanded: list[int] = field(default_factory=list)  # candidate numbers opened by this expand
    done: bool = False


class QuestionContext:
    def __init__(self, example: QAExample, env: SearchEnv, llm: LLMBackend, steps: EnvStepBatcher,
                 seed: int = 0, max_llm_calls: int = 64, action_tags: tuple[str, ...] = ()):
        self.example = example
        self.action_tags = tuple(action_tags)  # guided actions: the method's action tags (empty: not guided)
        self.env = env
        self.llm = llm
        self._steps = steps
        self.seed = seed
        self.max_llm_calls = max_llm_calls
        self.trace: list[dict[str, Any]] = []
        self.llm_calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.final_info: dict | None = None  # the env's info["episode"] once the episode ends
        self.stats: dict[str, Any] = {}  # method-level facts for analyses (slots, steps, stop reason)
        self.search_rounds: list[list[int]] = []  # indices into the episode's searches, per retrieval round
        self._open_round: list[int] | None = None
        self.started = time.perf_counter()

    @property
    def question(self) -> str:
        return self.example.question

    @property
    def done(self) -> bool:
        return self.final_info is not None

    @property
    def tokenizer(self):
        return self.llm.tokenizer

    # -- LLM -----------------------------------------------------------------------------------

    def turn_regex(self) -> str | None:
        """With guided actions, the regular expression of the next agent turn: free text, then one
        action the env accepts now (:func:`methods.guidance.turn_regex`); None otherwise."""
        if not self.action_tags:
            return None
        return turn_regex(self.action_tags, self.env.episode, self.env.config)

    async def generate(self, prompt: Prompt, *, stop: tuple[str, ...] | list[str] = (), max_tokens: int = 256,
                       temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, tag: str = "",
                       allowed_token_ids: tuple[int, ...] = (), regex: str | None = None) -> GenerationResult:
        """One LLM call, recorded in the trace under ``tag`` (e.g. ``"reason"``, ``"refine"``);
        ``allowed_token_ids``: a constrained choice; ``regex``: guided decoding (see
        :class:`GenerationRequest`)."""
        if self.llm_calls >= self.max_llm_calls:
            raise EpisodeOver(f"LLM call limit of {self.max_llm_calls} reached")
        request = GenerationRequest(prompt=prompt, stop=tuple(stop), max_tokens=max_tokens, temperature=temperature,
                                    top_p=top_p, top_k=top_k, seed=self.seed + self.llm_calls,
                                    allowed_token_ids=tuple(allowed_token_ids), regex=regex)
        self.llm_calls += 1
        started = time.perf_counter()
        result = await self.llm.agenerate(request)
        completion = result.completions[0]
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens
        self.trace.append({
            "type": "llm", "tag": tag, "prompt": _prompt_for_trace(prompt), "output": completion.text,
            "finish_reason": completion.finish_reason, "error": completion.error, "guided": regex is not None,
            "prompt_tokens": result.prompt_tokens, "completion_tokens": len(completion.token_ids),
            "latency_s": round(time.perf_counter() - started, 4),
        })
        return result

    # -- env actions ---------------------------------------------------------------------------

    async def step(self, action: str, hits: list[Hit] | None = None) -> StepOutcome:
        """Send raw action text (as a model wrote it) to the env.

        ``hits``: results already fetched for a search action's query (:meth:`retrieve`).
        """
        if self.done:
            raise EpisodeOver(f"the episode already ended ({self.finish_reason})")
        observation, _, terminated, truncated, info = await self._steps.step(self.env, action, hits=hits)
        valid = info["action"] != "invalid"
        if info["action"] == "search":
            index = self.env.episode.n_searches - 1
            if self._open_round is not None:
                self._open_round.append(index)
            else:
                self.search_rounds.append([index])
        record = self.env.episode.latest
        outcome = StepOutcome(
            observation=observation, valid=valid, reason=info.get("invalid_reason"),
            hits=list(record.hits) if record is not None else [],
            expanded=list(record.expanded) if (record is not None and info["action"] == "expand") else [],
            done=terminated or truncated,
        )
        self.trace.append({"type": "env", "action": action, "observation": observation, "kind": info["action"],
                           **({"invalid_reason": outcome.reason} if not valid else {})})
        if terminated or truncated:
            self.final_info = info["episode"]
            if self.finish_reason is None:
                self.finish_reason = "answered" if terminated else "env_limit"
        return outcome

    async def search(self, query: str, hits: list[Hit] | None = None) -> StepOutcome:
        """Search ``query``; with ``hits`` (from :meth:`retrieve`) the env uses them as the results."""
        return await self.step(format_search(query), hits=hits)

    async def retrieve(self, queries: list[str]) -> list[list[Hit]]:
        """Top-K hits of every query in ONE retriever call (shared with other questions' steps).

        Nothing is shown to the policy or counted by the env until each query is passed to
        :meth:`search` with its hits; this only makes the retrieval itself one batched call.
        """
        if not queries:
            return []
        results = await self._steps.retrieve(list(queries), self.env.config.candidates_per_search)
        self.trace.append({"type": "retrieve", "queries": list(queries), "k": self.env.config.candidates_per_search})
        return results

    @contextmanager
    def retrieval_round(self):
        """Searches made inside this block form one retrieval round (e.g. parallel sub-queries)."""
        if self._open_round is not None:  # nested: the outer round keeps collecting
            yield
            return
        self._open_round = []
        try:
            yield
        finally:
            if self._open_round:
                self.search_rounds.append(self._open_round)
            self._open_round = None

    async def expand(self, ids: list[int] | tuple[int, ...]) -> StepOutcome:
        return await self.step(format_expand(list(ids)))

    async def answer(self, text: str) -> StepOutcome:
        """End the episode with ``text``; an empty answer is recorded as no answer."""
        text = " ".join(text.split())
        if not text:
            self.note("empty_answer")
            return await self.give_up("empty_answer")
        return await self.step(format_answer(text))

    async def give_up(self, reason: str) -> StepOutcome:
        """End the episode without an answer (scored 0), recording why."""
        self.finish_reason = reason
        if self.done:
            return StepOutcome("", valid=True, done=True)
        self.final_info = self.env.summary()
        self.trace.append({"type": "end", "reason": reason})
        return StepOutcome("", valid=True, done=True)

    def note(self, kind: str, **data: Any) -> None:
        """Record a method-level event (a parse failure, a fallback taken, ...)."""
        self.trace.append({"type": "note", "kind": kind, **data})

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


def _prompt_for_trace(prompt: Prompt) -> Any:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return {"token_ids": len(prompt)}
    return prompt
