"""The PPO recipes in configs/ppo/ that state only what differs from the main job's default."""
from __future__ import annotations

import dataclasses

from envs.typed_config import load_config
from training.config import PPOConfig
from training.inputs import REPO_ROOT, load_env_config

RECIPES = REPO_ROOT / "configs" / "ppo"


def test_above_cut_is_the_default_with_its_two_changes():
    default = load_config(PPOConfig, ["--config", str(RECIPES / "default.yaml")])
    above = load_config(PPOConfig, ["--config", str(RECIPES / "above_cut.yaml")])
    assert above.sft["teacher_open_rate"] == 0.6
    assert {k: v for k, v in above.sft.items() if k != "teacher_open_rate"} == \
        {k: v for k, v in default.sft.items() if k != "teacher_open_rate"}
    reward, default_reward = load_env_config(above).reward, load_env_config(default).reward
    assert reward == dataclasses.replace(default_reward, negative_opened_penalty=0.15)
    assert reward.positive_opened_bonus == 0.25  # the base's env overrides are kept, not replaced
    differing = {f.name for f in dataclasses.fields(PPOConfig) if getattr(above, f.name) != getattr(default, f.name)}
    assert differing == {"sft", "env", "output_dir"}
