"""SEEDS-R1's paper recipe (issue 46, item 7): five SFT epochs chosen by dev EM (SEEDS §E.2), and
PPO that trains 500 updates and exports the step-450 policy (§E.3) through ``export_update``."""
from __future__ import annotations

import pytest

from envs.typed_config import ConfigError, load_config
from tests.ppo_runs import write_tiny_run
from training import ppo
from training.config import PPOConfig, with_values
from training.models.checkpoint import list_checkpoints
from training.runtime.inputs import REPO_ROOT
from training.sft_config import WarmStartConfig

PAPER_PPO = ["--config", str(REPO_ROOT / "configs/ppo/seeds_r1_qwen2.5_7b.yaml"), "--sft_checkpoint", "sft"]


def test_the_paper_recipes_train_five_epochs_and_export_update_450_of_500():
    sft = WarmStartConfig.from_yaml(REPO_ROOT / "configs/sft/seeds_r1_paper.yaml", {"teacher": {"llm": "vllm:/m/t"}})
    assert sft.train.epochs == 5 and sft.dev.enabled  # five epochs, the kept one chosen by dev EM
    cfg = load_config(PPOConfig, PAPER_PPO)
    assert (cfg.optim.updates, cfg.run.export_update, cfg.run.export) == (500, 450, True)
    assert cfg.run.export_update % cfg.run.save_every == 0  # the step-450 training checkpoint is written too
    assert PPOConfig().run.export_update is None  # elsewhere: the last policy, as before


def test_export_update_must_be_one_of_the_updates():
    for bad in ("0", "501"):
        with pytest.raises(ConfigError, match="export_update"):
            load_config(PPOConfig, [*PAPER_PPO, "--export_update", bad])
    assert with_values(load_config(PPOConfig, PAPER_PPO), {"run.export_update": None}).run.export_update is None


@pytest.mark.parametrize("export_update, exported_after", [(1, ["update_000001"]),
                                                           (None, ["update_000001", "update_000002"])])
def test_the_policy_is_exported_after_export_update(tmp_path, monkeypatch, export_update, exported_after):
    """A two-update tiny run: final_hf is written once, after update ``export_update`` (the
    checkpoints on disk at that moment say which), or at the end without it."""
    recipe = write_tiny_run(tmp_path, export=True, export_update=export_update)
    cfg = load_config(PPOConfig, ["--config", str(recipe)])
    calls: list[list[str]] = []
    real = ppo.export_hf

    def recording(actor, tokenizer, directory, *args, **kwargs):
        calls.append([p.name for p in list_checkpoints(cfg.run.output_dir)])
        return real(actor, tokenizer, directory, *args, **kwargs)

    monkeypatch.setattr(ppo, "export_hf", recording)
    ppo.train(cfg)
    assert calls == [exported_after]
    assert (tmp_path / "run" / "final_hf" / "config.json").is_file()
    assert [p.name for p in list_checkpoints(cfg.run.output_dir)] == ["update_000001", "update_000002"]
