"""Issue 46, items 5 and 6: SEEK's prompts carry PAGER's instructions and its caps are named options
that --budget paper sets to PAGER's values; the SEEDS prompts' worked example is off under the paper
preset (the paper's prompts are instructions only)."""
import pytest
from conftest import PASSAGES, OverlapRetriever
from fake_llm import FakeLLM
from test_methods import QUESTION, competent
from test_seek import GISTS, QUERIES, SELECT, SUBQUERY, focus_of

import methods
from methods.budgets import PAPER_OPTIONS, budget_options
from methods.prompts import seek as seek_prompts
from methods.runner import run_questions_sync
from methods.seek_parsing import after_marker, parse_gists

LONG_TEXT = "Paris capital France " + "the city has a long history of art and science " * 30 + "TAILMARK"
LONG = [*PASSAGES, ("p12", "Paris history", LONG_TEXT)]
EIGHT = [f"Topic number {n} about France" for n in range(1, 9)]


def seek_model(topics=GISTS, analysis=False, tagged=False):
    """A SEEK model: its sketch optionally after an analysis with numbered lines of its own, its
    answer optionally after reasoning, in <answer> tags."""
    def respond(prompt: str) -> str:
        if SELECT in prompt:
            return "1"
        if "plan what knowledge is needed" in prompt:
            listed = "\n".join(f"{i}. {g}" for i, g in enumerate(topics, 1))
            return f"1. The question needs a country.\n2. Then its capital.\nTopics:\n{listed}" if analysis else listed
        if SUBQUERY in prompt:
            return f"Reasoning: r.\nQuery: {QUERIES.get(focus_of(prompt, SUBQUERY), 'Paris capital France history')}"
        if "Topic to fill:" in prompt:
            return "Paris is the capital."
        if "reply to the question with the answer only" in prompt:
            return "The evidence names Paris.\n\n<answer>Paris" if tagged else "Paris"
        raise AssertionError(prompt[:200])
    return respond


def run_seek(respond, **options):
    llm = FakeLLM(respond)
    (record,) = run_questions_sync(methods.get("seek", **options), [QUESTION], llm, OverlapRetriever(LONG))
    return record


def llm_events(record, tag):
    return [e for e in record["trace"] if e["type"] == "llm" and e["tag"] == tag]


# -- item 5: SEEK ------------------------------------------------------------------------------------

def test_seek_prompts_carry_pagers_instructions():
    sketch = seek_prompts.SKETCH.format(question="Q?", output=seek_prompts.SKETCH_DIRECT)
    assert "three to five" not in sketch and "as many as the question needs and no more" in sketch
    assert "no two overlap" in sketch and "builds on what the earlier ones find" in sketch
    assert "hint at the answer" in sketch and "pieces of knowledge the question requires" in sketch
    assert "analysis first" in seek_prompts.SKETCH_REASONED and "Topics:" in seek_prompts.SKETCH_REASONED
    refine = seek_prompts.REFINE
    assert "the documents and what you already know" in refine and "does not repeat" in refine
    assert "Fill this topic only" in refine
    answer = seek_prompts.ANSWER.format(context="C", question="Q?", output=seek_prompts.ANSWER_REASONED)
    assert "rely on your own knowledge" in answer and "follow its facts" in answer
    assert answer.index("Reason step by step first") < answer.index("<answer>")
    assert "usable in a search engine without further context" in seek_prompts.SUBQUERY


def test_the_paper_preset_gives_seek_pagers_settings_and_explicit_options_win():
    assert PAPER_OPTIONS["seek"] == {"max_slots": None, "doc_chars": None, "reasoning_first": True}
    paper = methods.get("seek", **budget_options("paper", "seek"))
    assert (paper.max_slots, paper.doc_chars, paper.reasoning_first) == (None, None, True)
    for preset in (None, "small", "thinking"):
        seek = methods.get("seek", **budget_options(preset, "seek"))
        assert (seek.max_slots, seek.doc_chars, seek.reasoning_first) == (6, 800, False)
    mine = methods.get("seek", **budget_options("paper", "seek", {"max_slots": 4}))
    assert mine.max_slots == 4 and mine.doc_chars is None
    for bad in ({"max_slots": 0}, {"doc_chars": 0}):
        with pytest.raises(ValueError):
            methods.get("seek", **bad)
    parallel = methods.get("seek", variant="parallel_filling", max_slots=None, max_rounds=7)
    assert parallel.env_config().max_searches == 7  # one search per slot, at most max_rounds slots


