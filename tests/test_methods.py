"""Every method driven through the env by a scripted LLM: answers, traces, limits, bad output."""
import re

import pytest
from fake_llm import FakeLLM

import methods
from envs.config import EnvConfig
from envs.types import QAExample
from methods.runner import run_questions_sync

QUESTION = QAExample("q0", "What is the capital of France?", ("Paris",), positive_ids=("p0",))


def competent(prompt: str) -> str:
    """Follows every protocol and always lands on 'Paris'."""
    if "Final Information:" in prompt and "Search query:" in prompt:
        return "Final Information: Paris is the capital of France."
    if "Write the next sentence only." in prompt:
        if "Reasoning so far: (none)" in prompt:
            return "The passages say the capital of France is Paris. More text follows."
        return "So the answer is: Paris."
    if "So the answer is: <short answer>" in prompt:
        return "The passages say Paris is the capital. So the answer is: Paris."
    if "answer only" in prompt:
        return "Paris"
    tail = prompt.rstrip()
    if tail.endswith("<answer>"):
        return "Paris</answer>"
    if tail.endswith("</snapshot>"):
        return "Two previews look useful. <expand>1, 2</expand>"
    if tail.endswith("</retrieved>"):
        return "<read>2</read>"
    if tail.endswith("</information>") or tail.endswith("</result>"):
        return "<think>The capital is Paris.</think><answer>Paris</answer>"
    return "<think>I should look this up.</think><search>capital of France</search>"


def run(name, respond, examples=(QUESTION,), **options):
    llm = FakeLLM(respond)
    from conftest import OverlapRetriever

    retriever = OverlapRetriever()
    records = run_questions_sync(methods.get(name, **options), list(examples), llm, retriever)  # the paper's env
    return records, llm, retriever


EXPECTED_DOCS = {"vanilla-llm": 0, "vanilla-rag": 5, "react": 5, "react-dynk": 2, "search-o1": 10, "search-r1": 3,
                 "ircot": 5, "iter-retgen": 5, "seeds-react": 2, "seeds-o1": 2, "seeds-r1": 2,
                 "seek": 5, "kair": 5, "maps": 5, "main-rag": 12, "deepnote": 5}


def test_every_method_is_registered():
    assert set(methods.available()) == set(EXPECTED_DOCS)
    with pytest.raises(KeyError, match="unknown method"):
        methods.get("nope")
    with pytest.raises(TypeError, match="no option"):
        methods.get("react", kk=3)
    with pytest.raises(TypeError, match="env limits"):  # k is the env's candidates_per_search
        methods.get("react", k=3)
    assert methods.get("react", max_tokens=64).options()["max_tokens"] == 64


@pytest.mark.parametrize("name, paper", [
    ("seeds-react", {"candidates_per_search": 10, "max_expand": 10, "max_searches": 4, "max_actions": 12}),
    ("seeds-r1", {"candidates_per_search": 5, "max_expand": 5, "max_searches": 4, "max_actions": 10}),
    ("search-r1", {"candidates_per_search": 3, "max_searches": 4, "max_actions": 10}),
    ("search-o1", {"candidates_per_search": 10, "max_searches": 5, "max_actions": 12}),
])
def test_methods_take_their_limits_from_the_env(name, paper):
    """A method's paper limits are env defaults: the run's env overrides them, the method reads
    them from its env; its protocol (admission mode) is fixed, and contradicting it is an error."""
    method = methods.get(name)
    env = method.env_config()
    assert {key: getattr(env, key) for key in paper} == paper
    assert env.max_obs_tokens == 240 * env.candidates_per_search  # the cap fits every candidate
    assert not {"k", "max_searches", "max_expand", "max_actions"} & set(method.options())
    narrowed = method.env_config({"candidates_per_search": 2, "max_searches": 1, "preview": {"max_tokens": 7}})
    assert (narrowed.candidates_per_search, narrowed.max_searches, narrowed.preview.max_tokens) == (2, 1, 7)
    assert narrowed.preview.window_chars == EnvConfig().preview.window_chars  # a partial section overlays
    other = "prefix" if env.admission == "preview" else "preview"
    with pytest.raises(ValueError, match="runs with admission="):
        method.env_config({"admission": other})
    assert method.fit_env(EnvConfig(admission=other, candidates_per_search=7)).admission == env.admission


