"""KAIR driven through the env by a scripted LLM: the sufficiency-gated loop, what each step and
the final answer see, the ablation variants, the index formats, repairs and preview admission."""
import dataclasses

import pytest
from conftest import OverlapRetriever
from fake_llm import FakeLLM

import methods.kair  # noqa: F401  (registers "kair")
from envs.config import EnvConfig
from envs.types import QAExample
from methods.base import get
from methods.kair import KAIR, parse_step
from methods.llm import Completion
from methods.prompts import kair as prompts
from methods.runner import run_questions_sync

QUESTION = QAExample("q0", "What is the capital of France?", ("Paris",), positive_ids=("p0",))
# With k=3 and the overlap retriever: the question reads Paris, France, Berlin; the first query
# Mount Fuji, Tokyo, Japan; the second Vienna, Danube and Paris again (8 distinct passages).
QUERIES = ["Mount Fuji Japan Tokyo", "Danube Vienna Austria river", "euro currency", "Spree Berlin"]


def step_reply(step: int, judgement: str | None, query: str | None, index: bool = True) -> str:
    parts = [f"<index>\nKeywords:\n- IDX-{step}\n</index>"] if index else []
    parts.append(f"<think>Reasoning {step}.</think>")
    if judgement:
        parts.append(f"<judgement>{judgement}</judgement>")
    if query:
        parts.append(f"<next_query>{query}</next_query>")
    return "\n".join(parts)


def kind(prompt: str) -> str:
    """Which KAIR call (or admission call) a rendered prompt belongs to."""
    if "is missing some required parts" in prompt:
        return "repair"
    if "Build a knowledge index from all the documents" in prompt:
        return "build"
    if "with the answer only" in prompt:
        return "answer"
    if "Reply with the numbers to open" in prompt:
        return "select"
    if "Write these parts, in this order" in prompt:
        return "next" if "Your previous notes:" in prompt else "first"
    raise AssertionError(f"unexpected prompt: {prompt[:200]}")


class Script:
    """Step replies in order (the last one repeats); fixed replies for the other calls."""

    def __init__(self, steps, repair="I cannot say.", select="1", answer="Paris"):
        self.steps, self.repair, self.select, self.answer = list(steps), repair, select, answer
        self.by_kind: dict[str, list[str]] = {}
        self.n_steps = 0

    def __call__(self, prompt: str) -> str:
        what = kind(prompt)
        self.by_kind.setdefault(what, []).append(prompt)
        if what in ("first", "next"):
            self.by_kind.setdefault("step", []).append(prompt)
            reply = self.steps[min(self.n_steps, len(self.steps) - 1)]
            self.n_steps += 1
            return reply
        if what == "build":
            return "<index>\nKeywords:\n- BUILT-INDEX\n</index>"
        return {"repair": self.repair, "select": self.select, "answer": self.answer}[what]


def always_insufficient(index: bool = True) -> list[str]:
    return [step_reply(i, "insufficient", QUERIES[i], index) for i in range(4)]


def run(script, example=QUESTION, k=None, **options):
    llm = FakeLLM(script)
    method = KAIR(**options)
    env = method.env_config({"candidates_per_search": k, "max_expand": k} if k else {})
    (record,) = run_questions_sync(method, [example], llm, OverlapRetriever(), env)
    return record


def tags(record) -> list[str]:
    return [e["tag"] for e in record["trace"] if e["type"] == "llm"]


def notes(record) -> list[str]:
    return [e["kind"] for e in record["trace"] if e["type"] == "note"]


def test_stops_at_the_first_sufficient_judgement():
    script = Script([step_reply(0, "sufficient", None)])
    record = run(script)
    assert record["prediction"] == "Paris" and record["metrics"]["em"] == 1.0
    assert record["n_searches"] == 1 and record["docs_read"] == 5
    assert tags(record) == ["step", "answer"]
    stats = record["method_stats"]
    assert stats["steps"] == 1 and stats["stop"] == "sufficient" and stats["repairs"] == 0
    assert stats["variant"] == "full" and stats["index_format"] == "keywords_relations"


def test_runs_at_most_max_steps_when_always_insufficient():
    record = run(Script(always_insufficient()))
    assert record["n_searches"] == 4 and record["method_stats"]["steps"] == 4
    assert record["method_stats"]["stop"] == "max_steps"
    assert tags(record) == ["step"] * 4 + ["answer"]  # the 4th step still updates the index
    assert [s["query"] for s in record["searches"]] == [QUESTION.question] + QUERIES[:3]
    assert record["prediction"] == "Paris"


