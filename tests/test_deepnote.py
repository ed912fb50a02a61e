"""DeepNote driven through the env by a scripted LLM: the note is replaced only when the model says
the new one is better, the loop stops on rejected updates, at the step cap and at the document
budget, only new documents are read (and counted), and bad output is recorded, never raised."""
import json

import pytest
from conftest import OverlapRetriever
from fake_llm import FakeLLM
from test_evaluate import setup  # noqa: F401  (the evaluation fixture)

import methods
from envs.types import QAExample
from methods.deepnote import DeepNote, parse_queries
from methods.llm import Completion
from methods.prompts import deepnote as prompts
from methods.runner import run_questions_sync

QUESTION = QAExample("q0", "What is the capital of France?", ("Paris",), positive_ids=("p0",))
# Each step's two new questions; with the question appended, K=5 finds new documents every step.
QUERIES = ["Mount Fuji\nJapan", "Danube\nVienna Austria river", "Spree\nGermany", "euro\ncurrency"]
# What the overlap retriever shows (K=5) for the question and for each step's search, rank order.
FIRST_READ = ["Paris", "France", "Berlin", "Tokyo", "Euro"]


def kind(prompt: str) -> str:
    if "Is note B better than note A?" in prompt:
        return "compare"
    if "Improved note:" in prompt:
        return "refine"
    if "new search questions" in prompt:
        return "queries"
    if "write a note that keeps every fact" in prompt:
        return "init"
    if "Note taken while researching" in prompt:
        return "answer"
    raise AssertionError(prompt[:200])


class Script:
    """Notes NOTE-0 (init), NOTE-1, NOTE-2, ... (each refine); the given verdicts in order (the last
    repeats); QUERIES in order; Paris as the answer. Keeps every prompt by kind."""

    def __init__(self, verdicts=("yes",), queries=QUERIES, init="NOTE-0", answer="Paris"):
        self.verdicts, self.queries, self.init, self.answer = list(verdicts), list(queries), init, answer
        self.prompts: dict[str, list[str]] = {}

    def __call__(self, prompt: str) -> str:
        what = kind(prompt)
        seen = self.prompts.setdefault(what, [])
        seen.append(prompt)
        n = len(seen) - 1
        if what == "init":
            return self.init
        if what == "refine":
            return f"NOTE-{n + 1}"
        if what == "compare":
            return self.verdicts[min(n, len(self.verdicts) - 1)]
        if what == "queries":
            return self.queries[min(n, len(self.queries) - 1)]
        return self.answer


def run(script, llm_class=FakeLLM, env=None, **options):
    method = DeepNote(**options)
    (record,) = run_questions_sync(method, [QUESTION], llm_class(script), OverlapRetriever(),
                                   method.env_config(env or {}))
    return record


def tags(record) -> list[str]:
    return [e["tag"] for e in record["trace"] if e["type"] == "llm"]


def notes(record) -> list[str]:
    return [e["kind"] for e in record["trace"] if e["type"] == "note"]


def opened_titles(record) -> list[list[str]]:
    return [[s["titles"][i - 1] for i in s["expanded"]] for s in record["searches"]]


def test_note_is_replaced_only_when_the_model_says_better():
    script = Script(verdicts=["yes", "no", "yes"])
    record = run(script)
    stats = record["method_stats"]
    assert stats["verdicts"] == [True, False, True] and stats["replaced"] == 2
    assert stats["steps"] == 3 and stats["stop"] == "max_steps"
    assert tags(record) == ["init"] + ["queries", "refine", "compare"] * 3 + ["answer"]
    refine = script.prompts["refine"]
    assert "NOTE-0" in refine[0]  # step 1 refines the first note
    assert "NOTE-1" in refine[1]  # accepted: step 2 refines NOTE-1
    assert "NOTE-1" in refine[2] and "NOTE-2" not in refine[2]  # NOTE-2 was rejected: NOTE-1 stays best
    compare = script.prompts["compare"]
    assert "Note A:\nNOTE-1" in compare[2] and "Note B:\nNOTE-3" in compare[2]
    (answer,) = script.prompts["answer"]
    assert "NOTE-3" in answer and "NOTE-2" not in answer  # the answer reads the best note only
    assert "(Title: " not in answer
    assert record["prediction"] == "Paris" and record["metrics"]["em"] == 1.0


