"""MAPS: parallel sub-queries over complementary directions, with a disentangled working memory.

MAPS (paper §3) keeps, between iterations, only the original question, the knowledge
observations gathered so far (short texts, one per iteration) and a compact reasoning state
(replaced each iteration). Past sub-queries and past reasoning are never shown again, so later
searches are not pulled along the earlier search trajectory ("search momentum", §2).

One question runs like this:

1. Plan (one call): identify ``n_directions`` complementary retrieval directions and write one
   sub-query for each, as lines ``direction: … | query: …``.
2. Retrieve the top-``k`` of every sub-query in ONE retrieval call (one retrieval round, see
   :func:`methods.evidence.gather_evidence`; ``admission="preview"`` opens only the candidates
   one short call per sub-query chooses).
3. Refine (one call): consolidate the evidence (deduplicated by passage row, grouped by
   direction) into a new knowledge observation (appended) and a new reasoning state (replaces
   the old one).
4. Judge (one call): is the knowledge now sufficient? If so, or after ``max_iterations``
   iterations (paper §4: 10, top-5), stop; otherwise go back to 1.
5. Answer (one call) from the question, the observations and the reasoning state.

The judge is not asked before the first iteration (there is no knowledge to judge yet) nor after
the last (the answer follows anyway), so a full iteration costs three calls (plus one selection
call per sub-query under preview admission).

Ablations (``variant``, paper §5.2):

- ``full``: as above.
- ``no_retrieval_direction``: no directions; the plan call writes ``n_directions`` sub-queries
  directly (lines ``query: …``).
- ``no_parallel``: one direction and one sub-query per iteration.
- ``no_disentanglement``: every prompt sees the whole trajectory instead (each past round's
  sub-queries, observation and reasoning state).

No question is dropped: an unclear judgement counts as insufficient, a plan with no usable line
searches the question itself, an empty refinement keeps the old state (observation "(nothing
new)"), and an LLM error ends the loop and answers from what is there (or gives up if the answer
call fails too). Each fallback is a ``maps_*`` note in the trace; the stop reason is in
``ctx.stats["stop"]``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from envs.types import Hit
from methods.base import Method, paper_limits, register, require_choice
from methods.baselines import answer_from
from methods.context import QuestionContext
from methods.evidence import ADMISSIONS, SELECT_TOKENS, admission_protocol, gather_evidence, searches_left
from methods.prompts import format_docs
from methods.prompts import maps as prompts

VARIANTS = ("full", "no_retrieval_direction", "no_parallel", "no_disentanglement")
MAX_QUERY_WORDS = 32
_PLACEHOLDERS = {"search query", "what to find out"}  # the format line copied back verbatim

_LIST_MARK = re.compile(r"^\s*(?:[-*•]|\d+[.):]|\(\d+\))\s*")
_DIRECTION = re.compile(r"\**\bdirection\s*\d*\**\s*[:=]\**\s*(.*?)\s*(?=\||\bquery\s*\d*\**\s*[:=]|$)", re.IGNORECASE)
_QUERY = re.compile(r"\**\b(?:sub-?)?query\s*\d*\**\s*[:=]\**\s*(.+)", re.IGNORECASE)
_REFINE_LABEL = re.compile(r"\**\b(observation|new knowledge|knowledge|reasoning state|state)\**\s*:\**", re.IGNORECASE)
_JUDGEMENT = re.compile(r"\b(insufficient|not (?:yet )?(?:sufficient|enough)|sufficient|enough)\b", re.IGNORECASE)
_YES_NO = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)


@dataclass
class Search:
    """One planned sub-query and the retrieval direction it serves (None without directions)."""

    query: str
    direction: str | None = None


@dataclass
class Memory:
    """What later steps may see: knowledge observations, the reasoning state, and the trajectory
    (shown only in the ``no_disentanglement`` ablation)."""

    observations: list[str] = field(default_factory=list)
    state: str = ""
    rounds: list[tuple[list[Search], str, str]] = field(default_factory=list)  # (searches, observation, state)

    def add(self, searches: list[Search], observation: str, state: str) -> None:
        self.observations.append(observation)
        self.state = state
        self.rounds.append((searches, observation, state))

    def render(self, question: str, disentangled: bool) -> str:
        """The prompt's memory block: observations + state, or (not disentangled) every past round."""
        if disentangled:
            listed = "\n".join(f"{i}. {o}" for i, o in enumerate(self.observations, 1)) or prompts.NOTHING_YET
            return prompts.MEMORY.format(question=question, observations=listed, state=self.state or prompts.NO_STATE)
        rounds = "\n".join(
            prompts.ROUND.format(number=i, observation=observation, state=state or prompts.NO_STATE,
                                 searches="; ".join(f"{s.direction} -> {s.query}" if s.direction else s.query
                                                    for s in searches))
            for i, (searches, observation, state) in enumerate(self.rounds, 1))
        return prompts.TRAJECTORY.format(question=question, rounds=rounds or prompts.NOTHING_YET)


def _clean(text: str) -> str:
    text = re.sub(r"</?\w+>", " ", text)
    return " ".join(text.strip().strip("\"'`*[]<>").split())


