"""MAPS driven through the env by a scripted LLM: parallel sub-queries in one retrieval call,
disentangled memory, stopping, the ablations, preview admission and broken model output."""
import pytest
from conftest import OverlapRetriever
from fake_llm import FakeLLM

import methods.maps  # noqa: F401  (registers "maps")
from envs.config import EnvConfig
from envs.types import QAExample
from methods.base import get
from methods.llm import Completion
from methods.maps import MAPS, parse_judgement, parse_plan, parse_refinement
from methods.runner import run_questions_sync

QUESTION = QAExample("q0", "What is the capital of France?", ("Paris",), positive_ids=("p0",))
ERROR = "<<llm error>>"

# Marker phrases of the MAPS prompts (methods/prompts/maps.py) the scripted replies key on.
PLAN, SUB_QUERIES, REFINE, JUDGE, ANSWER = (
    "Plan the next searches", "that would find what is still unknown", "Consolidate the new evidence",
    "Reply with one word: sufficient or insufficient", "The searching is over",
)
SELECT = "Reply with the numbers to open"


class ErrorAwareLLM(FakeLLM):
    """A FakeLLM whose reply ``ERROR`` becomes an ``"error"`` completion, as real backends return."""

    def __init__(self, respond):
        self.failed: list[bool] = []

        def remember(prompt: str) -> str:
            reply = respond(prompt)
            self.failed.append(reply == ERROR)
            return reply

        super().__init__(remember)

    def generate(self, requests):
        self.failed = []
        results = super().generate(requests)
        for result, failed in zip(results, self.failed):
            if failed:
                result.completions[0] = Completion("", finish_reason="error", error="backend failed")
        return results


def sub_query(round_number: int, j: int) -> str:
    """Distinctive sub-query text (round r, direction j) that the retriever still matches on."""
    return f"zz{round_number}q{j} capital of France"


class Script:
    """Replies keyed on the prompt's marker phrase; the round is the number of plan calls so far."""

    def __init__(self, sufficient_after: int | None = 2, n: int = 3, judge: str | None = None,
                 plan: str | None = None, refine: str | None = None, answer: str = "Paris"):
        self.sufficient_after, self.n = sufficient_after, n
        self.judge, self.plan, self.refine, self.answer = judge, plan, refine, answer
        self.rounds = 0

    def __call__(self, prompt: str) -> str:
        if SELECT in prompt:
            return "1, 2"
        if PLAN in prompt or SUB_QUERIES in prompt:
            self.rounds += 1
            if self.plan is not None:
                return self.plan
            if PLAN in prompt:
                return "\n".join(f"direction: aim {j} | query: {sub_query(self.rounds, j)}" for j in range(self.n))
            return "\n".join(f"query: {sub_query(self.rounds, j)}" for j in range(self.n))
        if REFINE in prompt:
            if self.refine is not None:
                return self.refine
            return f"Observation: fact number {self.rounds} is Paris.\nState: state number {self.rounds}."
        if JUDGE in prompt:
            if self.judge is not None:
                return self.judge
            done = self.sufficient_after is not None and self.rounds >= self.sufficient_after
            return "sufficient" if done else "insufficient"
        if ANSWER in prompt:
            return self.answer
        return "unexpected prompt"


def run(respond, examples=(QUESTION,), llm_class=FakeLLM, **options):
    llm = llm_class(respond)
    retriever = OverlapRetriever()
    records = run_questions_sync(get("maps", **options), list(examples), llm, retriever)
    return records, llm, retriever


def tags(record):
    return [e["tag"] for e in record["trace"] if e["type"] == "llm"]


def notes(record):
    return [e["kind"] for e in record["trace"] if e["type"] == "note"]


