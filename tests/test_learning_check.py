"""scripts/learning_check.py is a thin driver of the product trainer: its recipe, overrides,
seeds and summary (the training itself is tests/test_learning.py's job)."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lc():
    spec = importlib.util.spec_from_file_location("learning_check", ROOT / "scripts" / "learning_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recipe_overrides_and_seed_folders(lc, tmp_path):
    args = lc.parse_args(["--seeds", "0", "3", "--set", "updates=5", "--set", "lora.r=8", "--out", str(tmp_path)])
    cfg = lc.seed_config(args, 3, sft_checkpoint="warm/model")
    assert (cfg.updates, cfg.lora.r, cfg.seed) == (5, 8, 3)
    assert cfg.output_dir == str(tmp_path / "seed3") and cfg.sft_checkpoint == "warm/model"
    assert cfg.env["expand_form"] == "judge" and cfg.env["shuffle_candidates"] is True
    with pytest.raises(SystemExit):
        lc.seed_config(lc.parse_args(["--set", "updates"]), 0, None)


def test_recipe_inherits_the_main_job_setting(tmp_path):
    from training.config import ConfigError, PPOConfig, load_config

    check = load_config(PPOConfig, ["--config", str(ROOT / "configs" / "ppo" / "learning_check.yaml")])
    main = load_config(PPOConfig, ["--config", str(ROOT / "configs" / "ppo" / "default.yaml")])
    assert (check.samples_per_question, check.output_dir) == (8, "runs/learning_check")
    assert (check.model, check.env, check.advantage, check.sft) == (main.model, main.env, main.advantage, main.sft)
    (tmp_path / "a.yaml").write_text("base: b.yaml\nupdates: 3\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="its own base"):
        load_config(PPOConfig, ["--config", str(tmp_path / "a.yaml")])


def _run(reward, precision):
    return {"comparison": {"reward": dict(zip(("before", "after", "diff", "lo", "hi"), reward)),
                           "precision": dict(zip(("before", "after", "diff", "lo", "hi"), precision)),
                           "em": dict(zip(("before", "after", "diff", "lo", "hi"), (0, 0, 0, 0, 0)))}}


def test_summary_over_seeds_and_targets(lc):
    runs = [_run((0.1, 0.3, 0.2, 0.1, 0.3), (0.2, 0.5, 0.3, 0.2, 0.4)),
            _run((0.1, 0.1, 0.0, -0.1, 0.1), (0.2, 0.3, 0.1, 0.0, 0.2))]
    summary = lc.summarize(runs)
    assert summary["reward_after"]["mean"] == pytest.approx(0.2)
    assert summary["reward_after"]["std"] == pytest.approx(0.1414, abs=1e-3)
    goals = lc.targets(summary)
    assert goals["reward_x1.5"] and goals["precision_+0.2"] and goals["reward_ratio"] == pytest.approx(2.0)
    assert not lc.targets(lc.summarize(runs[1:]))["reward_x1.5"]
