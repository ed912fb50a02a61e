"""Guided actions: the action-format expressions, the HF backend's llguidance masks, the runner's
wiring (agent turns carry the method's format, other calls do not) and the vLLM/OpenAI requests."""
from __future__ import annotations

import re
import types

import pytest
from fake_llm import FakeLLM
from test_methods import competent
from tiny_models import bpe_tokenizer
from tiny_models import tiny_llama as shared_tiny_llama

import methods
from envs.config import EnvConfig
from envs.episode import EpisodeState
from envs.protocol import CLOSING_TAGS, InvalidAction, parse_action
from inference.backends.openai_backend import request_body
from inference.backends.vllm_backend import guided_kwargs
from methods.guidance import action_regex, open_tags
from methods.llm import GenerationRequest
from methods.runner import run_questions_sync

SEEDS_TAGS = ("search", "expand", "answer")
TEXT = ["I should look this up. <search>capital of France</search> Two look useful. <expand>1, 2</expand> "
        "So it is <answer>Paris</answer>. <expand>none</expand>"] * 3


def fullmatch(regex: str, text: str) -> bool:
    return re.fullmatch(regex, text) is not None


def test_action_regex_accepts_one_well_formed_action_only():
    regex = action_regex(SEEDS_TAGS)
    for good in ("I will look it up. <search>capital of France</search>", "<expand>2, 5</expand>",
                 "<expand>none</expand>", "<expand>1 3</expand>", "Known.\nSo: <answer>Paris</answer>"):
        assert fullmatch(regex, good), good
    for bad in ("<search>a</search><answer>b</answer>", "<search>capital of", "<expand>two</expand>",
                "<think>x</think><answer>y</answer>", "x" * 301 + "<answer>y</answer>", "<search></search>",
                "<answer>Paris</answer> and more", "<read>2</read>"):
        assert not fullmatch(regex, bad), bad
    assert fullmatch(action_regex(("search", "read", "answer")), "<read>2</read>")
    numbered = action_regex(("expand",), candidates=10, max_expand=3)
    assert fullmatch(numbered, "<expand>10, 2 3</expand>") and fullmatch(numbered, "<expand>none</expand>")
    assert not fullmatch(numbered, "<expand>11</expand>") and not fullmatch(numbered, "<expand>1, 2, 3, 4</expand>")
    assert not fullmatch(numbered, "<expand>0</expand>")
    with pytest.raises(ValueError, match="no action content"):
        action_regex(("think",))


def test_actions_are_bounded_lines_and_a_turn_fits_its_budget():
    regex = action_regex(("search", "answer"), answer_chars=10, query_chars=20)
    assert fullmatch(regex, "<answer>" + "a" * 10 + "</answer>")
    assert fullmatch(regex, "<search>" + "q" * 20 + "</search>")
    for bad in ("<answer>" + "a" * 11 + "</answer>", "<search>" + "q" * 21 + "</search>",
                "<answer>Paris\nand more</answer>", "<search>one\ntwo</search>"):
        assert not fullmatch(regex, bad), bad  # one line, bounded
    budget = action_regex(("search", "answer"), answer_chars=10, query_chars=20, max_tokens=60)
    search_room = 60 - len("<search></search>") - 20
    assert fullmatch(budget, "x" * search_room + "<search>" + "q" * 20 + "</search>")
    assert not fullmatch(budget, "x" * (search_room + 1) + "<search>" + "q" * 20 + "</search>")
    answer_room = 60 - len("<answer></answer>") - 10
    assert fullmatch(budget, "x" * answer_room + "<answer>" + "a" * 10 + "</answer>")
    assert not fullmatch(budget, "x" * (answer_room + 1) + "<answer>a</answer>")
    numbered = action_regex(("expand",), candidates=10, max_expand=10, max_tokens=60)
    assert fullmatch(numbered, "<expand>" + ", ".join(str(i) for i in range(1, 11)) + "</expand>")
    with pytest.raises(ValueError, match="cannot hold"):
        action_regex(("search", "answer"), max_tokens=40)  # a 120-character query cannot fit 40 tokens


