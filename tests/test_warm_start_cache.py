"""``cache_warm_start``: a PPO run reuses the warm start and the evaluation before PPO that an earlier
run computed from the same inputs, and goes on exactly as if it had computed them itself."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from tests.conftest import PASSAGES, OverlapRetriever
from tests.ppo_runs import write_tiny_run
from training import sft
from training.config import PPOConfig, load_config, to_dict, with_values
from training.evaluation.policy_eval import OUTCOME_KEYS
from training.ppo import train
from training.ppo_loop import ppo_setup
from training.sft_config import SFTModelSettings, SFTRunSettings, SFTTrainSettings
from training.warm_start import warm_start_cache

TINY_SFT = {"lora": {"r": 4, "alpha": 8}, "num_questions": 4,
            "train": {"epochs": 1, "batch_size": 2, "learning_rate": 1e-3}}


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A tiny run with its own warm start and a greedy evaluation on the four questions; calls of
    the SFT training and of the evaluation are counted."""
    monkeypatch.setenv("SEEDS_RL_CACHE", str(tmp_path / "cache"))
    recipe = write_tiny_run(tmp_path, sft_warm_start=True, warm_start=TINY_SFT, eval_questions=4, updates=1,
                            lora={"enabled": True, "r": 4, "alpha": 8, "critic": False})
    calls = {"sft": 0, "evaluate": 0}

    def counted(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(sft, "train_sft", counted("sft", sft.train_sft))
    monkeypatch.setattr(ppo_setup, "evaluate_policy", counted("evaluate", ppo_setup.evaluate_policy))

    def run(name, *overrides):
        cfg = load_config(PPOConfig, ["--config", str(recipe), "--output_dir", str(tmp_path / name), *overrides])
        before = dict(calls)
        result = train(cfg)
        return result, {k: calls[k] - before[k] for k in calls}

    return run


def weights(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix == ".safetensors"}


def actor_state(result):
    return {name: tensor.detach().clone() for name, tensor in result["models"].actor.state_dict().items()}


def test_second_run_reuses_warm_start_and_evaluation_and_ends_the_same(tiny, tmp_path):
    first, counts = tiny("a")
    assert counts == {"sft": 1, "evaluate": 2}  # trained; evaluated before and after
    assert "cached_from" not in first["eval_start"]
    again, counts = tiny("b")
    assert counts == {"sft": 0, "evaluate": 1}  # only the evaluation after PPO ran
    summary = json.loads((tmp_path / "b" / "sft" / "sft_summary.json").read_text())
    assert summary["reused_from"].startswith(str(tmp_path / "cache" / "warm_starts"))
    assert summary["model_dir"] == str(tmp_path / "b" / "sft" / "model")
    assert weights(tmp_path / "b" / "sft" / "model") == weights(tmp_path / "a" / "sft" / "model")
    assert again["eval_start"].pop("cached_from").startswith(str(tmp_path / "cache" / "evaluations"))
    assert again["eval_start"] == first["eval_start"]
    # The random states are the same after a reused warm start and evaluation (LoRA's initialisation,
    # the sampled episodes): PPO ends with the same weights.
    assert again["eval_end"] == first["eval_end"]
    first_state, again_state = actor_state(first), actor_state(again)
    assert first_state.keys() == again_state.keys()
    assert all(torch.equal(first_state[name], again_state[name]) for name in first_state)
    assert [h["reward_mean"] for h in again["history"]] == [h["reward_mean"] for h in first["history"]]
    assert again["comparison"] == first["comparison"]
    saved = json.loads((tmp_path / "b" / "eval.json").read_text())
    assert saved["before"]["cached_from"] == str(next((tmp_path / "cache" / "evaluations").glob("*.json")))


def test_what_is_reused_follows_what_changed(tiny):
    tiny("a")
    _, counts = tiny("lr", "--lr_actor", "0.5")  # PPO only: both reused
    assert counts == {"sft": 0, "evaluate": 1}
    _, counts = tiny("eval", "--max_turn_tokens", "9")  # the greedy episodes can change: evaluated again
    assert counts == {"sft": 0, "evaluate": 2}
    _, counts = tiny("sft", "--sft.learning_rate", "0.002")  # another warm start, so another evaluation
    assert counts == {"sft": 1, "evaluate": 2}
    _, counts = tiny("off", "--cache_warm_start", "false")
    assert counts == {"sft": 1, "evaluate": 2}


def test_unreadable_entries_are_named_and_computed_again(tiny, tmp_path, capsys):
    tiny("a")
    for summary in (tmp_path / "cache" / "warm_starts").glob("*/sft_summary.json"):
        summary.write_text("{not json")
    for evaluation in (tmp_path / "cache" / "evaluations").glob("*.json"):
        evaluation.write_text('{"stats": {}}')
    _, counts = tiny("b")
    assert counts == {"sft": 1, "evaluate": 2}
    printed = capsys.readouterr().out
    assert "cannot be read" in printed and "training it again" in printed and "evaluating again" in printed


def test_evaluation_key_ignores_only_optimisation_settings(tmp_path, retriever, examples):
    default = PPOConfig()
    names = {section.name for section in dataclasses.fields(PPOConfig)} | {
        f"{section.name}.{spec.name}" for section in dataclasses.fields(PPOConfig)
        if dataclasses.is_dataclass(getattr(default, section.name))
        for spec in dataclasses.fields(getattr(default, section.name))}
    assert set(warm_start_cache.TRAINING_ONLY) <= names  # no misspelt field silently kept in the key
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    base = with_values(PPOConfig, {"model.name": "m", "env_config": None})

    def key(cfg, content=b"weights", search=retriever):
        (folder / "model.safetensors").write_bytes(content)
        return warm_start_cache.evaluation_key(to_dict(cfg), cfg.env, folder, examples, search)

    reference = key(base)
    assert key(with_values(base,
                           {"optim.lr_actor": 0.5, "optim.updates": 99, "run.output_dir": "elsewhere"})) == reference
    assert key(with_values(base, {"evaluation.eval_seed": 7})) != reference
    assert key(with_values(base, {"env": {"max_actions": 2}})) != reference
    assert key(base, content=b"other weights") != reference
    assert key(base, search=OverlapRetriever(PASSAGES[:-1])) != reference  # the index lost a passage
    assert key(base, search=OverlapRetriever(PASSAGES)) == reference


def test_a_cached_evaluation_must_hold_every_question(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SEEDS_RL_CACHE", str(tmp_path / "cache"))
    stats = {"em": 0.5, "precision": 0.25, "reward_mean": 0.1, "docs_read_per_question": 2.0}
    outcomes = {name: np.arange(3, dtype=np.float64) for name in OUTCOME_KEYS}
    warm_start_cache.store_evaluation("k", stats, outcomes)
    loaded_stats, loaded = warm_start_cache.load_evaluation("k", 3)
    assert loaded_stats["em"] == 0.5 and all(np.array_equal(loaded[k], outcomes[k]) for k in OUTCOME_KEYS)
    assert warm_start_cache.load_evaluation("k", 4) is None  # another number of questions
    assert warm_start_cache.load_evaluation("missing", 3) is None
    warm_start_cache.store_evaluation("s", {**stats, "em": "high"}, outcomes)
    assert warm_start_cache.load_evaluation("s", 3) is None
    assert capsys.readouterr().out.count("evaluating again") == 2


def test_restoring_twice_copies_once(tmp_path, monkeypatch):
    """The processes of one node all restore into the same ``sft/`` folder: the first copies, the
    others find the copy done (under a file lock)."""
    monkeypatch.setenv("SEEDS_RL_CACHE", str(tmp_path / "cache"))
    trained = tmp_path / "trained"
    (trained / "model").mkdir(parents=True)
    (trained / "model" / "model.safetensors").write_bytes(b"weights")
    assert warm_start_cache.store_warm_start("k", trained, {"model_dir": str(trained / "model"), "log_history": []})
    out = tmp_path / "run" / "sft"
    first = warm_start_cache.restore_warm_start("k", out)
    copied = (out / "model" / "model.safetensors").stat().st_mtime_ns
    (tmp_path / "cache" / "warm_starts" / "k" / "model" / "model.safetensors").write_bytes(b"changed")
    assert warm_start_cache.restore_warm_start("k", out) == first
    assert (out / "model" / "model.safetensors").stat().st_mtime_ns == copied
    assert first["model_dir"] == str(out / "model") and "log_history" not in first
    assert warm_start_cache.restore_warm_start("other", out) is None


def test_warm_start_key_follows_the_base_models_files(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "model.safetensors").write_bytes(b"one")
    config = sft.WarmStartConfig(model=SFTModelSettings(name=str(base)),
                                 run=SFTRunSettings(output_dir=str(tmp_path / "a")))
    records = [{"id": "q", "segments": []}]
    first = warm_start_cache.warm_start_key(config, records, [])
    # where it writes and how it logs are not in the key; what it learns is
    logs = SFTTrainSettings(progress=False, logging_steps=1, report_to="wandb")
    for other in (dataclasses.replace(config, run=SFTRunSettings(output_dir="b")),
                  dataclasses.replace(config, train=logs)):
        assert warm_start_cache.warm_start_key(other, records, []) == first
    assert warm_start_cache.warm_start_key(dataclasses.replace(config, train=SFTTrainSettings(epochs=1)), records,
                                           []) != first
    assert warm_start_cache.warm_start_key(config, records + records, []) != first
    (base / "model.safetensors").write_bytes(b"two")  # the same path, other weights
    assert warm_start_cache.warm_start_key(config, records, []) != first


def test_the_source_is_read_once_per_process():
    """A run's warm-start key and evaluation key both carry the code's digest: the files are read once."""
    warm_start_cache.source_digest.cache_clear()
    first, second = warm_start_cache.code_and_versions(), warm_start_cache.code_and_versions()
    assert first == second and len(first["code"]) == 64
    assert warm_start_cache.source_digest.cache_info().misses == 1
