"""HotpotQA recipe (issue 45): the sha256 held-out rule, the distractor corpus, both file formats,
bad input named by file and line, configs/ppo/hotpotqa.yaml, and a one-update tiny run on it."""
from __future__ import annotations

import hashlib
import json
import random

import pytest

from envs.data import DataFormatError, load_qa
from envs.hotpotqa import (
    HELD_OUT_MODULUS,
    MissingPositivesWarning,
    is_held_out,
    load_hotpotqa,
    prepare_hotpotqa,
    split_questions,
)
from envs.retrieval.corpus import load_corpus
from envs.typed_config import changed_fields, load_config
from scripts import prepare_hotpotqa as prepare_script
from tests.conftest import PASSAGES
from training.config import PPOConfig
from training.runtime.inputs import REPO_ROOT, load_train_and_held_out

RECIPE = REPO_ROOT / "configs" / "ppo" / "hotpotqa.yaml"


def hotpot_rows(n: int = 16) -> list[dict]:
    """``n`` FlashRAG-style HotpotQA rows over the toy passages: four context paragraphs each
    (neighbouring questions share paragraphs), the first two the supporting (bridge) titles."""
    rows = []
    for k in range(n):
        picked = [PASSAGES[(k + j) % len(PASSAGES)] for j in range(4)]
        rows.append({"id": f"q{k}", "question": f"What links {picked[0][1]} and {picked[1][1]}, question {k}?",
                     "golden_answers": [picked[1][1]], "dataset": "hotpotqa",
                     "supporting_titles": [picked[0][1], picked[1][1]],
                     "contexts": [{"title": t, "text": x} for _, t, x in picked]})
    return rows


def as_original_json(rows: list[dict]) -> list[dict]:
    """The same questions in HotpotQA's own JSON layout (sentences lists, supporting_facts pairs)."""
    return [{"_id": r["id"], "question": r["question"], "answer": r["golden_answers"][0], "type": "bridge",
             "supporting_facts": [[t, 0] for t in r["supporting_titles"]],
             "context": [[c["title"], [c["text"]]] for c in r["contexts"]]} for r in rows]


def write_jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_the_split_is_sha256_of_the_id_mod_8_disjoint_and_order_free():
    examples = load_qa_rows(hotpot_rows(64))
    parts = split_questions(examples)
    expected = {e.id for e in examples if int(hashlib.sha256(e.id.encode()).hexdigest(), 16) % 8 == 0}
    assert HELD_OUT_MODULUS == 8 and {e.id for e in parts.held_out} == expected
    assert is_held_out("q6") and is_held_out("q11") and not is_held_out("q0")  # fixed forever, on every machine
    assert not {e.id for e in parts.train} & expected
    assert {e.id for e in parts.train} | expected == {e.id for e in examples}
    shuffled = list(examples)
    random.Random(0).shuffle(shuffled)
    again = split_questions(shuffled)
    assert {e.id for e in again.held_out} == expected and {e.id for e in again.train} == {e.id for e in parts.train}


def load_qa_rows(rows: list[dict]):
    from envs.data import example_from_record

    return [example_from_record(r, default_id=str(k)) for k, r in enumerate(rows)]


def test_a_training_question_repeating_a_held_out_one_is_left_out_and_counted():
    rows = hotpot_rows(12)
    rows.append({**rows[6], "id": "copy-of-q6"})  # q6 is held out; its text again under a training id
    assert not is_held_out("copy-of-q6")
    parts = split_questions(load_qa_rows(rows))
    assert parts.repeats_dropped == 1 and "copy-of-q6" not in {e.id for e in parts.train}


