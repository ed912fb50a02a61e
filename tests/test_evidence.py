"""Batched retrieval of several queries and evidence admission (prefix / preview) for the
prompted iterative methods, driven through the env by a scripted LLM."""
import asyncio

import pytest
from conftest import OverlapRetriever
from fake_llm import FakeLLM

from envs.config import EnvConfig
from envs.search_env import SearchEnv
from envs.types import QAExample
from methods.context import QuestionContext
from methods.env_batcher import EnvStepBatcher
from methods.evidence import admission_protocol, gather_evidence, parse_selection

QUESTION = QAExample("q0", "What is the capital of France?", ("Paris",), positive_ids=("p0",))


def contexts(n, admission, respond, retriever):
    llm = FakeLLM(respond)
    config = EnvConfig(candidates_per_search=3, max_expand=3, **admission_protocol(admission, max_searches=4))
    steps = EnvStepBatcher(retriever)
    out = []
    for i in range(n):
        example = QAExample(f"q{i}", QUESTION.question, QUESTION.golden_answers, QUESTION.positive_ids)
        env = SearchEnv(retriever, None, config)
        env.reset(seed=i, options={"example": example})
        out.append(QuestionContext(example, env, llm, steps))
    return out, llm


def test_parse_selection():
    assert parse_selection("Open 2 and 3, maybe 2 again", 3) == [2, 3]
    assert parse_selection("none of them", 3) == []
    assert parse_selection("candidate 9", 3) is None
    assert parse_selection("I am not sure", 3) is None


def test_parallel_queries_of_several_questions_make_one_retrieval_call():
    retriever = OverlapRetriever()
    ctxs, _ = contexts(2, "prefix", lambda p: "", retriever)
    queries = ["capital of France", "river Seine", "euro currency"]

    async def go():
        return await asyncio.gather(*(gather_evidence(c, queries, "prefix") for c in ctxs))

    results = asyncio.run(go())
    assert len(retriever.calls) == 1 and len(retriever.calls[0]) == 6  # 2 questions x 3 sub-queries
    for ctx, read in zip(ctxs, results):
        assert [len(r) for r in read] == [3, 3, 3]
        assert read[0][0].title in {"Paris", "France"}
        assert ctx.search_rounds == [[0, 1, 2]]
        assert ctx.env.episode.n_searches == 3
        assert ctx.env.summary()["docs_read"] == len({h.row for r in read for h in r})


def test_preview_admission_opens_only_the_chosen_candidates():
    retriever = OverlapRetriever()
    replies = iter(["2", "none", "gibberish"])
    ctxs, llm = contexts(1, "preview", lambda p: next(replies), retriever)
    (ctx,) = ctxs

    read = asyncio.run(gather_evidence(ctx, ["capital of France", "Mount Fuji", "Danube river"], "preview",
                                       purposes=["the capital", "a mountain", "a river"]))
    assert len(retriever.calls) == 1
    assert [len(r) for r in read] == [1, 0, 1]  # chose 2; none; unusable reply -> the first candidate
    assert any(e.get("kind") == "selection_fallback" for e in ctx.trace if e["type"] == "note")
    assert "Current purpose: a mountain" in llm.prompts[1]
    kinds = [e["kind"] for e in ctx.trace if e["type"] == "env"]
    assert kinds == ["search", "expand"] * 3
    assert ctx.env.summary()["docs_read"] == 2


def test_refused_search_yields_no_passages_and_no_crash():
    retriever = OverlapRetriever()
    ctxs, _ = contexts(1, "prefix", lambda p: "", retriever)
    (ctx,) = ctxs
    read = asyncio.run(gather_evidence(ctx, [f"query {i}" for i in range(6)], "prefix"))
    assert [len(r) for r in read][:4] == [3] * 4 and read[4] == [] and read[5] == []  # max_searches=4
    assert ctx.env.episode.n_invalid == 0 and not ctx.done  # the answer action is still available
    assert any(e.get("kind") == "search_budget" for e in ctx.trace if e["type"] == "note")
    assert len(retriever.calls) == 1 and len(retriever.calls[0]) == 4


def test_admission_protocol_budget():
    with pytest.raises(ValueError):
        admission_protocol("topk", 4)
    assert admission_protocol("preview", 4)["max_actions"] == 9
    assert admission_protocol("prefix", 4)["max_actions"] == 5
