"""Reasoning models: thinking taken out before parsing, stops that fire inside thinking continued,
budget presets that leave room to think, and the chat template's thinking switch."""
import pytest
import test_kair
import test_maps
import test_seek
from conftest import OverlapRetriever
from fake_llm import FAKE_TAGS, FakeLLM, ThinkingLLM
from test_methods import QUESTION, competent

import methods
from envs.config import EnvConfig
from methods.budgets import BUDGET_FIELDS, PAPER_STATED, PRESETS, THINKING, budget_options, presets
from methods.llm import Completion
from methods.runner import run_questions_sync
from methods.thinking import continuation_prompt, prompt_opens_thinking, split_thinking

PROMPTED = [m for m in methods.available() if methods.base.REGISTRY[m].handles_thinking]


# -- splitting -------------------------------------------------------------------------------------

def test_split_takes_out_only_the_leading_thinking_block():
    split = split_thinking("\n<think>maybe <search>x</search></think>\n\n<search>real</search>")
    assert split.visible == "<search>real</search>" and split.thinking == "maybe <search>x</search>"
    assert split.present and split.closed and not split.cut_off
    # a <think> written after other text is a method's own format (KAIR's reasoning part)
    kair = "<index>k</index>\n<think>reasoning</think><judgement>sufficient</judgement>"
    assert split_thinking(kair).visible == kair and not split_thinking(kair).present
    assert split_thinking("<answer>Paris</answer>").visible == "<answer>Paris</answer>"


def test_split_recognises_a_block_opened_by_the_prompt_and_a_cut_off_one():
    assert split_thinking("still thinking <answer>x</answer>", opened=True).cut_off
    assert split_thinking("still thinking <answer>x</answer>", opened=True).visible == ""
    closed = split_thinking("thought <search>x</search></think><answer>Paris</answer>")  # template opened it
    assert closed.visible == "<answer>Paris</answer>" and closed.thinking.startswith("thought")
    cut = split_thinking("<think>a long thought <answer>Berlin</answer>")
    assert cut.cut_off and cut.visible == "" and "Berlin" in cut.thinking


class TailTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join({1: "<|im_start|>assistant\n", 2: "<think>\n", 3: "</think>\n\n"}[i] for i in ids)


def test_prompt_opens_thinking_reads_the_rendered_tail():
    assert prompt_opens_thinking([{"role": "user", "content": "q"}], [1, 2], TailTokenizer())
    assert not prompt_opens_thinking([{"role": "user", "content": "q"}], [1, 2, 3], TailTokenizer())
    assert not prompt_opens_thinking([{"role": "user", "content": "q"}], [1, 2], None)
    assert prompt_opens_thinking("Question: q\n<think>\n", [], None)


def test_continuation_prompt_continues_ids_text_or_the_assistant_message():
    parts = [Completion("<think>a", [5, 6]), Completion(" b", [7])]
    assert continuation_prompt([{"role": "user", "content": "q"}], [1, 2], parts) == [1, 2, 5, 6, 7]
    no_ids = [Completion("<think>a"), Completion(" b")]
    assert continuation_prompt("Q:", [], no_ids) == "Q:<think>a b"
    assert continuation_prompt([{"role": "user", "content": "q"}], [], no_ids)[-1] == {
        "role": "assistant", "content": "<think>a b"}
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "so far "}]
    assert continuation_prompt(chat, [], no_ids)[-1]["content"] == "so far <think>a b"
    assert continuation_prompt([3, 4], [], no_ids) is None


# -- every prompted method with a scripted reasoning model -------------------------------------------

def script_for(method: str):
    """A competent script for the method (the method's own test scripts)."""
    if method == "seek":
        return test_seek.scripted()
    if method == "kair":
        return test_kair.Script([test_kair.step_reply(0, "insufficient", test_kair.QUERIES[0]),
                                 test_kair.step_reply(1, "sufficient", None)])
    if method == "maps":
        return test_maps.Script(sufficient_after=1)
    return competent


def run_thinking(method: str, budget: str, **options):
    llm = ThinkingLLM(script_for(method))
    method_obj = methods.get(method, **budget_options(budget, method, options))
    (record,) = run_questions_sync(method_obj, [QUESTION], llm, OverlapRetriever(), EnvConfig())
    return record


