"""MAIN-RAG driven through the env by scripted LLMs: the log-prob judge scores, the adaptive judge
bar (hand-computed), what the final predictor reads, the env's counts, and every fallback."""
import json
import math

import pytest
from conftest import OverlapRetriever
from fake_llm import FakeLLM
from test_evaluate import setup  # noqa: F401  (the evaluation fixture)

import methods
from envs.types import QAExample
from methods.llm import Completion
from methods.main_rag import MainRAG, adaptive_filter, judge_bar, logprob_score, yes_no_token_ids
from methods.runner import run_questions_sync

QUESTION = QAExample("q0", "What is the capital of France?", ("Paris",), positive_ids=("p0",))
# With K=5 the overlap retriever gives the question these candidates, in rank order.
TOP5 = ["Paris", "France", "Berlin", "Tokyo", "Euro"]
# P(Yes) the scripted judge gives each title; its score is logit(p) = log p - log(1 - p):
#   Paris 2.9444, France 0.8473, Berlin -0.4055, Tokyo -0.8473, Euro -2.9444
# mean = -0.4055 / 5 = -0.0811; population std = sqrt(3.7879 - 0.0066) = 1.9446.
P_YES = {"Paris": 0.95, "France": 0.7, "Berlin": 0.4, "Tokyo": 0.3, "Euro": 0.05}
YES, NO = 11, 12
FULL_VOCAB_SHARE = 0.4  # forced calls: Yes and No together hold this much of the full vocabulary's mass


class WordTokenizer:
    """A tokenizer where Yes and No are single tokens (a real one's shape: ``input_ids``)."""

    vocab = {"Yes": [YES], "No": [NO], "Maybe": [13, 14]}

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": self.vocab.get(text, [99, 98])}

    def decode(self, ids, skip_special_tokens=False):
        return ""  # prompt tails hold no <think>


def kind(prompt: str) -> str:
    if "Reply with Yes or No only." in prompt:
        return "judge"
    if "were checked for relevance" in prompt:
        return "final"
    if "Read the document below" in prompt:
        return "predict"
    raise AssertionError(prompt[:200])


def title_of(prompt: str) -> str:
    return prompt.split("Document: (Title: ", 1)[1].split(")", 1)[0]


class Script:
    """Predictor: the document's title; judge: ``judge(title)``; final: Paris. Keeps the prompts."""

    def __init__(self, judge=lambda title: "Yes"):
        self.judge, self.prompts = judge, {}

    def __call__(self, prompt: str) -> str:
        what = kind(prompt)
        self.prompts.setdefault(what, []).append(prompt)
        if what == "predict":
            return title_of(prompt)
        return self.judge(title_of(prompt)) if what == "judge" else "Paris"


class LogprobLLM(FakeLLM):
    """A scripted LLM with a tokenizer whose constrained Yes/No choices come back as a real backend
    renormalising the choice gives them: the greedy token and its log-prob over the two."""

    tokenizer = WordTokenizer()
    count_tokenizer = None  # the env counts words, as with every scripted LLM

    def __init__(self, script, p_yes=P_YES, logprobs=True, errors=()):
        super().__init__(script)
        self.p_yes, self.with_logprobs, self.errors = p_yes, logprobs, set(errors)

    def generate(self, requests):
        results = super().generate(requests)
        texts = self.prompts[-len(requests):]
        for request, result, text in zip(requests, results, texts):
            if not request.allowed_token_ids:
                continue
            assert request.allowed_token_ids in ((YES, NO), (YES,), (NO,)) and request.max_tokens == 1
            title = title_of(text)
            if title in self.errors:
                result.completions[0] = Completion("", finish_reason="error", error="boom")
                continue
            p = self.p_yes[title]
            token, prob = (YES, p) if p >= 0.5 else (NO, 1 - p)
            if len(request.allowed_token_ids) == 1:  # forced: a full-vocabulary log-prob, as vLLM gives it
                token = request.allowed_token_ids[0]
                prob = FULL_VOCAB_SHARE * (p if token == YES else 1 - p)
            result.completions[0] = Completion("Yes" if token == YES else "No", [token],
                                               [math.log(prob)] if self.with_logprobs else [], "length")
        return results


def run(llm, k=5, **options):
    method = MainRAG(**options)
    env = method.env_config({"candidates_per_search": k, "max_expand": k})
    (record,) = run_questions_sync(method, [QUESTION], llm, OverlapRetriever(), env)
    return record


def final_titles(script) -> list[str]:
    (final,) = script.prompts["final"]
    return [line.split("(Title: ", 1)[1].split(")", 1)[0] for line in final.splitlines() if line.startswith("Doc ")]


