"""Run a method over many questions at once, batching LLM calls and retrievals across them.

Each question is one coroutine (the method's ``run``) with its own :class:`SearchEnv`; at most
``concurrency`` run at a time. A method that raises, or ends without answering, still yields a
prediction: scored 0, with the finish reason and the error in the record. No question is
dropped.
"""
from __future__ import annotations

import asyncio
import traceback
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from envs.config import EnvConfig
from envs.metrics import cover_em
from envs.search_env import SearchEnv
from envs.types import QAExample
from methods.base import Method
from methods.context import EpisodeOver, QuestionContext
from methods.env_batcher import EnvStepBatcher
from methods.llm import LLMBackend


def prediction_record(ctx: QuestionContext) -> dict[str, Any]:
    """One line of ``predictions.jsonl``: prediction, golds, metrics, evidence use, cost, trace."""
    episode = ctx.final_info or ctx.env.summary()
    return {
        "id": ctx.example.id,
        "question": ctx.example.question,
        "golden_answers": list(ctx.example.golden_answers),
        "prediction": episode["answer"],
        "metrics": episode["metrics"],
        "finish_reason": ctx.finish_reason or "no_answer",
        "n_searches": episode["n_searches"],
        "n_actions": episode["n_actions"],
        "n_invalid": episode["n_invalid"],
        "docs_read": episode["docs_read"],
        "doc_tokens": episode["doc_tokens"],
        "docs_shown": episode["docs_shown"],
        "positives_shown": episode["positives_shown"],
        "positives_opened": episode["positives_opened"],
        "negatives_opened": episode["negatives_opened"],
        "positives_missed": episode["positives_missed"],
        **{key: episode[key] for key in ("pages_fetched", "page_failures") if key in episode},  # live web
        "reward": episode["reward"]["total"],
        "reward_breakdown": episode["reward"],  # answer, selection, format (penalties), terminal, total
        "searches": episode["searches"],
        "search_rounds": ctx.search_rounds,
        "method_stats": ctx.stats,
        "llm_calls": ctx.llm_calls,
        "llm_prompt_tokens": ctx.prompt_tokens,
        "llm_completion_tokens": ctx.completion_tokens,
        "latency_s": round(ctx.elapsed(), 4),
        "trace": ctx.trace,
    }


async def run_question(method: Method, ctx: QuestionContext) -> dict[str, Any]:
    """Run one question to the end; never raises for method or model failures."""
    try:
        await method.run(ctx)
        if not ctx.done:
            await ctx.give_up("no_answer")
    except EpisodeOver as err:
        ctx.note("episode_over", message=str(err))
        if not ctx.done:
            await ctx.give_up("llm_call_limit")
    except Exception as err:  # a method bug or an unexpected backend failure: record, score 0
        ctx.trace.append({"type": "error", "error": f"{type(err).__name__}: {err}",
                          "traceback": traceback.format_exc(limit=6)})
        await ctx.give_up(f"error: {type(err).__name__}")
    record = prediction_record(ctx)
    normalization = getattr(method, "cover_em_normalization", "squad")  # SEEK: its paper's Cover-EM
    if normalization != "squad" and record["prediction"] is not None:
        record["metrics"] = {**record["metrics"],
                             "cover_em": cover_em(record["prediction"], record["golden_answers"], normalization)}
    return record


async def run_questions(
    method: Method,
    examples: Sequence[QAExample],
    llm: LLMBackend,
    retriever,
    env_config: EnvConfig | None = None,
    concurrency: int = 32,
    seed: int = 0,
    max_llm_calls: int | None = None,
    on_result: Callable[[dict], None] | None = None,
    env_tokenizer: Any = None,
    guided_actions: bool = False,
) -> list[dict]:
    """Predictions for ``examples`` (in input order); ``on_result`` sees each as it finishes.

    ``env_config``: the whole env to run in (its limits; the method's protocol settings replace
    the env's, :meth:`~methods.base.Method.fit_env`); None: the method's own paper env
    (:meth:`~methods.base.Method.env_config`).

    ``guided_actions``: every agent turn decodes only the method's action format
    (:meth:`Method.action_regex`; ValueError for a method without one).

    ``max_llm_calls``: per question (None: the method's :meth:`Method.llm_call_cap`, 64 for all but
    MAPS, which gets room for all its iterations).

    The env counts observation caps in ``env_tokenizer``'s tokens when given (a policy trained on
    these episodes), else in the backend's (:attr:`LLMBackend.count_tokenizer`: the ``openai``
    backend's ``tokenizer`` option), words when it has none."""
    config = method.fit_env(env_config) if env_config is not None else method.env_config()
    if max_llm_calls is None:
        max_llm_calls = method.llm_call_cap()
    tags = method.action_tags if guided_actions else ()
    if guided_actions and method.action_regex() is None:
        raise ValueError(f"method {method.name!r} declares no action format to guide (Method.action_tags)")
    steps = EnvStepBatcher(retriever)
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(example: QAExample) -> dict:
        question_seed = seed + zlib.crc32(example.id.encode()) % 2**31  # stable across resumed runs
        async with gate:
            env = SearchEnv(retriever, None, config,
                            tokenizer=env_tokenizer if env_tokenizer is not None else llm.count_tokenizer)
            env.reset(seed=question_seed, options={"example": example})
            ctx = QuestionContext(example, env, llm, steps, seed=question_seed, max_llm_calls=max_llm_calls,
                                  handle_thinking=method.handles_thinking, action_tags=tags,
                                  sampling=method.sampling())
            record = await run_question(method, ctx)
        if on_result is not None:
            on_result(record)
        return record

    return list(await asyncio.gather(*(one(ex) for ex in examples)))


def run_questions_sync(*args, **kwargs) -> list[dict]:
    """:func:`run_questions` from synchronous code."""
    return asyncio.run(run_questions(*args, **kwargs))