def test_each_step_sees_only_new_documents_and_its_previous_notes():
    script = Script([step_reply(0, "insufficient", QUERIES[0]), step_reply(1, "insufficient", QUERIES[1]),
                     step_reply(2, "sufficient", None)])
    record = run(script, k=3)
    assert record["method_stats"]["steps"] == 3 and record["method_stats"]["stop"] == "sufficient"
    first, second, third = script.by_kind["step"]
    assert "Title: Paris" in first and "Your previous notes" not in first
    assert all(f"Title: {t}" in second for t in ("Mount Fuji", "Tokyo", "Japan"))
    assert "Title: Paris" not in second and "Title: Berlin" not in second  # older documents stay out
    assert "IDX-0" in second and QUERIES[0] in second and "Reasoning 0." in second
    assert prompts.CARRY_INDEX.strip() in second
    assert all(f"Title: {t}" in third for t in ("Vienna", "Danube", "Paris")) and "Title: Mount Fuji" not in third
    assert "IDX-1" in third and "IDX-0" not in third  # only the previous step's output
    (answer,) = script.by_kind["answer"]
    assert answer.count("(Title: ") == 8 and answer.count("(Title: Paris)") == 1  # all docs, deduplicated
    assert "IDX-2" in answer and "IDX-1" not in answer  # the final index
    assert answer.index("Knowledge index") < answer.index("Documents:")


@pytest.mark.parametrize("variant, step_calls, answer_has_index, answer_has_docs, loop_has_index", [
    ("full", 4, True, True, True),
    ("qa_with_docs_only", 3, False, True, True),
    ("qa_with_index_only", 4, True, False, True),
    ("no_index", 3, False, True, False),
    ("no_evolving", 3, True, True, False),
])
def test_variants(variant, step_calls, answer_has_index, answer_has_docs, loop_has_index):
    script = Script(always_insufficient(index=loop_has_index))
    record = run(script, variant=variant)
    assert record["method_stats"]["variant"] == variant and record["n_searches"] == 4
    assert record["prediction"] == "Paris"
    expected = ["step"] * step_calls + (["build_index"] if variant == "no_evolving" else []) + ["answer"]
    assert tags(record) == expected  # the last step call is skipped when its notes feed nothing
    assert all(("<index>" in p) == loop_has_index for p in script.by_kind["step"])
    (answer,) = script.by_kind["answer"]
    assert ("Knowledge index" in answer) == answer_has_index
    assert ("(Title: " in answer) == answer_has_docs
    if variant == "no_evolving":
        (build,) = script.by_kind["build"]
        assert build.count("(Title: ") == answer.count("(Title: ") == record["docs_read"]  # all documents
        assert "BUILT-INDEX" in answer and "IDX-" not in answer
    elif answer_has_index:
        assert "IDX-3" in answer


def test_no_index_notes_carry_reasoning_and_query():
    script = Script([step_reply(0, "insufficient", QUERIES[0], index=False), step_reply(1, "sufficient", None, False)])
    record = run(script, variant="no_index", k=3)
    second = script.by_kind["step"][1]
    assert "Reasoning 0." in second and QUERIES[0] in second and "<index>" not in second
    assert record["method_stats"]["stop"] == "sufficient"


@pytest.mark.parametrize("index_format", sorted(prompts.INDEX_FORMATS))
def test_each_index_format_has_its_own_instruction(index_format):
    script = Script([step_reply(0, "insufficient", QUERIES[0]), step_reply(1, "sufficient", None)])
    record = run(script, index_format=index_format)
    assert record["method_stats"]["index_format"] == index_format
    for prompt in script.by_kind["step"]:
        assert prompts.INDEX_FORMATS[index_format] in prompt
        assert not any(text in prompt for name, text in prompts.INDEX_FORMATS.items() if name != index_format)
    build = Script([step_reply(0, "sufficient", None, index=False)])
    run(build, variant="no_evolving", index_format=index_format)
    assert prompts.INDEX_FORMATS[index_format] in build.by_kind["build"][0]


def test_broken_step_gets_one_repair_then_ends_with_a_recorded_reason():
    script = Script(["<index>Keywords:\n- Paris</index><think>Not sure.</think>"], repair="no idea")
    record = run(script)
    assert tags(record) == ["step", "repair", "answer"]
    (repair,) = script.by_kind["repair"]
    assert "<judgement>" in repair and "<next_query>" in repair and "Not sure." in repair
    assert record["method_stats"]["repairs"] == 1 and record["method_stats"]["stop"] == "no_query"
    assert {"kair_step_format", "kair_repair_failed", "kair_stop"} <= set(notes(record))
    assert record["prediction"] == "Paris" and record["finish_reason"] == "answered"


