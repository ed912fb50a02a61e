"""MAPS under broken model output and backend errors: every call falls back (noted), no question
is dropped; and the tolerant parsers of methods/maps_parsing.py."""
import pytest
from conftest import OverlapRetriever
from fake_llm import FakeLLM
from test_maps import (
    DIRECTIONS,
    ERROR,
    JUDGE,
    PLAN,
    QUESTION,
    REFINE,
    SUB_QUERY,
    ErrorAwareLLM,
    Script,
    notes,
    prompts_with,
    run,
    sub_query,
    tags,
)

from envs.config import EnvConfig
from methods.base import get
from methods.maps import MAPS
from methods.maps_parsing import (
    parse_directions,
    parse_judgement,
    parse_plan,
    parse_refinement,
    parse_sub_query,
    parse_sufficiency,
)
from methods.runner import run_questions_sync


def test_unusable_directions_search_the_question():
    (record,), _, retriever = run(Script(sufficient_after=1, plan="I am not sure what to do."))
    assert retriever.calls == [[QUESTION.question]]
    assert "maps_no_directions" in notes(record)
    assert "sub_query" not in tags(record)  # nothing to write a sub-query for
    assert record["method_stats"]["sub_queries"] == [1] and record["prediction"] == "Paris"


def test_sub_query_reply_without_a_query_searches_the_direction_and_question():
    (record,), _, retriever = run(Script(sufficient_after=1, query="Hmm.\nLet me think about this one."))
    assert retriever.calls == [[f"aim {j} {QUESTION.question}" for j in range(3)]]
    assert notes(record).count("maps_sub_query_fallback") == 3


def test_unlabelled_one_line_sub_query_is_used_and_noted():
    (record,), _, retriever = run(Script(sufficient_after=1, n=1, query="Eiffel Tower height"))
    assert retriever.calls == [["Eiffel Tower height"]] and "maps_sub_query_unlabelled" in notes(record)


def test_two_directions_writing_one_query_search_it_once():
    (record,), llm, retriever = run(Script(sufficient_after=1, query="query: capital of France"))
    assert retriever.calls == [["capital of France"]]
    assert notes(record).count("maps_duplicate_sub_query") == 2
    assert "Direction 1: aim 0 (search: capital of France)" in prompts_with(llm, REFINE)[0]


def test_garbage_judgement_counts_as_insufficient():
    (record,), _, retriever = run(Script(judge="Hmm, hard to say."), max_iterations=3)
    assert notes(record).count("maps_judgement_unclear") == 2
    stats = record["method_stats"]
    assert stats["stop"] == "max_iterations" and stats["judgements"] == [None, None]
    assert retriever.calls[2] == [sub_query(3, j) for j in range(3)]  # its directions are still searched
    assert record["prediction"] == "Paris"


def test_empty_refinement_keeps_the_state():
    (record,), llm, _ = run(Script(sufficient_after=1, refine=""))
    assert "maps_refine_empty" in notes(record)
    judging = prompts_with(llm, DIRECTIONS)[1]
    assert "1. (nothing new)" in judging and "(no reasoning yet)" in judging


def test_unlabelled_refinement_becomes_the_observation():
    (record,), llm, _ = run(Script(sufficient_after=1, refine="Paris is the capital of France."))
    assert "maps_refine_unlabelled" in notes(record)
    assert "1. Paris is the capital of France." in prompts_with(llm, DIRECTIONS)[1]


@pytest.mark.parametrize("failing", [DIRECTIONS, SUB_QUERY, REFINE])
def test_llm_error_mid_loop_answers_from_what_is_there(failing):
    script = Script(sufficient_after=None)

    def respond(prompt):
        return ERROR if failing in prompt else script(prompt)

    (record,), _, _ = run(respond, llm_class=ErrorAwareLLM)
    assert record["method_stats"]["stop"] == "llm_error"
    assert "llm_error" in notes(record)
    assert record["prediction"] == "Paris" and record["finish_reason"] == "answered"


@pytest.mark.parametrize("failing", [PLAN, JUDGE])
def test_single_call_llm_error_answers_from_what_is_there(failing):
    script = Script(sufficient_after=None)

    def respond(prompt):
        return ERROR if failing in prompt else script(prompt)

    (record,), _, _ = run(respond, llm_class=ErrorAwareLLM, variant="single_call")
    assert record["method_stats"]["stop"] == "llm_error" and record["finish_reason"] == "answered"


def test_llm_error_everywhere_gives_up_with_a_record():
    (record,), _, _ = run(lambda prompt: ERROR, llm_class=ErrorAwareLLM)
    assert record["id"] == "q0" and record["prediction"] is None
    assert record["finish_reason"] == "llm_error" and record["metrics"]["em"] == 0.0


@pytest.mark.parametrize("variant", ["full", "no_retrieval_direction", "no_parallel", "single_call"])
def test_garbage_everywhere_still_yields_a_prediction(variant):
    (record,), _, retriever = run(lambda prompt: "I am not sure what to do here", max_iterations=3, variant=variant)
    assert record["finish_reason"] == "answered" and record["metrics"]["em"] == 0.0
    assert retriever.calls == [[QUESTION.question]] * 3


