"""SEEK: sketch-guided knowledge construction for RAG (arXiv 2601.09402 v2), inference only.

From the question alone the model first writes a *steering sketch*: a few logically ordered
topics ("gists"), each paired with an empty evidence slot. Then, one slot per round, in order:
one call writes a reasoning step and a sub-query guided by that gist and the current sketch
(both are dropped afterwards and never shown to a later prompt); the sub-query's top-k
documents are read through the env; one call refines them into evidence, which fills exactly
that slot. The final answer sees the question and the completed sketch only, never raw documents.

The sketch is a data structure (:class:`Sketch`), not text the model rewrites: the model names
the topics once, then writes one slot's evidence at a time, and the method fills the slot.

Variants (option ``variant``; the paper's ablations, §5.2 and A.3):

- ``full``: as above.
- ``parallel_filling``: one call writes a sub-query for every slot; all are retrieved in ONE
  retrieval round; then one refine call per slot, run concurrently.
- ``plan``: the sketch is a plan; each step's evidence is appended to a list of notes instead
  of a slot; after each step a yes/no call judges whether the notes suffice.
- ``update``: ``full`` plus, after each fill, one call that may remove, add or reword topics;
  topics kept verbatim keep their evidence; an unusable reply keeps the sketch (noted).
- ``no_iter_retrieval``: one retrieval with the question, then the slots are filled in order
  from those same documents (one refine call per slot).
- ``no_initialization``: no sketch: write a sub-query, retrieve, summarise into a note, judge
  sufficiency; repeat until judged sufficient or the round cap.

Every variant makes at most ``max_rounds`` retrieval rounds, reads under ``admission``
("prefix": the top-k; "preview": the model opens chosen candidates) and records every fallback
in the trace with ``ctx.note``. ``ctx.stats`` holds variant, slots, slots_filled, rounds, stop.
"""
from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import ClassVar

from envs.types import Hit
from methods.base import Method, paper_limits, register, require_choice
from methods.context import QuestionContext
from methods.evidence import ADMISSIONS, SELECT_TOKENS, admission_protocol, gather_evidence, searches_left
from methods.parsing import extract_answer, last_tag
from methods.prompts import format_docs
from methods.prompts import seek as prompts

VARIANTS = ("full", "parallel_filling", "plan", "update", "no_iter_retrieval", "no_initialization")
GIST_CHARS = 120
QUERY_WORDS = 32
EVIDENCE_CHARS = 600

_ITEM = re.compile(r"^\s*[*_]*(?:#{2,6}|(?:step|topic)?\s*\d{1,2}\s*[.):]|[-*•])\s*(.+?)\s*$", re.IGNORECASE)
_NUMBERED = re.compile(r"^\s*(?:query\s*)?(\d{1,2})\s*[.):]\s*(.+?)\s*$", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"<\s*to be filled\s*>|\[\s*(?:to be filled)?\s*\]|\(\s*empty\s*\)", re.IGNORECASE)
_LABEL = re.compile(r"^\W*(?:sub-?query|search query|query|search|evidence|note|summary)\s*:\s*", re.IGNORECASE)
_QUERY_LINE = re.compile(r"^\W*(?:sub-?query|search query|query)\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE)
_VERDICT = re.compile(r"\b(yes|no|not|insufficient|sufficient|enough)\b", re.IGNORECASE)
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"</?[A-Za-z_]+>")
_KEEP = re.compile(r"\bkeep\b|\bno change|\bunchanged\b|\bfine as it is\b", re.IGNORECASE)


