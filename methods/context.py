"""What a method sees of one question: the LLM, the env actions, and a trace of both.

Everything a method does goes through a :class:`QuestionContext`, which records it: every LLM
call (prompt, output, tokens, latency, finish reason) and every env step (action, observation,
validity). The runner turns the trace and the env's episode summary into one prediction line.
"""
from __future__ import annotations

import dataclasses
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from envs.episode import EpisodeState, SearchRecord
from envs.protocol import format_answer, format_expand, format_search
from envs.search_env import SearchEnv
from envs.types import Hit, QAExample
from methods.base import Sampling
from methods.env_batcher import EnvStepBatcher
from methods.llm import (
    Completion,
    GenerationRequest,
    GenerationResult,
    LLMBackend,
    Prompt,
)
from methods.thinking import (
    THINK_CLOSE,
    continuation_prompt,
    merged,
    needs_continuation,
    prompt_opens_thinking,
    split_thinking,
)

MAX_CONTINUATIONS = 8  # continued generations of one call whose stop strings fired inside its thinking


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
    # The passages this step's observation showed (an expand's, or a prefix search's), each with the
    # text as shown (cut where the observation cap cut it): what a method hands a reader.
    shown: list[Hit] = field(default_factory=list)


class QuestionContext:
    def __init__(self, example: QAExample, env: SearchEnv, llm: LLMBackend, steps: EnvStepBatcher,
                 seed: int = 0, max_llm_calls: int = 64, handle_thinking: bool = True,
                 action_tags: tuple[str, ...] = (), sampling: Sampling | None = None):
        self.example = example
        # the decoding of every call that does not set its own (the method's; default greedy)
        self.sampling = sampling or Sampling()
        if self.sampling.seed is not None:  # the method's own seed replaces the run's, per question as before
            seed = self.sampling.seed + zlib.crc32(example.id.encode()) % 2**31
        self.action_tags = tuple(action_tags)  # guided actions: the method's action tags (empty: not guided)
        self.env = env
        self.llm = llm
        self._steps = steps
        self.seed = seed
        self.max_llm_calls = max_llm_calls
        self.handle_thinking = handle_thinking  # see generate(); off for trained token-in/token-out protocols
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
    def episode(self) -> EpisodeState:
        """The env's current episode (the runner resets the env before a method runs)."""
        episode = self.env.episode
        if episode is None:
            raise RuntimeError("the env has no episode: reset() it first")
        return episode

    @property
    def tokenizer(self):
        return self.llm.tokenizer

    # -- LLM -----------------------------------------------------------------------------------

    async def generate(self, prompt: Prompt, *, stop: tuple[str, ...] | list[str] = (), max_tokens: int = 256,
                       temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
                       tag: str = "",
                       allowed_token_ids: tuple[int, ...] = (), regex: str | None = None) -> GenerationResult:
        """One LLM call, recorded in the trace under ``tag`` (e.g. ``"reason"``, ``"refine"``);
        ``allowed_token_ids``: a constrained choice; ``regex``: guided decoding (see
        :class:`GenerationRequest`). ``temperature``, ``top_p``, ``top_k``: None takes the method's
        (:attr:`sampling`); each call's seed is the question's seed plus the call's number.

        With ``handle_thinking`` (every prompted method) a leading ``<think>`` block is taken out of
        the completion's text into ``completion.thinking`` before the method sees it, and a stop
        string that fires inside the thinking (or before any visible text follows it) does not end
        the call: generation continues, within the same ``max_tokens``, first up to ``</think>``
        (the only stop while thinking), then with the call's own stops. The trace keeps the whole
        output; a call that ends inside its thinking is noted as ``thinking_cut_off``.
        """
        if self.llm_calls >= self.max_llm_calls:
            raise EpisodeOver(f"LLM call limit of {self.max_llm_calls} reached")
        sampling = self.sampling
        request = GenerationRequest(prompt=prompt, stop=tuple(stop), max_tokens=max_tokens,
                                    temperature=sampling.temperature if temperature is None else temperature,
                                    top_p=sampling.top_p if top_p is None else top_p,
                                    top_k=sampling.top_k if top_k is None else top_k, seed=self.seed + self.llm_calls,
                                    allowed_token_ids=tuple(allowed_token_ids), regex=regex)
        self.llm_calls += 1
        started = time.perf_counter()
        result = await self.llm.agenerate(request)
        self.prompt_tokens += result.prompt_tokens
        parts = [result.completions[0]]
        entry: dict[str, Any] = {}
        seen = None  # the completion the method sees, when thinking was taken out
        if self.handle_thinking and parts[0].finish_reason != "error":
            parts, entry, seen = await self._through_thinking(request, result, parts)
        raw = "".join(p.text for p in parts)
        self.completion_tokens += result.completion_tokens + sum(len(p.token_ids) for p in parts[1:])
        self.trace.append({
            "type": "llm", "tag": tag, "prompt": _prompt_for_trace(prompt), "output": raw,
            "finish_reason": parts[-1].finish_reason, "error": parts[-1].error, "guided": regex is not None,
            "prompt_tokens": result.prompt_tokens, "completion_tokens": sum(len(p.token_ids) for p in parts),
            "latency_s": round(time.perf_counter() - started, 4), **entry,
        })
        if entry.get("thinking") == "cut_off":
            self.note("thinking_cut_off", call=tag, max_tokens=max_tokens)
        if seen is not None:
            result = dataclasses.replace(result, completions=[seen] + result.completions[1:])
        return result

    async def _through_thinking(self, request: GenerationRequest, result: GenerationResult,
                                parts: list[Completion]) -> tuple[list[Completion], dict[str, Any], Completion | None]:
        """Continue a call whose stop fired inside its thinking: the parts generated, what the trace
        adds, and the completion the method sees (None: the output had no thinking)."""
        opened = prompt_opens_thinking(request.prompt, result.prompt_token_ids, self.tokenizer)
        split = split_thinking(parts[0].text, opened)
        if not split.present:
            return parts, {}, None
        continued = 0
        while needs_continuation(parts[-1], split) and continued < MAX_CONTINUATIONS:
            left = request.max_tokens - sum(len(p.token_ids) or len(p.text.split()) for p in parts)
            prompt = continuation_prompt(request.prompt, result.prompt_token_ids, parts)
            if left < 1 or prompt is None:
                break
            seed = None if request.seed is None else request.seed + 7919 * (continued + 1)  # a fresh draw
            stop = request.stop if split.closed else (THINK_CLOSE,)
            more = await self.llm.agenerate(dataclasses.replace(request, prompt=prompt, max_tokens=left, seed=seed,
                                                                stop=stop))
            self.prompt_tokens += more.prompt_tokens
            parts.append(more.completions[0])
            continued += 1
            if parts[-1].finish_reason == "error":
                break
            split = split_thinking("".join(p.text for p in parts), opened)
        entry: dict[str, Any] = {"thinking": "closed" if split.closed else "cut_off"}
        if continued:
            entry["continued"] = continued
        return parts, entry, merged(parts, split)

    # -- env actions ---------------------------------------------------------------------------

    async def step(self, action: str, hits: list[Hit] | None = None) -> StepOutcome:
        """Send raw action text (as a model wrote it) to the env.

        ``hits``: results already fetched for a search action's query (:meth:`retrieve`).
        """
        if self.done:
            raise EpisodeOver(f"the episode already ended ({self.finish_reason})")
        before = self.episode.latest
        shown_before = set(before.shown) if before is not None else set()
        observation, _, terminated, truncated, info = await self._steps.step(self.env, action, hits=hits)
        valid = info["action"] != "invalid"
        if info["action"] == "search":
            index = self.episode.n_searches - 1
            if self._open_round is not None:
                self._open_round.append(index)
            else:
                self.search_rounds.append([index])
        record = self.episode.latest
        outcome = StepOutcome(
            observation=observation, valid=valid, reason=info.get("invalid_reason"),
            hits=list(record.hits) if record is not None else [],
            expanded=list(record.expanded) if (record is not None and info["action"] == "expand") else [],
            done=terminated or truncated,
            shown=shown_passages(record, shown_before if record is before else set()),
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


def shown_passages(record: SearchRecord | None, already: set[int]) -> list[Hit]:
    """The passages the latest step's observation concerns (``record``'s candidates not in
    ``already``), in order, each with its text as the env showed it (a passage read earlier in the
    episode: as it was shown then); passages the observation cap cut off entirely are left out."""
    if record is None:
        return []
    return [dataclasses.replace(record.hits[number - 1], text=text)
            for number, text in record.shown.items() if number not in already and text]


def _prompt_for_trace(prompt: Prompt) -> Any:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return {"token_ids": len(prompt)}
    return prompt
