"""The PPO config's one tree of sections: the old flat names still read (recipes, run folders,
command lines) through one map, the env built from its recipe with the overrides on top, the
resolved tree written beside every run and read back."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from envs.config import EnvConfig
from envs.typed_config import ConfigError, changed_fields, from_dict, load_config, save_resolved, with_values
from training.config import OLD_FLAT_KEYS, SECTIONS, PPOConfig

OLD_RUN_CONFIG = Path(__file__).parent / "data" / "ppo_config_before_sections.yaml"
DEFAULT = ["--config", "configs/ppo/default.yaml"]


def test_every_old_name_points_at_a_field():
    cfg = PPOConfig()
    for old, dotted in OLD_FLAT_KEYS.items():
        node = cfg
        for part in dotted.split("."):
            assert hasattr(node, part), f"{old} -> {dotted}"
            node = getattr(node, part)
    assert set(SECTIONS) == {f.name for f in dataclasses.fields(PPOConfig)} - {"env_config"}


def test_an_old_run_folder_loads_as_the_same_settings_in_the_nested_form(capsys):
    old = load_config(PPOConfig, ["--config", str(OLD_RUN_CONFIG)])
    assert "deprecated: old flat PPO config keys" in capsys.readouterr().err
    nested = load_config(PPOConfig, [*DEFAULT, "--run.seed", "3", "--warm_start.train.epochs", "1",
                                     "--model.lora.r", "8",
                                     "--env.reward.negative_opened_penalty", "0.15", "--optim.updates", "6",
                                     "--rollout.temperature", "1.0", "--evaluation.verdict_cut", "level",
                                     "--warm_start.teacher.samples", "1", "--warm_start.train.loss_agg", "token_mean",
                                     "--algorithm.answer_credit", "episode"])
    assert old == nested
    assert (old.run.seed, old.warm_start.train.epochs, old.model.lora.r, old.env.max_actions) == (3, 1, 8, 3)


def test_old_flat_overrides_on_the_command_line_win_over_a_nested_recipe():
    cfg = load_config(PPOConfig, [*DEFAULT, "--updates", "2", "--verdict_credit_centred", "false", "--sft.epochs", "1",
                                  "--lora.r", "4", "--model", "gemma3-270m", "--vllm.dtype", "float16"])
    assert (cfg.optim.updates, cfg.algorithm.verdict_credit_centred, cfg.warm_start.train.epochs) == (2, False, 1)
    assert (cfg.model.lora.r, cfg.model.lora.top_layers, cfg.model.name) == (4, 4, "gemma3-270m")
    assert cfg.rollout.vllm.dtype == "float16"
    assert cfg.warm_start.num_questions == 96  # the recipe's other warm-start keys are kept


def test_the_written_config_is_the_nested_tree_and_reads_back(tmp_path):
    cfg = load_config(PPOConfig, [*DEFAULT, "--env.max_expand", "2"])
    saved = yaml.safe_load(save_resolved(cfg, tmp_path).read_text())
    assert set(SECTIONS) <= set(saved) and saved["env"]["max_expand"] == 2 and "updates" not in saved
    assert load_config(PPOConfig, ["--config", str(tmp_path / "config.yaml")]) == cfg


def test_env_precedence_defaults_recipe_overrides_command_line(tmp_path):
    recipe = tmp_path / "env.yaml"
    recipe.write_text("max_actions: 7\nmax_searches: 2\nreward: {format_penalty: 0.3}\n")
    ppo = tmp_path / "ppo.yaml"
    ppo.write_text(yaml.safe_dump({"env_config": str(recipe), "env": {"max_searches": 3}}))
    cfg = load_config(PPOConfig, ["--config", str(ppo), "--env.max_actions", "9"])
    assert isinstance(cfg.env, EnvConfig)
    assert (cfg.env.max_actions, cfg.env.max_searches, cfg.env.reward.format_penalty) == (9, 3, 0.3)
    assert cfg.env.max_expand == EnvConfig().max_expand  # neither says: EnvConfig's default
    bare = load_config(PPOConfig, ["--env_config", "null", "--env.max_actions", "4"])
    assert bare.env == EnvConfig(max_actions=4)
    assert PPOConfig().env == load_config(PPOConfig, []).env  # the default recipe, as loaded
    with pytest.raises(ConfigError, match="env.max_actionz"):
        load_config(PPOConfig, ["--env.max_actionz", "3"])


def test_sections_check_their_fields_and_the_root_the_pairs():
    with pytest.raises(ConfigError, match="updates"):
        with_values(PPOConfig, {"optim.updates": 0})
    with pytest.raises(ConfigError, match="export_update"):  # run and optim together
        with_values(PPOConfig, {"optim.updates": 2, "run.export_update": 3})
    with pytest.raises(ConfigError, match="constrain_verdicts"):  # algorithm and rollout together
        with_values(PPOConfig, {"algorithm.verdict_credit": 1.0, "rollout.constrain_verdicts": False})
    with pytest.raises(ConfigError, match="warm_start.lora"):
        with_values(PPOConfig, {"warm_start.lora": {"rank": 8}})


def test_with_values_and_changed_fields():
    base = PPOConfig()
    changed = with_values(base, {"optim.updates": 3, "env.max_actions": 4})
    assert changed_fields(base, changed) == {"optim.updates", "env.max_actions"}
    assert from_dict(PPOConfig, {"optim": {"updates": 3}, "env": {"max_actions": 4}}) == changed
    with pytest.raises(ConfigError, match="optim.update"):
        with_values(base, {"optim.update": 3})


def test_an_old_run_folder_resumes_on_its_sft_checkpoint(tmp_path, monkeypatch):
    from training.ppo_loop import ppo_setup

    old = yaml.safe_load(OLD_RUN_CONFIG.read_text())
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**old, "sft_checkpoint": "runs/x/sft/model"}))
    monkeypatch.setattr(ppo_setup, "load_latest", lambda out: "checkpoint")
    cfg = with_values(PPOConfig, {"run.output_dir": str(tmp_path), "run.resume": True})
    sft_checkpoint, latest = ppo_setup.resume_point(cfg.run, cfg.model)
    assert latest == "checkpoint" and sft_checkpoint == "runs/x/sft/model"


def test_seed_spread_reads_the_eval_settings_of_old_and_new_run_folders(tmp_path):
    from training.seed_spread import eval_settings

    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.yaml").write_text(OLD_RUN_CONFIG.read_text())
    cfg = load_config(PPOConfig, ["--config", str(OLD_RUN_CONFIG)])
    save_resolved(cfg, tmp_path / "new")
    assert eval_settings(tmp_path / "old") == eval_settings(tmp_path / "new")
    assert eval_settings(tmp_path / "new")["evaluation.eval_questions"] == cfg.evaluation.eval_questions