def test_seek_under_the_paper_settings_keeps_every_topic_whole_documents_and_a_reasoned_answer():
    record = run_seek(seek_model(EIGHT, analysis=True, tagged=True), **budget_options("paper", "seek"))
    assert record["prediction"] == "Paris" and record["method_stats"]["slots"] == 8  # the analysis' lines are no topics
    assert "sketch_truncated" not in [e.get("kind") for e in record["trace"]]
    (sketch,) = llm_events(record, "sketch")
    assert "analysis first" in sketch["prompt"][0]["content"]
    assert any("TAILMARK" in e["prompt"][0]["content"] for e in llm_events(record, "refine"))  # not cut at 800
    (answer,) = llm_events(record, "answer")
    assert "Reason step by step first" in answer["prompt"][0]["content"]
    assert "answer_form" not in [e.get("kind") for e in record["trace"]]  # the tagged answer was read


def test_seek_by_default_caps_topics_and_documents_and_asks_direct_replies():
    record = run_seek(seek_model(EIGHT))
    assert record["prediction"] == "Paris" and record["method_stats"]["slots"] == 6
    assert "sketch_truncated" in [e.get("kind") for e in record["trace"]]
    refines = [e["prompt"][0]["content"] for e in llm_events(record, "refine")]
    assert any("Paris history" in p for p in refines) and not any("TAILMARK" in p for p in refines)
    (answer,) = llm_events(record, "answer")
    assert "Without explanation" in answer["prompt"][0]["content"]
    assert "Reason step by step" not in answer["prompt"][0]["content"]


def test_the_topic_list_is_read_after_the_marker():
    text = "Analysis:\n1. a first step\n2. a second step\n**Topics:**\n1. Composer of the opera\n2. Birthplace"
    assert parse_gists(after_marker(text, "Topics:")) == ["Composer of the opera", "Birthplace"]
    assert parse_gists(after_marker("1. A\n2. B", "Topics:")) == ["A", "B"]  # no marker: every line
    assert parse_gists(after_marker("Topics: 1. A", "Topics:")) == ["A"]


# -- item 6: the SEEDS prompts' worked example ---------------------------------------------------------

@pytest.mark.parametrize("method", ["seeds-react", "seeds-o1"])
def test_the_seeds_example_is_off_under_the_paper_preset(method):
    def first_prompt(options):
        (record,) = run_questions_sync(methods.get(method, **options), [QUESTION], FakeLLM(competent),
                                       OverlapRetriever())
        return next(e for e in record["trace"] if e["type"] == "llm")["prompt"][0]["content"]

    assert PAPER_OPTIONS[method] == {"example": False}
    assert methods.get(method).example and methods.get(method, **budget_options("thinking", method)).example
    paper = first_prompt(budget_options("paper", method))
    assert "Here is an example" not in paper and "Magic Flute" not in paper and QUESTION.question in paper
    assert "Magic Flute" in first_prompt({})  # the default shows the worked example
    assert "Magic Flute" in first_prompt(budget_options("paper", method, {"example": True}))


def test_budget_paper_on_the_command_line(tmp_path):
    from inference import evaluate as ev

    seek = ev.build_method(ev.resolve_args(["--method.name", "seek", "--method.budget", "paper",
                                            "--run.output_dir", str(tmp_path)]).method)
    assert (seek.max_slots, seek.doc_chars, seek.reasoning_first) == (None, None, True)
    argv = ["--method.name", "seeds-o1", "--method.budget", "paper", "--run.output_dir", str(tmp_path)]
    assert not ev.build_method(ev.resolve_args(argv).method).example
    assert ev.build_method(ev.resolve_args([*argv, "--method.options.example", "true"]).method).example
    argv = ["--method.name", "seek", "--method.budget", "paper", "--method.options.max_slots", "5",
            "--run.output_dir", str(tmp_path)]
    seek = ev.build_method(ev.resolve_args(argv).method)
    assert seek.max_slots == 5 and seek.doc_chars is None