@pytest.fixture(scope="module")
def long_backend():
    pytest.importorskip("llguidance")
    from inference.backends.hf import HFBackend

    tokenizer = bpe_tokenizer(TEXT, 300, repeats=20)
    return HFBackend(shared_tiny_llama(tokenizer, init=0.3, context=4096), tokenizer, max_batch_size=4)


def test_guided_turns_close_their_action_within_the_budget(long_backend, retriever, examples):
    """A model that never stops on its own (random weights), guided, with short turns: every turn
    ends in its closed action, none runs out of tokens, answers are single bounded lines."""
    method = methods.get("seeds-react", max_tokens=48, answer_chars=12, query_chars=16, example=False)
    env = method.env_config({"max_actions": 6, "candidates_per_search": 3})
    records = run_questions_sync(method, examples[:2], long_backend, retriever, env, guided_actions=True)
    turns = [e for r in records for e in r["trace"] if e["type"] == "llm" and e["tag"] == "turn"]
    assert turns and all(e["guided"] for e in turns)
    assert all(e["finish_reason"] == "stop" and e["completion_tokens"] <= 48 for e in turns), [
        (e["output"], e["finish_reason"], e["error"], e["completion_tokens"]) for e in turns]
    assert all(not isinstance(parse_action(e["output"]), InvalidAction) for e in turns)
    assert not any("never closed" in str(e) for r in records for e in r["trace"])
    for record in records:
        assert record["prediction"] is None or len(record["prediction"]) <= 12 and "\n" not in record["prediction"]


def test_methods_declare_their_action_formats():
    assert methods.get("seeds-react").action_regex() == action_regex(SEEDS_TAGS)
    assert methods.get("react-dynk").action_regex() == action_regex(("search", "read", "answer"))
    assert methods.get("vanilla-rag").action_regex() is None


@pytest.fixture(scope="module")
def backend():
    pytest.importorskip("llguidance")
    from inference.backends.hf import HFBackend

    tokenizer = bpe_tokenizer(TEXT, 300, repeats=20)
    return HFBackend(shared_tiny_llama(tokenizer, init=0.3, context=1024), tokenizer, max_batch_size=4)


def test_guided_rows_always_end_in_one_action(backend):
    """A random model writes anything; guided, every sample is free text then one valid action."""
    regex = action_regex(SEEDS_TAGS, thought_chars=40)
    prompt = "Question: What is the capital of France? Think, then act."
    requests = [GenerationRequest(prompt, stop=CLOSING_TAGS, max_tokens=400, temperature=1.0, seed=s, regex=regex)
                for s in range(6)] + [GenerationRequest(prompt, stop=CLOSING_TAGS, max_tokens=400, regex=regex)]
    for result in backend.generate(requests):
        completion = result.completions[0]
        assert completion.finish_reason == "stop", completion
        assert completion.stop_string == completion.text[-len(completion.stop_string):]
        assert fullmatch(regex, completion.text), completion.text
        assert not isinstance(parse_action(completion.text), InvalidAction), completion.text
        assert backend.tokenizer.decode(completion.token_ids) == completion.text


def test_guided_without_stop_strings_ends_at_the_expression(backend):
    regex = "[^<]{0,10}<answer>[a-z ]{1,12}</answer>"
    (result,) = backend.generate([GenerationRequest("Say it:", max_tokens=200, temperature=1.0, seed=3,
                                                    regex=regex)])
    assert result.completions[0].finish_reason == "eos" and fullmatch(regex, result.text), result.text


def test_unguided_rows_in_a_guided_batch_are_unchanged(backend):
    plain = GenerationRequest("The capital of France", max_tokens=12)
    guided = GenerationRequest("The capital of France", max_tokens=300, regex=action_regex(SEEDS_TAGS, 20))
    alone = backend.generate([plain])[0].completions[0]
    together = backend.generate([guided, plain])[1].completions[0]
    assert together.token_ids == alone.token_ids