def test_options_and_budget():
    with pytest.raises(ValueError, match="variant"):
        MAPS(variant="no_such_thing")
    with pytest.raises(ValueError, match="admission"):
        MAPS(admission="topk")
    with pytest.raises(ValueError, match="n_directions"):
        MAPS(n_directions=0)
    config = MAPS().env_config()
    assert config.max_searches == 30 and config.candidates_per_search == 5 and config.admission == "prefix"
    assert MAPS(admission="preview", n_directions=2).env_config().max_searches == 20
    assert MAPS().calls_per_iteration() == 5 and MAPS(admission="preview").calls_per_iteration() == 8
    assert MAPS(variant="single_call").calls_per_iteration() == 3
    assert MAPS(variant="no_retrieval_direction").calls_per_iteration() == 2


def test_call_budget_counts_the_sub_query_calls():
    llm = FakeLLM(Script(sufficient_after=None, n=3))
    records = run_questions_sync(get("maps", n_directions=2), [QUESTION], llm, OverlapRetriever(), EnvConfig(),
                                 max_llm_calls=8)
    (record,) = records
    # an iteration of two directions needs 4 calls; a second one would leave none for the answer
    assert tags(record) == ["directions", "sub_query", "sub_query", "refine", "answer"]
    assert record["method_stats"]["stop"] == "llm_call_budget"


def test_parse_directions_is_tolerant_and_capped():
    text = ("Sufficient: no\n"
            "Direction 1: **the director of Film A**\n"
            "direction: The director of film A!\n"
            "- birth date of that director | query: ignored\n"
            "2. the river\n"
            "direction: <what to find out>\n"
            "3. (nothing new)\n"
            "Some prose that is not a direction.\n")
    assert parse_directions(text, limit=10) == ["the director of Film A", "birth date of that director", "the river"]
    assert parse_directions(text, limit=2) == ["the director of Film A", "birth date of that director"]
    assert parse_directions("I have no idea.", limit=3) == []


def test_parse_sub_query_forms():
    assert parse_sub_query("Reasoning: we need X.\nQuery: capital of France") == ("capital of France", "label")
    assert parse_sub_query("**Sub-query:** \"Seine river\"") == ("Seine river", "label")
    assert parse_sub_query("<search>Mount Fuji height</search>") == ("Mount Fuji height", "tag")
    assert parse_sub_query("Reasoning: one line.\nEiffel Tower height") == ("Eiffel Tower height", "line")
    assert parse_sub_query("query: <search query>") == ("", "none")
    assert parse_sub_query("first line\nsecond line") == ("", "none")
    assert parse_sub_query(" ".join(["word"] * 40)) == ("", "none")
    assert parse_sub_query("query: " + " ".join(["w"] * 40))[0] == " ".join(["w"] * 32)


def test_parse_sufficiency():
    assert parse_sufficiency("Sufficient: yes") == "sufficient"
    assert parse_sufficiency("**Sufficient:** no\ndirection: x") == "insufficient"
    assert parse_sufficiency("Insufficient.\ndirection: x") == "insufficient"
    assert parse_sufficiency("The knowledge is enough.") == "sufficient"
    assert parse_sufficiency("direction: whether the knowledge is sufficient") is None
    assert parse_sufficiency("- the river\n- the city") is None
    assert parse_sufficiency("") is None and parse_sufficiency("maybe") is None


def test_parse_plan_is_tolerant_and_capped():
    text = ("Direction 1: the capital | Query: capital of France\n"
            "direction: the capital again | query: Capital of France!\n"
            "direction: the river\nquery: Seine river\n"
            "- currency | euro France\n"
            "2. Mount Fuji\n"
            "query: <search query>\n"
            "direction: only a direction\n")
    searches = parse_plan(text, limit=10)
    assert [(s.direction, s.query) for s in searches] == [
        ("the capital", "capital of France"), ("the river", "Seine river"), ("currency", "euro France"),
        (None, "Mount Fuji"), ("only a direction", "only a direction")]
    assert len(parse_plan(text, limit=2)) == 2
    assert parse_plan("I have no idea.", limit=3) == []
    assert [s.query for s in parse_plan("Sufficient: no\nquery: a b\nquery: c d", limit=3)] == ["a b", "c d"]


def test_parse_refinement_and_judgement():
    labelled = "**Observation:** Paris is the capital.\n**State:** done"
    assert parse_refinement(labelled) == ("Paris is the capital.", "done")
    assert parse_refinement("Observation: x") == ("x", None)
    assert parse_refinement("no labels") == (None, None)
    assert parse_judgement("Sufficient.") == "sufficient"
    assert parse_judgement("The knowledge is not sufficient yet") == "insufficient"
    assert parse_judgement("Insufficient") == "insufficient"
    assert parse_judgement("Yes, we can answer") == "sufficient"
    assert parse_judgement("maybe") is None
