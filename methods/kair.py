"""KAIR: iterative retrieval anchored by an evolving, in-context knowledge index.

One question runs like this (paper §3, Eqs. 1-9):

1. Retrieve the top-k documents for the question.
2. Step call: the model reads ONLY the newly retrieved documents plus its previous notes (index,
   reasoning, query) and writes an updated ``<index>``, a short ``<think>``, a
   ``<judgement>`` (sufficient | insufficient) and, if insufficient, a ``<next_query>``.
3. While the judgement is insufficient and fewer than ``max_steps`` retrievals were made,
   retrieve the next query's top-k and go back to 2.
4. Final answer from ALL retrieved documents (deduplicated by passage row) plus the final index.

Index formats (``index_format``): ``keywords_relations`` (keywords plus head -> relation -> tail
lines; the paper's main setting), ``summary``, ``keywords``, ``facts``, ``keywords_facts``.

Ablations (``variant``, paper §5.2):

- ``full``: as above.
- ``qa_with_docs_only``: the same loop; the final answer sees the documents only.
- ``qa_with_index_only``: the same loop; the final answer sees the final index only.
- ``no_index``: the loop keeps no index (the model reasons, judges and writes queries from the
  new documents and its previous reasoning); the final answer sees the documents.
- ``no_evolving``: the loop of ``no_index``; one extra call builds an index from all documents at
  the end, and the final answer sees the documents plus that index.

Unlike the authors' code, no question is ever dropped: a step that lacks required parts gets one
repair call asking for just those parts; if that fails too, the old index is carried, a missing
judgement with a query counts as insufficient, and a step without a query ends the loop (stop
reason ``no_query``). Every stop reason is in ``ctx.stats["stop"]`` and the trace.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from envs.types import Hit
from methods.base import Method, paper_limits, register, require_choice
from methods.baselines import answer_from
from methods.context import QuestionContext
from methods.evidence import ADMISSIONS, SELECT_TOKENS, admission_protocol, gather_evidence
from methods.prompts import format_docs
from methods.prompts import kair as prompts

VARIANTS = ("full", "qa_with_docs_only", "qa_with_index_only", "no_index", "no_evolving")
INDEX_FORMATS = tuple(prompts.INDEX_FORMATS)
JUDGEMENTS = ("sufficient", "insufficient")

_TAG_NAMES = {"index": "index", "think": "think", "judgement": "judgement", "judgment": "judgement",
              "next_query": "next_query", "next_question": "next_query"}
_TAG_ALT = "|".join(_TAG_NAMES)
# A part runs from its opening tag to the next tag of any part (opening or closing) or the end.
_PART = re.compile(rf"<({_TAG_ALT})>(.*?)(?=</?(?:{_TAG_ALT})>|$)", re.IGNORECASE | re.DOTALL)
_JUDGEMENT_LABEL = re.compile(r"judge?ment\W{0,4}\s*(insufficient|sufficient)", re.IGNORECASE)
_QUERY_LABEL = re.compile(r"next[ _]query\s*:\s*(.+)", re.IGNORECASE)
_NO_QUERY = {"", "none", "n/a", "na", "nothing", "no query", "-"}


@dataclass
class StepNotes:
    """The parsed parts of one step's output; None marks a part that is missing."""

    index: str | None = None
    reasoning: str | None = None
    judgement: str | None = None  # "sufficient" | "insufficient" | None
    query: str | None = None

    def missing(self, need_index: bool, need_decision: bool) -> list[str]:
        """Required parts that are absent: ``index``, ``judgement``, ``next_query``."""
        gaps = ["index"] if need_index and not self.index else []
        if need_decision and self.judgement is None:
            gaps.append("judgement")
        if need_decision and self.judgement != "sufficient" and not self.query:
            gaps.append("next_query")
        return gaps

    def fill_from(self, other: StepNotes) -> None:
        """Take each part this step lacks from ``other`` (a repair's output)."""
        self.index = self.index or other.index
        self.reasoning = self.reasoning or other.reasoning
        self.judgement = self.judgement or other.judgement
        self.query = self.query or other.query

    def render(self, with_index: bool) -> str:
        """The notes in the tagged layout, as the next step sees them."""
        lines = [f"<index>\n{self.index or '(empty)'}\n</index>"] if with_index else []
        lines.append(f"<think>{self.reasoning or '(none)'}</think>")
        lines.append(f"<judgement>{self.judgement or '(missing)'}</judgement>")
        lines.append(f"<next_query>{self.query or 'none'}</next_query>")
        return "\n".join(lines)