def test_a_bad_regex_fails_its_own_request_only(backend):
    bad, good = backend.generate([GenerationRequest("x", max_tokens=3, regex="a("),
                                  GenerationRequest("x", max_tokens=3)])
    assert bad.completions[0].finish_reason == "error" and "cannot guide" in bad.completions[0].error
    assert good.completions[0].finish_reason != "error"


class RecordingLLM(FakeLLM):
    def __init__(self, respond):
        super().__init__(respond)
        self.requests: list[GenerationRequest] = []

    def generate(self, requests):
        self.requests.extend(requests)
        return super().generate(requests)


def test_runner_guides_agent_turns_with_the_actions_the_env_accepts(retriever, examples):
    method = methods.get("seeds-react")
    env = method.env_config({"max_actions": 4, "candidates_per_search": 3})
    llm = RecordingLLM(lambda prompt: "Look it up. <search>capital of France</search>")  # ignores the guide
    (record,) = run_questions_sync(method, examples[:1], llm, retriever, env, guided_actions=True)
    turns = [e for e in record["trace"] if e["type"] == "llm" and e["tag"] == "turn"]
    forced = [e for e in record["trace"] if e["type"] == "llm" and e["tag"] == "forced_answer"]
    assert turns and forced and all(e["guided"] for e in turns) and not any(e["guided"] for e in forced)
    first, second = (r.regex for r in llm.requests[:2])
    assert first == action_regex(("search", "answer"), max_tokens=256)  # nothing to expand yet, seeds-react's turn
    assert fullmatch(second, "Open two. <expand>1, 3</expand>") and fullmatch(second, "<expand>none</expand>")
    for refused in ("<search>again</search>", "<answer>Paris</answer>", "<expand>4</expand>"):
        assert not fullmatch(second, refused), refused  # a snapshot of 3 awaits its expand
    assert llm.requests[-1].regex is None  # the forced answer is not a turn
    (unguided,) = run_questions_sync(method, examples[:1], RecordingLLM(competent), retriever, env)
    assert not any(e.get("guided") for e in unguided["trace"] if e["type"] == "llm")


def test_open_tags_follow_the_env_rules(examples):
    config = EnvConfig(admission="preview", max_searches=2, require_expand=True)
    episode = EpisodeState(examples[0])
    assert open_tags(SEEDS_TAGS, episode, config) == ("search", "answer")
    episode.awaiting_expand = True
    assert open_tags(SEEDS_TAGS, episode, config) == ("expand",)
    assert open_tags(("search", "answer"), episode, config) == ("search", "answer")  # none accepted: all, env explains
    episode.awaiting_expand = False
    episode.searches = [None, None]  # both searches spent
    assert open_tags(SEEDS_TAGS, episode, config) == ("answer",)
    prefix = EnvConfig(admission="prefix", max_searches=2)
    assert open_tags(("search", "answer"), EpisodeState(examples[0]), prefix) == ("search", "answer")


def test_guiding_a_method_without_an_action_format_is_refused(retriever):
    with pytest.raises(ValueError, match="declares no action format"):
        run_questions_sync(methods.get("vanilla-rag"), [], FakeLLM(competent), retriever, guided_actions=True)


def test_vllm_and_openai_requests_carry_the_expression():
    class Params:
        def __init__(self, regex):
            self.regex = regex

    new = types.SimpleNamespace(sampling_params=types.SimpleNamespace(StructuredOutputsParams=Params))
    old = types.SimpleNamespace(sampling_params=types.SimpleNamespace(GuidedDecodingParams=Params))
    assert guided_kwargs(new, "a+")["structured_outputs"].regex == "a+"
    assert guided_kwargs(old, "a+")["guided_decoding"].regex == "a+"
    assert guided_kwargs(new, None) == {}
    with pytest.raises(ValueError, match="no guided decoding"):
        guided_kwargs(types.SimpleNamespace(sampling_params=types.SimpleNamespace()), "a+")
    request = GenerationRequest("q", regex="a+")
    assert request_body("m", request, vllm_extensions=True)[1]["structured_outputs"] == {"regex": "a+"}
    with pytest.raises(ValueError, match="vLLM-compatible server"):
        request_body("m", request, vllm_extensions=False)
