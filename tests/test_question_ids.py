"""Stable question ids, and every place that pairs records by id refusing an id that names another
question: generated questions, resume, shards and merge, --compare, the viewer, --vs, seed_spread."""
import json

import pytest
import yaml
from test_analysis import maps_records, scored
from test_analysis import write_run as write_analysis_run
from test_default_data import SUMMARIES
from test_evaluate import argv, setup  # noqa: F401  (the fixture)

from envs.default_questions import generate_default_questions
from envs.question_match import QuestionMismatchError
from envs.retrieval.default_corpus import write_default_corpus
from inference import analysis, view
from inference import evaluate as ev
from inference.analysis_metrics import conflict_split
from inference.compare import compare_records
from inference.predictions import PredictionsFileError
from inference.shards import merge_run, run_records, write_plan
from training import seed_spread


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDS_RL_CACHE", str(tmp_path / "cache"))
    return write_default_corpus(SUMMARIES, tmp_path / "corpus.jsonl", tmp_path / "articles.jsonl")


def test_a_larger_generated_draw_keeps_the_smaller_ones_questions_under_the_same_ids(files):
    corpus, articles = files
    full = generate_default_questions(7, seed=0, corpus_path=corpus, meta_path=articles)
    for n in range(1, 7):
        assert generate_default_questions(n, seed=0, corpus_path=corpus, meta_path=articles) == full[:n]
    other_seed = generate_default_questions(7, seed=1, corpus_path=corpus, meta_path=articles)
    by_id = {e.id: e.question for e in full}
    assert {e.id: e.question for e in other_seed} == by_id  # every question, under the same id in any draw


def record(qid, question, em=1.0):
    return {"id": qid, "question": question, "prediction": "p", "metrics": {"em": em, "f1": em}, "docs_read": 1,
            "llm_calls": 1, "llm_prompt_tokens": 1, "llm_completion_tokens": 1, "latency_s": 0.1,
            "finish_reason": "answer", "n_searches": 1, "n_invalid": 0, "doc_tokens": 1, "positives_opened": 0,
            "golden_answers": ["x"]}


def test_compare_refuses_an_id_that_names_another_question():
    baseline = [record("q1", "Who wrote Hamlet?"), record("q2", "Where is Vienna?")]
    extended = [record("q1", "Who wrote Hamlet?"), record("q2", "What is the capital of Peru?", 0.0)]
    with pytest.raises(QuestionMismatchError, match=r"1 question id\(s\).*'q2'"):
        compare_records(baseline, extended)
    assert compare_records(baseline, baseline[:1])["questions_paired"] == 1


def write_run(folder, records):
    folder.mkdir(parents=True)
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_compare_cli_and_viewer_refuse_runs_whose_ids_name_different_questions(tmp_path):
    a = write_run(tmp_path / "a", [record("q1", "Who wrote Hamlet?"), record("q2", "Where is Vienna?")])
    b = write_run(tmp_path / "b", [record("q1", "Who wrote Hamlet?"), record("q2", "Capital of Peru?")])
    with pytest.raises(SystemExit, match="'q2'.*cannot be paired"):
        ev.main(["--compare", str(a), str(b)])
    with pytest.raises(SystemExit, match="'q2'"):
        view.main([str(a), str(b), "--out", str(tmp_path / "view.html")])
    run = write_analysis_run(tmp_path / "maps", maps_records(3))
    vanilla = write_analysis_run(tmp_path / "vanilla", [scored(f"q{k}", 0, 0, 1) for k in range(3)])
    with pytest.raises(SystemExit, match="'q0', 'q1', 'q2'"):
        analysis.main([str(run), "--encoder", "hash:64", "--vs", str(vanilla)])
    split = conflict_split([record("q2", "Where is Vienna?")], [record("q2", "Capital of Peru?")])
    assert split["mismatched_questions"] == 1 and split["conflict"]["n"] == split["utilisation"]["n"] == 0


def test_resume_refuses_a_question_file_whose_ids_now_name_other_questions(setup):  # noqa: F811
    ev.main(argv(setup, "vanilla-rag", "--data.limit", "2"))
    data = setup["data"]
    lines = open(data).read().splitlines()
    changed = json.loads(lines[1]) | {"question": "Which river flows through Budapest?"}
    with open(data, "w") as handle:
        handle.write("\n".join([lines[0], json.dumps(changed), *lines[2:]]) + "\n")
    calls = len(setup["llm"].prompts)
    with pytest.raises(SystemExit, match=r"'b'.*--run.overwrite"):
        ev.main(argv(setup, "vanilla-rag", "--data.limit", "3"))
    assert len(setup["llm"].prompts) == calls  # nothing ran


def test_shards_and_merge_refuse_an_id_naming_two_questions(tmp_path):
    out = tmp_path / "run"
    (out / "shards").mkdir(parents=True)
    (out / "shards" / "part-000-of-002.jsonl").write_text(json.dumps(record("q1", "Who wrote Hamlet?")) + "\n")
    (out / "shards" / "part-001-of-002.jsonl").write_text(json.dumps(record("q1", "Who wrote Faust?")) + "\n")
    with pytest.raises(PredictionsFileError, match="'q1'"):
        run_records(out)
    (out / "shards" / "part-001-of-002.jsonl").unlink()
    write_plan(out, ["q1"], {"q1": "0" * 16})  # the plan's question differs from the prediction's
    with pytest.raises(PredictionsFileError, match="'q1'"):
        merge_run(out, ["q1"])


def write_ppo_run(folder, eval_seed, digests=None):
    folder.mkdir(parents=True)
    per_side = {"reward": [1.0, 0.0], "em": [1.0, 0.0], "docs_read": [1.0, 1.0], "positives_opened": [1.0, 0.0],
                "answered": [1.0, 1.0]}
    evaluation = {"per_question": {"before": per_side, "after": per_side}, "questions": 2}
    if digests is not None:
        evaluation["question_digests"] = digests
    (folder / "eval.json").write_text(json.dumps(evaluation))
    (folder / "config.yaml").write_text(yaml.safe_dump({"eval_questions": 2, "eval_seed": eval_seed}))
    return folder


def test_seed_spread_refuses_runs_evaluated_on_different_questions(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(seed_spread, "read_run", lambda folder: pytest.fail("read before the check"))
    runs = [write_ppo_run(tmp_path / "s0", 1000), write_ppo_run(tmp_path / "s1", 2000)]
    assert seed_spread.main([str(r) for r in runs]) == 2
    assert "eval_seed 1000 vs 2000" in capsys.readouterr().err
    runs = [write_ppo_run(tmp_path / "d0", 1000, ["aa", "bb"]), write_ppo_run(tmp_path / "d1", 1000, ["aa", "cc"])]
    assert seed_spread.main([str(r) for r in runs]) == 2
    assert "positions [1]" in capsys.readouterr().err