@pytest.mark.parametrize("layout", ["jsonl", "original_json"])
def test_prepare_writes_split_corpus_and_positives(tmp_path, layout):
    rows = hotpot_rows()
    if layout == "jsonl":
        source = write_jsonl(tmp_path / "hotpot.jsonl", rows)
    else:
        source = tmp_path / "hotpot_dev_distractor_v1.json"
        source.write_text(json.dumps(as_original_json(rows)), encoding="utf-8")
    summary = prepare_hotpotqa(source, tmp_path / "out")
    train, held_out = load_qa(tmp_path / "out/train.jsonl"), load_qa(tmp_path / "out/held_out.jsonl")
    assert [e.id for e in held_out] == [r["id"] for r in rows if is_held_out(r["id"])]
    assert [e.id for e in train] == [r["id"] for r in rows if not is_held_out(r["id"])]
    assert (summary["train"], summary["held_out"], summary["questions"]) == (len(train), len(held_out), 16)
    for example, row in zip(sorted(train + held_out, key=lambda e: int(e.id[1:])), rows):
        assert example.positive_titles == tuple(row["supporting_titles"])  # bridge title included
        assert example.golden_answers == tuple(row["golden_answers"])
    corpus = load_corpus(tmp_path / "out/corpus.jsonl")
    paragraphs = {(c["title"], c["text"]) for r in rows for c in r["contexts"]}
    assert len(corpus) == len(paragraphs) == summary["passages"] < summary["paragraphs"] == 64
    assert {(p.title, p.text) for p in corpus} == paragraphs  # one passage per unique paragraph
    titles = {p.title for p in corpus}
    assert all(t in titles for r in rows for t in r["supporting_titles"])


def test_both_layouts_prepare_the_same_files(tmp_path):
    rows = hotpot_rows()
    original = tmp_path / "hotpot.json"
    original.write_text(json.dumps(as_original_json(rows)), encoding="utf-8")
    prepare_hotpotqa(write_jsonl(tmp_path / "hotpot.jsonl", rows), tmp_path / "a")
    prepare_hotpotqa(original, tmp_path / "b")
    assert (tmp_path / "a/corpus.jsonl").read_text() == (tmp_path / "b/corpus.jsonl").read_text()
    for name in ("train.jsonl", "held_out.jsonl"):  # the same questions; metadata keeps each file's extra keys
        a, b = ([{**json.loads(line), "metadata": None} for line in (tmp_path / side / name).read_text().splitlines()]
                for side in ("a", "b"))
        assert a == b


def test_an_eval_source_is_held_out_whole_and_shares_the_corpus(tmp_path):
    rows = hotpot_rows(20)
    source = write_jsonl(tmp_path / "train.jsonl", rows[:14] + [rows[15]])
    summary = prepare_hotpotqa(source, tmp_path / "out", eval_source=write_jsonl(tmp_path / "dev.jsonl", rows[14:]))
    assert [e.id for e in load_qa(tmp_path / "out/held_out.jsonl")] == [r["id"] for r in rows[14:]]
    assert len(load_qa(tmp_path / "out/train.jsonl")) == 14 and summary["repeats_dropped_from_train"] == 1
    titles = {p.title for p in load_corpus(tmp_path / "out/corpus.jsonl")}
    assert all(c["title"] in titles for r in rows[14:] for c in r["contexts"])


@pytest.mark.parametrize("bad, message", [
    ({"id": "x", "question": "Q?", "golden_answers": ["a"], "supporting_titles": ["A"]}, "line 3: .*no context"),
    ({"id": "x", "question": "Q?", "golden_answers": ["a"], "contexts": [{"title": "A", "text": "t"}]},
     "line 3: .*no supporting-fact titles"),
    ({"id": "q0", "question": "Q?", "golden_answers": ["a"], "supporting_titles": ["A"],
      "contexts": [{"title": "A", "text": "t"}]}, "line 3: question id 'q0' was already used at line 1"),
    ("{not json", "line 3: bad JSON"),
    ({"id": "x", "question": "Q?", "supporting_titles": ["A"], "contexts": []}, "line 3: missing answers"),
])
def test_bad_input_names_the_file_and_line(tmp_path, bad, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [*hotpot_rows(1), "", bad])
    with pytest.raises(DataFormatError, match=f"bad.jsonl: {message}"):
        load_hotpotqa(path)


