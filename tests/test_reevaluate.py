"""``python -m training.reevaluate``: a finished run's warm start and trained policy played again, greedy,
under another verdict cut, reported as the trainer reports and pooled by ``training.seed_spread``."""
from __future__ import annotations

import json

import pytest
from accelerate import Accelerator
from test_rollout import script_lm, tokenizer  # noqa: F401 (fixtures)
from test_verdict_cut import GradedVerdicts

from envs.typed_config import load_config, save_resolved
from training.config import PPOConfig
from training.reevaluate import main, reevaluate
from training.runtime.inputs import REPO_ROOT
from training.seed_spread import RunFolderError, read_run


@pytest.fixture
def run_folder(tmp_path, script_lm, tokenizer):  # noqa: F811
    """A run folder of the default recipe whose warm start and export are the scripted tiny model."""
    run = tmp_path / "run"
    for folder in (tmp_path / "warm", run / "final_hf"):
        script_lm.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    cfg = load_config(PPOConfig, ["--config", str(REPO_ROOT / "configs/ppo/default.yaml"), "--model.dtype", "float32",
                                  "--model.sft_checkpoint", str(tmp_path / "warm"), "--rollout.max_turn_tokens", "12",
                                  "--rollout.max_context_tokens", "1024", "--run.seed", "3"])
    save_resolved(cfg, run)
    return run


def replay(run_folder, retriever, examples, cut, monkeypatch):
    monkeypatch.setattr("training.reevaluate.HFBackend", GradedVerdicts)  # verdicts with graded π(yes), all of them
    monkeypatch.setattr("training.rollouts.rollout_generation.session_supported", lambda backend: False)
    return reevaluate(run_folder, cut, retriever=retriever, held_out=examples, accelerator=Accelerator(cpu=True))


def test_the_cut_replays_both_sides_and_writes_a_folder_seed_spread_reads(run_folder, retriever, examples,
                                                                          monkeypatch):
    level = replay(run_folder, retriever, examples, "level", monkeypatch)
    ranked = replay(run_folder, retriever, examples, "snapshot_mean", monkeypatch)
    out = run_folder / "recut-snapshot_mean"
    saved = load_config(PPOConfig, ["--config", str(out / "config.yaml")])
    assert saved.evaluation.verdict_cut == "snapshot_mean" and saved.run.seed == 3
    assert json.loads((out / "eval.json").read_text())["comparison"] == ranked["comparison"]
    sides = read_run(out)
    shown = len(examples) * 5
    for side in ("before", "after"):  # the same weights on both sides: the same episodes
        assert level["per_question"][side]["docs_read"] == [5.0] * len(examples)  # every verdict a yes
        docs = sides[side]["docs_read"]
        assert 0 < docs.sum() < shown and all(0 < d < 5 for d in docs)
        assert list(docs) == ranked["per_question"]["before"]["docs_read"]
    assert ranked["comparison"]["docs"]["diff"] == 0.0
    assert not (run_folder / "eval.json").exists()  # the run folder's own report is left alone


def test_folders_it_cannot_replay_are_refused(run_folder, tmp_path, retriever, examples, capsys):
    with pytest.raises(RunFolderError, match="no config.yaml"):
        reevaluate(tmp_path / "nothing", "snapshot_mean")
    with pytest.raises(RunFolderError, match="missing: no Hugging Face model folder"):
        reevaluate(run_folder, "snapshot_mean", after=str(tmp_path / "missing"), retriever=retriever,
                   held_out=examples)
    stream = load_config(PPOConfig, ["--config", str(run_folder / "config.yaml"), "--env.judge_context", "stream"])
    save_resolved(stream, tmp_path / "stream")
    assert main([str(tmp_path / "stream")]) == 2
    assert "not judged alone" in capsys.readouterr().err