def parse_judgement(text: str) -> str | None:
    """``sufficient`` / ``insufficient`` from a judgement's text; None if it says neither."""
    words = re.findall(r"[a-z]+", text.lower())
    if "insufficient" in words or ("not" in words and "sufficient" in words):
        return "insufficient"
    return "sufficient" if "sufficient" in words else None


def parse_query(text: str) -> str | None:
    """The first line of a query part, unquoted; None for empty or "none"."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = " ".join(line.strip("\"'`*[] ").split())
    return None if line.lower().rstrip(".") in _NO_QUERY else line


def parse_step(text: str) -> StepNotes:
    """Tolerant parse of a step output: tags in any case, closing tags optional, labels as fallback."""
    parts: dict[str, str] = {}
    for name, body in _PART.findall(text):
        if body.strip():
            parts[_TAG_NAMES[name.lower()]] = body.strip()  # the last non-empty one wins
    judgement = parse_judgement(parts["judgement"]) if "judgement" in parts else None
    if judgement is None and (label := _JUDGEMENT_LABEL.search(text)):
        judgement = label.group(1).lower()
    query = parse_query(parts["next_query"]) if "next_query" in parts else None
    if "next_query" not in parts and (label := _QUERY_LABEL.search(text)):
        query = parse_query(label.group(1))
    return StepNotes(parts.get("index"), parts.get("think"), judgement, query)


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


@register("kair")
@dataclass
class KAIR(Method):
    """KAIR: evolving knowledge index, sufficiency judgement, next query; answer from docs + index."""

    paper_env: ClassVar[dict] = paper_limits(k=5, max_expand=5)  # documents per retrieval step
    max_steps: int = 4  # retrieval steps in total, the first one included
    index_format: str = "keywords_relations"
    variant: str = "full"
    admission: str = "prefix"  # "prefix": read the top-k; "preview": open only chosen candidates
    step_tokens: int = 200
    repair_tokens: int = 64
    answer_tokens: int = 48
    select_tokens: int = SELECT_TOKENS  # admission="preview": each candidate-selection call

    def __post_init__(self) -> None:
        require_choice("variant", self.variant, VARIANTS)
        require_choice("index_format", self.index_format, INDEX_FORMATS)
        require_choice("admission", self.admission, ADMISSIONS)
        if self.max_steps < 1:
            raise ValueError("max_steps must be >= 1")

    def fixed_env(self) -> dict:
        return admission_protocol(self.admission, max_searches=self.max_steps)

    # -- what each variant uses ----------------------------------------------------------------

    @property
    def index_in_loop(self) -> bool:
        return self.variant not in ("no_index", "no_evolving")

    @property
    def answer_uses_loop_index(self) -> bool:
        return self.variant in ("full", "qa_with_index_only")

    @property
    def index_instruction(self) -> str:
        return prompts.INDEX_FORMATS[self.index_format]

    # -- the loop ------------------------------------------------------------------------------

    async def run(self, ctx: QuestionContext) -> None:
        ctx.stats.update(variant=self.variant, index_format=self.index_format, steps=0, repairs=0, judgements=[])
        docs: dict[int, Hit] = {}  # every passage read, by corpus row, in first-read order
        notes: StepNotes | None = None  # the latest step's parsed output
        query, stop = ctx.question, "max_steps"
        for step in range(1, self.max_steps + 1):
            new = await self.retrieve(ctx, query, first=step == 1)
            if ctx.done:
                stop = "env_ended"
                break
            ctx.stats["steps"] = step
            for hit in new:
                docs.setdefault(hit.row, hit)
            last = step == self.max_steps
            if last and not self.answer_uses_loop_index:
                break  # the last step's notes would feed nothing: skip the call
            latest = await self.reason(ctx, new, notes, need_decision=not last)
            if latest is None:
                stop = "llm_error"
                break
            notes = latest
            ctx.stats["judgements"].append(notes.judgement)
            if notes.judgement == "sufficient" or last:
                stop = "sufficient" if notes.judgement == "sufficient" else "max_steps"
                break
            if not notes.query:
                stop = "no_query"
                break
            if notes.judgement is None:
                ctx.note("kair_judgement_missing", assumed="insufficient", query=notes.query)
            query = notes.query
        ctx.stats["stop"] = stop
        ctx.note("kair_stop", reason=stop, steps=ctx.stats["steps"])
        if not ctx.done:
            await self.final_answer(ctx, list(docs.values()), notes.index if notes else None)

    async def retrieve(self, ctx: QuestionContext, query: str, first: bool) -> list[Hit]:
        """The documents read for ``query`` (top-k, or the opened candidates under preview)."""
        purpose = prompts.FIRST_PURPOSE if first else prompts.NEXT_PURPOSE.format(query=query)
        (read,) = await gather_evidence(ctx, [query], self.admission, purposes=[purpose],
                                        select_tokens=self.select_tokens)
        return read

    async def reason(self, ctx: QuestionContext, new: list[Hit], previous: StepNotes | None,
                     need_decision: bool) -> StepNotes | None:
        """One step call (plus at most one repair); None when the LLM fails."""
        with_index = self.index_in_loop
        parts = prompts.step_parts(self.index_instruction if with_index else None)
        docs = format_docs(new)
        if previous is None:
            prompt = prompts.FIRST_STEP.format(question=ctx.question, docs=docs, parts=parts)
        else:
            prompt = prompts.NEXT_STEP.format(question=ctx.question, docs=docs, parts=parts,
                                              previous=previous.render(with_index),
                                              carry_index=prompts.CARRY_INDEX if with_index else "")
        result = await ctx.generate(chat(prompt), stop=("</next_query>",), max_tokens=self.step_tokens, tag="step")
        completion = result.completions[0]
        if completion.finish_reason == "error":
            ctx.note("llm_error", call="step")
            return None
        notes = parse_step(completion.text)
        if notes.reasoning is None and completion.thinking:
            notes.reasoning = completion.thinking  # a leading <think> (methods.thinking) is the step's reasoning
        gaps = notes.missing(with_index, need_decision)
        if gaps:
            ctx.note("kair_step_format", missing=gaps)
            await self.repair(ctx, notes, gaps, docs, completion.text)
        if with_index and not notes.index and previous is not None and previous.index:
            notes.index = previous.index
            ctx.note("kair_index_carried")
        return notes

    async def repair(self, ctx: QuestionContext, notes: StepNotes, gaps: list[str], docs: str, output: str) -> None:
        """ONE call asking for just the missing parts; what it supplies fills the gaps in ``notes``."""
        ctx.stats["repairs"] += 1
        missing = "\n".join(prompts.MISSING_PART[g].format(index_instruction=self.index_instruction) for g in gaps)
        prompt = prompts.REPAIR.format(question=ctx.question, docs=docs, output=output.strip() or "(empty)",
                                       missing=missing)
        budget = self.step_tokens if "index" in gaps else self.repair_tokens  # an index needs room
        result = await ctx.generate(chat(prompt), stop=("</next_query>",), max_tokens=budget, tag="repair")
        completion = result.completions[0]
        if completion.finish_reason != "error":
            notes.fill_from(parse_step(completion.text))
        still = notes.missing("index" in gaps, "judgement" in gaps or "next_query" in gaps)
        if still or completion.finish_reason == "error":
            ctx.note("kair_repair_failed", missing=still, llm_error=completion.finish_reason == "error")

    # -- the answer ----------------------------------------------------------------------------

    async def final_answer(self, ctx: QuestionContext, docs: list[Hit], index: str | None) -> None:
        """Answer from what the variant uses: docs + index, docs only, or index only."""
        if self.variant == "no_evolving":
            index = await self.build_index(ctx, docs)
        if self.variant in ("full", "no_evolving", "qa_with_index_only") and not index:
            ctx.note("kair_empty_index")
        index_text, docs_text = index or "(empty)", format_docs(docs)
        if self.variant in ("full", "no_evolving"):
            prompt = prompts.ANSWER_WITH_INDEX_AND_DOCS.format(index=index_text, docs=docs_text, question=ctx.question)
        elif self.variant == "qa_with_index_only":
            prompt = prompts.ANSWER_WITH_INDEX.format(index=index_text, question=ctx.question)
        else:
            prompt = prompts.ANSWER_WITH_DOCS.format(docs=docs_text, question=ctx.question)
        await answer_from(ctx, prompt, max_tokens=self.answer_tokens)

    async def build_index(self, ctx: QuestionContext, docs: list[Hit]) -> str | None:
        """``no_evolving``: one call that builds the index from all documents at the end."""
        prompt = prompts.BUILD_INDEX.format(docs=format_docs(docs), question=ctx.question,
                                            index_instruction=self.index_instruction)
        result = await ctx.generate(chat(prompt), stop=("</index>",), max_tokens=self.step_tokens, tag="build_index")
        completion = result.completions[0]
        if completion.finish_reason == "error":
            ctx.note("llm_error", call="build_index")
            return None
        index = parse_step(completion.text).index
        if index is None and completion.text.strip():
            ctx.note("kair_index_untagged")
            index = completion.text.strip()
        return index
