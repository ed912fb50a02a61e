"""MAIN-RAG (Chang et al., 2024/2025): training-free multi-agent filtering of retrieved documents.

One question runs like this, in the env:

1. One search for the question; the env shows the K candidates as previews (preview admission).
2. Agent 1, the Predictor, answers the question from each candidate alone (K calls, batched).
3. Agent 2, the Judge, scores each (document, question, predicted answer) triple: the score is
   log P("Yes") - log P("No") of its one-word relevance verdict (``judge_scoring="logprob"``).
4. The adaptive judge bar: tau = mean(scores) - ``threshold_n`` * std(scores) (population std);
   the candidates scoring at least tau are kept, best score first, and only they are expanded
   (opened) in the env, so the env's reads are the kept documents.
5. Agent 3, the Final-Predictor, answers from the kept documents in score order.

The Predictor and the Judge read every candidate's full text from the search results without the
env counting it (the env counts what the final answer reads); ``method_stats["filter_reads"]`` gives
that number so an analysis can add it.

Log-probabilities: the backends report only the log-prob of the token they generate, so the judge
reads its score from constrained one-token calls (``allowed_token_ids``), in one of two ways
(``judge_logprobs``; ``auto`` picks by backend):

- ``choice`` (``auto`` on the ``hf`` backend): ONE call constrained to {Yes, No}. The hf backend
  renormalises the log-prob over the allowed tokens, so the chosen token's log-prob gives both:
  log P(other) = log(1 - P(chosen)).
- ``forced`` (``auto`` on ``vllm`` and ``openai``): TWO calls, one allowed only Yes, one only No.
  vLLM reports the full-vocabulary log-prob of a forced token (its raw log-probs), and
  log P(Yes) - log P(No) over the vocabulary equals the same difference over the two words. A
  backend that renormalises instead returns 0.0 for both (no information): that is noted
  (``main_rag_forced_uninformative``) and the candidate gets a parsed verdict.

Without a local tokenizer (the ``openai`` backend with no ``tokenizer`` option, scripted test
LLMs), with Yes/No not single tokens, or with no log-prob in the reply, the judge falls back to a
parsed verdict: +1 for yes, -1 for no, 0 for an unparseable reply. ``method_stats`` says which
scoring was used (``judge_scoring``, ``judge_logprobs``, ``score_sources``) and a trace note says why.
"""
from __future__ import annotations

import asyncio
import math
import statistics
from dataclasses import dataclass
from typing import Any, ClassVar

from envs.types import Hit
from methods.base import DEFAULT_LLM_CALLS, Method, paper_limits, register, require_choice
from methods.baselines import answer_from
from methods.context import QuestionContext
from methods.llm import Completion
from methods.parsing import extract_answer
from methods.prompts import format_docs
from methods.prompts import main_rag as prompts
from methods.seek_parsing import parse_verdict

JUDGE_SCORINGS = ("logprob", "parsed")
JUDGE_LOGPROBS = ("auto", "choice", "forced")
FORCED_BACKENDS = ("vllm", "openai")  # full-vocabulary log-probs of a forced token (``forced`` under auto)
JUDGE_WORDS = ("Yes", "No")
PROB_FLOOR = 1e-6  # P(chosen) is clipped to [floor, 1 - floor]: a score lies within +-13.8
TIE_TOLERANCE = 1e-9  # a score this close below tau counts as reaching it (float noise in the mean)


@dataclass
class Assessment:
    """One candidate's pass through agents 1 and 2: the predicted answer and the judge's score
    (None: the judge failed, and the candidate is dropped)."""

    answer: str
    score: float | None
    source: str  # "logprob", "parsed", "unparsed" or "error"


def judge_bar(scores: list[float], threshold_n: float) -> float:
    """The adaptive judge bar: mean - ``threshold_n`` * population std of ``scores``."""
    return statistics.fmean(scores) - threshold_n * statistics.pstdev(scores)


def adaptive_filter(scores: list[float | None], threshold_n: float) -> tuple[list[int], float | None]:
    """(indices of the kept candidates, best score first with ties in candidate order; tau).

    Kept: every scored candidate whose score reaches tau (:func:`judge_bar` of the scored ones);
    unscored (None) candidates are never kept. No scores at all: nothing kept, tau None."""
    scored = [s for s in scores if s is not None]
    if not scored:
        return [], None
    tau = judge_bar(scored, threshold_n)
    kept = [(i, s) for i, s in enumerate(scores) if s is not None and s >= tau - TIE_TOLERANCE]
    return [i for i, _ in sorted(kept, key=lambda pair: (-pair[1], pair[0]))], tau