def _normalised(query: str) -> str:
    return " ".join(re.findall(r"\w+", query.lower()))


def parse_plan(text: str, limit: int) -> list[Search]:
    """Sub-queries (with directions where given) from a plan, tolerantly: one per line, as
    ``direction: … | query: …``, ``query: …``, a ``direction:`` line followed by a ``query:``
    line, or a bulleted/numbered line (``- a | b`` or ``1. query``). A direction without a query
    is searched as written. Deduplicated (case and punctuation ignored), at most ``limit``."""
    searches: list[Search] = []
    pending: str | None = None  # a direction waiting for its query on a later line
    for line in text.splitlines():
        direction = _DIRECTION.search(line)
        query = _QUERY.search(line)
        if query:
            searches.append(Search(_clean(query.group(1)), _clean(direction.group(1)) if direction else pending))
            pending = None
        elif direction:
            if pending:
                searches.append(Search(pending, pending))
            pending = _clean(direction.group(1)) or None
        elif _LIST_MARK.match(line) and _clean(_LIST_MARK.sub("", line)):
            item = _LIST_MARK.sub("", line)
            aim, _, rest = item.rpartition("|")
            searches.append(Search(_clean(rest), _clean(aim) or None))
    if pending:
        searches.append(Search(pending, pending))
    unique: dict[str, Search] = {}
    for search in searches:
        search.query = " ".join(search.query.split()[:MAX_QUERY_WORDS])
        key = _normalised(search.query)
        if key and key not in _PLACEHOLDERS and key not in unique:
            unique[key] = search
    return list(unique.values())[:limit]


def parse_refinement(text: str) -> tuple[str | None, str | None]:
    """``(observation, state)`` from ``Observation: …`` / ``State: …`` lines; None where absent."""
    parts: dict[str, str] = {}
    labels = list(_REFINE_LABEL.finditer(text))
    for label, following in zip(labels, labels[1:] + [None]):
        body = _clean(text[label.end(): following.start() if following else len(text)])
        kind = "state" if "state" in label.group(1).lower() else "observation"
        if body and kind not in parts:
            parts[kind] = body
    return parts.get("observation"), parts.get("state")


def parse_judgement(text: str) -> str | None:
    """``sufficient`` / ``insufficient`` from the judge's reply (first verdict word); None if unclear."""
    found = _JUDGEMENT.search(text)
    if found:
        word = found.group(1).lower()
        return "sufficient" if word in ("sufficient", "enough") else "insufficient"
    yes_no = _YES_NO.search(text)
    if yes_no:
        return "sufficient" if yes_no.group(1).lower() == "yes" else "insufficient"
    return None


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