def llm_calls(record):
    return [e for e in record["trace"] if e["type"] == "llm"]


def notes(record):
    return [e["kind"] for e in record["trace"] if e["type"] == "note"]


@pytest.mark.parametrize("method", PROMPTED)
def test_thinking_preset_lets_every_method_think_then_act(method):
    record = run_thinking(method, "thinking")
    assert record["finish_reason"] == "answered" and record["prediction"] == "Paris", record["trace"][-3:]
    assert record["n_invalid"] == 0 and "thinking_cut_off" not in notes(record)
    calls = llm_calls(record)
    assert calls and all(c["thinking"] == "closed" for c in calls)
    assert all(FAKE_TAGS.split("\n")[0] in c["output"] for c in calls)  # the thinking stays in the trace
    actions = [e["action"] for e in record["trace"] if e["type"] == "env"]
    assert not any("Berlin" in a or "fake" in a for a in actions)  # nothing from inside the thinking acted
    if method != "vanilla-llm" and method != "iter-retgen":  # calls with stop strings: fired inside, continued
        assert any(c.get("continued") for c in calls)
    for call in calls[1:]:  # no earlier thinking is fed back into a later prompt
        assert "I need to reason about which evidence" not in str(call["prompt"])


@pytest.mark.parametrize("method", PROMPTED)
def test_small_preset_records_the_cut_off_instead_of_crashing(method):
    record = run_thinking(method, "small")
    assert record["id"] == QUESTION.id and not any(e["type"] == "error" for e in record["trace"])
    assert "thinking_cut_off" in notes(record)
    assert any(c["thinking"] == "cut_off" and c["finish_reason"] == "length" for c in llm_calls(record))
    actions = [e["action"] for e in record["trace"] if e["type"] == "env"]
    assert not any("Berlin" in a or "fake" in a for a in actions)
    assert record["prediction"] != "Berlin"


def test_trained_protocols_see_raw_completions():
    assert {m for m in methods.available() if m not in PROMPTED} == {"search-r1", "seeds-r1"}
    llm = FakeLLM(lambda prompt: "<think>plan</think><answer>Paris</answer>")
    (record,) = run_questions_sync(methods.get("seeds-r1"), [QUESTION], llm, OverlapRetriever(), EnvConfig())
    assert record["prediction"] == "Paris" and "thinking" not in llm_calls(record)[0]


def test_kair_takes_a_leading_think_as_the_step_reasoning():
    script = test_kair.Script(["<think>why it is Paris</think>\n<index>\nKeywords:\n- Paris\n</index>\n"
                               "<judgement>insufficient</judgement><next_query>Seine</next_query>",
                               test_kair.step_reply(1, "sufficient", None)])
    record = test_kair.run(script)
    assert "<think>why it is Paris</think>" in script.by_kind["next"][0]  # carried as the step's reasoning
    assert record["prediction"] == "Paris"


# -- presets ----------------------------------------------------------------------------------------

def test_presets_cover_every_budget_option_of_every_method():
    assert set(BUDGET_FIELDS) == set(methods.available())
    table = presets()
    assert set(table) == set(PRESETS)
    for name in PRESETS:
        for method, fields in BUDGET_FIELDS.items():
            assert set(table[name][method]) == set(fields)
            methods.get(method, **table[name][method])  # every field is a real option
    assert table["small"]["seeds-react"]["max_tokens"] == methods.get("seeds-react").max_tokens == 256
    assert table["paper"]["kair"] == {**THINKING["kair"], **PAPER_STATED["kair"]}
    assert table["paper"]["seek"]["refine_tokens"] == 32768 and table["paper"]["search-r1"]["max_tokens"] == 500


def test_explicit_options_win_over_the_preset():
    assert budget_options("thinking", "seeds-react", {"max_tokens": 300})["max_tokens"] == 300
    assert budget_options("thinking", "seeds-react", {})["max_tokens"] == THINKING["seeds-react"]["max_tokens"]
    assert budget_options(None, "kair", {"k": 3}) == {"k": 3}
    with pytest.raises(ValueError, match="budget preset"):
        budget_options("huge", "kair")