def test_old_limit_options_move_to_the_env_with_a_warning():
    with pytest.warns(DeprecationWarning, match="candidates_per_search"):
        own, env = methods.base.split_env_limits("react", {"k": 3, "max_tokens": 64, "max_searches": 2})
    assert own == {"max_tokens": 64} and env == {"candidates_per_search": 3, "max_searches": 2}


def test_prompts_state_the_env_limits():
    """The method states the limits of the env it runs in, not limits of its own."""
    (record,), llm, _ = run("seeds-react", competent)
    assert "up to 10 candidate passages" in llm.prompts[0] and "at most 10 per snapshot" in llm.prompts[0]
    llm = FakeLLM(competent)
    from conftest import OverlapRetriever
    method = methods.get("seeds-react")
    run_questions_sync(method, [QUESTION], llm, OverlapRetriever(),
                       method.env_config({"candidates_per_search": 3, "max_expand": 2, "max_searches": 2}))
    assert "up to 3 candidate passages" in llm.prompts[0] and "at most 2 per snapshot" in llm.prompts[0]


@pytest.mark.parametrize("name", sorted(EXPECTED_DOCS))
def test_methods_answer_through_the_env(name):
    records, llm, _ = run(name, competent)
    (record,) = records
    assert record["prediction"] == "Paris" and record["metrics"]["em"] == 1.0, record["trace"]
    assert record["finish_reason"] == "answered"
    if name == "ircot":  # question retrieval, then one retrieval with the first thought
        assert record["n_searches"] == 2 and 5 < record["docs_read"] <= 10
    elif name == "iter-retgen":  # three rounds of top-5; a passage read twice counts once
        assert record["n_searches"] == 3 and 5 <= record["docs_read"] <= 15
    else:
        assert record["docs_read"] == EXPECTED_DOCS[name]
    assert record["llm_calls"] == sum(1 for e in record["trace"] if e["type"] == "llm") >= 1
    env_events = [e for e in record["trace"] if e["type"] == "env"]
    assert env_events[-1]["kind"] == "answer"
    assert record["n_searches"] == len(record["searches"]) == sum(e["kind"] == "search" for e in env_events)


def test_seeds_react_trace_shape():
    (record,), llm, _ = run("seeds-react", competent)
    kinds = [e["kind"] for e in record["trace"] if e["type"] == "env"]
    assert kinds == ["search", "expand", "answer"]
    snapshot = record["trace"][1]["observation"]
    assert snapshot.startswith("<snapshot>") and len(re.findall(r"^\[\d+\] ", snapshot, flags=re.M)) == 10
    assert record["searches"][0]["expanded_ranks"] == [1, 2]
    # the model saw its own search, the snapshot and the opened passages in its next prompts
    assert "<snapshot>" in llm.prompts[1] and "<information>" in llm.prompts[2]


def test_search_o1_reader_sees_documents_and_result_reaches_reasoning():
    (record,), llm, _ = run("search-o1", competent)
    tags = [e["tag"] for e in record["trace"] if e["type"] == "llm"]
    assert tags == ["turn", "reason_in_documents", "turn"]
    assert "Doc 1 (Title: " in llm.prompts[1]
    assert "<result>Paris is the capital of France.</result>" in llm.prompts[2]


def test_seeds_o1_reads_only_admitted_passages():
    (record,), llm, _ = run("seeds-o1", competent)
    reader_prompt = next(p for p in llm.prompts if "Final Information:" in p)
    assert reader_prompt.count("Doc ") == 2


@pytest.mark.parametrize("name", sorted(EXPECTED_DOCS))
def test_garbage_output_ends_cleanly_with_zero_score(name):
    records, _, _ = run(name, lambda prompt: "I am not sure what to do here")
    (record,) = records
    assert record["metrics"]["em"] == 0.0
    assert record["finish_reason"]
    assert record["id"] == "q0"


@pytest.mark.parametrize("name", ["react", "seeds-react", "seeds-r1", "search-o1"])
def test_junk_ids_and_missing_tags_hit_the_limits_then_force_an_answer(name):
    def stubborn(prompt: str) -> str:
        if prompt.rstrip().endswith("<answer>"):
            return "Lyon</answer>"
        if prompt.rstrip().endswith("</snapshot>"):
            return "<expand>99, banana</expand>"
        return "<search>capital of France" + str(len(prompt)) + "</search>"

    options = {"force_answer": True} if name == "seeds-r1" else {}  # SEEDS-R1 forces only when asked
    (record,), _, _ = run(name, stubborn, **options)
    config = methods.get(name).env_config()
    assert record["prediction"] == "Lyon" and record["metrics"]["em"] == 0.0
    assert record["n_searches"] <= config.max_searches
    assert any(e.get("kind") == "forced_answer" for e in record["trace"] if e["type"] == "note")