def test_repair_supplies_the_missing_parts_and_the_loop_goes_on():
    script = Script(["<index>Keywords:\n- Paris</index><think>Need more.</think>", step_reply(1, "sufficient", None)],
                    repair=f"<judgement>insufficient</judgement><next_query>{QUERIES[0]}</next_query>")
    record = run(script, k=3)
    assert tags(record) == ["step", "repair", "step", "answer"]
    assert record["searches"][1]["query"] == QUERIES[0]
    assert "- Paris" in script.by_kind["step"][1]  # the first output's index is kept
    assert record["method_stats"]["stop"] == "sufficient" and record["method_stats"]["repairs"] == 1


def test_missing_judgement_with_a_query_continues_and_missing_index_is_carried():
    script = Script([step_reply(0, "insufficient", QUERIES[0]), f"<think>More.</think><next_query>{QUERIES[1]}",
                     step_reply(2, "sufficient", None)])
    record = run(script, k=3)
    assert tags(record) == ["step", "step", "repair", "step", "answer"]
    assert "<index>" in script.by_kind["repair"][0] and "<judgement>" in script.by_kind["repair"][0]
    assert record["searches"][2]["query"] == QUERIES[1]  # unclosed tag read to the end
    assert "IDX-0" in script.by_kind["step"][2]  # the old index carried into the next step
    assert {"kair_index_carried", "kair_judgement_missing"} <= set(notes(record))


def test_preview_admission_reads_only_the_opened_candidates():
    script = Script([step_reply(0, "insufficient", QUERIES[0]), step_reply(1, "sufficient", None)], select="2")
    record = run(script, admission="preview", k=3)
    kinds = [e["kind"] for e in record["trace"] if e["type"] == "env"]
    assert kinds == ["search", "expand", "search", "expand", "answer"]
    assert all(p.count("(Title: ") == 1 for p in script.by_kind["step"])
    assert script.by_kind["answer"][0].count("(Title: ") == 2 and record["docs_read"] == 2
    assert [s["expanded_ranks"] for s in record["searches"]] == [[2], [2]]
    assert "find the missing piece: " + QUERIES[0] in script.by_kind["select"][1]


class FailingLLM(FakeLLM):
    """Answers ``<<error>>`` replies with an error completion, like a backend that failed a request."""

    def generate(self, requests):
        results = super().generate(requests)
        for result in results:
            if result.completions[0].text == "<<error>>":
                result.completions[0] = Completion("", finish_reason="error", error="boom")
        return results


def test_llm_error_in_a_step_falls_back_to_answering():
    script = Script([step_reply(0, "insufficient", QUERIES[0]), "<<error>>"])
    (record,) = run_questions_sync(KAIR(), [QUESTION], FailingLLM(script), OverlapRetriever(), EnvConfig())
    assert record["method_stats"]["stop"] == "llm_error" and record["prediction"] == "Paris"
    assert "IDX-0" in script.by_kind["answer"][0]  # the last good index is used
    script = Script([step_reply(0, "sufficient", None)], answer="<<error>>")
    (record,) = run_questions_sync(KAIR(), [QUESTION], FailingLLM(script), OverlapRetriever(), EnvConfig())
    assert record["finish_reason"] == "llm_error" and record["prediction"] is None


def test_garbage_output_still_yields_a_record():
    record = run(lambda prompt: "I am not sure what to do here")
    assert record["id"] == "q0" and record["finish_reason"] == "answered"
    assert record["method_stats"]["stop"] == "no_query" and record["method_stats"]["repairs"] == 1


def test_parse_step_is_tolerant():
    notes_ = parse_step("<INDEX>Keywords:\n- A\n<Think>why</think>\n<Judgment>Insufficient.</Judgment>"
                        "<next_query>\n\"who founded A\"\nextra")
    assert notes_.index == "Keywords:\n- A" and notes_.reasoning == "why"
    assert notes_.judgement == "insufficient" and notes_.query == "who founded A"
    assert parse_step("<judgement>not sufficient</judgement><next_query>none</next_query>").query is None
    assert parse_step("<judgement>sufficient</judgement>").judgement == "sufficient"
    assert parse_step("<judgement>maybe</judgement>").judgement is None
    assert parse_step("Judgement: sufficient").judgement == "sufficient"


def test_options_and_env():
    with pytest.raises(ValueError, match="variant"):
        KAIR(variant="w/o everything")
    with pytest.raises(ValueError, match="index_format"):
        KAIR(index_format="graph")
    with pytest.raises(ValueError, match="admission"):
        KAIR(admission="topk")
    config = KAIR().env_config()
    assert (config.candidates_per_search, config.max_searches, config.admission, config.max_actions) == (
        5, 4, "prefix", 5)
    assert KAIR(admission="preview").env_config().max_actions == 9
    method = get("kair", variant="no_index", max_steps=3)
    assert method.options()["variant"] == "no_index" and dataclasses.is_dataclass(method)