def _norm(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


# -- parsing model output ------------------------------------------------------------------------

def parse_gists(text: str) -> list[str]:
    """Topic names from numbered (``1.``), bulleted or ``##`` lines, in order, deduplicated."""
    gists, seen = [], set()
    for line in text.splitlines():
        match = _ITEM.match(line)
        if not match:
            continue
        gist = " ".join(_PLACEHOLDER.sub(" ", match.group(1)).replace("**", "").split()).strip(" :-")
        key = _norm(gist)
        if key and key not in seen and not key.startswith("evidence"):
            seen.add(key)
            gists.append(gist[:GIST_CHARS])
    return gists


def _clean_query(text: str) -> str:
    words = _LABEL.sub("", text).replace("**", "").strip().strip("\"'`").split()
    return " ".join(words[:QUERY_WORDS])


def parse_query(text: str) -> str:
    """The sub-query: a ``Query:`` line, a ``<search>`` tag, else the last line that is not reasoning."""
    found = _QUERY_LINE.search(text)
    if found and _clean_query(found.group(1)):
        return _clean_query(found.group(1))
    tagged = last_tag(text, "search")
    if tagged:
        return _clean_query(tagged)
    lines = [ln for ln in text.splitlines() if ln.strip() and not re.match(r"^\W*reasoning\b", ln, re.IGNORECASE)]
    return _clean_query(lines[-1]) if lines else ""


def parse_numbered_queries(text: str) -> dict[int, str]:
    """``{topic number: query}`` from ``1. query`` lines; unnumbered lines count in order."""
    numbered = {int(m.group(1)): _clean_query(m.group(2)) for m in map(_NUMBERED.match, text.splitlines()) if m}
    if numbered:
        return {i: q for i, q in numbered.items() if q}
    plain = [_clean_query(ln) for ln in text.splitlines() if ln.strip()]
    return {i: q for i, q in enumerate(plain, 1) if q}


def clean_evidence(text: str, gists: list[str]) -> str:
    """The evidence written for one slot, without echoed outline lines, placeholders or labels."""
    echoes = {_norm(g) for g in gists} | {_norm(h) for h in (prompts.OUTLINE_HEADING, prompts.PLAN_HEADING,
                                                              prompts.NOTES_HEADING)}
    kept = []
    for line in _TAG.sub(" ", _THINK.sub(" ", text)).splitlines():
        item = _ITEM.match(line)
        if "to be filled" in line.lower() or _norm(line) in echoes or (item and _norm(item.group(1)) in echoes):
            continue
        kept.append(_LABEL.sub("", line.strip()))
    return " ".join(" ".join(kept).split())[:EVIDENCE_CHARS]


def parse_verdict(text: str) -> bool | None:
    """True for yes/sufficient/enough, False for no/not/insufficient (first word that says), else None."""
    found = _VERDICT.search(text)
    return None if found is None else found.group(1).lower() in ("yes", "sufficient", "enough")


# -- the sketch -------------------------------------------------------------------------------------

@dataclass
class Slot:
    gist: str
    evidence: str | None = None  # None while the slot is empty


@dataclass
class Sketch:
    """The steering sketch: ordered gists, each with one evidence slot."""

    slots: list[Slot] = field(default_factory=list)

    @classmethod
    def from_gists(cls, gists: list[str]) -> Sketch:
        return cls([Slot(g) for g in gists])

    def gists(self) -> list[str]:
        return [s.gist for s in self.slots]

    def next_empty(self) -> int | None:
        return next((i for i, s in enumerate(self.slots) if s.evidence is None), None)

    @property
    def filled(self) -> int:
        return sum(s.evidence is not None for s in self.slots)

    def render(self) -> str:
        lines = [prompts.OUTLINE_HEADING]
        for i, slot in enumerate(self.slots, 1):
            lines += [f"{i}. {slot.gist}", f"   Evidence: {slot.evidence or prompts.EMPTY_SLOT}"]
        return "\n".join(lines)

    def revised(self, gists: list[str]) -> Sketch:
        """A sketch with ``gists``; a gist kept verbatim (up to case and punctuation) keeps its evidence."""
        evidence = {_norm(s.gist): s.evidence for s in self.slots}
        return Sketch([Slot(g, evidence.get(_norm(g))) for g in gists])


def render_notes(notes: list[str], plan: list[str] | None = None) -> str:
    """The knowledge of the notes variants: the plan (if any), then the notes so far."""
    parts = [prompts.PLAN_HEADING + "\n" + "\n".join(f"{i}. {g}" for i, g in enumerate(plan, 1))] if plan else []
    parts.append(prompts.NOTES_HEADING + "\n" + ("\n".join(f"- {n}" for n in notes) or prompts.NO_NOTES))
    return "\n\n".join(parts)


def fallback_query(focus: str, question: str) -> str:
    """The query used when the model wrote none: the gist and the question (the question alone without a gist)."""
    return question if _norm(focus) in (_norm(question), _norm(prompts.NOTES_FOCUS)) else f"{focus} {question}"


# -- the method ----------------------------------------------------------------------------------------

@register("seek")
@dataclass
class Seek(Method):
    """SEEK and its ablations (``variant``); see the module docstring."""

    variant: str = "full"
    admission: str = "prefix"  # or "preview": open only the candidates the model chooses
    paper_env: ClassVar[dict] = paper_limits(k=5, max_expand=5)  # documents per sub-query
    max_rounds: int = 10  # retrieval rounds at most
    max_slots: int = 6  # gists beyond this are dropped (noted)
    doc_chars: int = 800  # characters of each document shown to the refine call
    sketch_tokens: int = 160  # also the sketch update call
    query_tokens: int = 48  # per sub-query
    refine_tokens: int = 128
    judge_tokens: int = 8
    answer_tokens: int = 48
    select_tokens: int = SELECT_TOKENS  # admission="preview": each candidate-selection call

    def __post_init__(self) -> None:
        require_choice("variant", self.variant, VARIANTS)
        require_choice("admission", self.admission, ADMISSIONS)
        for name in ("max_rounds", "max_slots"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")

    def fixed_env(self) -> dict:
        searches = {"parallel_filling": self.max_slots, "no_iter_retrieval": 1}.get(self.variant, self.max_rounds)
        return admission_protocol(self.admission, max_searches=searches)

    async def run(self, ctx: QuestionContext) -> None:
        ctx.stats.update(variant=self.variant, slots=0, slots_filled=0, rounds=0, stop="")
        if self.variant == "update":
            ctx.stats["updates"] = 0
        fill = {"full": self._fill_in_order, "update": self._fill_in_order, "parallel_filling": self._fill_in_parallel,
                "no_iter_retrieval": self._fill_from_one_retrieval, "plan": self._gather_plan_notes,
                "no_initialization": self._gather_notes}[self.variant]
        knowledge = await fill(ctx)
        ctx.stats["rounds"] = len(ctx.search_rounds)
        if not ctx.done:
            await self._answer(ctx, knowledge)

    # -- variants: each returns the knowledge shown to the answer call ----------------------------

    async def _fill_in_order(self, ctx: QuestionContext) -> str:
        """``full`` and ``update``: one slot per round, first empty slot first."""
        sketch = await self._init_sketch(ctx)
        rounds, stop = 0, "filled"
        while (index := sketch.next_empty()) is not None:
            stop = self._round_blocker(ctx, rounds)
            if stop:
                break
            slot = sketch.slots[index]
            query = await self._write_query(ctx, sketch.render(), slot.gist)
            (hits,) = await gather_evidence(ctx, [query], self.admission, purposes=[slot.gist],
                                            select_tokens=self.select_tokens)
            slot.evidence = await self._refine(ctx, sketch.render(), slot.gist, query, hits, sketch.gists())
            rounds += 1
            if self.variant == "update" and rounds < self.max_rounds:
                sketch = await self._update(ctx, sketch)
        self._record(ctx, stop or "filled", sketch)
        return sketch.render()

    async def _fill_in_parallel(self, ctx: QuestionContext) -> str:
        """``parallel_filling``: all sub-queries in one call, one retrieval round, concurrent refines."""
        sketch = await self._init_sketch(ctx)
        gists, context = sketch.gists(), sketch.render()
        prompt = prompts.PARALLEL_QUERIES.format(question=ctx.question, context=context)
        text = await self._call(ctx, prompt, self.query_tokens * len(gists), "subqueries")
        written = parse_numbered_queries(text or "")
        queries = [written.get(i) or fallback_query(g, ctx.question) for i, g in enumerate(gists, 1)]
        missing = [i for i in range(1, len(gists) + 1) if not written.get(i)]
        if missing:
            ctx.note("subquery_fallback", slots=missing, output=text)
        read = await gather_evidence(ctx, queries, self.admission, purposes=gists, select_tokens=self.select_tokens)
        evidence = await asyncio.gather(*(self._refine(ctx, context, g, q, hits, gists)
                                          for g, q, hits in zip(gists, queries, read)))
        for slot, found in zip(sketch.slots, evidence):
            slot.evidence = found
        self._record(ctx, "filled", sketch)
        return sketch.render()

    async def _fill_from_one_retrieval(self, ctx: QuestionContext) -> str:
        """``no_iter_retrieval``: retrieve once with the question, then fill the slots in order."""
        sketch = await self._init_sketch(ctx)
        (hits,) = await gather_evidence(ctx, [ctx.question], self.admission, select_tokens=self.select_tokens)
        for slot in sketch.slots:
            slot.evidence = await self._refine(ctx, sketch.render(), slot.gist, ctx.question, hits, sketch.gists())
        self._record(ctx, "filled", sketch)
        return sketch.render()

    async def _gather_plan_notes(self, ctx: QuestionContext) -> str:
        """``plan``: the sketch's gists as plan steps; evidence appended to notes."""
        return await self._gather_notes(ctx, plan=(await self._init_sketch(ctx)).gists())

    async def _gather_notes(self, ctx: QuestionContext, plan: list[str] | None = None) -> str:
        """``plan`` (with a plan) and ``no_initialization`` (without): notes until judged sufficient."""
        notes: list[str] = []
        limit = self.max_rounds if plan is None else min(len(plan), self.max_rounds)
        stop = "plan_done" if plan is not None and len(plan) <= self.max_rounds else "round_cap"
        for step in range(limit):
            blocker = self._round_blocker(ctx, step)
            if blocker:
                stop = blocker
                break
            context = render_notes(notes, plan)
            focus = plan[step] if plan else prompts.NOTES_FOCUS
            query = await self._write_query(ctx, context, focus)
            (hits,) = await gather_evidence(ctx, [query], self.admission, purposes=[plan[step] if plan else query],
                                            select_tokens=self.select_tokens)
            notes.append(await self._refine(ctx, context, focus, query, hits, plan or []))
            if step + 1 < limit and await self._judge(ctx, render_notes(notes, plan)):
                stop = "sufficient"
                break
        self._record(ctx, stop, notes=notes)
        return render_notes(notes, plan)

    # -- one step each ------------------------------------------------------------------------------

    async def _call(self, ctx: QuestionContext, prompt: str, max_tokens: int, tag: str,
                    stop: tuple[str, ...] = ()) -> str | None:
        """One LLM call; None (and an ``llm_error`` note) if the backend reports an error."""
        result = await ctx.generate([{"role": "user", "content": prompt}], stop=stop, max_tokens=max_tokens, tag=tag)
        completion = result.completions[0]
        if completion.finish_reason == "error":
            ctx.note("llm_error", call=tag, error=completion.error)
            return None
        return completion.text

    async def _init_sketch(self, ctx: QuestionContext) -> Sketch:
        """Gists from the question alone; a one-gist sketch of the question if none can be parsed."""
        text = await self._call(ctx, prompts.SKETCH.format(question=ctx.question), self.sketch_tokens, "sketch")
        gists = self._capped(ctx, parse_gists(text or ""))
        if not gists:
            ctx.note("sketch_fallback", output=text)
            gists = [ctx.question]
        ctx.stats["slots"] = len(gists)
        return Sketch.from_gists(gists)

    def _capped(self, ctx: QuestionContext, gists: list[str]) -> list[str]:
        if len(gists) > self.max_slots:
            ctx.note("sketch_truncated", dropped=gists[self.max_slots:])
        return gists[: self.max_slots]

    async def _write_query(self, ctx: QuestionContext, context: str, focus: str) -> str:
        """Reasoning step + sub-query (only the sub-query is used, for this round only)."""
        prompt = prompts.SUBQUERY.format(question=ctx.question, context=context, focus=focus)
        text = await self._call(ctx, prompt, self.query_tokens, "subquery")
        query = parse_query(text or "")
        if not query:
            query = fallback_query(focus, ctx.question)
            ctx.note("subquery_fallback", output=text, query=query)
        return query

    async def _refine(self, ctx: QuestionContext, context: str, focus: str, query: str, hits: list[Hit],
                      gists: list[str]) -> str:
        """The documents refined into evidence for ``focus``; NO_EVIDENCE (noted) when there is none."""
        if not hits:
            ctx.note("no_documents", topic=focus, query=query)
            return prompts.NO_EVIDENCE
        prompt = prompts.REFINE.format(question=ctx.question, context=context, focus=focus, query=query,
                                       docs=format_docs(hits, self.doc_chars))
        text = await self._call(ctx, prompt, self.refine_tokens, "refine", stop=("\n\n",))
        evidence = clean_evidence(text or "", gists)
        if not evidence:
            ctx.note("empty_evidence", topic=focus, output=text)
            return prompts.NO_EVIDENCE
        return evidence

    async def _judge(self, ctx: QuestionContext, context: str) -> bool:
        """Sufficiency judgement; an unusable reply counts as "not yet" (noted)."""
        text = await self._call(ctx, prompts.JUDGE.format(question=ctx.question, context=context),
                                self.judge_tokens, "judge")
        verdict = parse_verdict(text or "")
        if verdict is None:
            ctx.note("judge_unparsed", output=text)
        return bool(verdict)

    async def _update(self, ctx: QuestionContext, sketch: Sketch) -> Sketch:
        """``update``: the model may remove, add or reword gists; an unusable reply keeps the sketch."""
        prompt = prompts.UPDATE.format(question=ctx.question, context=sketch.render())
        text = await self._call(ctx, prompt, self.sketch_tokens, "update")
        gists = self._capped(ctx, parse_gists(text or ""))
        if not gists:
            if text is None or not _KEEP.search(text):
                ctx.note("update_unparsed", output=text)
            return sketch
        revised = sketch.revised(gists)
        if revised.gists() != sketch.gists():
            ctx.stats["updates"] = ctx.stats.get("updates", 0) + 1
            ctx.note("sketch_updated", before=sketch.gists(), after=revised.gists())
        return revised

    async def _answer(self, ctx: QuestionContext, knowledge: str) -> None:
        prompt = prompts.ANSWER.format(context=knowledge, question=ctx.question)
        text = await self._call(ctx, prompt, self.answer_tokens, "answer", stop=("\n\n",))
        if text is None:
            await ctx.give_up("llm_error")
            return
        answer, form = extract_answer(text)
        if form != "line":
            ctx.note("answer_form", form=form)
        await ctx.answer(answer)

    # -- bookkeeping ---------------------------------------------------------------------------------

    def _round_blocker(self, ctx: QuestionContext, rounds: int) -> str:
        """Why no further retrieval round may start ("" if one may)."""
        if ctx.done:
            return "episode_over"
        if rounds >= self.max_rounds:
            return "round_cap"
        return "search_budget" if searches_left(ctx) == 0 else ""

    def _record(self, ctx: QuestionContext, stop: str, sketch: Sketch | None = None,
                notes: list[str] | None = None) -> None:
        ctx.stats["stop"] = stop
        if sketch is not None:
            ctx.stats["slots_filled"] = sketch.filled
            ctx.stats["slots_without_evidence"] = sum(s.evidence == prompts.NO_EVIDENCE for s in sketch.slots)
            ctx.stats["final_slots"] = len(sketch.slots)
        if notes is not None:
            ctx.stats["notes"] = len(notes)
