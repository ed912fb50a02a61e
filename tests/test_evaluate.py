"""The evaluation runner end to end with a scripted LLM: outputs, resume, compare, config."""
import json

import pytest
from conftest import PASSAGES
from fake_llm import FakeLLM
from test_methods import competent

from envs.retrieval.corpus import load_corpus
from envs.retrieval.encoders import load_encoder
from envs.retrieval.index import build_index
from inference import evaluate as ev
from inference.predictions import PredictionsFileError, PredictionWriter, load_predictions
from inference.run_metrics import opening_stats

QUESTIONS = [
    {"id": "a", "question": "What is the capital of France?", "golden_answers": ["Paris"]},
    {"id": "b", "question": "Which river flows through Vienna?", "golden_answers": ["Danube"]},
    {"id": "c", "question": "What is the capital of Japan?", "golden_answers": ["Tokyo"]},
]


@pytest.fixture
def setup(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "title": t, "text": x}) + "\n" for i, t, x in PASSAGES))
    index = tmp_path / "index"
    build_index(load_corpus(corpus), load_encoder("hash"), index, show_progress=False)
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    llm = FakeLLM(competent)
    backend_options = []
    monkeypatch.setattr("inference.evaluate.load_backend", lambda spec, **kw: backend_options.append(kw) or llm)
    return {"backend_options": backend_options, "index": str(index), "data": str(data), "out": tmp_path / "run",
            "llm": llm}


def argv(setup, method="seeds-react", *extra):
    return ["--method.name", method, "--data.path", setup["data"], "--data.index", setup["index"],
            "--model.name", "hf:fake", "--run.output_dir", str(setup["out"]), *extra]


def test_run_writes_predictions_metrics_and_config(setup, capsys):
    assert ev.main(argv(setup)) == 0
    records = load_predictions(setup["out"] / "predictions.jsonl")
    assert sorted(r["id"] for r in records) == ["a", "b", "c"]
    first = next(r for r in records if r["id"] == "a")
    assert first["prediction"] == "Paris" and first["metrics"]["em"] == 1.0
    for key in ("searches", "doc_tokens", "llm_prompt_tokens", "llm_completion_tokens", "latency_s", "finish_reason",
                "trace", "docs_read"):
        assert key in first
    assert first["searches"][0]["expanded_ranks"] == [1, 2]
    metrics = json.loads((setup["out"] / "metrics.json").read_text())
    assert metrics["questions"] == 3 and metrics["em"] == pytest.approx(1 / 3)  # the fake always says Paris
    assert metrics["docs_read_per_question"] == 2.0
    config = json.loads((setup["out"] / "config.json").read_text())
    assert config["method"] == "seeds-react" and config["env"]["admission"] == "preview"
    assert config["guided_actions"] is True  # a method with an action format on an hf backend
    assert setup["backend_options"] == [{"prefix_cache": 32}] and "prefix_cache" not in config["llm_options"]
    assert first["trace"][0]["guided"] is True
    assert "Beyond-prefix" in capsys.readouterr().out


def test_killed_run_resumes_without_duplicates(setup):
    ev.main(argv(setup, "vanilla-rag", "--data.limit", "2"))  # 2 of 3 done ...
    path = setup["out"] / "predictions.jsonl"
    with open(path, "a") as handle:
        handle.write('{"id": "c", "question": "torn li')  # ... and a third killed mid-write
    calls_before = len(setup["llm"].prompts)
    ev.main(argv(setup, "vanilla-rag", "--data.limit", "2"))  # same config: nothing left to run
    assert len(setup["llm"].prompts) == calls_before
    assert [r["id"] for r in load_predictions(path)] == ["a", "b"]
    with pytest.raises(SystemExit, match=r"different configuration \(seed\)"):
        ev.main(argv(setup, "vanilla-rag", "--data.limit", "2", "--run.seed", "1"))
    ev.main(argv(setup, "vanilla-rag", "--data.limit", "3", "--run.overwrite"))
    ids = [r["id"] for r in load_predictions(path)]
    assert sorted(ids) == ["a", "b", "c"] and len(ids) == 3