def notes(record) -> list[str]:
    return [e["kind"] for e in record["trace"] if e["type"] == "note"]


@pytest.mark.parametrize("n, kept", [
    (0.0, ["Paris", "France"]),  # tau = -0.0811: Berlin's -0.4055 falls below it
    (1.0, ["Paris", "France", "Berlin", "Tokyo"]),  # tau = -0.0811 - 1.9446 = -2.0257: only Euro below
    (-0.5, ["Paris"]),  # tau = -0.0811 + 0.9723 = 0.8912: France's 0.8473 falls below it
])
def test_log_prob_judge_keeps_exactly_the_candidates_above_the_adaptive_bar(n, kept):
    script = Script()
    record = run(LogprobLLM(script), threshold_n=n)
    stats = record["method_stats"]
    assert stats["judge_scoring"] == "logprob" and stats["score_sources"] == ["logprob"] * 5
    expected = [math.log(P_YES[t]) - math.log(1 - P_YES[t]) for t in TOP5]
    assert stats["scores"] == pytest.approx(expected)
    assert stats["scores"] == pytest.approx([2.9444, 0.8473, -0.4055, -0.8473, -2.9444], abs=1e-4)
    assert stats["threshold"] == pytest.approx({0.0: -0.0811, 1.0: -2.0257, -0.5: 0.8912}[n], abs=1e-4)
    assert stats["kept"] == [TOP5.index(t) + 1 for t in kept]
    # the final predictor reads the kept documents only, best score first
    assert final_titles(script) == kept
    assert record["prediction"] == "Paris" and record["metrics"]["em"] == 1.0
    # the env opened exactly those: its reads and the selection counts reach the record
    assert [e["kind"] for e in record["trace"] if e["type"] == "env"] == ["search", "expand", "answer"]
    assert record["docs_read"] == len(kept) and record["searches"][0]["expanded_ranks"] == stats["kept"]
    assert record["positives_opened"] == 1 and record["negatives_opened"] == len(kept) - 1
    assert stats["filter_reads"] == 5  # what agents 1 and 2 read, which the env does not count
    tags = [e["tag"] for e in record["trace"] if e["type"] == "llm"]
    assert tags == ["predict"] * 5 + ["judge"] * 5 + ["answer"]


class VLLMLike(LogprobLLM):
    name = "vllm"


@pytest.mark.parametrize("llm_class, options", [(VLLMLike, {}), (LogprobLLM, {"judge_logprobs": "forced"})])
def test_forced_judge_calls_give_the_same_margin_from_full_vocabulary_log_probs(llm_class, options):
    script = Script()
    record = run(llm_class(script), **options)
    stats = record["method_stats"]
    assert stats["judge_scoring"] == "logprob" and stats["judge_logprobs"] == "forced"
    assert stats["scores"] == pytest.approx([2.9444, 0.8473, -0.4055, -0.8473, -2.9444], abs=1e-4)
    assert stats["kept"] == [1, 2] and final_titles(script) == ["Paris", "France"]
    tags = [e["tag"] for e in record["trace"] if e["type"] == "llm"]
    assert tags == ["predict"] * 5 + ["judge"] * 10 + ["answer"]  # a Yes call and a No call per candidate


def test_predicted_answers_reach_the_judge():
    script = Script()
    run(LogprobLLM(script))
    for prompt in script.prompts["judge"]:
        assert f"Answer drawn from it: {title_of(prompt)}" in prompt


def test_candidates_are_mapped_by_number_when_the_env_shuffles_them():
    script = Script()
    method = MainRAG()
    env = method.env_config({"candidates_per_search": 5, "max_expand": 5, "shuffle_candidates": True})
    (record,) = run_questions_sync(method, [QUESTION], LogprobLLM(script), OverlapRetriever(), env)
    assert final_titles(script) == ["Paris", "France"]
    assert sorted(record["searches"][0]["expanded_ranks"]) == [1, 2]  # the retriever's ranks of the kept two


def test_parsed_fallback_without_a_tokenizer_is_recorded():
    replies = {"Paris": "Yes.", "France": "yes, it does", "Berlin": "No", "Tokyo": "No.", "Euro": "hmm"}
    script = Script(lambda title: replies[title])
    record = run(FakeLLM(script))
    stats = record["method_stats"]
    assert stats["judge_scoring"] == "parsed" and "main_rag_logprob_unavailable" in notes(record)
    assert stats["scores"] == [1.0, 1.0, -1.0, -1.0, 0.0]  # mean 0: the unparsed 0 reaches the bar
    assert stats["score_sources"] == ["parsed", "parsed", "parsed", "parsed", "unparsed"]
    assert "main_rag_judge_unparsed" in notes(record)
    assert stats["kept"] == [1, 2, 5] and final_titles(script) == ["Paris", "France", "Euro"]
    assert record["docs_read"] == 3


