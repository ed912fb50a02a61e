"""The papers' decoding and search caps under --budget presets (issue 46, items 1-3): per-method
sampling that reaches the backend and is recorded, per-dataset caps of each method's source, greedy
as an explicit choice, thinking cut-offs counted in metrics.json, and the live-web recipe."""
import json
from pathlib import Path

import pytest
from conftest import OverlapRetriever
from fake_llm import FakeLLM
from test_evaluate import argv, setup  # noqa: F401  (the evaluation fixture)
from test_methods import QUESTION, competent

import methods
from envs.config import EnvConfig
from envs.types import QAExample
from inference import evaluate as ev
from inference.run_metrics import summarize
from methods.budgets import budget_options, dataset_kind
from methods.runner import run_questions_sync

ROOT = Path(__file__).resolve().parents[1]


class RecordingLLM(FakeLLM):
    """The scripted LLM, keeping every generation request it receives."""

    def __init__(self, respond):
        super().__init__(respond)
        self.requests = []

    def generate(self, requests):
        self.requests.extend(requests)
        return super().generate(requests)


def sampling_of(preset, method, **options):
    return methods.get(method, **budget_options(preset, method, options)).sampling()


# -- item 1: decoding ------------------------------------------------------------------------------

def test_paper_preset_gives_each_method_its_sources_sampling():
    for method in ("search-o1", "seeds-o1", "seek"):  # Search-o1's and PAGER's code
        s = sampling_of("paper", method)
        assert (s.temperature, s.top_p, s.top_k) == (0.7, 0.8, 20) and not s.greedy
    s = sampling_of("paper", "kair")  # KAIR's code
    assert (s.temperature, s.top_p, s.top_k) == (0.1, 0.9, 0)
    for method in ("seeds-react", "maps"):  # silent: the reasoning models' recommended sampling
        s = sampling_of("paper", method)
        assert (s.temperature, s.top_p, s.top_k) == (0.6, 0.95, 20)
    s = sampling_of("thinking", "seeds-o1")
    assert (s.temperature, s.top_p, s.top_k) == (0.6, 0.95, 20)
    for preset in ("paper", "thinking"):  # trained protocols: evaluated greedily, as validated
        assert sampling_of(preset, "search-r1").greedy and sampling_of(preset, "seeds-r1").greedy


