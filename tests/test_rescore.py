"""``python -m training.rescore``: a run's before/after under other selection-reward weights."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from envs.rewards import RewardConfig
from envs.typed_config import load_config, save_resolved
from training.config import PPOConfig
from training.evaluation.policy_eval import compare_runs
from training.rescore import main, rescore_run, rescored
from training.runtime.inputs import REPO_ROOT

ALPHA, BETA = 0.25, 0.15


def scored(em: np.ndarray, positives: np.ndarray, docs: np.ndarray, alpha: float, beta: float) -> dict:
    """Per-question outcomes as the env would score them (no missed positives, no format penalty)."""
    selection = alpha * positives - beta * (docs - positives)
    return {"reward": em + selection, "em": em, "positives_opened": positives, "docs_read": docs,
            "selection_reward": selection}


def sides(alpha: float, beta: float) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    n = 48
    docs_before, docs_after = rng.integers(2, 5, n).astype(float), rng.integers(0, 2, n).astype(float)
    return {"before": scored(rng.integers(0, 2, n).astype(float), np.minimum(docs_before, rng.integers(0, 2, n)),
                             docs_before, alpha, beta),
            "after": scored(rng.integers(0, 2, n).astype(float), np.minimum(docs_after, rng.integers(0, 2, n)),
                            docs_after, alpha, beta)}


@pytest.fixture
def run_folder(tmp_path):
    cfg = load_config(PPOConfig, ["--config", str(REPO_ROOT / "configs/ppo/default.yaml"), "--seed", "7",
                                  "--env.reward.negative_opened_penalty", str(BETA)])
    save_resolved(cfg, tmp_path)
    per_question = {side: {k: v.tolist() for k, v in outcomes.items()} for side, outcomes in sides(ALPHA, BETA).items()}
    (tmp_path / "eval.json").write_text(json.dumps({"per_question": per_question}))
    return tmp_path


def test_the_runs_own_weights_give_back_its_own_report(run_folder):
    result = rescore_run(run_folder)
    assert result["run"] == result["as"] == (ALPHA, BETA)
    stored = sides(ALPHA, BETA)
    assert result["comparison"] == compare_runs(stored["before"], stored["after"], seed=7)


def test_other_weights_score_as_the_env_would_have(run_folder):
    result = rescore_run(run_folder, negative_opened_penalty=0.05, positive_opened_bonus=0.1)
    direct = sides(0.1, 0.05)  # the same episodes scored under α 0.1, β 0.05 from the start
    expected = compare_runs(direct["before"], direct["after"], seed=7)
    for name in ("reward", "selection", "precision", "em"):
        assert result["comparison"][name] == pytest.approx(expected[name])
    # opening fewer negatives is worth less at a lower β
    assert result["comparison"]["reward"]["diff"] < rescore_run(run_folder)["comparison"]["reward"]["diff"]


def test_weights_without_per_question_counts_are_refused():
    outcomes = sides(ALPHA, BETA)["before"]
    run = RewardConfig(positive_opened_bonus=ALPHA, negative_opened_penalty=BETA)
    with pytest.raises(ValueError, match="missed_positive_penalty"):
        rescored(outcomes, run, dataclasses.replace(run, missed_positive_penalty=0.2))
    same = rescored(outcomes, run, run)
    assert all(np.array_equal(same[k], outcomes[k]) for k in outcomes)


def test_the_command_prints_the_rescored_line_and_names_a_bad_folder(run_folder, tmp_path_factory, capsys):
    assert main([str(run_folder), "--negative_opened_penalty", "0.05"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    fields = dict(item.split("=") for item in last.split())
    assert set(fields) == {"reward_before", "reward_after", "reward_diff_lo", "reward_diff_hi",
                           "precision_before", "precision_after"}
    empty = tmp_path_factory.mktemp("no_run")
    assert main([str(empty)]) == 2
    assert "no config.yaml" in capsys.readouterr().err
    (run_folder / "eval.json").unlink()
    assert main([str(run_folder)]) == 2
    assert "no eval.json" in capsys.readouterr().err
