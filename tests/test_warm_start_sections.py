"""The SFT warm start's one tree of sections (training/sft_sections.py), shared by ``python -m
training.sft`` and the PPO run's ``warm_start`` section: the flat names of earlier recipes, run folders
and command lines still read, through one map per class, into exactly today's config."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from envs.typed_config import ConfigError, load_config, with_values
from training.config import PPOConfig
from training.sft import resolve_config, warm_start_config
from training.sft_config import WarmStartConfig
from training.sft_sections import OLD_SFT_KEYS, OLD_WARM_START_KEYS, WarmStartSettings, quick_dev, quick_train

OLD_SFT_RUN_CONFIG = Path(__file__).parent / "data" / "sft_config_before_sections.yaml"
SFT_DEFAULT = ["--config", "configs/sft/default.yaml"]
PPO_DEFAULT = ["--config", "configs/ppo/default.yaml"]


def leaves(cfg) -> set[str]:
    """The dotted names of the fields of ``cfg``'s sections (``env`` and LoRA's inner fields left out)."""
    sections = [(spec.name, getattr(cfg, spec.name)) for spec in dataclasses.fields(cfg)]
    return {f"{name}.{inner.name}" for name, section in sections if dataclasses.is_dataclass(section)
            for inner in dataclasses.fields(section)}


def test_every_old_sft_name_is_one_field_and_every_field_had_one():
    assert sorted(OLD_SFT_KEYS.values()) == sorted(leaves(WarmStartConfig()))
    warm = WarmStartSettings()
    for old, dotted in OLD_WARM_START_KEYS.items():
        section, name = dotted.split(".")
        assert hasattr(getattr(warm, section), name), f"{old} -> {dotted}"


def test_an_old_sft_run_folder_loads_as_the_same_settings_in_the_nested_form(capsys):
    old = load_config(WarmStartConfig, ["--config", str(OLD_SFT_RUN_CONFIG)])
    assert "deprecated: old flat SFT config keys" in capsys.readouterr().err
    nested = load_config(WarmStartConfig, [
        *SFT_DEFAULT, "--train.epochs", "1", "--teacher.query", "quoted", "--teacher.samples", "2",
        "--dev.enabled", "false", "--model.lora.enabled", "true", "--model.lora.r", "8", "--model.name",
        "smollm2-135m", "--data.path", "questions.jsonl", "--dev.max_turn_tokens", "64", "--run.output_dir",
        "runs/sft-old", "--env.max_actions", "3"])
    assert old == nested
    assert (old.train.epochs, old.teacher.query, old.dev.enabled, old.model.lora.r) == (1, "quoted", False, 8)


def test_old_flat_sft_flags_give_the_nested_config(capsys):
    old, _ = resolve_config([*SFT_DEFAULT, "--epochs", "1", "--teacher", "method", "--teacher_llm", "openai:m",
                             "--teacher_llm_options.base_url", "http://x", "--dev_eval", "false", "--lora", "true",
                             "--lora_r", "8", "--output_dir", "runs/x", "--seed", "2", "--num_envs", "4",
                             "--dev_fraction", "0.2", "--eval_batch_size", "3", "--collect-only"])
    assert "deprecated: old flat SFT config keys" in capsys.readouterr().err
    nested, _ = resolve_config([*SFT_DEFAULT, "--train.epochs", "1", "--teacher.kind", "method", "--teacher.llm",
                                "openai:m", "--teacher.llm_options.base_url", "http://x", "--dev.enabled", "false",
                                "--model.lora.enabled", "true", "--model.lora.r", "8", "--run.output_dir", "runs/x",
                                "--run.seed", "2", "--teacher.num_envs", "4", "--dev.fraction", "0.2",
                                "--dev.batch_size", "3"])
    assert old == nested and nested.teacher.llm_options == {"base_url": "http://x"}
    assert nested.model.lora.target_modules == "all-linear"  # the warm start's own LoRA default stays


def test_an_old_flat_warm_start_section_and_the_older_sft_key_give_the_nested_one(tmp_path, capsys):
    flat = {"epochs": 1, "teacher_query": "quoted", "teacher_open_rate": 0.5, "dev_eval": True, "eval_before": True,
            "lora_r": 8, "num_questions": 12, "merge_lora": False,
            "other": {"teacher_extra_expand": 1, "dev_fraction": 0.2, "eval_batch_size": 4, "device": "cpu"}}
    nested = with_values(PPOConfig, {"warm_start": {
        "train": {"epochs": 1}, "teacher": {"query": "quoted", "open_rate": 0.5, "extra_expand": 1},
        "dev": {"enabled": True, "before": True, "fraction": 0.2, "batch_size": 4}, "lora": {"r": 8},
        "num_questions": 12, "merge_lora": False, "device": "cpu"}})
    for key in ("warm_start", "sft"):
        recipe = tmp_path / f"{key}.yaml"
        recipe.write_text(f"{key}: {flat!r}\n".replace("'", '"').replace("True", "true").replace("False", "false"))
        assert load_config(PPOConfig, ["--config", str(recipe)]) == nested, key
    assert "deprecated: old flat warm_start keys" in capsys.readouterr().err
    # experiments/runs.csv's flags: --sft.<old name> over a nested recipe
    cfg = load_config(PPOConfig, [*PPO_DEFAULT, "--sft.teacher_samples", "2", "--sft.loss_agg", "turn_mean",
                                  "--sft.verdict_labels", "both", "--sft.group_by_length", "false"])
    assert (cfg.warm_start.teacher.samples, cfg.warm_start.train.loss_agg, cfg.warm_start.train.verdict_labels,
            cfg.warm_start.train.group_by_length) == (2, "turn_mean", "both", False)
    assert cfg.warm_start.teacher.open_rate == 0.6 and cfg.warm_start.train.epochs == 3  # the recipe's kept


def test_the_warm_start_section_holds_the_sft_sections_with_the_quick_defaults():
    cfg = PPOConfig()
    warm = cfg.warm_start
    assert (warm.num_questions, warm.train.epochs, warm.train.learning_rate, warm.train.warmup_ratio,
            warm.train.max_length, warm.dev.enabled, warm.dev.before) == (32, 2, 2e-4, 0.1, 2048, False, False)
    assert warm.train == quick_train() and warm.dev == quick_dev()
    sft = warm_start_config(cfg)
    assert sft.teacher is warm.teacher and sft.train is warm.train and sft.dev is warm.dev  # passed through
    assert (sft.data.num_questions, sft.run.output_dir) == (32, "runs/ppo-default/sft")
    with pytest.raises(ConfigError, match="warm_start.train.epochz"):
        load_config(PPOConfig, ["--warm_start.train.epochz", "1"])
    with pytest.raises(ConfigError, match="teacher.llm"):  # a method teacher without its model fails at load time
        load_config(PPOConfig, ["--warm_start.teacher.kind", "method"])