def test_every_rejection_keeps_the_first_note():
    script = Script(verdicts=["no"])
    record = run(script, max_fail_steps=5)
    assert record["method_stats"]["verdicts"] == [False] * 3 and record["method_stats"]["replaced"] == 0
    assert all("NOTE-0" in p for p in script.prompts["refine"])
    assert "NOTE-0" in script.prompts["answer"][0]


@pytest.mark.parametrize("max_fail_steps, steps", [(1, 1), (2, 2)])
def test_stops_after_max_fail_steps_rejections(max_fail_steps, steps):
    script = Script(verdicts=["no"])
    record = run(script, max_fail_steps=max_fail_steps)
    stats = record["method_stats"]
    assert stats["stop"] == "no_improvement" and stats["steps"] == steps and stats["verdicts"] == [False] * steps
    assert record["n_searches"] == steps + 1 and len(script.prompts["compare"]) == steps
    assert tags(record)[-1] == "answer" and record["prediction"] == "Paris"


def test_rejections_count_in_all_not_in_a_row():
    record = run(Script(verdicts=["no", "yes", "no"]), max_steps=4)
    assert record["method_stats"]["verdicts"] == [False, True, False]
    assert record["method_stats"]["stop"] == "no_improvement" and record["method_stats"]["steps"] == 3


@pytest.mark.parametrize("max_steps", [0, 1, 2])
def test_stops_at_the_step_cap(max_steps):
    script = Script(verdicts=["yes"])
    record = run(script, max_steps=max_steps)
    stats = record["method_stats"]
    assert stats["steps"] == max_steps and stats["stop"] == "max_steps" and stats["verdicts"] == [True] * max_steps
    assert record["n_searches"] == max_steps + 1 == len(record["searches"])
    assert len(script.prompts.get("compare", [])) == max_steps
    config = DeepNote(max_steps=max_steps).env_config()
    assert (config.max_searches, config.max_actions, config.admission) == (max_steps + 1, 2 * max_steps + 3, "preview")


def test_searches_use_the_new_questions_with_the_question():
    script = Script(verdicts=["yes"])
    record = run(script, max_steps=2)
    assert [s["query"] for s in record["searches"]] == [
        QUESTION.question, f"Mount Fuji Japan {QUESTION.question}", f"Danube Vienna Austria river {QUESTION.question}"]
    asked = script.prompts["queries"]
    assert "Questions already asked: (none)" in asked[0]
    assert "Questions already asked: Mount Fuji; Japan" in asked[1] and "NOTE-1" in asked[1]


def test_only_new_documents_are_read_and_counted():
    script = Script(verdicts=["yes"])
    record = run(script)
    opened = opened_titles(record)
    # the searches also return Paris, Tokyo, France, Berlin and Euro again: they are not reopened
    assert opened == [FIRST_READ, ["Mount Fuji"], ["Vienna", "Danube"], ["Spree"]]
    flat = [t for step in opened for t in step]
    assert len(flat) == len(set(flat))  # no document opened twice
    for step in opened[1:]:
        assert step and not set(step) & set(FIRST_READ)
    assert record["docs_read"] == len(flat) == record["method_stats"]["docs_folded"]
    # each refine sees exactly the documents its search opened
    for prompt, titles in zip(script.prompts["refine"], opened[1:]):
        assert prompt.count("(Title: ") == len(titles) and all(f"(Title: {t})" in prompt for t in titles)
    init = script.prompts["init"][0]
    assert all(f"(Title: {t})" in init for t in FIRST_READ) and init.count("(Title: ") == 5
    assert record["positives_opened"] == 1 and record["negatives_opened"] == len(flat) - 1


def test_a_search_with_nothing_new_counts_as_a_rejected_step():
    script = Script(verdicts=["yes"], queries=["capital\nFrance"])  # finds the first five again
    record = run(script)
    assert opened_titles(record)[1] == [] and "deepnote_no_new_documents" in notes(record)
    assert record["method_stats"]["verdicts"] == [False, False] and record["method_stats"]["stop"] == "no_improvement"
    assert "refine" not in script.prompts and record["docs_read"] == 5