def test_a_larger_limit_or_sample_extends_the_run(setup):
    path = setup["out"] / "predictions.jsonl"
    ev.main(argv(setup, "vanilla-rag", "--data.limit", "1"))
    calls = len(setup["llm"].prompts)
    ev.main(argv(setup, "vanilla-rag", "--data.limit", "3"))  # not refused: runs b and c only
    assert len(setup["llm"].prompts) == calls + 2
    assert sorted(r["id"] for r in load_predictions(path)) == ["a", "b", "c"]
    config = json.loads((setup["out"] / "config.json").read_text())
    assert config["limit"] == 3 and config["sample"] is None and config["guided_actions"] is False  # no format
    ev.main(argv(setup, "vanilla-rag", "--data.sample", "2", "--run.seed", "0"))
    metrics = json.loads((setup["out"] / "metrics.json").read_text())
    assert metrics["questions"] == 2 and json.loads((setup["out"] / "config.json").read_text())["sample"] == 2
    assert len(setup["llm"].prompts) == calls + 2  # the sample's questions were all done already


def test_sample_is_seeded_nested_and_recorded(setup, tmp_path):
    data = tmp_path / "many.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Question {i}?", "golden_answers": ["x"]}) + "\n"
                            for i in range(40)))

    def ids(*extra):
        args = ev.resolve_args(["--method.name", "vanilla-llm", "--data.path", str(data), "--run.output_dir", "o",
                                *extra])
        return [e.id for e in ev.load_examples(args.data, args.run.seed)]
    five, ten = ids("--data.sample", "5", "--run.seed", "3"), ids("--data.sample", "10", "--run.seed", "3")
    assert len(five) == 5 and five == ids("--data.sample", "5", "--run.seed", "3") and set(five) < set(ten)
    assert five != ids("--data.sample", "5", "--run.seed", "4") and five != [f"q{i}" for i in range(5)]
    assert five == sorted(five, key=lambda q: int(q[1:]))  # file order
    with pytest.raises(SystemExit, match="not both"):
        ids("--data.sample", "5", "--data.limit", "5")


def test_runs_from_before_new_config_keys_resume(setup):
    ev.main(argv(setup, "seeds-react", "--data.limit", "1"))
    config_path = setup["out"] / "config.json"
    old = json.loads(config_path.read_text())
    del old["sample"], old["guided_actions"]  # as written before these options existed
    config_path.write_text(json.dumps(old))
    with pytest.raises(SystemExit, match=r"different configuration \(guided_actions\)"):
        ev.main(argv(setup, "seeds-react", "--data.limit", "2"))  # guided by default now: not the old run
    ev.main(argv(setup, "seeds-react", "--data.limit", "2", "--model.guided_actions", "false"))
    assert len(load_predictions(setup["out"] / "predictions.jsonl")) == 2
    with pytest.raises(SystemExit, match="declares no action format"):
        ev.main(argv(setup, "vanilla-rag", "--model.guided_actions", "--run.overwrite"))


def test_resume_runs_only_missing_questions(setup):
    out = setup["out"]
    ev.main(argv(setup, "vanilla-llm"))
    lines = (out / "predictions.jsonl").read_text().splitlines()
    (out / "predictions.jsonl").write_text("\n".join(lines[:1]) + "\n")
    calls_before = len(setup["llm"].prompts)
    ev.main(argv(setup, "vanilla-llm"))
    assert len(setup["llm"].prompts) - calls_before == 2
    assert sorted(r["id"] for r in load_predictions(out / "predictions.jsonl")) == ["a", "b", "c"]