def yes_no_token_ids(tokenizer: Any) -> tuple[int, int] | None:
    """The token ids of ``Yes`` and ``No`` (each exactly one token, distinct); None otherwise."""
    if tokenizer is None:
        return None
    try:
        pieces = [list(tokenizer(word, add_special_tokens=False)["input_ids"]) for word in JUDGE_WORDS]
    except Exception:  # a tokenizer that cannot encode plain words here: no constrained choice
        return None
    if any(len(p) != 1 for p in pieces) or pieces[0] == pieces[1]:
        return None
    return int(pieces[0][0]), int(pieces[1][0])


def logprob_score(completion: Completion, ids: tuple[int, int]) -> float | None:
    """log P(Yes) - log P(No) from a one-token choice between ``ids`` (yes, no), reading the
    chosen token's log-prob as renormalised over the two; None when the reply has no usable
    log-prob (no token, a token outside the choice, a NaN)."""
    if not completion.token_ids or not completion.logprobs:
        return None
    token, logprob = completion.token_ids[0], completion.logprobs[0]
    if token not in ids or math.isnan(logprob):
        return None
    p = min(max(math.exp(logprob), PROB_FLOOR), 1 - PROB_FLOOR)
    margin = math.log(p) - math.log1p(-p)
    return margin if token == ids[0] else -margin


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


