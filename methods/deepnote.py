"""DeepNote (Wang et al., 2024; thunlp/DeepNote): note-centric iterative retrieval.

One question runs like this, in the env (paper §3; the released ``src/main.py`` for the numbers):

1. Search the question; read its top-k and write the first note from them (``init``).
2. Up to ``max_steps`` times: ask for ``queries_per_step`` new search questions from the question,
   the best note and the questions asked so far; run ONE search with them and the question (as the
   authors' code does, cut to ``query_chars``); read the candidates not read before (at most
   ``max_docs`` documents in all); fold them into the best note (``refine``); ask whether the new
   note is better than the best one (``compare``) and keep it only if the model says yes.
3. Stop early after ``max_fail_steps`` rejected updates (a step that finds no new document, or
   whose refined note is empty, counts as rejected), when the document budget is spent, or when
   the model writes no query.
4. Answer from the best note alone.

Reads: every search is shown as previews and only the documents folded into the note are opened
(expanded), so the env counts exactly the documents DeepNote reads; a document re-retrieved by a
later search is not read again. Unparseable model output never crashes the run: an unclear
comparison keeps the old note, an empty note or query list is handled as above, and each such case
is a trace note; ``method_stats`` holds the steps, the verdicts and the stop reason.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from envs.types import Hit
from methods.base import Method, paper_limits, register
from methods.baselines import answer_from
from methods.context import QuestionContext
from methods.evidence import admission_protocol
from methods.prompts import deepnote as prompts
from methods.prompts import format_docs
from methods.seek_parsing import parse_verdict

QUERY_CHARS = 500  # the authors' code cuts the search text (new questions + question) at 500 characters
_LIST_MARK = re.compile(r"^\s*(?:[-*•]+|\(?\d+[.):]|q\d*[.:)]|question\s*\d*\s*[:.)])\s*", re.IGNORECASE)
_TAGS = re.compile(r"</?[A-Za-z_]+>")


def parse_queries(text: str, n: int) -> list[str]:
    """Up to ``n`` search questions from a reply, one per line, without list marks, tags or quotes."""
    queries = []
    for line in _TAGS.sub(" ", text).splitlines():
        line = " ".join(_LIST_MARK.sub("", line).strip().strip("\"'`*").split())
        if line and line.lower().rstrip(".") not in ("none", "n/a") and line not in queries:
            queries.append(line)
    return queries[:n]


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


@register("deepnote")
@dataclass
class DeepNote(Method):
    """DeepNote: a note written from the first retrieval, refined with each new retrieval and kept
    only when the model judges the refined note better; the answer comes from the best note."""

    paper_env: ClassVar[dict] = paper_limits(k=5, max_expand=5)  # the code's retrieve_top_k 5
    max_steps: int = 3  # update steps after the first note (the code's max_step)
    max_fail_steps: int = 2  # rejected updates before stopping (the code's max_fail_step; 1: stop at the first)
    queries_per_step: int = 2  # new questions asked for per step, searched together (the code asks for two)
    max_docs: int = 15  # documents read in all (the code's max_top_k)
    query_chars: int = QUERY_CHARS
    note_tokens: int = 256
    query_tokens: int = 64
    compare_tokens: int = 8
    answer_tokens: int = 32

    def __post_init__(self) -> None:
        for name in ("max_fail_steps", "queries_per_step", "max_docs", "query_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_steps < 0:
            raise ValueError("max_steps must be >= 0")

    def fixed_env(self) -> dict:
        return {**admission_protocol("preview", max_searches=self.max_steps + 1), "expand_form": "list"}

    async def run(self, ctx: QuestionContext) -> None:
        """First note, the update loop, the answer from the best note."""
        ctx.stats.update(steps=0, verdicts=[], replaced=0, stop="max_steps")
        read: set[int] = set()
        docs = await self.read(ctx, ctx.question, read)
        if ctx.done:
            return
        best = await self.write(ctx, prompts.INIT_NOTE.format(question=ctx.question, docs=format_docs(docs)), "init")
        if best is None:
            await ctx.give_up("llm_error")
            return
        holder = [best or prompts.EMPTY_NOTE]  # the best note so far (update_loop replaces it)
        ctx.stats["stop"] = await self.update_loop(ctx, read, holder)
        ctx.stats["docs_folded"] = len(read)
        ctx.note("deepnote_stop", reason=ctx.stats["stop"], steps=ctx.stats["steps"])
        if not ctx.done:
            await answer_from(ctx, prompts.ANSWER.format(note=holder[0], question=ctx.question),
                              max_tokens=self.answer_tokens)

    async def update_loop(self, ctx: QuestionContext, read: set[int], best: list[str]) -> str:
        """The update steps; ``best[0]`` holds the best note. Returns the stop reason."""
        asked: list[str] = []
        fails = 0
        for step in range(1, self.max_steps + 1):
            if len(read) >= self.max_docs:
                return "max_docs"
            queries = await self.new_queries(ctx, best[0], asked)
            if queries is None:
                return "llm_error"
            if not queries:
                return "no_query"
            asked.extend(queries)
            ctx.stats["steps"] = step
            new = await self.read(ctx, " ".join(queries + [ctx.question])[: self.query_chars], read)
            if ctx.done:
                return "env_ended"
            verdict = await self.try_update(ctx, best, new)
            if verdict is None:
                return "llm_error"
            ctx.stats["verdicts"].append(verdict)
            if verdict:
                ctx.stats["replaced"] += 1
                continue
            fails += 1
            if fails >= self.max_fail_steps:
                return "no_improvement"
        return "max_steps"

    async def try_update(self, ctx: QuestionContext, best: list[str], new: list[Hit]) -> bool | None:
        """Refine the best note with ``new`` and compare; True: ``best[0]`` was replaced, False:
        kept (no new documents, an empty refinement, a no or an unclear comparison), None: LLM error."""
        if not new:
            ctx.note("deepnote_no_new_documents")
            return False
        prompt = prompts.REFINE_NOTE.format(question=ctx.question, note=best[0], docs=format_docs(new))
        candidate = await self.write(ctx, prompt, "refine")
        if candidate is None:
            return None
        if not candidate:
            return False
        result = await ctx.generate(chat(prompts.COMPARE.format(question=ctx.question, old=best[0], new=candidate)),
                                    stop=("\n",), max_tokens=self.compare_tokens, tag="compare")
        completion = result.completions[0]
        if completion.finish_reason == "error":
            ctx.note("llm_error", call="compare")
            return None
        better = parse_verdict(completion.text)
        if better is None:
            ctx.note("deepnote_compare_unparsed", output=completion.text, kept="old")
        if better:
            best[0] = candidate
        return bool(better)

    async def read(self, ctx: QuestionContext, query: str, read: set[int]) -> list[Hit]:
        """Search ``query`` and open the candidates not read before, best rank first, within the
        document budget; the opened passages as the env showed them (their rows join ``read``)."""
        outcome = await ctx.search(query)
        if not outcome.valid or outcome.done or not outcome.hits or not outcome.observation.startswith("<snapshot>"):
            return []
        room = min(self.max_docs - len(read), ctx.env.config.max_expand)
        fresh = sorted((h.rank, number) for number, h in enumerate(outcome.hits, 1) if h.row not in read)
        opened = await ctx.expand([number for _, number in fresh[: max(room, 0)]])
        shown = list(opened.shown) if opened.valid else []
        read.update(hit.row for hit in shown)
        return shown

    async def write(self, ctx: QuestionContext, prompt: str, tag: str) -> str | None:
        """A note call: the note's text ("" when empty, noted), None on an LLM error (noted)."""
        result = await ctx.generate(chat(prompt), max_tokens=self.note_tokens, tag=tag)
        completion = result.completions[0]
        if completion.finish_reason == "error":
            ctx.note("llm_error", call=tag)
            return None
        note = completion.text.strip()
        if not note:
            ctx.note("deepnote_empty_note", call=tag)
        return note

    async def new_queries(self, ctx: QuestionContext, note: str, asked: list[str]) -> list[str] | None:
        """The step's new search questions ([] when the reply has none, noted); None on an LLM error."""
        prompt = prompts.NEW_QUERIES.format(n=self.queries_per_step, question=ctx.question, note=note,
                                            asked="; ".join(asked) or "(none)")
        result = await ctx.generate(chat(prompt), max_tokens=self.query_tokens, tag="queries")
        completion = result.completions[0]
        if completion.finish_reason == "error":
            ctx.note("llm_error", call="queries")
            return None
        queries = parse_queries(completion.text, self.queries_per_step)
        if not queries:
            ctx.note("deepnote_no_query", output=completion.text)
        return queries
