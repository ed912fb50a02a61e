"""The PPO recipes in configs/ppo/: the main job's default, and those that state only what differs from it."""
from __future__ import annotations

import dataclasses

from envs.typed_config import changed_fields, load_config
from training.config import PPOConfig, with_values
from training.runtime.inputs import REPO_ROOT

RECIPES = REPO_ROOT / "configs" / "ppo"


def test_the_default_opens_above_the_cut_and_charges_beta_005_for_12_updates():
    default = load_config(PPOConfig, ["--config", str(RECIPES / "default.yaml")])
    assert default.warm_start.teacher.open_rate == 0.6
    reward = default.env.reward
    assert (reward.positive_opened_bonus, reward.negative_opened_penalty) == (0.25, 0.05)
    assert default.optim.updates == 12
    assert default.algorithm.verdict_credit_centred  # the verdicts' own credit moves which candidates open, not how
    # many
    # rollouts sampled cooler, and greedy evaluations opening by rank within each snapshot
    assert (default.rollout.temperature, default.evaluation.verdict_cut) == (0.7, "snapshot_mean")
    above = load_config(PPOConfig, ["--config", str(RECIPES / "above_cut.yaml")])  # runs 43-45's command
    assert not above.algorithm.verdict_credit_centred  # as those runs measured it
    assert (above.env.reward.negative_opened_penalty, above.optim.updates) == (0.15, 6)
    previous = load_config(PPOConfig, ["--config", str(RECIPES / "centred_beta015.yaml")])  # r72-r74's default
    assert with_values(above, {"run.output_dir": previous.run.output_dir, "algorithm.verdict_credit_centred": True}) \
        == previous
    assert changed_fields(previous, default) == {"env.reward", "optim.updates", "run.output_dir", "rollout.temperature",
                                                 "evaluation.verdict_cut"}
    assert (previous.rollout.temperature, previous.evaluation.verdict_cut) == (1.0, "level")  # as measured


def test_half_open_is_the_previous_default_with_its_two_values():
    default = load_config(PPOConfig, ["--config", str(RECIPES / "default.yaml")])
    half = load_config(PPOConfig, ["--config", str(RECIPES / "half_open.yaml")])
    assert half.warm_start.teacher.open_rate == 0.5
    assert with_values(half.warm_start, {"teacher.open_rate": 0.6}) == default.warm_start
    reward, default_reward = half.env.reward, default.env.reward
    assert reward == dataclasses.replace(default_reward, negative_opened_penalty=0.05)
    assert reward.positive_opened_bonus == 0.25  # the base's env overrides are kept, not replaced
    assert changed_fields(half, default) == {"warm_start.teacher", "optim.updates", "run.output_dir",
                                             "algorithm.verdict_credit_centred", "rollout.temperature",
                                             "evaluation.verdict_cut"}


def test_answer_reading_is_the_default_with_two_readings_turn_weights_and_the_answer_credit():
    default = load_config(PPOConfig, ["--config", str(RECIPES / "default.yaml")])
    reading = load_config(PPOConfig, ["--config", str(RECIPES / "answer_reading.yaml")])
    assert (reading.warm_start.teacher.samples, reading.warm_start.train.loss_agg) == (2, "turn_mean")
    assert reading.algorithm.answer_credit == "answer"
    assert (default.warm_start.teacher.samples, default.warm_start.train.loss_agg) == (1, "token_mean")
    assert changed_fields(reading, default) == {"warm_start.teacher", "warm_start.train", "algorithm.answer_credit",
                                                "run.output_dir"}
    # the default with the flags runs r99-r100 were started with is the same config
    flags = load_config(PPOConfig, ["--config", str(RECIPES / "default.yaml"),
                                    "--warm_start.train.loss_agg", "turn_mean", "--warm_start.teacher.samples", "2",
                                    "--algorithm.answer_credit", "answer", "--run.output_dir", reading.run.output_dir])
    assert flags == reading
