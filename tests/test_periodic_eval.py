"""``eval_every``: a greedy held-out evaluation on the way, logged as ``eval/<metric>`` and drawn
in curves.png, that leaves the training itself exactly as it was (the run draws the same numbers)."""
from __future__ import annotations

import json

import pytest
import torch

from training.evaluation.curves import PERIODIC_PREFIX, build_figure, read_metrics
from training.evaluation.ppo_report import PERIODIC_EVAL_KEYS


def run_tiny(tmp_path, name: str, **overrides) -> tuple[list[dict], dict]:
    from envs.typed_config import load_config
    from tests.ppo_runs import write_tiny_run
    from training.config import PPOConfig
    from training.ppo import train

    recipe = write_tiny_run(tmp_path / name, eval_questions=4, updates=3, **overrides)
    result = train(load_config(PPOConfig, ["--config", str(recipe)]))
    records = read_metrics(tmp_path / name / "run" / "metrics.jsonl")
    weights = {k: v.detach().clone() for k, v in result["models"].actor.named_parameters() if v.requires_grad}
    return records, weights


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("periodic")
    return run_tiny(folder, "plain"), run_tiny(folder, "every", eval_every=1)


def test_evaluations_on_the_way_are_logged_and_leave_training_unchanged(runs):
    (plain, plain_weights), (every, every_weights) = runs
    logged = [sorted(k for k in record if k.startswith(PERIODIC_PREFIX)) for record in every]
    expected = sorted(PERIODIC_PREFIX + key for key in PERIODIC_EVAL_KEYS if key != "verdict_auc")
    assert logged[0] == expected and logged[1] == expected  # after updates 1 and 2 ...
    assert logged[2] == []  # ... not after the last: the evaluation after PPO is that one
    assert not any(k.startswith(PERIODIC_PREFIX) for record in plain for k in record)
    for a, b in zip(plain, every):
        assert a["reward_mean"] == b["reward_mean"] and a["policy_loss"] == pytest.approx(b["policy_loss"], abs=0)
    assert plain_weights.keys() == every_weights.keys()
    assert all(torch.equal(plain_weights[k], every_weights[k]) for k in plain_weights)


def test_curves_draw_the_evaluations_on_the_way(runs, tmp_path):
    (_, _), (every, _) = runs
    figure = build_figure(tmp_path, every, None)
    em_axis = next(a for a in figure.axes if a.get_title().startswith("EM"))
    assert len(em_axis.lines) == 2  # the training curve and the dashed held-out one
    assert list(em_axis.lines[1].get_xdata()) == [1, 2]
    json.dumps(every)  # the records stay plain JSON