def test_the_document_budget_caps_reads_and_ends_the_loop():
    script = Script(verdicts=["yes"])
    record = run(script, max_docs=7)
    assert opened_titles(record) == [FIRST_READ, ["Mount Fuji"], ["Vienna"]]  # Danube is past the budget
    assert record["docs_read"] == 7 and record["method_stats"]["stop"] == "max_docs"
    assert record["method_stats"]["steps"] == 2 and record["n_searches"] == 3


def test_bad_outputs_are_recorded():
    script = Script(verdicts=["maybe"], init="   ")
    record = run(script)
    assert "deepnote_empty_note" in notes(record) and prompts.EMPTY_NOTE in script.prompts["queries"][0]
    assert notes(record).count("deepnote_compare_unparsed") == 2  # unclear: the old note is kept
    assert record["method_stats"]["verdicts"] == [False, False] and record["finish_reason"] == "answered"
    assert prompts.EMPTY_NOTE in script.prompts["refine"][1] and "NOTE-1" not in script.prompts["refine"][1]
    assert "NOTE-" not in script.prompts["answer"][0]  # neither unclear update was taken
    record = run(Script(queries=["   \n- \n"]))
    assert record["method_stats"]["stop"] == "no_query" and "deepnote_no_query" in notes(record)
    assert record["n_searches"] == 1 and record["prediction"] == "Paris"
    record = run(lambda prompt: "I am not sure what to do here")
    assert record["finish_reason"] == "answered" and record["metrics"]["em"] == 0.0


class FailingLLM(FakeLLM):
    """Answers ``<<error>>`` replies with an error completion, like a backend that failed a request."""

    def generate(self, requests):
        results = super().generate(requests)
        for result in results:
            if result.completions[0].text == "<<error>>":
                result.completions[0] = Completion("", finish_reason="error", error="boom")
        return results


def test_llm_errors_end_the_loop_or_the_question_with_a_reason():
    script = Script(verdicts=["yes", "<<error>>"])
    record = run(script, FailingLLM)
    assert record["method_stats"]["stop"] == "llm_error" and record["prediction"] == "Paris"
    assert "NOTE-1" in script.prompts["answer"][0]  # the best note before the failure
    record = run(Script(init="<<error>>"), FailingLLM)
    assert record["finish_reason"] == "llm_error" and record["prediction"] is None


def test_parse_queries():
    assert parse_queries("1. Who built it?\n2) When?\n- Where\n", 2) == ["Who built it?", "When?"]
    assert parse_queries('Question 1: "A B"\nQ2: C\nC\n', 3) == ["A B", "C"]
    assert parse_queries("<search>x y</search>\nnone", 2) == ["x y"]
    assert parse_queries("\n\n", 2) == []


def test_options_and_registry():
    with pytest.raises(ValueError, match="max_fail_steps"):
        DeepNote(max_fail_steps=0)
    with pytest.raises(ValueError, match="max_steps"):
        DeepNote(max_steps=-1)
    config = DeepNote().env_config()
    assert (config.candidates_per_search, config.max_expand, config.max_searches) == (5, 5, 4)
    method = methods.get("deepnote", max_steps=2, queries_per_step=3)
    assert method.options()["queries_per_step"] == 3 and method.name == "deepnote"


def test_evaluate_runs_deepnote_from_the_command_line(setup):  # noqa: F811
    from test_evaluate import argv

    from inference import evaluate as ev
    from inference.predictions import load_predictions

    assert ev.main(argv(setup, "deepnote", "--method.budget", "paper", "--method.options.max_steps", "2")) == 0
    records = load_predictions(setup["out"] / "predictions.jsonl")
    assert len(records) == 3 and all(r["n_searches"] <= 3 for r in records)
    assert all(r["docs_read"] == r["method_stats"]["docs_folded"] for r in records)
    config = json.loads((setup["out"] / "config.json").read_text())
    assert config["method"] == "deepnote" and config["method_options"]["note_tokens"] == 1280
    assert config["env"]["max_searches"] == 3
