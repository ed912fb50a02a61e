"""SEEK: sketch-guided knowledge construction for RAG (arXiv 2601.09402 v2), inference only.

From the question alone the model first writes a *steering sketch*: a few logically ordered
topics ("gists"), each paired with an empty evidence slot. Then, one slot per round, in order:
one call writes a reasoning step and a sub-query guided by that gist and the current sketch
(both are dropped afterwards and never shown to a later prompt); the sub-query's top-k
documents are read through the env; one call refines them into evidence, which fills exactly
that slot. The final answer sees the question and the completed sketch only, never raw documents.

The sketch is a data structure (:class:`Sketch`), not text the model rewrites: the model names
the topics once, then writes one slot's evidence at a time, and the method fills the slot (only
the ``update`` ablation lets the model rewrite it).

Variants (option ``variant``; the paper's ablations, §5.2 and A.3):

- ``full``: as above.
- ``parallel_filling``: one call writes a sub-query for every slot; all are retrieved in ONE
  retrieval round; then one refine call per slot, run concurrently.
- ``plan``: the sketch is a plan; each step's evidence is appended to a list of notes instead
  of a slot, and after each step a yes/no call judges whether the notes suffice. The notes are
  concatenated until that judgement says yes or ``max_rounds``: step i researches plan topic i,
  and once every topic has had its step, further steps research whatever the notes still lack.
- ``update``: ``full`` plus, after each fill, one call that rewrites the sketch, topics and
  evidence (paper A.3): it may remove redundant topics, add or reword topics, delete irrelevant
  content from filled slots and resolve conflicting evidence. Topics kept verbatim keep their
  evidence unless the reply states new evidence; stated evidence must be grounded in the old
  evidence (``seek_parsing.grounded``: no facts that were never retrieved), else the edit is
  refused and noted; an emptied slot is filled again; a "keep", unusable or cut-off reply keeps
  the sketch.
- ``no_iter_retrieval``: one retrieval with the question, then the slots are filled in order
  from those same documents (one refine call per slot).
- ``no_initialization``: no sketch: write a sub-query, retrieve, summarise into a note, judge
  sufficiency; repeat until judged sufficient or the round cap.

PAGER (SEEK's code) against our defaults, each a named option that ``--method.budget paper`` sets to PAGER's
value (:data:`methods.budgets.PAPER_OPTIONS`; docs/paper_settings.md): ``max_slots`` (6; PAGER: no
cap), ``doc_chars`` (800 characters per document; PAGER: whole documents) and ``reasoning_first``
(off; PAGER: the sketch call analyses before its topics, the answer call reasons before a tagged
answer). The prompts carry PAGER's instructions in every setting (:mod:`methods.prompts.seek`).

Every variant makes at most ``max_rounds`` retrieval rounds, reads under ``admission``
("prefix": the top-k; "preview": the model opens chosen candidates) and records every fallback
in the trace with ``ctx.note``. ``ctx.stats`` holds variant, slots, slots_filled, rounds, stop
(``plan``: notes, steps_beyond_plan; ``update``: updates, evidence_edits, refused_edits).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import ClassVar

from envs.metrics import COVER_EM_NORMALIZATIONS
from envs.types import Hit
from methods.base import Method, paper_limits, register, require_choice
from methods.context import QuestionContext
from methods.evidence import ADMISSIONS, SELECT_TOKENS, admission_protocol, gather_evidence, searches_left
from methods.parsing import extract_answer
from methods.prompts import format_docs
from methods.prompts import seek as prompts
from methods.seek_parsing import (
    EVIDENCE_CHARS,
    Revision,
    after_marker,
    clean_evidence,
    grounded,
    norm,
    parse_gists,
    parse_numbered_queries,
    parse_query,
    parse_sketch_revision,
    parse_verdict,
    says_keep,
)

VARIANTS = ("full", "parallel_filling", "plan", "update", "no_iter_retrieval", "no_initialization")


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

    def revised(self, revisions: list[Revision]) -> tuple[Sketch, list[dict]]:
        """The sketch ``revisions`` describe, and one record per slot whose evidence an edit changed.

        A topic kept verbatim (up to case and punctuation) keeps its evidence unless the revision
        states other evidence; stated evidence replaces it ("[to be filled]" empties the slot) when
        it is grounded in the old sketch's evidence (:func:`methods.seek_parsing.grounded`), else
        the edit is refused (recorded) and the slot keeps what it had. New topics start empty
        unless grounded evidence (moved from another slot) is stated for them.
        """
        before = {norm(s.gist): s.evidence for s in self.slots}
        source = " ".join(s.evidence for s in self.slots if s.evidence)
        slots: list[Slot] = []
        edits: list[dict] = []
        for revision in revisions:
            old = before.get(norm(revision.gist))
            new = old if not revision.stated else (revision.evidence[:EVIDENCE_CHARS] if revision.evidence else None)
            if new is not None and new != old and not grounded(new, source):
                edits.append({"topic": revision.gist, "refused": new})
                new = old
            elif norm(new or "") != norm(old or ""):
                edits.append({"topic": revision.gist, "before": old, "after": new})
            slots.append(Slot(revision.gist, new))
        return Sketch(slots), edits


def render_notes(notes: list[str], plan: list[str] | None = None) -> str:
    """The knowledge of the notes variants: the plan (if any), then the notes so far."""
    parts = [prompts.PLAN_HEADING + "\n" + "\n".join(f"{i}. {g}" for i, g in enumerate(plan, 1))] if plan else []
    parts.append(prompts.NOTES_HEADING + "\n" + ("\n".join(f"- {n}" for n in notes) or prompts.NO_NOTES))
    return "\n\n".join(parts)


def fallback_query(focus: str, question: str) -> str:
    """The query used when the model wrote none: the gist and the question (the question alone without a gist)."""
    bare = {norm(question), norm(prompts.NOTES_FOCUS), norm(prompts.PLAN_DONE_FOCUS)}
    return question if norm(focus) in bare else f"{focus} {question}"


# -- the method ----------------------------------------------------------------------------------------

@register("seek")
@dataclass
class Seek(Method):
    """SEEK and its ablations (``variant``); see the module docstring."""

    variant: str = "full"
    admission: str = "prefix"  # or "preview": open only the candidates the model chooses
    paper_env: ClassVar[dict] = paper_limits(k=5, max_expand=5)  # documents per sub-query
    max_rounds: int = 10  # retrieval rounds at most
    # Caps PAGER does not have (named deviations; --method.budget paper lifts both: methods.budgets.PAPER_OPTIONS):
    max_slots: int | None = 6  # gists beyond this are dropped (noted); None: no cap (PAGER's 10 rounds still bound it)
    doc_chars: int | None = 800  # characters of each document shown to the refine call; None: whole (PAGER)
    # PAGER's sketch call analyses the question before the topics, and its answer call reasons before a short
    # tagged answer; off by default (direct replies within the small budgets), on under --method.budget paper
    reasoning_first: bool = False
    sketch_tokens: int = 160
    update_tokens: int = 1024  # the update call rewrites the whole sketch, evidence included
    query_tokens: int = 48  # per sub-query
    refine_tokens: int = 128
    judge_tokens: int = 8
    answer_tokens: int = 48
    select_tokens: int = SELECT_TOKENS  # admission="preview": each candidate-selection call
    # Cover-EM as SEEK reports it (PAGER's code: punctuation to spaces); "squad" as for the other methods
    cover_em_normalization: str = "seek"

    def __post_init__(self) -> None:
        require_choice("variant", self.variant, VARIANTS)
        require_choice("admission", self.admission, ADMISSIONS)
        require_choice("cover_em_normalization", self.cover_em_normalization, tuple(COVER_EM_NORMALIZATIONS))
        for name in ("max_rounds", "max_slots", "doc_chars"):
            value = getattr(self, name)
            if (value is not None or name == "max_rounds") and (value is None or value < 1):
                raise ValueError(f"{name} must be at least 1" + ("" if name == "max_rounds" else " (or None: no cap)"))

    @property
    def slot_cap(self) -> int:
        """The most gists kept: ``max_slots``, else (no cap) ``max_rounds`` under ``parallel_filling``,
        whose one retrieval round makes a search per slot, and no cap otherwise (0)."""
        if self.max_slots is not None:
            return self.max_slots
        return self.max_rounds if self.variant == "parallel_filling" else 0

    def fixed_env(self) -> dict:
        searches = {"parallel_filling": self.slot_cap, "no_iter_retrieval": 1}.get(self.variant, self.max_rounds)
        return admission_protocol(self.admission, max_searches=searches)

    async def run(self, ctx: QuestionContext) -> None:
        ctx.stats.update(variant=self.variant, slots=0, slots_filled=0, rounds=0, stop="")
        if self.variant == "update":
            ctx.stats.update(updates=0, evidence_edits=0, refused_edits=0)
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
        """``plan`` (with a plan) and ``no_initialization`` (without): notes are concatenated until
        judged sufficient or ``max_rounds``. With a plan, step i researches plan topic i; once every
        topic has had its step, the steps research whatever the notes still lack."""
        notes: list[str] = []
        stop = "round_cap"
        for step in range(self.max_rounds):
            blocker = self._round_blocker(ctx, step)
            if blocker:
                stop = blocker
                break
            context = render_notes(notes, plan)
            topic = plan[step] if plan and step < len(plan) else None
            focus = topic or (prompts.PLAN_DONE_FOCUS if plan else prompts.NOTES_FOCUS)
            query = await self._write_query(ctx, context, focus)
            (hits,) = await gather_evidence(ctx, [query], self.admission, purposes=[topic or query],
                                            select_tokens=self.select_tokens)
            notes.append(await self._refine(ctx, context, focus, query, hits, plan or []))
            if step + 1 < self.max_rounds and await self._judge(ctx, render_notes(notes, plan)):
                stop = "sufficient"
                break
        self._record(ctx, stop, notes=notes)
        if plan is not None:
            ctx.stats["steps_beyond_plan"] = max(0, len(notes) - len(plan))
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
        output = prompts.SKETCH_REASONED if self.reasoning_first else prompts.SKETCH_DIRECT
        text = await self._call(ctx, prompts.SKETCH.format(question=ctx.question, output=output), self.sketch_tokens,
                                "sketch")
        listed = after_marker(text or "", prompts.TOPICS_MARKER) if self.reasoning_first else text or ""
        gists = self._capped(ctx, parse_gists(listed))
        if not gists:
            ctx.note("sketch_fallback", output=text)
            gists = [ctx.question]
        ctx.stats["slots"] = len(gists)
        return Sketch.from_gists(gists)

    def _capped(self, ctx: QuestionContext, gists: list[str]) -> list[str]:
        cap = self.slot_cap or len(gists)
        if len(gists) > cap:
            ctx.note("sketch_truncated", dropped=gists[cap:])
        return gists[:cap]

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
        """``update``: the model rewrites the sketch, topics and evidence: it may remove, add or
        reword topics and cut or reconcile filled evidence (see :meth:`Sketch.revised`). A "keep",
        an unusable or a cut-off reply keeps the sketch (the last two noted)."""
        prompt = prompts.UPDATE.format(question=ctx.question, context=sketch.render())
        result = await ctx.generate([{"role": "user", "content": prompt}], max_tokens=self.update_tokens, tag="update")
        completion = result.completions[0]
        if completion.finish_reason == "error":
            ctx.note("llm_error", call="update", error=completion.error)
            return sketch
        revisions = parse_sketch_revision(completion.text)
        if not revisions:
            if not says_keep(completion.text):
                ctx.note("update_unparsed", output=completion.text)
            return sketch
        if completion.finish_reason == "length":  # topics after the cut would be lost
            ctx.note("update_truncated", output=completion.text)
            return sketch
        revised, edits = sketch.revised(self._capped_revisions(ctx, revisions))
        if revised.gists() != sketch.gists():
            ctx.stats["updates"] += 1
            ctx.note("sketch_updated", before=sketch.gists(), after=revised.gists())
        for edit in edits:
            refused = "refused" in edit
            ctx.stats["refused_edits" if refused else "evidence_edits"] += 1
            ctx.note("evidence_edit_refused" if refused else "evidence_edited", **edit)
        return revised

    def _capped_revisions(self, ctx: QuestionContext, revisions: list[Revision]) -> list[Revision]:
        cap = self.slot_cap or len(revisions)
        if len(revisions) > cap:
            ctx.note("sketch_truncated", dropped=[r.gist for r in revisions[cap:]])
        return revisions[:cap]

    async def _answer(self, ctx: QuestionContext, knowledge: str) -> None:
        output = prompts.ANSWER_REASONED if self.reasoning_first else prompts.ANSWER_DIRECT
        prompt = prompts.ANSWER.format(context=knowledge, question=ctx.question, output=output)
        stop = ("</answer>",) if self.reasoning_first else ("\n\n",)
        text = await self._call(ctx, prompt, self.answer_tokens, "answer", stop=stop)
        if text is None:
            await ctx.give_up("llm_error")
            return
        answer, form = extract_answer(text)
        if form != ("tag" if self.reasoning_first else "line"):
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
