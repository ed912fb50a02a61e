"""MAPS: parallel sub-queries over complementary directions, with a disentangled working memory.

MAPS (paper §3) keeps, between iterations, only the original question, the knowledge
observations gathered so far (short texts, one per iteration) and a compact reasoning state
(replaced each iteration). Past sub-queries and past reasoning are never shown again, so later
searches are not pulled along the earlier search trajectory ("search momentum", §2).

One question runs like this (the paper's three prompts, §A.4 Figures 5–7: directions, parallel
sub-queries, refinement; each a separate call):

1. Directions (one call): from the second iteration on, first judge whether the knowledge is
   sufficient (``Sufficient: yes|no``); if it is, stop. Otherwise name the complementary
   retrieval directions still needed, one per line. The model decides how many, at most
   ``n_directions`` (the paper gives no number; ``fixed_directions=true`` asks for exactly
   ``n_directions``).
2. Sub-queries (one call per direction, run concurrently): each call sees the memory and ITS
   direction only, and writes one sub-query.
3. Retrieve the top-``k`` of every sub-query in ONE retrieval call (one retrieval round, see
   :func:`methods.evidence.gather_evidence`; ``admission="preview"`` opens only the candidates
   one short call per sub-query chooses).
4. Refine (one call): consolidate the evidence (deduplicated by passage row, grouped by
   direction) into a new knowledge observation (appended) and a new reasoning state (replaces
   the old one).
5. Back to 1, until judged sufficient or after ``max_iterations`` iterations (paper §4: 10,
   top-5); then answer (one call) from the question, the observations and the reasoning state.

No judgement is asked before the first iteration (there is no knowledge to judge yet), so an
iteration of m directions costs 2 + m calls (plus one selection call per sub-query under
preview admission), and stopping costs one directions call.

Variants (``variant``; the ablations of paper §5.2 plus our earlier one-call planner):

- ``full``: as above.
- ``no_retrieval_direction``: no directions; one call judges and writes up to ``n_directions``
  sub-queries directly (lines ``query: …``).
- ``no_parallel``: one direction and one sub-query per iteration.
- ``no_disentanglement``: every prompt sees the whole trajectory instead (each past round's
  sub-queries, observation and reasoning state).
- ``single_call``: one plan call writes exactly ``n_directions`` lines ``direction: … | query: …``;
  refine; then a separate judge call (not after the last iteration).

No question is dropped: an unclear judgement counts as insufficient, a planning reply with no
usable direction searches the question itself, a sub-query reply without a query searches its
direction followed by the question, an empty refinement keeps the old state (observation "(nothing new)"),
and an LLM error ends the loop and answers from what is there (or gives up if the answer call
fails too). Each fallback is a ``maps_*`` note in the trace; the stop reason is in
``ctx.stats["stop"]``.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import ClassVar

from envs.types import Hit
from methods.base import DEFAULT_LLM_CALLS, Method, paper_limits, register, require_choice
from methods.baselines import answer_from
from methods.context import QuestionContext
from methods.evidence import ADMISSIONS, SELECT_TOKENS, admission_protocol, gather_evidence, searches_left
from methods.maps_parsing import (
    Search,
    clean,
    parse_directions,
    parse_judgement,
    parse_plan,
    parse_refinement,
    parse_sub_query,
    parse_sufficiency,
)
from methods.prompts import format_docs
from methods.prompts import maps as prompts

VARIANTS = ("full", "no_retrieval_direction", "no_parallel", "no_disentanglement", "single_call")


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


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


@register("maps")
@dataclass
class MAPS(Method):
    """MAPS: parallel sub-queries over complementary directions; observations + refined state."""

    paper_env: ClassVar[dict] = paper_limits(k=5, max_expand=5)  # passages per sub-query (paper §4: top-5)
    max_iterations: int = 10
    n_directions: int = 3  # the most directions (sub-queries) per iteration; 1 under no_parallel
    fixed_directions: bool = False  # ask for exactly n_directions (single_call always does)
    variant: str = "full"
    admission: str = "prefix"  # "prefix": read the top-k; "preview": open only chosen candidates
    judge_tokens: int = 48  # single_call's separate judge call
    plan_tokens: int = 120  # the directions call (or the sub-queries / single_call plan call)
    query_tokens: int = 48  # each direction's sub-query call
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
        """The most sub-queries one iteration may make."""
        return 1 if self.variant == "no_parallel" else self.n_directions

    @property
    def with_directions(self) -> bool:
        return self.variant != "no_retrieval_direction"

    @property
    def disentangled(self) -> bool:
        return self.variant != "no_disentanglement"

    @property
    def asks_exactly(self) -> bool:
        return self.fixed_directions or self.variant == "single_call"

    def fixed_env(self) -> dict:
        return admission_protocol(self.admission, max_searches=self.max_iterations * self.queries_per_iteration)

    def calls_per_iteration(self) -> int:
        """LLM calls an iteration may need: planning, sub-queries, selections (preview), refine (+ judge)."""
        n = self.queries_per_iteration
        selections = n if self.admission == "preview" else 0
        if self.variant == "single_call":
            return 3 + selections
        return 2 + (n if self.with_directions else 0) + selections

    def llm_call_cap(self) -> int:
        """Room for all ``max_iterations`` iterations and the answer (preview admission: 8 calls an
        iteration, 81 for the paper's 10), never below the default cap."""
        return max(DEFAULT_LLM_CALLS, self.max_iterations * self.calls_per_iteration() + 1)

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
            searches, stop_now = await self.next_searches(ctx, memory, judged=iteration > 1)
            if stop_now:
                stop = stop_now
                break
            purposes = [s.direction or s.query for s in searches] if self.with_directions else None
            evidence = await gather_evidence(ctx, [s.query for s in searches], self.admission,
                                             purposes=purposes, select_tokens=self.select_tokens)
            ctx.stats["iterations"] = iteration
            ctx.stats["sub_queries"].append(len(searches))
            if ctx.done:
                stop = "env_ended"
                break
            if not await self.refine(ctx, memory, searches, evidence):
                stop = "llm_error"
                break
            if self.variant == "single_call" and iteration < self.max_iterations:
                stop = await self.judge(ctx, memory)
                if stop:
                    break
                stop = "max_iterations"
        ctx.stats["stop"] = stop
        ctx.note("maps_stop", reason=stop, iterations=ctx.stats["iterations"])
        if not ctx.done:
            await self.final_answer(ctx, memory)

    def memory_text(self, ctx: QuestionContext, memory: Memory) -> str:
        return memory.render(ctx.question, self.disentangled)

    async def call(self, ctx: QuestionContext, prompt: str, max_tokens: int, tag: str,
                   stop: tuple[str, ...] = ()) -> str | None:
        """One LLM call (counted and traced by ``ctx``); None, noted ``llm_error``, when the backend fails."""
        completion = (await ctx.generate(chat(prompt), stop=stop, max_tokens=max_tokens, tag=tag)).completions[0]
        if completion.finish_reason == "error":
            ctx.note("llm_error", call=tag, error=completion.error)
            return None
        return completion.text

    async def next_searches(self, ctx: QuestionContext, memory: Memory, judged: bool) -> tuple[list[Search], str]:
        """This iteration's searches, or a stop reason (``sufficient``, ``llm_error``) and none."""
        if self.variant == "single_call":
            searches = await self.plan_in_one_call(ctx, memory)
            return (searches, "") if searches is not None else ([], "llm_error")
        n, memory_text = self.queries_per_iteration, self.memory_text(ctx, memory)
        judge = prompts.JUDGE_FIRST if judged else prompts.NO_JUDGEMENT
        if self.with_directions:
            prompt = prompts.DIRECTIONS.format(memory=memory_text, judge=judge,
                                               directions=prompts.directions_wanted(n, self.asks_exactly))
        else:
            prompt = prompts.SUB_QUERIES.format(memory=memory_text, judge=judge,
                                                queries=prompts.queries_wanted(n, self.asks_exactly))
        text = await self.call(ctx, prompt, self.plan_tokens, "directions" if self.with_directions else "sub_queries")
        if text is None:
            return [], "llm_error"
        if judged and self.read_verdict(ctx, parse_sufficiency(text), text) == "sufficient":
            return [], "sufficient"
        if not self.with_directions:
            searches = [Search(s.query) for s in parse_plan(text, n)]
        else:
            directions = parse_directions(text, n)
            searches = await self.write_sub_queries(ctx, memory_text, directions) if directions else []
            if searches is None:
                return [], "llm_error"
        if not searches:
            ctx.note("maps_no_sub_queries" if not self.with_directions else "maps_no_directions",
                     output=text, fallback="question")
            return [Search(ctx.question, prompts.QUESTION_DIRECTION if self.with_directions else None)], ""
        return searches, ""

    def read_verdict(self, ctx: QuestionContext, verdict: str | None, text: str) -> str:
        """Record a judgement; an unclear one counts as insufficient (noted)."""
        ctx.stats["judgements"].append(verdict)
        if verdict is None:
            ctx.note("maps_judgement_unclear", output=text, assumed="insufficient")
            return "insufficient"
        return verdict

    async def write_sub_queries(self, ctx: QuestionContext, memory_text: str,
                                directions: list[str]) -> list[Search] | None:
        """One concurrent call per direction, each seeing the memory and its own direction only;
        None if any call fails. A reply without a query searches the direction and the question (noted)."""
        replies = await asyncio.gather(*(
            self.call(ctx, prompts.SUB_QUERY.format(memory=memory_text, direction=d), self.query_tokens, "sub_query")
            for d in directions))
        texts = [reply for reply in replies if reply is not None]
        if len(texts) < len(replies):
            return None
        searches: list[Search] = []
        by_query: set[str] = set()
        for direction, reply in zip(directions, texts):
            query, form = parse_sub_query(reply)
            if not query:
                query = f"{direction} {ctx.question}"
                ctx.note("maps_sub_query_fallback", direction=direction, output=reply, query=query)
            elif form == "line":
                ctx.note("maps_sub_query_unlabelled", direction=direction, output=reply)
            key = " ".join(query.lower().split())
            if key in by_query:  # two directions, one query: search it once
                ctx.note("maps_duplicate_sub_query", direction=direction, query=query)
                continue
            by_query.add(key)
            searches.append(Search(query, direction))
        return searches

    async def plan_in_one_call(self, ctx: QuestionContext, memory: Memory) -> list[Search] | None:
        """``single_call``: exactly ``n_directions`` directions and one sub-query each; None on LLM error."""
        n = self.queries_per_iteration
        prompt = prompts.PLAN.format(memory=self.memory_text(ctx, memory),
                                     directions=prompts.directions_wanted(n, fixed=True))
        text = await self.call(ctx, prompt, self.plan_tokens, "directions")
        if text is None:
            return None
        searches = parse_plan(text, n)
        if not searches:
            ctx.note("maps_no_sub_queries", output=text, fallback="question")
            return [Search(ctx.question, prompts.QUESTION_DIRECTION)]
        if any(s.direction is None for s in searches):
            ctx.note("maps_missing_direction", queries=[s.query for s in searches if s.direction is None])
            for search in searches:
                search.direction = search.direction or search.query
        return searches

    async def refine(self, ctx: QuestionContext, memory: Memory, searches: list[Search],
                     evidence: list[list[Hit]]) -> bool:
        """Consolidate this round's evidence into a new observation and state; False on LLM error."""
        prompt = prompts.REFINE.format(memory=self.memory_text(ctx, memory),
                                       evidence=self.evidence_text(searches, evidence))
        text = await self.call(ctx, prompt, self.refine_tokens, "refine")
        if text is None:
            return False
        observation, state = parse_refinement(text)
        if observation is None and state is None:
            observation = clean(text) or None
            ctx.note("maps_refine_empty" if observation is None else "maps_refine_unlabelled", output=text)
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

    async def judge(self, ctx: QuestionContext, memory: Memory) -> str:
        """``single_call``'s separate judge call: "sufficient" or "llm_error" to stop, "" to go on."""
        prompt = prompts.JUDGE.format(memory=self.memory_text(ctx, memory))
        text = await self.call(ctx, prompt, self.judge_tokens, "judge", stop=("\n\n",))
        if text is None:
            return "llm_error"
        return "sufficient" if self.read_verdict(ctx, parse_judgement(text), text) == "sufficient" else ""

    async def final_answer(self, ctx: QuestionContext, memory: Memory) -> None:
        """Answer from the question, the observations and the reasoning state (or the trajectory)."""
        prompt = prompts.ANSWER.format(memory=self.memory_text(ctx, memory), question=ctx.question)
        await answer_from(ctx, prompt, max_tokens=self.answer_tokens)