@register("maps")
@dataclass
class MAPS(Method):
    """MAPS: parallel sub-queries over complementary directions; observations + refined state."""

    paper_env: ClassVar[dict] = paper_limits(k=5, max_expand=5)  # passages per sub-query (paper §4: top-5)
    max_iterations: int = 10
    n_directions: int = 3  # directions (and sub-queries) per iteration; 1 under no_parallel
    variant: str = "full"
    admission: str = "prefix"  # "prefix": read the top-k; "preview": open only chosen candidates
    judge_tokens: int = 48
    plan_tokens: int = 120
    refine_tokens: int = 160
    answer_tokens: int = 48
    select_tokens: int = SELECT_TOKENS  # admission="preview": each candidate-selection call

    def __post_init__(self) -> None:
        require_choice("variant", self.variant, VARIANTS)
        require_choice("admission", self.admission, ADMISSIONS)
        if self.max_iterations < 1 or self.n_directions < 1:
            raise ValueError("max_iterations and n_directions must be >= 1")

    @property
    def queries_per_iteration(self) -> int:
        return 1 if self.variant == "no_parallel" else self.n_directions

    @property
    def with_directions(self) -> bool:
        return self.variant != "no_retrieval_direction"

    @property
    def disentangled(self) -> bool:
        return self.variant != "no_disentanglement"

    def fixed_env(self) -> dict:
        return admission_protocol(self.admission, max_searches=self.max_iterations * self.queries_per_iteration)

    def calls_per_iteration(self) -> int:
        """LLM calls an iteration may need: plan, selections (preview), refine, judge."""
        return 3 + (self.queries_per_iteration if self.admission == "preview" else 0)

    # -- the loop ------------------------------------------------------------------------------

    async def run(self, ctx: QuestionContext) -> None:
        ctx.stats.update(variant=self.variant, iterations=0, sub_queries=[], judgements=[])
        memory = Memory()
        stop = "max_iterations"
        for iteration in range(1, self.max_iterations + 1):
            if searches_left(ctx) < 1:
                stop = "search_budget"
                break
            if ctx.max_llm_calls - ctx.llm_calls < self.calls_per_iteration() + 1:  # keep one for the answer
                stop = "llm_call_budget"
                break
            searches = await self.plan(ctx, memory)
            if searches is None:
                stop = "llm_error"
                break
            evidence = await gather_evidence(ctx, [s.query for s in searches], self.admission,
                                             purposes=[s.direction for s in searches] if self.with_directions else None,
                                             select_tokens=self.select_tokens)
            ctx.stats["iterations"] = iteration
            ctx.stats["sub_queries"].append(len(searches))
            if ctx.done:
                stop = "env_ended"
                break
            if not await self.refine(ctx, memory, searches, evidence):
                stop = "llm_error"
                break
            if iteration == self.max_iterations:
                break
            verdict = await self.judge(ctx, memory)
            if verdict is None:
                stop = "llm_error"
                break
            if verdict == "sufficient":
                stop = "sufficient"
                break
        ctx.stats["stop"] = stop
        ctx.note("maps_stop", reason=stop, iterations=ctx.stats["iterations"])
        if not ctx.done:
            await self.final_answer(ctx, memory)

    def memory_text(self, ctx: QuestionContext, memory: Memory) -> str:
        return memory.render(ctx.question, self.disentangled)

    async def plan(self, ctx: QuestionContext, memory: Memory) -> list[Search] | None:
        """Directions and one sub-query each (or bare sub-queries); None when the LLM fails."""
        n = self.queries_per_iteration
        if self.with_directions:
            prompt = prompts.DIRECTIONS.format(memory=self.memory_text(ctx, memory),
                                               directions=prompts.directions_wanted(n))
        else:
            prompt = prompts.SUB_QUERIES.format(memory=self.memory_text(ctx, memory),
                                                queries=prompts.queries_wanted(n))
        completion = (await ctx.generate(chat(prompt), max_tokens=self.plan_tokens,
                                         tag="directions" if self.with_directions else "sub_queries")).completions[0]
        if completion.finish_reason == "error":
            ctx.note("llm_error", call="plan", error=completion.error)
            return None
        searches = parse_plan(completion.text, n)
        if not searches:
            ctx.note("maps_no_sub_queries", output=completion.text, fallback="question")
            return [Search(ctx.question, prompts.QUESTION_DIRECTION if self.with_directions else None)]
        if not self.with_directions:
            for search in searches:
                search.direction = None
        elif any(s.direction is None for s in searches):
            ctx.note("maps_missing_direction", queries=[s.query for s in searches if s.direction is None])
            for search in searches:
                search.direction = search.direction or search.query
        return searches

    async def refine(self, ctx: QuestionContext, memory: Memory, searches: list[Search],
                     evidence: list[list[Hit]]) -> bool:
        """Consolidate this round's evidence into a new observation and state; False on LLM error."""
        prompt = prompts.REFINE.format(memory=self.memory_text(ctx, memory),
                                       evidence=self.evidence_text(searches, evidence))
        completion = (await ctx.generate(chat(prompt), max_tokens=self.refine_tokens, tag="refine")).completions[0]
        if completion.finish_reason == "error":
            ctx.note("llm_error", call="refine", error=completion.error)
            return False
        observation, state = parse_refinement(completion.text)
        if observation is None and state is None:
            observation = _clean(completion.text) or None
            ctx.note("maps_refine_empty" if observation is None else "maps_refine_unlabelled", output=completion.text)
        elif state is None:
            ctx.note("maps_refine_no_state")
        memory.add(searches, observation or prompts.NOTHING_NEW, state or memory.state)
        return True

    def evidence_text(self, searches: list[Search], evidence: list[list[Hit]]) -> str:
        """Passages grouped by direction (or sub-query), each passage shown once."""
        shown: set[int] = set()
        groups = []
        for number, (search, hits) in enumerate(zip(searches, evidence), 1):
            new = [h for h in hits if h.row not in shown]
            shown.update(h.row for h in new)
            docs = format_docs(new) if new else (prompts.ALREADY_SHOWN if hits else "(no passages)")
            if search.direction is None:
                groups.append(prompts.EVIDENCE_GROUP_NO_DIRECTION.format(number=number, query=search.query, docs=docs))
            else:
                groups.append(prompts.EVIDENCE_GROUP.format(number=number, direction=search.direction,
                                                            query=search.query, docs=docs))
        return "\n\n".join(groups)

    async def judge(self, ctx: QuestionContext, memory: Memory) -> str | None:
        """``sufficient`` or ``insufficient`` (an unclear reply counts as insufficient); None on LLM error."""
        prompt = prompts.JUDGE.format(memory=self.memory_text(ctx, memory))
        completion = (await ctx.generate(chat(prompt), stop=("\n\n",), max_tokens=self.judge_tokens,
                                         tag="judge")).completions[0]
        if completion.finish_reason == "error":
            ctx.note("llm_error", call="judge", error=completion.error)
            return None
        verdict = parse_judgement(completion.text)
        ctx.stats["judgements"].append(verdict)
        if verdict is None:
            ctx.note("maps_judgement_unclear", output=completion.text, assumed="insufficient")
            return "insufficient"
        return verdict

    async def final_answer(self, ctx: QuestionContext, memory: Memory) -> None:
        """Answer from the question, the observations and the reasoning state (or the trajectory)."""
        prompt = prompts.ANSWER.format(memory=self.memory_text(ctx, memory), question=ctx.question)
        await answer_from(ctx, prompt, max_tokens=self.answer_tokens)
