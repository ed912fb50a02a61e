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
                                                 "evaluation.verdict_cut", "warm_start.teacher", "warm_start.train",
                                                 "algorithm.answer_credit"}
    assert (previous.rollout.temperature, previous.evaluation.verdict_cut) == (1.0, "level")  # as measured


def _one_reading_values() -> dict[str, object]:
    """The three settings every recipe measured before spread-r99-r101 pins (one reading, token_mean, episode)."""
    return {"warm_start.teacher.samples": 1, "warm_start.train.loss_agg": "token_mean",
            "algorithm.answer_credit": "episode"}


def test_the_default_answers_from_what_it_read_and_the_older_recipes_keep_one_reading():
    default = load_config(PPOConfig, ["--config", str(RECIPES / "default.yaml")])
    assert (default.warm_start.teacher.samples, default.warm_start.train.loss_agg) == (2, "turn_mean")
    assert default.algorithm.answer_credit == "answer"
    assert default.warm_start.train.epochs == 3  # the flow mapping over two lines kept the warm start's other keys
    one = load_config(PPOConfig, ["--config", str(RECIPES / "one_reading.yaml")])  # spread-r95-r97's default
    assert changed_fields(one, default) == {"warm_start.teacher", "warm_start.train", "algorithm.answer_credit",
                                            "run.output_dir"}
    assert with_values(default, {**_one_reading_values(), "run.output_dir": one.run.output_dir}) == one
    for name in ("above_cut", "centred_beta015", "half_open"):  # each as its runs measured it
        recipe = load_config(PPOConfig, ["--config", str(RECIPES / f"{name}.yaml")])
        assert with_values(recipe, _one_reading_values()) == recipe, name


def test_half_open_is_the_previous_default_with_its_two_values():
    default = load_config(PPOConfig, ["--config", str(RECIPES / "default.yaml")])
    half = load_config(PPOConfig, ["--config", str(RECIPES / "half_open.yaml")])
    assert half.warm_start.teacher.open_rate == 0.5
    assert with_values(half.warm_start, {"teacher.open_rate": 0.6, "teacher.samples": 2,
                                         "train.loss_agg": "turn_mean"}) == default.warm_start
    reward, default_reward = half.env.reward, default.env.reward
    assert reward == dataclasses.replace(default_reward, negative_opened_penalty=0.05)
    assert reward.positive_opened_bonus == 0.25  # the base's env overrides are kept, not replaced
    assert changed_fields(half, default) == {"warm_start.teacher", "optim.updates", "run.output_dir",
                                             "algorithm.verdict_credit_centred", "rollout.temperature",
                                             "evaluation.verdict_cut", "warm_start.train", "algorithm.answer_credit"}


def test_answer_reading_is_the_default_with_its_own_output_folder():
    default = load_config(PPOConfig, ["--config", str(RECIPES / "default.yaml")])
    reading = load_config(PPOConfig, ["--config", str(RECIPES / "answer_reading.yaml")])
    assert (reading.warm_start.teacher.samples, reading.warm_start.train.loss_agg) == (2, "turn_mean")
    assert reading.algorithm.answer_credit == "answer"
    assert changed_fields(reading, default) == {"run.output_dir"}
    # the flags runs r99-r101 were started with, over the one-reading default they ran on, give the same config
    flags = load_config(PPOConfig, ["--config", str(RECIPES / "one_reading.yaml"),
                                    "--warm_start.train.loss_agg", "turn_mean", "--warm_start.teacher.samples", "2",
                                    "--algorithm.answer_credit", "answer", "--run.output_dir", reading.run.output_dir])
    assert flags == reading