def test_greedy_is_the_default_and_an_explicit_choice_under_a_preset(tmp_path):
    for method in methods.available():
        assert methods.get(method).sampling().greedy
        assert sampling_of("small", method).greedy and sampling_of(None, method).greedy
    assert sampling_of("paper", "search-o1", temperature=0).greedy  # an explicit option wins
    args = ev.resolve_args(["--method.name", "search-o1", "--method.budget", "paper", "--method.greedy",
                            "--run.output_dir", str(tmp_path)])
    method = ev.build_method(args.method)
    assert method.sampling().greedy and (method.top_p, method.top_k) == (1.0, 0)
    assert method.max_tokens == 8192  # the preset's budgets stay
    args = ev.resolve_args(["--method.name", "kair", "--method.options.temperature", "-1",
                            "--run.output_dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="temperature"):
        ev.build_method(args.method)


def test_the_sampling_reaches_every_generation_request():
    llm = RecordingLLM(competent)
    method = methods.get("search-o1", **budget_options("paper", "search-o1"))
    (record,) = run_questions_sync(method, [QUESTION], llm, OverlapRetriever(), EnvConfig(), seed=3)
    assert record["prediction"] == "Paris" and len(llm.requests) >= 2  # reasoner and reader calls
    assert {(r.temperature, r.top_p, r.top_k) for r in llm.requests} == {(0.7, 0.8, 20)}
    seeds = [r.seed for r in llm.requests]
    assert len(set(seeds)) == len(seeds)  # each call its own draw
    llm = RecordingLLM(competent)
    run_questions_sync(methods.get("search-o1"), [QUESTION], llm, OverlapRetriever(), EnvConfig())
    assert {(r.temperature, r.top_p, r.top_k) for r in llm.requests} == {(0.0, 1.0, 0)}
    # sampling_seed replaces the run's --seed
    a, b = RecordingLLM(competent), RecordingLLM(competent)
    run_questions_sync(methods.get("vanilla-llm", sampling_seed=66), [QUESTION], a, OverlapRetriever(), EnvConfig(),
                       seed=0)
    run_questions_sync(methods.get("vanilla-llm", sampling_seed=66), [QUESTION], b, OverlapRetriever(), EnvConfig(),
                       seed=5)
    assert [r.seed for r in a.requests] == [r.seed for r in b.requests]


def test_config_and_metrics_record_the_sampling(setup):  # noqa: F811
    ev.main(argv(setup, "seeds-react", "--method.budget", "paper", "--data.limit", "1"))
    config = json.loads((setup["out"] / "config.json").read_text())
    metrics = json.loads((setup["out"] / "metrics.json").read_text())
    expected = {"mode": "sample", "temperature": 0.6, "top_p": 0.95, "top_k": 20, "seed": 0}
    assert config["sampling"] == expected and metrics["sampling"] == expected
    assert "temperature" not in config["method_options"]
    ev.main(argv(setup, "seeds-react", "--run.overwrite", "--data.limit", "1"))  # no preset: greedy, recorded as such
    config = json.loads((setup["out"] / "config.json").read_text())
    assert config["sampling"]["mode"] == "greedy"
    assert json.loads((setup["out"] / "metrics.json").read_text())["sampling"]["mode"] == "greedy"


def test_runs_from_before_the_sampling_option_still_resume(setup):  # noqa: F811
    ev.main(argv(setup, "vanilla-rag", "--data.limit", "1"))
    path = setup["out"] / "config.json"
    config = json.loads(path.read_text())
    del config["sampling"]
    path.write_text(json.dumps(config))
    ev.main(argv(setup, "vanilla-rag", "--data.limit", "2"))  # greedy then and now: resumes
    with pytest.raises(SystemExit, match="sampling"):
        ev.main(argv(setup, "vanilla-rag", "--data.limit", "3", "--method.options.temperature", "0.7"))


# -- item 3: search caps per method and dataset -----------------------------------------------------

def env_of(tmp_path, method, *extra):
    args = ev.resolve_args(["--method.name", method, "--run.output_dir", str(tmp_path), *extra])
    return ev.build_env(args, ev.build_method(args.method))


def test_dataset_kind_from_the_name_or_file():
    assert dataset_kind("data/nq_test.jsonl") == dataset_kind("RUC-NLPIR/FlashRAG_datasets/triviaqa") == "single_hop"
    for name in ("hotpotqa_dev_distractor_500.jsonl", "2WikiMultihopQA", "musique_ans", "bamboogle.jsonl"):
        assert dataset_kind(name) == "multi_hop"
    assert dataset_kind("hle.jsonl") is None and dataset_kind("inquiry.jsonl") is None and dataset_kind(None) is None


def test_paper_preset_gives_search_o1s_caps_per_dataset(tmp_path):
    multi = env_of(tmp_path, "search-o1", "--method.budget", "paper", "--data.path", "x/hotpotqa_dev.jsonl")
    assert (multi.max_searches, multi.max_actions, multi.candidates_per_search) == (10, 15, 10)
    single = env_of(tmp_path, "search-o1", "--method.budget", "paper", "--data.path", "x/nq_test.jsonl")
    assert (single.max_searches, single.max_actions) == (5, 15)
    hinted = env_of(tmp_path, "search-o1", "--method.budget", "paper", "--data.path", "x/questions.jsonl",
                    "--data.dataset", "nq")
    assert hinted.max_searches == 5
    assert env_of(tmp_path, "search-o1", "--method.budget", "paper").max_searches == 10  # unknown: multi-hop default
    seeds_o1 = env_of(tmp_path, "seeds-o1", "--method.budget", "paper", "--data.path", "musique.jsonl")
    assert (seeds_o1.max_searches, seeds_o1.max_actions) == (10, 25)
    assert env_of(tmp_path, "seeds-o1", "--method.budget", "paper", "--data.dataset", "triviaqa").max_searches == 5
    # an explicit --env still wins over the preset
    assert env_of(tmp_path, "search-o1", "--method.budget", "paper", "--data.path", "hotpotqa.jsonl",
                  "--env.max_searches", "3").max_searches == 3
    # without the paper preset the caps stay as before (earlier results do not move)
    for extra in ((), ("--method.budget", "thinking"), ("--method.budget", "small")):
        env = env_of(tmp_path, "search-o1", "--data.path", "hotpotqa.jsonl", *extra)
        assert (env.max_searches, env.max_actions) == (5, 12)
        env = env_of(tmp_path, "seeds-react", "--data.path", "hotpotqa.jsonl", *extra)
        assert (env.max_searches, env.max_actions) == (4, 12)
    env = env_of(tmp_path, "seeds-react", "--method.budget", "paper", "--data.path", "hotpotqa.jsonl")
    assert (env.max_searches, env.max_actions) == (4, 12)  # no source states SEEDS-ReAct's caps


# -- item 2: thinking cut-offs and the live-web recipe -----------------------------------------------

def test_metrics_count_thinking_cut_offs_on_a_scripted_transcript():
    def reply(prompt: str) -> str:  # thinks past any budget on the France question, answers at once otherwise
        if "France" in prompt:
            return "<think>" + " ".join(["hmm"] * 500) + "</think>\nParis"
        return "<think>short</think>\nTokyo"

    questions = [QUESTION, QAExample(id="q2", question="What is the capital of Japan?", golden_answers=["Tokyo"])]
    records = run_questions_sync(methods.get("vanilla-llm", answer_tokens=64), questions, FakeLLM(reply),
                                 OverlapRetriever(), EnvConfig())
    cut = [e for r in records for e in r["trace"] if e["type"] == "llm" and e.get("thinking") == "cut_off"]
    assert len(cut) == 1 and cut[0]["finish_reason"] == "length"
    metrics = summarize(records)
    assert metrics["thinking_cut_offs"] == 1 and metrics["thinking_cut_off_questions"] == 1
    assert summarize(records[1:])["thinking_cut_offs"] == 0


def test_the_live_web_recipe_uses_the_thinking_budget(tmp_path):
    args = ev.resolve_args(["--config", str(ROOT / "configs/eval/seeds_o1_web.yaml"), "--data.path", "hle.jsonl",
                            "--model.name", "openai:qwq-32b", "--run.output_dir", str(tmp_path)])
    assert args.method.budget == "thinking"
    method = ev.build_method(args.method)
    assert method.max_tokens == 8192 and method.reader_max_tokens == 8192
    assert not method.sampling().greedy