def test_compare_prints_runs_side_by_side(setup, tmp_path, capsys):
    ev.main(argv(setup, "vanilla-rag"))
    other = dict(setup, out=tmp_path / "run2")
    ev.main(argv(other, "seeds-react"))
    capsys.readouterr()
    assert ev.main(["--compare", str(setup["out"]), str(other["out"])]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("run") and table[2].startswith("run ") and table[3].startswith("run2")
    assert (setup["out"] / "compare.json").exists()  # the paired comparison, beside the baseline run


def test_config_file_and_method_options(setup, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"method: react\nmethod_option: ['k=3']\ndata: {setup['data']}\nindex: {setup['index']}\n"
                      f"llm: hf:fake\nout: {setup['out']}\n")
    ev.main(["--config", str(recipe)])
    config = json.loads((setup["out"] / "config.json").read_text())
    # k is an env limit now: the old option is read as the env's candidates_per_search (with a note)
    assert "k" not in config["method_options"] and config["env"]["candidates_per_search"] == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("methd: react\n")
    with pytest.raises(SystemExit, match="methd"):
        ev.main(["--config", str(bad)])


def test_prediction_file_guards(tmp_path):
    path = tmp_path / "p.jsonl"
    with PredictionWriter(path) as writer:
        writer.write({"id": "x"})
        with pytest.raises(PredictionsFileError):
            writer.write({"id": "x"})
    path.write_text('{"id": "x"}\nnot json\n{"id": "y"}\n')
    with pytest.raises(PredictionsFileError, match="line 2"):
        load_predictions(path)


def test_opening_stats_follow_the_seeds_definitions():
    records = [{"searches": [
        {"answer_bearing": [False, True, False, False], "expanded": [2, 3]},  # hit; rank 3 beyond prefix 2
        {"answer_bearing": [True, False], "expanded": [2]},  # pool has one, the opened one missed it; beyond
        {"answer_bearing": [False, False], "expanded": [1]},  # no answer-bearing candidate: not counted
    ]}]
    stats = opening_stats(records)
    assert stats["answer_bearing_hit_rate"] == 0.5 and stats["answer_bearing_rounds"] == 2
    assert stats["beyond_prefix_fraction"] == pytest.approx(2 / 4)


def test_wandb_logging_goes_offline_without_a_key(setup, monkeypatch):
    import sys
    import types

    calls = {}

    class FakeRun:
        def __init__(self, **kwargs):
            calls["init"] = kwargs
            self.summary = {}

        def log(self, data):
            calls["log"] = data

        def finish(self):
            calls["finished"] = True

    class FakeTable:
        def __init__(self, columns):
            self.columns, self.rows = columns, []

        def add_data(self, *row):
            self.rows.append(row)

    fake = types.SimpleNamespace(init=lambda **kw: FakeRun(**kw), Table=FakeTable)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    ev.main(argv(setup, "vanilla-rag", "--run.report_to", "wandb", "--run.wandb_project", "proj"))
    assert calls["init"]["mode"] == "offline" and calls["init"]["project"] == "proj"
    assert calls["init"]["config"]["method"] == "vanilla-rag"
    assert len(calls["log"]["predictions"].rows) == 3 and calls["finished"]


def test_variant_flag_is_checked_against_the_method(setup):
    with pytest.raises(SystemExit, match="no option"):
        ev.main(argv(setup, "seeds-react", "--method.variant", "plan"))
    with pytest.raises(SystemExit, match="contradicts"):
        ev.main(argv(setup, "seeds-react", "--method.variant", "plan", "--method.options.variant", "update"))


def test_variant_flag_runs_the_variant(setup):
    assert ev.main(argv(setup, "maps", "--method.variant", "no_parallel", "--method.options.max_iterations", "2")) == 0
    config = json.loads((setup["out"] / "config.json").read_text())
    assert config["method_options"]["variant"] == "no_parallel"
    records = load_predictions(setup["out"] / "predictions.jsonl")
    assert len(records) == 3
    for record in records:
        assert all(len(r) == 1 for r in record["search_rounds"])  # one sub-query per iteration
        assert record["method_stats"]["variant"] == "no_parallel"
