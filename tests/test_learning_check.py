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
    args = lc.parse_args(["--seeds", "0", "3", "--updates", "5", "--lora.r", "8", "--out", str(tmp_path)])
    cfg = lc.seed_config(args, 3, sft_checkpoint="warm/model")
    assert (cfg.optim.updates, cfg.model.lora.r, cfg.run.seed) == (5, 8, 3)
    assert cfg.run.output_dir == str(tmp_path / "seed3") and cfg.model.sft_checkpoint == "warm/model"
    assert cfg.env.expand_form == "judge" and cfg.env.shuffle_candidates is True
    with pytest.raises(SystemExit):
        lc.seed_config(lc.parse_args(["--no_such_field", "3"]), 0, None)


def test_recipe_inherits_the_main_job_setting(tmp_path):
    from training.config import ConfigError, PPOConfig, load_config, with_values

    check = load_config(PPOConfig, ["--config", str(ROOT / "configs" / "ppo" / "learning_check.yaml")])
    main = load_config(PPOConfig, ["--config", str(ROOT / "configs" / "ppo" / "default.yaml")])
    assert check.run.output_dir == "runs/learning_check"  # the main job itself: one seed fits ~25 minutes on 2 cores
    assert with_values(check, {"run.output_dir": main.run.output_dir}) == main
    (tmp_path / "a.yaml").write_text("base: b.yaml\nupdates: 3\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="its own base"):
        load_config(PPOConfig, ["--config", str(tmp_path / "a.yaml")])


def _row(before, after, lo, hi):
    return {"before": before, "after": after, "diff": after - before, "lo": lo, "hi": hi}


def _comparison(recall_after, docs_after):
    return {"reward": _row(-0.2, 0.0, 0.1, 0.3), "em": _row(0.05, 0.06, -0.01, 0.03),
            "precision": _row(0.15, 0.30, 0.05, 0.25), "recall": _row(0.72, recall_after, -0.1, 0.1),
            "f1": _row(0.25, 0.40, 0.05, 0.25), "docs": _row(3.2, docs_after, -1, 0), "copy": _row(0.0, 0.0, 0, 0)}


def test_one_seed_is_judged_by_its_own_comparison(lc):
    kept = _comparison(recall_after=0.75, docs_after=2.0)
    assert lc.pooled_comparison([{"comparison": kept}]) is kept
    from training.evaluation.selection_profile import selection_misses

    assert selection_misses(kept) == []
    stopped = _comparison(recall_after=0.06, docs_after=0.09)  # the reward rose by reading nothing
    misses = selection_misses(stopped)
    assert len(misses) == 3 and lc.summary_line(stopped, misses).startswith("selection_misses=3 recall_after=0.0600")