def test_parsed_scoring_can_be_chosen_with_a_tokenizer():
    script = Script(lambda title: "Yes" if title == "Paris" else "No")
    llm = LogprobLLM(script)
    record = run(llm, judge_scoring="parsed")
    assert record["method_stats"]["judge_scoring"] == "parsed" and "main_rag_logprob_unavailable" not in notes(record)
    assert record["method_stats"]["kept"] == [1] and final_titles(script) == ["Paris"]


def test_a_reply_without_log_probs_falls_back_to_its_text():
    script = Script()
    record = run(LogprobLLM(script, logprobs=False))
    stats = record["method_stats"]
    assert stats["score_sources"] == ["parsed"] * 5 and notes(record).count("main_rag_logprob_missing") == 5
    assert stats["scores"] == [1.0, 1.0, -1.0, -1.0, -1.0]  # the constrained token's word, parsed
    assert stats["kept"] == [1, 2]


def test_a_failed_judgement_drops_its_candidate_and_the_bar_uses_the_rest():
    script = Script()
    record = run(LogprobLLM(script, errors={"France"}))
    stats = record["method_stats"]
    assert stats["scores"][1] is None and stats["score_sources"][1] == "error"
    assert "main_rag_judge_error" in notes(record)
    # tau over Paris, Berlin, Tokyo, Euro: (2.9444 - 0.4055 - 0.8473 - 2.9444) / 4 = -0.3132
    assert stats["threshold"] == pytest.approx(-0.3132, abs=1e-4)
    assert stats["kept"] == [1] and final_titles(script) == ["Paris"]


def test_the_expand_cap_opens_the_best_scored():
    script = Script()
    method = MainRAG(threshold_n=1.0)
    env = method.env_config({"candidates_per_search": 5, "max_expand": 2})
    (record,) = run_questions_sync(method, [QUESTION], LogprobLLM(script), OverlapRetriever(), env)
    assert "main_rag_expand_cap" in notes(record) and record["method_stats"]["kept"] == [1, 2]
    assert final_titles(script) == ["Paris", "France"] and record["docs_read"] == 2


def test_garbage_and_llm_errors_end_with_a_record():
    record = run(FakeLLM(lambda prompt: "I am not sure what to do here"))
    assert record["finish_reason"] == "answered" and record["metrics"]["em"] == 0.0

    def boom(prompt):
        raise RuntimeError("backend exploded")

    record = run(FakeLLM(boom))
    assert record["finish_reason"] == "error: RuntimeError" and record["prediction"] is None


def test_adaptive_filter_by_hand():
    assert judge_bar([1.0, 2.0, 3.0, 6.0], 0.0) == 3.0
    assert judge_bar([1.0, 2.0, 3.0, 6.0], 1.0) == pytest.approx(3.0 - math.sqrt(3.5))
    kept, tau = adaptive_filter([1.0, 6.0, None, 3.0, 2.0], 0.0)
    assert tau == 3.0 and kept == [1, 3]  # 6 then 3 (3 reaches the bar); None is never kept
    assert adaptive_filter([0.5, 0.5, 0.5], 0.0) == ([0, 1, 2], 0.5)  # all equal: all kept, in order
    assert adaptive_filter([0.1, 0.2, 0.3], 0.0)[0] == [2, 1]  # the float mean 0.2 still keeps 0.2
    assert adaptive_filter([None, None], 0.0) == ([], None)


def test_log_prob_score_and_token_ids():
    ids = (YES, NO)
    assert logprob_score(Completion("Yes", [YES], [math.log(0.8)]), ids) == pytest.approx(math.log(4))
    assert logprob_score(Completion("No", [NO], [math.log(0.8)]), ids) == pytest.approx(-math.log(4))
    assert logprob_score(Completion("Yes", [YES], [0.0]), ids) == pytest.approx(math.log((1 - 1e-6) / 1e-6))
    assert logprob_score(Completion("Yes", [YES], []), ids) is None
    assert logprob_score(Completion("Maybe", [13], [-0.1]), ids) is None
    assert yes_no_token_ids(WordTokenizer()) == (YES, NO)
    assert yes_no_token_ids(None) is None

    class Split(WordTokenizer):
        vocab = {"Yes": [1, 2], "No": [3]}

    assert yes_no_token_ids(Split()) is None


