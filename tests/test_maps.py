"""MAPS driven through the env by a scripted LLM: separate direction, sub-query and refine calls,
parallel sub-queries in one retrieval call, disentangled memory, stopping, the ablations and the
single-call variant, preview admission. Broken model output: tests/test_maps_fallbacks.py."""
import re

from conftest import OverlapRetriever
from fake_llm import FakeLLM

import methods.maps  # noqa: F401  (registers "maps")
from envs.config import EnvConfig
from envs.types import QAExample
from methods.base import get
from methods.llm import Completion
from methods.runner import run_questions_sync

QUESTION = QAExample("q0", "What is the capital of France?", ("Paris",), positive_ids=("p0",))
ERROR = "<<llm error>>"

# Marker phrases of the MAPS prompts (methods/prompts/maps.py) the scripted replies key on.
DIRECTIONS, SUB_QUERY, SUB_QUERIES, PLAN = (
    "do not write search queries yet", "Retrieval direction to pursue now:",
    "that would find what is still unknown", "Plan the next searches",
)
JUDGE_FIRST, REFINE, JUDGE, ANSWER = (
    "'Sufficient: yes' or 'Sufficient: no'", "Consolidate the new evidence",
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
    """Replies keyed on the prompt's marker phrase; the round is the number of planning calls so far.

    The planning call of round r+1 judges "sufficient" once ``sufficient_after`` rounds are done
    (``judge`` overrides the verdict line); it names ``n`` directions ``aim j`` (``plan`` overrides
    the whole reply); each sub-query call answers for the direction its prompt names.
    """

    def __init__(self, sufficient_after: int | None = 2, n: int = 3, judge: str | None = None,
                 plan: str | None = None, query: str | None = None, refine: str | None = None,
                 answer: str = "Paris"):
        self.sufficient_after, self.n = sufficient_after, n
        self.judge, self.plan, self.query, self.refine, self.answer = judge, plan, query, refine, answer
        self.rounds = 0

    def done(self) -> bool:
        return self.sufficient_after is not None and self.rounds > self.sufficient_after

    def verdict(self) -> str:
        return self.judge if self.judge is not None else ("Sufficient: yes" if self.done() else "Sufficient: no")

    def __call__(self, prompt: str) -> str:
        if SELECT in prompt:
            return "1, 2"
        if DIRECTIONS in prompt or SUB_QUERIES in prompt or PLAN in prompt:
            return self.planning(prompt)
        if SUB_QUERY in prompt:
            if self.query is not None:
                return self.query
            j = int(re.search(r"pursue now: aim (\d+)", prompt).group(1))
            return f"Reasoning: direction {j} is open.\nquery: {sub_query(self.rounds, j)}"
        if REFINE in prompt:
            if self.refine is not None:
                return self.refine
            return f"Observation: fact number {self.rounds} is Paris.\nState: state number {self.rounds}."
        if JUDGE in prompt:
            if self.judge is not None:
                return self.judge
            return "sufficient" if self.rounds >= (self.sufficient_after or 99) else "insufficient"
        if ANSWER in prompt:
            return self.answer
        return "unexpected prompt"

    def planning(self, prompt: str) -> str:
        self.rounds += 1
        verdict = [self.verdict()] if JUDGE_FIRST in prompt else []
        if JUDGE_FIRST in prompt and self.done() and self.judge is None:
            return verdict[0]
        if self.plan is not None:
            return "\n".join(verdict + [self.plan])
        if PLAN in prompt:
            return "\n".join(f"direction: aim {j} | query: {sub_query(self.rounds, j)}" for j in range(self.n))
        if SUB_QUERIES in prompt:
            return "\n".join(verdict + [f"query: {sub_query(self.rounds, j)}" for j in range(self.n)])
        return "\n".join(verdict + [f"direction: aim {j}" for j in range(self.n)])


def run(respond, examples=(QUESTION,), llm_class=FakeLLM, **options):
    llm = llm_class(respond)
    retriever = OverlapRetriever()
    records = run_questions_sync(get("maps", **options), list(examples), llm, retriever)
    return records, llm, retriever


def tags(record):
    return [e["tag"] for e in record["trace"] if e["type"] == "llm"]


def notes(record):
    return [e["kind"] for e in record["trace"] if e["type"] == "note"]


def prompts_with(llm, marker):
    return [p for p in llm.prompts if marker in p]


def test_directions_sub_queries_and_refinement_are_separate_calls():
    (record,), llm, retriever = run(Script(sufficient_after=2))
    assert record["prediction"] == "Paris" and record["metrics"]["em"] == 1.0
    assert tags(record) == (["directions", "sub_query", "sub_query", "sub_query", "refine"] * 2
                            + ["directions", "answer"])
    assert record["llm_calls"] == 12
    assert retriever.calls == [[sub_query(r, j) for j in range(3)] for r in (1, 2)]  # one retrieval call a round
    assert record["search_rounds"] == [[0, 1, 2], [3, 4, 5]] and record["n_searches"] == 6
    stats = record["method_stats"]
    assert stats["variant"] == "full" and stats["iterations"] == 2 and stats["sub_queries"] == [3, 3]
    assert stats["stop"] == "sufficient" and stats["judgements"] == ["insufficient", "sufficient"]
    directions = prompts_with(llm, DIRECTIONS)
    assert JUDGE_FIRST not in directions[0] and all(JUDGE_FIRST in p for p in directions[1:])  # nothing to judge yet
    assert "at most 3" in directions[0]  # the model decides how many


def test_each_sub_query_call_sees_its_own_direction_and_the_memory():
    _, llm, _ = run(Script(sufficient_after=2))
    calls = prompts_with(llm, SUB_QUERY)
    assert len(calls) == 6
    for i, prompt in enumerate(calls[:3]):
        assert f"pursue now: aim {i}" in prompt
        assert all(f"aim {j}" not in prompt for j in range(3) if j != i)  # independent of the other directions
        assert "Knowledge gathered so far:\n(nothing yet)" in prompt
    assert "1. fact number 1 is Paris." in calls[3] and "state number 1." in calls[3]


def test_refinement_consolidates_the_gathered_evidence_by_direction():
    _, llm, _ = run(Script(sufficient_after=1))
    (refine_prompt,) = prompts_with(llm, REFINE)
    for j in range(3):
        assert f"Direction {j + 1}: aim {j} (search: zz1q{j} capital of France)" in refine_prompt
    assert refine_prompt.count("(Title: Paris)") == 1  # a passage found by several sub-queries is shown once
    assert "(no passages beyond those shown above)" in refine_prompt
    answer_prompt = llm.prompts[-1]
    assert ANSWER in answer_prompt and "1. fact number 1 is Paris." in answer_prompt


def test_the_state_is_replaced_and_observations_accumulate():
    _, llm, _ = run(Script(sufficient_after=2))
    answer_prompt = llm.prompts[-1]
    assert "1. fact number 1 is Paris." in answer_prompt and "2. fact number 2 is Paris." in answer_prompt
    assert "state number 2." in answer_prompt and "state number 1." not in answer_prompt


def test_the_model_decides_how_many_directions_up_to_the_cap():
    (record,), llm, retriever = run(Script(sufficient_after=1, n=2))
    assert tags(record)[:4] == ["directions", "sub_query", "sub_query", "refine"]
    assert retriever.calls[0] == [sub_query(1, 0), sub_query(1, 1)]
    (record,), _, retriever = run(Script(sufficient_after=1, n=5))
    assert tags(record).count("sub_query") == 3 and retriever.calls[0] == [sub_query(1, j) for j in range(3)]
    _, llm, _ = run(Script(sufficient_after=1, n=2), fixed_directions=True, n_directions=2)
    assert "identify 2 complementary retrieval directions" in prompts_with(llm, DIRECTIONS)[0]


def test_full_variant_never_shows_past_sub_queries_or_directions():
    (record,), llm, _ = run(Script(sufficient_after=3))
    assert record["method_stats"]["iterations"] == 3
    refines = [i for i, p in enumerate(llm.prompts) if REFINE in p]
    for round_number, refine_at in enumerate(refines, 1):
        later = llm.prompts[refine_at + 1:]
        assert later and all(f"zz{round_number}q" not in p for p in later)
    # past directions never come back either: planning and answering see observations and state only
    assert all("aim" not in p for p in prompts_with(llm, DIRECTIONS) + [llm.prompts[-1]])


def test_no_disentanglement_shows_the_trajectory():
    (record,), llm, _ = run(Script(sufficient_after=3), variant="no_disentanglement")
    assert record["method_stats"]["variant"] == "no_disentanglement"
    directions = prompts_with(llm, DIRECTIONS)
    assert "aim 0 -> zz1q0" in directions[1] and "zz2q2" in directions[2]  # past sub-queries reach later plans
    assert "state number 1." in directions[2] and "state number 2." in directions[2]  # and every past state
    assert "zz1q1" in prompts_with(llm, SUB_QUERY)[-1]
    assert "zz1q1" in llm.prompts[-1]  # the answer sees the whole trajectory too


def test_stops_at_max_iterations_without_a_last_judgement():
    (record,), _, retriever = run(Script(sufficient_after=None), max_iterations=3)
    stats = record["method_stats"]
    assert stats["stop"] == "max_iterations" and stats["iterations"] == 3
    assert stats["judgements"] == ["insufficient", "insufficient"]
    assert tags(record) == ["directions", "sub_query", "sub_query", "sub_query", "refine"] * 3 + ["answer"]
    assert len(retriever.calls) == 3 and record["prediction"] == "Paris"


def test_no_parallel_makes_one_direction_and_one_sub_query_per_iteration():
    method = get("maps", variant="no_parallel", max_iterations=4)
    assert method.env_config().max_searches == 4
    (record,), llm, retriever = run(Script(sufficient_after=3, n=3), variant="no_parallel", max_iterations=4)
    assert retriever.calls == [[sub_query(r, 0)] for r in (1, 2, 3)]  # a longer reply is capped at one
    assert record["method_stats"]["sub_queries"] == [1, 1, 1]
    assert tags(record) == ["directions", "sub_query", "refine"] * 3 + ["directions", "answer"]
    assert "the single most useful retrieval direction" in prompts_with(llm, DIRECTIONS)[0]


def test_no_retrieval_direction_writes_sub_queries_directly():
    (record,), llm, retriever = run(Script(sufficient_after=1), variant="no_retrieval_direction")
    assert tags(record) == ["sub_queries", "refine", "sub_queries", "answer"]
    assert all(DIRECTIONS not in p and "direction" not in p.lower() for p in llm.prompts)
    assert JUDGE_FIRST in prompts_with(llm, SUB_QUERIES)[1]
    assert retriever.calls == [[sub_query(1, j) for j in range(3)]]
    assert "Search 1: zz1q0 capital of France" in prompts_with(llm, REFINE)[0]
    assert record["method_stats"]["stop"] == "sufficient"


def test_single_call_variant_plans_in_one_call_and_judges_separately():
    (record,), llm, retriever = run(Script(sufficient_after=2), variant="single_call")
    assert tags(record) == ["directions", "refine", "judge"] * 2 + ["answer"]
    assert retriever.calls == [[sub_query(r, j) for j in range(3)] for r in (1, 2)]
    assert record["method_stats"]["judgements"] == ["insufficient", "sufficient"]
    assert record["method_stats"]["stop"] == "sufficient" and record["prediction"] == "Paris"
    assert "identify 3 complementary retrieval directions" in prompts_with(llm, PLAN)[0]
    (record,), _, _ = run(Script(sufficient_after=None), variant="single_call", max_iterations=2)
    assert tags(record) == ["directions", "refine", "judge", "directions", "refine", "answer"]
    assert record["method_stats"]["stop"] == "max_iterations"


def test_preview_admission_opens_only_chosen_candidates():
    (record,), llm, retriever = run(Script(sufficient_after=1), admission="preview")
    assert len(retriever.calls) == 1 and len(retriever.calls[0]) == 3
    assert tags(record) == ["directions"] + ["sub_query"] * 3 + ["select"] * 3 + ["refine", "directions", "answer"]
    kinds = [e["kind"] for e in record["trace"] if e["type"] == "env"]
    assert kinds == ["search", "expand"] * 3 + ["answer"]
    assert all(s["expanded_ranks"] == [1, 2] for s in record["searches"])
    assert record["docs_read"] == 2  # the three sub-queries share their top two candidates
    assert "Current purpose: aim 1" in prompts_with(llm, SELECT)[1]
    assert prompts_with(llm, REFINE)[0].count("Doc ") == 2  # each opened passage shown once


def test_two_questions_share_one_retrieval_call_per_round():
    examples = [QUESTION, QAExample("q1", "Which river flows through Berlin?", ("Spree",))]
    records, llm, retriever = run(Script(sufficient_after=None), examples=examples, max_iterations=2)
    assert [r["id"] for r in records] == ["q0", "q1"]
    assert [len(c) for c in retriever.calls] == [6, 6]
    assert all(r["search_rounds"] == [[0, 1, 2], [3, 4, 5]] for r in records)
    assert max(llm.batches) >= 3  # the sub-query calls of one question go out together


def test_llm_call_budget_leaves_room_for_the_answer():
    llm = FakeLLM(Script(sufficient_after=None))
    records = run_questions_sync(get("maps"), [QUESTION], llm, OverlapRetriever(), EnvConfig(), max_llm_calls=10)
    (record,) = records
    assert record["method_stats"]["stop"] == "llm_call_budget" and record["method_stats"]["iterations"] == 1
    assert record["llm_calls"] == 6 and record["finish_reason"] == "answered"


def test_tokens_of_every_call_are_counted():
    (record,), llm, _ = run(Script(sufficient_after=1))
    llm_events = [e for e in record["trace"] if e["type"] == "llm"]
    assert record["llm_calls"] == len(llm_events) == len(llm.prompts) == 7
    assert record["llm_prompt_tokens"] == sum(e["prompt_tokens"] for e in llm_events) > 0
    assert record["llm_completion_tokens"] == sum(e["completion_tokens"] for e in llm_events) > 0
    assert all(e["prompt_tokens"] > 0 for e in llm_events if e["tag"] == "sub_query")


def test_preview_admission_reaches_the_papers_ten_iterations_by_default():
    """8 calls an iteration with preview admission: the default cap of 64 stopped MAPS after 7 of
    its 10 iterations; without a cap the method asks for room for all 10 and the answer."""
    method = get("maps", admission="preview")
    assert method.calls_per_iteration() == 8 and method.llm_call_cap() == 81
    assert get("maps").llm_call_cap() == 64 and get("seeds-react").llm_call_cap() == 64  # the others keep 64
    (record,), _, _ = run(Script(sufficient_after=None), admission="preview")
    assert record["method_stats"]["stop"] == "max_iterations" and record["method_stats"]["iterations"] == 10
    assert record["prediction"] == "Paris"
    (capped,) = run_questions_sync(method, [QUESTION], FakeLLM(Script(sufficient_after=None)), OverlapRetriever(),
                                   max_llm_calls=64)
    assert capped["method_stats"]["stop"] == "llm_call_budget" and capped["method_stats"]["iterations"] == 7
