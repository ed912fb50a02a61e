"""training/studies/verdict_signal.py and scripts/run_verdict_signal.py: verdicts matched to their labels, AUCs,
and the supervised bound learning on the box world (where the full box is always shown first)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
import torch

from envs.protocol import judge_token_ids
from scripts import box_world
from training.rollouts.rollout import Episode
from training.studies.verdict_signal import judged_episodes, question_overlap, roc_auc, supervised_bound

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import run_verdict_signal as verdict_signal  # noqa: E402


def test_roc_auc_by_hand():
    assert roc_auc([True, False, False], [0.9, 0.1, 0.5]) == 1.0
    assert roc_auc([True, False], [0.2, 0.8]) == 0.0
    assert roc_auc([True, True, False, False], [0.5, 0.1, 0.5, 0.0]) == pytest.approx((0.5 + 1 + 0 + 1) / 4)
    assert roc_auc([True, True], [0.1, 0.2]) != roc_auc([True, True], [0.1, 0.2])  # NaN: one class only


def test_question_overlap_counts_content_words():
    assert question_overlap("Which river flows through Paris?", "[2] Seine: river of Paris") == pytest.approx(2 / 3)
    assert question_overlap("Which river?", "the of and") == 0.0


class _Tok:
    def decode(self, ids):
        return " ".join(str(i) for i in ids)


def _episode(choice_mask: list[int], positive: list[bool]) -> Episode:
    n = len(choice_mask)
    return Episode(token_ids=list(range(n)), loss_mask=[1] * n, sampler_logprobs=[0.0] * n, turn_ids=[0] * n,
                   reward=0.0, prompt_length=0, example_id="q", group_id=3, finish_reason="answer",
                   info={"searches": [{"positive": positive}]}, choice_mask=choice_mask)


def test_judged_episodes_match_verdicts_to_labels_and_skip_mismatches():
    good = _episode([0, 0, 1, 0, 1, 0], [False, True])
    short = _episode([0, 1, 0, 0, 0, 0], [False, True])  # one verdict for two candidates: skipped
    none = _episode([0] * 6, [])
    judged, skipped = judged_episodes([good, short, none], _Tok())
    assert skipped == 1 and len(judged) == 1
    episode = judged[0]
    assert episode.positions == [2, 4] and episode.labels == [False, True] and episode.group == 3
    assert episode.token_ids == [0, 1, 2, 3, 4]  # up to the last verdict
    assert episode.candidate_texts == ["0 1", "3"]


ARGS = argparse.Namespace(train_questions=32, test_questions=16, top_layers=[1], epochs=3, lr=3e-3, seed=7)


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    """The box world, a policy taught the protocol, and its sampled (training, held-out) episodes."""
    setup = box_world.build(tmp_path_factory.mktemp("verdict_signal"))
    torch.manual_seed(0)
    policy = box_world.protocol_policy(setup, "cpu", torch.float32, steps=60)
    cfg = box_world.ppo_config(setup, str(setup["base"]))
    episodes = verdict_signal.sample(cfg, ARGS, policy, setup["tok"], setup["retriever"], setup["train"])
    return setup, policy, cfg, episodes


def test_measure_on_the_box_world_learns_from_labels(box, capsys, monkeypatch):
    setup, policy, cfg, episodes = box
    monkeypatch.setattr(verdict_signal, "sample", lambda *a, **k: episodes)  # sampled once, in the fixture
    result = verdict_signal.measure(cfg, ARGS, policy, setup["tok"], setup["retriever"], setup["train"])
    assert result["verdicts"] > 100 and result["judged_episodes"] > 40
    assert result["positives"] == pytest.approx(result["verdicts"] / 5, abs=5)  # one full box in five
    assert 0.0 <= result["policy_auc"] <= 1.0 and 0.0 <= result["overlap_auc"] <= 1.0
    rows = result["bounds"]["1"]
    assert [r["epoch"] for r in rows] == [0, 1, 2, 3]
    # the full box is always shown first, so the labels are learnable: held-out AUC rises to ~1
    assert rows[-1]["heldout_auc"] > 0.9 and rows[-1]["heldout_auc"] > rows[0]["heldout_auc"] + 0.1
    assert "held-out AUC" in capsys.readouterr().out


def test_the_bound_does_not_learn_without_steps(box):
    setup, policy, _, (train_eps, test_eps) = box
    train, _ = judged_episodes(train_eps, setup["tok"])
    test, _ = judged_episodes(test_eps, setup["tok"])
    rows = supervised_bound(policy, train, test, torch.tensor(judge_token_ids(setup["tok"])), 1, 1, lr=0.0)
    assert rows[0]["heldout_auc"] == pytest.approx(rows[-1]["heldout_auc"])


def test_main_writes_the_result_and_the_last_line(tmp_path, monkeypatch, capsys):
    result = {"verdicts": 10, "positives": 2, "policy_auc": 0.4, "overlap_auc": 0.9,
              "bounds": {"4": [{"epoch": 0, "heldout_auc": 0.5, "train_auc": 0.5},
                               {"epoch": 1, "heldout_auc": 0.625, "train_auc": 0.75}]}}
    monkeypatch.setattr(verdict_signal, "load_tokenizer", lambda model: object())
    monkeypatch.setattr(verdict_signal, "load_causal_lm", lambda *a, **k: torch.nn.Linear(1, 1))
    monkeypatch.setattr(verdict_signal, "load_retriever", lambda data: None)
    monkeypatch.setattr(verdict_signal, "load_train_and_held_out", lambda data, evaluation: ([], []))
    monkeypatch.setattr(verdict_signal, "measure", lambda cfg, args, *rest: result)
    assert verdict_signal.main(["--model", "m", "--out", str(tmp_path), "--", "--env.judge_question", "true"]) == 0
    saved = json.loads((tmp_path / "verdict_signal.json").read_text())
    assert saved["bounds"]["4"][1]["heldout_auc"] == 0.625 and saved["overrides"] == ["--env.judge_question", "true"]
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        "policy_auc=0.4000 overlap_auc=0.9000 bound_auc=0.6250")
