"""The PPO recipes in configs/ppo/: the main job's default, and those that state only what differs from it."""
from __future__ import annotations

import dataclasses

from envs.typed_config import load_config
from training.config import PPOConfig
from training.runtime.inputs import REPO_ROOT, load_env_config

RECIPES = REPO_ROOT / "configs" / "ppo"


def test_the_default_opens_above_the_cut_and_charges_beta_015():
    default = load_config(PPOConfig, ["--config", str(RECIPES / "default.yaml")])
    assert default.sft["teacher_open_rate"] == 0.6
    reward = load_env_config(default).reward
    assert (reward.positive_opened_bonus, reward.negative_opened_penalty) == (0.25, 0.15)
    assert default.verdict_credit_centred  # the verdicts' own credit moves which candidates open, not how many
    above = load_config(PPOConfig, ["--config", str(RECIPES / "above_cut.yaml")])  # runs 43-45's command
    assert not above.verdict_credit_centred  # as those runs measured it
    assert dataclasses.replace(above, output_dir=default.output_dir, verdict_credit_centred=True) == default


def test_half_open_is_the_previous_default_with_its_two_values():
    default = load_config(PPOConfig, ["--config", str(RECIPES / "default.yaml")])
    half = load_config(PPOConfig, ["--config", str(RECIPES / "half_open.yaml")])
    assert half.sft["teacher_open_rate"] == 0.5
    assert {k: v for k, v in half.sft.items() if k != "teacher_open_rate"} == \
        {k: v for k, v in default.sft.items() if k != "teacher_open_rate"}
    reward, default_reward = load_env_config(half).reward, load_env_config(default).reward
    assert reward == dataclasses.replace(default_reward, negative_opened_penalty=0.05)
    assert reward.positive_opened_bonus == 0.25  # the base's env overrides are kept, not replaced
    differing = {f.name for f in dataclasses.fields(PPOConfig) if getattr(half, f.name) != getattr(default, f.name)}
    assert differing == {"sft", "env", "output_dir", "verdict_credit_centred"}