def test_a_bad_item_of_the_original_json_is_named(tmp_path):
    items = as_original_json(hotpot_rows(3))
    items[2]["context"] = []
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(items), encoding="utf-8")
    with pytest.raises(DataFormatError, match="hotpot.json: item 2: question 'q2' has no context"):
        load_hotpotqa(path)


def test_a_supporting_title_outside_its_own_contexts_is_warned_about_not_dropped(tmp_path):
    rows = hotpot_rows(3)
    rows[1]["supporting_titles"] = [*rows[1]["supporting_titles"], "Atlantis"]
    with pytest.warns(MissingPositivesWarning, match="1 supporting title.*line 2 \\('Atlantis'\\)"):
        examples = load_hotpotqa(write_jsonl(tmp_path / "hotpot.jsonl", rows))
    assert "Atlantis" in examples[1].positive_titles and len(examples) == 3


def test_the_script_reports_bad_input_without_a_traceback(tmp_path, capsys):
    path = write_jsonl(tmp_path / "bad.jsonl", ["{not json"])
    assert prepare_script.main(["--source", path, "--out-dir", str(tmp_path / "out"), "--no-index"]) == 2
    assert "bad.jsonl: line 1: bad JSON" in capsys.readouterr().err


def test_the_recipe_is_the_default_on_the_prepared_hotpotqa_files():
    cfg = load_config(PPOConfig, ["--config", str(RECIPE)])
    default = load_config(PPOConfig, ["--config", str(RECIPE.parent / "default.yaml")])
    assert changed_fields(cfg, default) == {"data.train_data", "evaluation.eval_data", "data.index",
                                            "data.train_questions", "evaluation.eval_questions", "run.output_dir"}
    assert (cfg.data.train_data, cfg.evaluation.eval_data, cfg.data.index) == (
        "data/hotpotqa/train.jsonl", "data/hotpotqa/held_out.jsonl", "data/hotpotqa/index")
    # all 445 / all 55 of the 500-question file
    assert (cfg.data.train_questions, cfg.evaluation.eval_questions) == (0, 55)
    assert prepare_script.DEFAULT_OUT == "data/hotpotqa"


def prepared(tmp_path, n: int = 16):
    """A prepared folder (hash-encoder index) for ``n`` toy questions; returns (folder, summary)."""
    out = tmp_path / "hotpotqa"
    source = write_jsonl(tmp_path / "hotpot.jsonl", hotpot_rows(n))
    assert prepare_script.main(["--source", source, "--out-dir", str(out), "--encoder", "hash", "--quiet"]) == 0
    return out, json.loads((out / "split.json").read_text())


def test_the_trainer_reads_the_recipe_split(tmp_path):
    out, summary = prepared(tmp_path, 40)
    cfg = load_config(PPOConfig, ["--config", str(RECIPE), "--data", str(out / "train.jsonl"),
                                  "--eval_data", str(out / "held_out.jsonl"), "--eval_questions", "100"])
    train, held_out = load_train_and_held_out(cfg.data, cfg.evaluation)
    assert (len(train), len(held_out)) == (summary["train"], summary["held_out"])
    assert all(is_held_out(e.id) for e in held_out) and not any(is_held_out(e.id) for e in train)
    assert not {e.question for e in train} & {e.question for e in held_out}


def test_one_tiny_ppo_update_on_the_prepared_files(tmp_path, capsys):
    """The recipe's data path end to end: prepared files and index, a tiny model, one update,
    the evaluation before and after on the held-out questions, the machine-readable last line."""
    from tests.ppo_runs import write_tiny_run
    from training import ppo

    out, summary = prepared(tmp_path)
    recipe = write_tiny_run(tmp_path, data=str(out / "train.jsonl"), eval_data=str(out / "held_out.jsonl"),
                            index=str(out / "index"), train_questions=0, eval_questions=summary["held_out"],
                            updates=1)
    result = ppo.train(load_config(PPOConfig, ["--config", str(recipe)]))
    assert result["update"] == 1 and result["eval_end"] is not None
    lines = capsys.readouterr().out.strip().splitlines()
    assert f"on {summary['held_out']} held-out questions" in "\n".join(lines)
    assert lines[-1].startswith("reward_before=")