@register("main-rag")
@dataclass
class MainRAG(Method):
    """MAIN-RAG: per-document predictor, yes/no judge scores, adaptive judge bar, final predictor."""

    # K=20 candidates: MAIN-RAG's own setting as we recall it (not in the texts we have; docs/baselines.md).
    # SEEDS' Table 1 ran every local baseline at K=10 (SEEDS §4.1, §A.3): --env.candidates_per_search 10.
    paper_env: ClassVar[dict] = paper_limits(k=20, max_expand=20)
    threshold_n: float = 0.0  # tau = mean - n * std; 0: the plain per-query mean, the paper's default bar
    judge_scoring: str = "logprob"  # "logprob": log P(Yes) - log P(No); "parsed": +1 / -1 / 0 from the text
    judge_logprobs: str = "auto"  # "choice": one {Yes, No} call; "forced": a Yes call and a No call; auto: by backend
    predict_tokens: int = 32
    judge_tokens: int = 8  # the parsed judge (the log-prob judge decodes one token)
    answer_tokens: int = 32

    def __post_init__(self) -> None:
        require_choice("judge_scoring", self.judge_scoring, JUDGE_SCORINGS)
        require_choice("judge_logprobs", self.judge_logprobs, JUDGE_LOGPROBS)

    def llm_call_cap(self) -> int:
        """Room for the paper's K in the worst case: a prediction, two forced judge calls and a
        parsed fallback per candidate, and the answer (a larger K needs ``--method.max_llm_calls``)."""
        return max(DEFAULT_LLM_CALLS, 4 * self.paper_env["candidates_per_search"] + 8)

    def fixed_env(self) -> dict:
        """One search, one expand of the kept candidates, the answer."""
        return {"admission": "preview", "require_expand": True, "expand_form": "list", "max_searches": 1,
                "max_actions": 3}

    async def run(self, ctx: QuestionContext) -> None:
        """Search once, score every candidate (agents 1 and 2), open the kept ones, answer (agent 3)."""
        outcome = await ctx.search(ctx.question)
        hits = list(outcome.hits) if outcome.valid and outcome.observation.startswith("<snapshot>") else []
        ids = self.choice_ids(ctx)
        ctx.stats.update(judge_scoring="logprob" if ids else "parsed", threshold_n=self.threshold_n,
                         judge_logprobs=self.logprob_mode(ctx) if ids else None, filter_reads=len(hits))
        if not hits:
            ctx.stats.update(kept=[], threshold=None)
            ctx.note("main_rag_no_candidates")
            await answer_from(ctx, prompts.FINAL.format(docs="(no passages)", question=ctx.question),
                              max_tokens=self.answer_tokens)
            return
        assessed = await asyncio.gather(*(self.assess(ctx, hit, ids) for hit in hits))
        scores = [a.score for a in assessed]
        kept, tau = adaptive_filter(scores, self.threshold_n)
        limit = ctx.env.config.max_expand
        if len(kept) > limit:
            ctx.note("main_rag_expand_cap", kept=len(kept), opened=limit)
            kept = kept[:limit]
        ctx.stats.update(scores=scores, score_sources=[a.source for a in assessed], threshold=tau,
                         predictions=[a.answer for a in assessed], kept=[i + 1 for i in kept])
        if not kept:
            ctx.note("main_rag_nothing_kept")  # every judgement failed: the answer sees no document
        if ctx.done:
            return
        opened = await ctx.expand([i + 1 for i in kept])
        by_row = {hit.row: hit for hit in opened.shown} if opened.valid else {}
        docs = [by_row[hits[i].row] for i in kept if hits[i].row in by_row]  # as shown, in score order
        await answer_from(ctx, prompts.FINAL.format(docs=format_docs(docs), question=ctx.question),
                          max_tokens=self.answer_tokens)

    def choice_ids(self, ctx: QuestionContext) -> tuple[int, int] | None:
        """The Yes/No token ids of a log-prob judge; None (noted once) when it must parse instead."""
        if self.judge_scoring != "logprob":
            return None
        ids = yes_no_token_ids(ctx.tokenizer)
        if ids is None:
            reason = "no local tokenizer" if ctx.tokenizer is None else "Yes/No are not single distinct tokens"
            ctx.note("main_rag_logprob_unavailable", reason=reason, fallback="parsed")
        return ids

    def logprob_mode(self, ctx: QuestionContext) -> str:
        """``choice`` or ``forced`` (``auto``: forced on backends with full-vocabulary log-probs)."""
        if self.judge_logprobs != "auto":
            return self.judge_logprobs
        return "forced" if getattr(ctx.llm, "name", "") in FORCED_BACKENDS else "choice"

    async def assess(self, ctx: QuestionContext, hit: Hit, ids: tuple[int, int] | None) -> Assessment:
        """Agent 1 then agent 2 on one candidate."""
        result = await ctx.generate(chat(prompts.PREDICT.format(title=hit.title, text=hit.text, question=ctx.question)),
                                    stop=("\n\n",), max_tokens=self.predict_tokens, tag="predict")
        completion = result.completions[0]
        answer = extract_answer(completion.text)[0] if completion.finish_reason != "error" else ""
        if not answer:
            ctx.note("main_rag_no_prediction", row=hit.row, llm_error=completion.finish_reason == "error")
        prompt = chat(prompts.JUDGE.format(title=hit.title, text=hit.text, question=ctx.question,
                                           answer=answer or prompts.NO_ANSWER))
        if ids is None:
            return await self.parsed_judgement(ctx, hit, answer, prompt)
        if self.logprob_mode(ctx) == "forced":
            return await self.forced_judgement(ctx, hit, answer, prompt, ids)
        verdict = await ctx.generate(prompt, max_tokens=1, tag="judge", allowed_token_ids=ids)
        judged = verdict.completions[0]
        if judged.finish_reason == "error":
            ctx.note("main_rag_judge_error", row=hit.row)
            return Assessment(answer, None, "error")
        score = logprob_score(judged, ids)
        if score is not None:
            return Assessment(answer, score, "logprob")
        ctx.note("main_rag_logprob_missing", row=hit.row, output=judged.text)
        return self.parsed(ctx, hit, answer, judged)

    async def forced_judgement(self, ctx: QuestionContext, hit: Hit, answer: str, prompt: list[dict[str, str]],
                               ids: tuple[int, int]) -> Assessment:
        """log P(Yes) - log P(No) from a call forced to Yes and one forced to No (full-vocabulary
        log-probs); a parsed verdict when they carry none (missing, or both 0.0: renormalised)."""
        results = await asyncio.gather(*(ctx.generate(prompt, max_tokens=1, tag="judge", allowed_token_ids=(token,))
                                         for token in ids))
        forced = [r.completions[0] for r in results]
        if any(c.finish_reason == "error" for c in forced):
            ctx.note("main_rag_judge_error", row=hit.row)
            return Assessment(answer, None, "error")
        logprobs = [c.logprobs[0] if c.logprobs and c.token_ids[:1] == [token] else None
                    for c, token in zip(forced, ids)]
        known = [lp for lp in logprobs if lp is not None]
        if len(known) < len(logprobs) or any(math.isnan(lp) for lp in known):
            ctx.note("main_rag_logprob_missing", row=hit.row, output=[c.text for c in forced])
        elif known == [0.0, 0.0]:
            ctx.note("main_rag_forced_uninformative", row=hit.row)
        else:
            return Assessment(answer, known[0] - known[1], "logprob")
        return await self.parsed_judgement(ctx, hit, answer, prompt)

    async def parsed_judgement(self, ctx: QuestionContext, hit: Hit, answer: str,
                               prompt: list[dict[str, str]]) -> Assessment:
        """A free judge reply, parsed (:meth:`parsed`); an LLM error drops the candidate."""
        verdict = await ctx.generate(prompt, stop=("\n",), max_tokens=self.judge_tokens, tag="judge")
        judged = verdict.completions[0]
        if judged.finish_reason == "error":
            ctx.note("main_rag_judge_error", row=hit.row)
            return Assessment(answer, None, "error")
        return self.parsed(ctx, hit, answer, judged)

    @staticmethod
    def parsed(ctx: QuestionContext, hit: Hit, answer: str, judged: Completion) -> Assessment:
        """The fallback score of a judge reply: +1 yes, -1 no, 0 (noted) when it says neither."""
        verdict = parse_verdict(judged.text)
        if verdict is None:
            ctx.note("main_rag_judge_unparsed", row=hit.row, output=judged.text)
            return Assessment(answer, 0.0, "unparsed")
        return Assessment(answer, 1.0 if verdict else -1.0, "parsed")