def test_parallel_sub_queries_go_out_in_one_retrieval_call_per_iteration():
    (record,), llm, retriever = run(Script(sufficient_after=2))
    assert record["prediction"] == "Paris" and record["metrics"]["em"] == 1.0
    assert retriever.calls == [[sub_query(r, j) for j in range(3)] for r in (1, 2)]
    assert record["search_rounds"] == [[0, 1, 2], [3, 4, 5]]
    assert record["n_searches"] == 6
    stats = record["method_stats"]
    assert stats["variant"] == "full" and stats["iterations"] == 2 and stats["sub_queries"] == [3, 3]
    assert stats["stop"] == "sufficient" and stats["judgements"] == ["insufficient", "sufficient"]
    assert tags(record) == ["directions", "refine", "judge"] * 2 + ["answer"]
    refine_prompt = next(p for p in llm.prompts if REFINE in p)
    assert "Direction 1: aim 0 (search: zz1q0 capital of France)" in refine_prompt
    # a passage found by several sub-queries is shown once
    assert refine_prompt.count("(Title: Paris)") == 1
    answer_prompt = llm.prompts[-1]
    assert "1. fact number 1 is Paris." in answer_prompt and "2. fact number 2 is Paris." in answer_prompt
    assert "state number 2." in answer_prompt and "state number 1." not in answer_prompt  # the state is replaced


def refine_indices(prompts):
    return [i for i, p in enumerate(prompts) if REFINE in p]


def test_full_variant_never_shows_past_sub_queries():
    (record,), llm, _ = run(Script(sufficient_after=3))
    assert record["method_stats"]["iterations"] == 3
    for round_number, refine_at in enumerate(refine_indices(llm.prompts), 1):
        later = llm.prompts[refine_at + 1:]
        assert later
        for j in range(3):
            assert all(f"zz{round_number}q{j}" not in p for p in later)


def test_no_disentanglement_shows_the_trajectory():
    (record,), llm, _ = run(Script(sufficient_after=3), variant="no_disentanglement")
    assert record["method_stats"]["variant"] == "no_disentanglement"
    plans = [p for p in llm.prompts if PLAN in p]
    assert "zz1q0" in plans[1] and "zz2q2" in plans[2]  # past sub-queries reach later plans
    assert "state number 1." in plans[2] and "state number 2." in plans[2]  # and every past state
    assert "zz1q1" in llm.prompts[-1]  # the answer sees the whole trajectory too


def test_stops_at_max_iterations():
    (record,), _, retriever = run(Script(sufficient_after=None), max_iterations=3)
    stats = record["method_stats"]
    assert stats["stop"] == "max_iterations" and stats["iterations"] == 3
    assert tags(record) == ["directions", "refine", "judge"] * 2 + ["directions", "refine", "answer"]
    assert len(retriever.calls) == 3 and record["prediction"] == "Paris"


def test_no_parallel_makes_one_sub_query_per_iteration():
    method = get("maps", variant="no_parallel", max_iterations=4)
    assert method.env_config().max_searches == 4
    script = Script(sufficient_after=3, n=1)
    (record,), llm, retriever = run(script, variant="no_parallel", max_iterations=4)
    assert [len(c) for c in retriever.calls] == [1, 1, 1]
    assert record["method_stats"]["sub_queries"] == [1, 1, 1]
    assert "the single most useful retrieval direction" in next(p for p in llm.prompts if PLAN in p)


def test_no_parallel_caps_a_longer_plan_at_one_query():
    _, _, retriever = run(Script(sufficient_after=1, n=3), variant="no_parallel")
    assert retriever.calls == [[sub_query(1, 0)]]


def test_no_retrieval_direction_writes_sub_queries_directly():
    (record,), llm, retriever = run(Script(sufficient_after=1), variant="no_retrieval_direction")
    assert tags(record) == ["sub_queries", "refine", "judge", "answer"]
    assert all(PLAN not in p and "direction" not in p.lower() for p in llm.prompts)
    assert retriever.calls == [[sub_query(1, j) for j in range(3)]]
    assert "Search 1: zz1q0 capital of France" in next(p for p in llm.prompts if REFINE in p)


def test_preview_admission_opens_only_chosen_candidates():
    (record,), llm, retriever = run(Script(sufficient_after=1), admission="preview")
    assert len(retriever.calls) == 1 and len(retriever.calls[0]) == 3
    assert tags(record) == ["directions", "select", "select", "select", "refine", "judge", "answer"]
    kinds = [e["kind"] for e in record["trace"] if e["type"] == "env"]
    assert kinds == ["search", "expand"] * 3 + ["answer"]
    assert all(s["expanded_ranks"] == [1, 2] for s in record["searches"])
    assert record["docs_read"] == 2  # the three sub-queries share their top two candidates
    assert "Current purpose: aim 1" in [p for p in llm.prompts if SELECT in p][1]
    refine_prompt = next(p for p in llm.prompts if REFINE in p)
    assert refine_prompt.count("Doc ") == 2  # each opened passage shown once


