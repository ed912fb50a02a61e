"""scripts/run_reader_study.py end to end on the conftest toy retriever: the teacher table alone, then a
scripted policy's greedy answers and its teacher-forced answers, the JSON and the last line."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from test_rollout import script_lm, tokenizer  # noqa: F401 (fixtures)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import run_reader_study as reader_study  # noqa: E402

OVERRIDES = ["--", "--env.expand_form", "list", "--env.judge_context", "stream", "--env.shuffle_candidates", "false",
             "--max_turn_tokens", "8", "--eval_questions", "4"]  # the scripted policy's protocol


@pytest.fixture
def toy_world(monkeypatch, retriever, examples, tokenizer, script_lm):  # noqa: F811
    monkeypatch.setattr(reader_study, "load_retriever", lambda data: retriever)
    monkeypatch.setattr(reader_study, "load_train_and_held_out", lambda data, evaluation: (examples, examples))
    monkeypatch.setattr(reader_study, "load_tokenizer", lambda name: tokenizer)
    loaded = []
    monkeypatch.setattr(reader_study, "load_causal_lm", lambda name, **kw: loaded.append(name) or script_lm)
    return loaded


def last_line(capsys) -> dict[str, float]:
    line = capsys.readouterr().out.strip().splitlines()[-1]
    return {key: float(value) for key, value in (field.split("=") for field in line.split())}


def test_without_a_model_only_the_teacher_table(toy_world, tmp_path, capsys):
    assert reader_study.main(["--out", str(tmp_path), *OVERRIDES]) == 0
    fields = last_line(capsys)
    saved = json.loads((tmp_path / "reader_study.json").read_text())
    assert saved["questions"] == 4 and "policy" not in saved and toy_world == []
    assert fields["teacher_em"] == pytest.approx(saved["teacher"]["open_rate 0.5"]["first_title"]["em"], abs=1e-4)
    assert all(math.isnan(fields[k]) for k in ("policy_em", "first_opened", "question_copy", "forced_reads"))


def test_a_policy_that_reads_the_first_passage_it_opens(toy_world, tmp_path, capsys):
    """The scripted policy searches "capital France", opens candidate 1 and answers "Paris" on every
    question: right on q0 only (EM 0.25), and each answer is the title of the passage it opened."""
    assert reader_study.main(["--model", "scripted", "--out", str(tmp_path), *OVERRIDES]) == 0
    fields = last_line(capsys)
    saved = json.loads((tmp_path / "reader_study.json").read_text())
    assert toy_world == ["scripted"]
    assert saved["policy"]["episodes"] == 4 and saved["policy"]["em"] == fields["policy_em"] == 0.25
    assert saved["policy"]["first_opened"] == 4 and fields["first_opened"] == 1.0
    assert fields["question_copy"] == 0.0
    forced = saved["teacher_forced"]
    assert forced["episodes"] > 0 and 0.0 <= fields["forced_reads"] <= 1.0
    assert fields["forced_reads"] == pytest.approx(forced["teacher_answer"] / forced["episodes"], abs=1e-4)