def test_seeds_r1_does_not_force_an_answer_by_default():
    """As in training rollouts (RolloutConfig.force_answer, same default): the action limit ends it."""
    def stubborn(prompt: str) -> str:
        return "<search>capital of France" + str(len(prompt)) + "</search>"

    (record,), _, _ = run("seeds-r1", stubborn)
    assert record["finish_reason"] == "env_limit" and record["prediction"] is None
    assert not any(e.get("kind") == "forced_answer" for e in record["trace"] if e["type"] == "note")


def test_llm_failure_is_recorded_not_raised():
    def boom(prompt: str) -> str:
        raise RuntimeError("backend exploded")

    records, _, _ = run("seeds-react", boom,
                        examples=[QUESTION, QAExample("q1", "Which river flows through Berlin?", ("Spree",))])
    assert [r["id"] for r in records] == ["q0", "q1"]
    for record in records:
        assert record["finish_reason"] == "error: RuntimeError" and record["prediction"] is None
        assert any(e["type"] == "error" and "backend exploded" in e["error"] for e in record["trace"])


def test_questions_run_concurrently_with_batched_llm_and_retrieval():
    examples = [QAExample(f"q{i}", f"What is the capital of France? ({i})", ("Paris",)) for i in range(8)]
    records, llm, retriever = run("seeds-react", competent, examples=examples)
    assert [r["id"] for r in records] == [e.id for e in examples]
    assert all(r["metrics"]["em"] == 1.0 for r in records)
    assert max(llm.batches) == 8  # the first turns of all questions went out together
    assert len(retriever.calls) == 1 and len(retriever.calls[0]) == 8  # one retrieval for 8 searches


def test_dynk_translates_read_counts():
    from methods.baselines import ReActDynamicK

    assert ReActDynamicK.translate("ok <read>3</read>") == "<expand>1, 2, 3</expand>"
    assert ReActDynamicK.translate("<read>0</read>") == "<expand>none</expand>"
    assert ReActDynamicK.translate("<read>many</read>") == "<read>many</read>"
    assert ReActDynamicK.translate("<answer>x</answer>") == "<answer>x</answer>"


def test_readers_get_the_passages_as_the_env_showed_them():
    """The o1 reader reads what the observation cap let through, which is what doc_tokens counts:
    the text past the cut reaches neither the env's observation nor the reader."""
    from conftest import PASSAGES, OverlapRetriever

    llm = FakeLLM(competent)
    method = methods.get("seeds-o1")
    env = method.env_config({"max_obs_tokens": 27})  # FakeLLM has no tokenizer: the env counts words
    (record,) = run_questions_sync(method, [QUESTION], llm, OverlapRetriever(), env)
    reader_prompt = next(p for p in llm.prompts if "Final Information:" in p)
    opened = next(e["observation"] for e in record["trace"] if e["type"] == "env" and e["kind"] == "expand")
    assert "[truncated: observation limit reached]" in opened
    full_text = {title: text for _, title, text in PASSAGES}
    docs = re.findall(r"^Doc \d+ \(Title: (.+?)\) (.*)$", reader_prompt, flags=re.M)
    assert docs and all(full_text[title].startswith(text) for title, text in docs)
    assert any(text != full_text[title] for title, text in docs)  # the reader got the cut, not the full text
    shown_words = sum(len(title.split()) + len(text.split()) + 1 for title, text in docs)  # "[i] Title\ntext"
    assert shown_words == record["doc_tokens"]
    assert 0 < record["doc_tokens"] <= 27


def test_k10_methods_have_room_for_ten_passages():
    """ReAct-style K=10 methods get a cap that fits ten passages (the SEEDS-R1 cap would cut them)."""
    from conftest import OverlapRetriever

    (record,), _, _ = run("search-o1", competent)
    information = next(e["observation"] for e in record["trace"] if e["type"] == "env" and e["kind"] == "search")
    assert "[truncated" not in information and information.count("\n[") == 10
    llm = FakeLLM(competent)
    method = methods.get("search-o1")
    (cut,) = run_questions_sync(method, [QUESTION], llm, OverlapRetriever(), method.env_config({"max_obs_tokens": 60}))
    assert cut["doc_tokens"] < record["doc_tokens"]