def test_two_questions_share_one_retrieval_call_per_round():
    examples = [QUESTION, QAExample("q1", "Which river flows through Berlin?", ("Spree",))]
    script = Script(sufficient_after=None)
    records, llm, retriever = run(script, examples=examples, max_iterations=2)
    assert [r["id"] for r in records] == ["q0", "q1"]
    assert [len(c) for c in retriever.calls] == [6, 6]
    assert all(r["search_rounds"] == [[0, 1, 2], [3, 4, 5]] for r in records)
    assert max(llm.batches) == 2


def test_unusable_plan_searches_the_question():
    (record,), _, retriever = run(Script(sufficient_after=1, plan="I am not sure what to do."))
    assert retriever.calls == [[QUESTION.question]]
    assert "maps_no_sub_queries" in notes(record)
    assert record["method_stats"]["sub_queries"] == [1] and record["prediction"] == "Paris"


def test_garbage_judgement_counts_as_insufficient():
    (record,), _, _ = run(Script(judge="Hmm, hard to say."), max_iterations=3)
    assert notes(record).count("maps_judgement_unclear") == 2
    assert record["method_stats"]["stop"] == "max_iterations" and record["method_stats"]["judgements"] == [None, None]
    assert record["prediction"] == "Paris"


def test_empty_refinement_keeps_the_state():
    (record,), llm, _ = run(Script(sufficient_after=1, refine=""))
    assert "maps_refine_empty" in notes(record)
    judge_prompt = next(p for p in llm.prompts if JUDGE in p)
    assert "1. (nothing new)" in judge_prompt and "(no reasoning yet)" in judge_prompt


def test_unlabelled_refinement_becomes_the_observation():
    (record,), llm, _ = run(Script(sufficient_after=1, refine="Paris is the capital of France."))
    assert "maps_refine_unlabelled" in notes(record)
    assert "1. Paris is the capital of France." in next(p for p in llm.prompts if JUDGE in p)


@pytest.mark.parametrize("failing", [PLAN, REFINE, JUDGE])
def test_llm_error_mid_loop_answers_from_what_is_there(failing):
    script = Script(sufficient_after=None)

    def respond(prompt):
        return ERROR if failing in prompt else script(prompt)

    (record,), _, _ = run(respond, llm_class=ErrorAwareLLM)
    assert record["method_stats"]["stop"] == "llm_error"
    assert "llm_error" in notes(record)
    assert record["prediction"] == "Paris" and record["finish_reason"] == "answered"


def test_llm_error_everywhere_gives_up_with_a_record():
    (record,), _, _ = run(lambda prompt: ERROR, llm_class=ErrorAwareLLM)
    assert record["id"] == "q0" and record["prediction"] is None
    assert record["finish_reason"] == "llm_error" and record["metrics"]["em"] == 0.0


def test_garbage_everywhere_still_yields_a_prediction():
    (record,), _, retriever = run(lambda prompt: "I am not sure what to do here", max_iterations=3)
    assert record["finish_reason"] == "answered" and record["metrics"]["em"] == 0.0
    assert retriever.calls == [[QUESTION.question]] * 3


def test_llm_call_budget_leaves_room_for_the_answer():
    llm = FakeLLM(Script(sufficient_after=None))
    records = run_questions_sync(get("maps"), [QUESTION], llm, OverlapRetriever(), EnvConfig(), max_llm_calls=10)
    (record,) = records
    assert record["method_stats"]["stop"] == "llm_call_budget"
    assert record["llm_calls"] <= 10 and record["finish_reason"] == "answered"


def test_options_and_budget():
    with pytest.raises(ValueError, match="variant"):
        MAPS(variant="no_such_thing")
    with pytest.raises(ValueError, match="admission"):
        MAPS(admission="topk")
    config = MAPS().env_config()
    assert config.max_searches == 30 and config.candidates_per_search == 5 and config.admission == "prefix"
    assert MAPS(admission="preview", n_directions=2).env_config().max_searches == 20


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