def test_options_env_and_registry():
    with pytest.raises(ValueError, match="judge_scoring"):
        MainRAG(judge_scoring="vote")
    with pytest.raises(ValueError, match="judge_logprobs"):
        MainRAG(judge_logprobs="top")
    assert MainRAG().llm_call_cap() == 88
    config = MainRAG().env_config()
    assert (config.candidates_per_search, config.max_expand, config.admission, config.max_searches,
            config.max_actions) == (20, 20, "preview", 1, 3)
    method = methods.get("main-rag", threshold_n=0.5)
    assert method.options()["threshold_n"] == 0.5 and method.name == "main-rag"


def test_hf_backend_scores_are_the_yes_no_logit_margin():
    """On the hf backend (a tiny random Llama with Yes and No as single tokens) each judge score is
    log P(Yes) - log P(No) of the judge prompt's next token, as a full forward pass computes it."""
    torch = pytest.importorskip("torch")
    from conftest import PASSAGES
    from tiny_models import bpe_tokenizer, tiny_llama

    from inference.backends.hf import HFBackend
    from methods.llm import GenerationRequest

    tokenizer = bpe_tokenizer([f"{title}: {text}" for _, title, text in PASSAGES], 500, added=["Yes", "No"])
    model = tiny_llama(tokenizer, init=0.3)
    llm = HFBackend(model, tokenizer, max_batch_size=8)
    method = MainRAG()
    (record,) = run_questions_sync(method, [QUESTION], llm, OverlapRetriever(),
                                   method.env_config({"candidates_per_search": 3, "max_expand": 3}))
    stats = record["method_stats"]
    assert stats["judge_scoring"] == "logprob" and stats["score_sources"] == ["logprob"] * 3, record["trace"][-3:]
    yes, no = yes_no_token_ids(tokenizer)
    titles = record["searches"][0]["titles"]
    judged = [e["prompt"] for e in record["trace"] if e["type"] == "llm" and e["tag"] == "judge"]
    assert len(judged) == 3
    for prompt in judged:
        ids = llm.generate([GenerationRequest(prompt=prompt, max_tokens=1)])[0].prompt_token_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        score = stats["scores"][titles.index(title_of(prompt[0]["content"]))]
        assert score == pytest.approx(float(logits[yes] - logits[no]), abs=1e-3)
    kept, _ = adaptive_filter(stats["scores"], 0.0)
    assert stats["kept"] == [i + 1 for i in kept] and record["docs_read"] == len(kept)
    assert stats["judge_logprobs"] == "choice"
    # forced single-token calls on hf come back renormalised (0.0): no information, a parsed verdict instead
    method = MainRAG(judge_logprobs="forced")
    (record,) = run_questions_sync(method, [QUESTION], llm, OverlapRetriever(),
                                   method.env_config({"candidates_per_search": 3, "max_expand": 3}))
    assert notes(record).count("main_rag_forced_uninformative") == 3
    assert set(record["method_stats"]["score_sources"]) <= {"parsed", "unparsed"}
    assert record["finish_reason"] in ("answered", "empty_answer")


def test_when_every_judgement_fails_nothing_is_opened():
    script = Script()
    record = run(LogprobLLM(script, errors=set(TOP5)))
    assert record["method_stats"]["kept"] == [] and record["method_stats"]["threshold"] is None
    assert "main_rag_nothing_kept" in notes(record) and record["docs_read"] == 0
    assert "(no passages)" in script.prompts["final"][0] and record["finish_reason"] == "answered"


def test_evaluate_runs_main_rag_from_the_command_line(setup):  # noqa: F811
    from test_evaluate import argv

    from inference import evaluate as ev
    from inference.predictions import load_predictions

    extra = ("--env.candidates_per_search", "4", "--method.options.threshold_n", "0.5")
    assert ev.main(argv(setup, "main-rag", *extra)) == 0
    records = load_predictions(setup["out"] / "predictions.jsonl")
    assert len(records) == 3 and all(r["finish_reason"] == "answered" for r in records)
    assert all(r["method_stats"]["filter_reads"] == 4 and r["docs_read"] == len(r["method_stats"]["kept"])
               for r in records)
    config = json.loads((setup["out"] / "config.json").read_text())
    assert config["method"] == "main-rag" and config["method_options"]["threshold_n"] == 0.5
    assert (config["env"]["admission"], config["env"]["candidates_per_search"]) == ("preview", 4)
