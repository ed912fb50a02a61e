"""Retrieve evidence for one or several queries in ONE retrieval call, under either admission mode.

SEEK, KAIR and MAPS read the top-k of every query in the papers (``admission="prefix"``). With
``admission="preview"`` (the SEEDS setting) each query's candidates are first shown as previews,
one short LLM call names the ones worth reading, and only those are expanded and returned. The
env counts and scores what was opened either way, so the two settings are compared on the same
metrics.
"""
from __future__ import annotations

import re

from envs.types import Hit
from methods.base import require_choice
from methods.context import QuestionContext
from methods.prompts import admission as prompts

ADMISSIONS = ("prefix", "preview")
SELECT_TOKENS = 24


def admission_protocol(admission: str, max_searches: int) -> dict:
    """What the env of a method that makes up to ``max_searches`` searches under ``admission`` must be
    (the method's ``fixed_env``; K and the observation cap stay the env's).

    Repeated queries are allowed (parallel or iterative sub-queries may coincide); in preview mode
    every search is followed by one expand, so the action budget is two per search plus the answer.
    """
    require_choice("admission", admission, ADMISSIONS)
    per_search = 2 if admission == "preview" else 1
    return {"admission": admission, "require_expand": True, "max_searches": max_searches,
            "max_actions": per_search * max_searches + 1, "duplicate_query": "allow"}


def parse_selection(text: str, n_candidates: int) -> list[int] | None:
    """Candidate numbers named in ``text`` (1-based, in order, deduplicated, in range).

    ``[]`` when the reply says none (or names no valid number but says none); None when the
    reply is unusable (no numbers in range and no "none").
    """
    numbers = [int(m) for m in re.findall(r"\d+", text)]
    chosen = list(dict.fromkeys(i for i in numbers if 1 <= i <= n_candidates))
    if chosen:
        return chosen
    if re.search(r"\bnone\b|\bnothing\b|\bno candidates?\b", text, flags=re.IGNORECASE):
        return []
    return None


async def choose_candidates(ctx: QuestionContext, snapshot: str, n_candidates: int, purpose: str,
                            max_tokens: int = SELECT_TOKENS) -> list[int]:
    """One LLM call: which of the ``n_candidates`` previewed candidates to open.

    An unusable reply opens the first candidate (the retriever's best, unless the env shuffles)
    and is recorded in the trace as ``selection_fallback``.
    """
    body = snapshot.removeprefix("<snapshot>").removesuffix("</snapshot>").strip()
    prompt = prompts.SELECT.format(question=ctx.question, purpose=purpose, candidates=body)
    result = await ctx.generate([{"role": "user", "content": prompt}], stop=("\n\n",), max_tokens=max_tokens,
                                tag="select")
    completion = result.completions[0]
    chosen = None if completion.finish_reason == "error" else parse_selection(completion.text, n_candidates)
    if chosen is None:
        ctx.note("selection_fallback", output=completion.text, opened=[1])
        return [1]
    return chosen[: ctx.env.config.max_expand]


def searches_left(ctx: QuestionContext) -> int:
    """Searches the env still allows while keeping one action for the answer."""
    episode, config = ctx.episode, ctx.env.config
    per_search = 2 if config.admission == "preview" else 1
    by_actions = (config.max_actions - episode.n_actions - 1) // per_search
    return max(0, min(config.max_searches - episode.n_searches, by_actions))


async def gather_evidence(ctx: QuestionContext, queries: list[str], admission: str,
                          purposes: list[str] | None = None, select_tokens: int = SELECT_TOKENS) -> list[list[Hit]]:
    """The passages read for each of ``queries``: one retrieval call, one retrieval round.

    Queries beyond the env's remaining search budget (one action is always kept for the
    answer) are not sent and yield no passages; the trace records them as ``search_budget``.
    A search the env refuses for another reason is recorded by the env; it never raises.
    ``select_tokens``: the budget of each preview-selection call.
    """
    queries = [" ".join(q.split()) for q in queries]
    budget = searches_left(ctx)
    nonempty = [i for i, q in enumerate(queries) if q]
    if len(nonempty) > budget:
        dropped = nonempty[budget:]
        ctx.note("search_budget", dropped=[queries[i] for i in dropped])
        queries = ["" if i in set(dropped) else q for i, q in enumerate(queries)]
    fetched = await ctx.retrieve([q for q in queries if q])
    found = iter(fetched)
    read: list[list[Hit]] = []
    with ctx.retrieval_round():
        for i, query in enumerate(queries):
            if not query or ctx.done:
                read.append([])
                continue
            outcome = await ctx.search(query, hits=next(found))
            if not outcome.valid or outcome.done:
                read.append([])
                continue
            # What is read is what the env showed (text cut by the observation cap, passages read
            # earlier in the episode left out): exactly what doc_tokens counts.
            if admission == "prefix" or not outcome.observation.startswith("<snapshot>") or not outcome.hits:
                read.append(list(outcome.shown) if admission == "prefix" else [])
                continue
            purpose = purposes[i] if purposes else f"find evidence for: {query}"
            chosen = await choose_candidates(ctx, outcome.observation, len(outcome.hits), purpose, select_tokens)
            opened = await ctx.expand(chosen)
            read.append(list(opened.shown) if opened.valid else [])
    return read
