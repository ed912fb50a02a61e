"""target_kl: an update's optimizer steps end after the first mini-batch whose KL to the rollout
policy is past the target, verdict tokens measured apart from text tokens (training/algorithm/kl_stop.py)."""
from __future__ import annotations

import math

import pytest
import torch

from tests.test_ppo_loop import tiny_cfg, trainable
from tests.tiny_models import tiny_llama, tiny_tokenizer
from training.algorithm.kl_stop import approx_kl_sums, exceeds_target_kl, kl_means, kl_summary
from training.config import ConfigError
from training.models.policy_models import wrap_models
from training.ppo import train


def test_kl_sums_keep_verdict_tokens_apart_from_text_tokens():
    old = torch.zeros(2, 4)
    logp = torch.tensor([[0.0, -0.5, 0.0, 0.0], [0.0, 0.0, 0.0, -2.0]])
    model = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    choice = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    sums = approx_kl_sums(logp, old, model, choice)
    k3 = lambda d: math.exp(d) - 1.0 - d  # noqa: E731
    assert sums.tolist() == pytest.approx([k3(-0.5), 2.0, k3(-2.0), 1.0])
    text, verdicts = kl_means(sums)
    assert text == pytest.approx(k3(-0.5) / 2) and verdicts == pytest.approx(k3(-2.0))
    # a large verdict move stops even where the text mean is far below the target
    assert exceeds_target_kl(sums, 0.5) and not exceeds_target_kl(sums, 1.2) and not exceeds_target_kl(sums, None)
    no_verdicts = approx_kl_sums(logp, old, model, torch.zeros(2, 4))
    assert math.isnan(kl_means(no_verdicts * torch.tensor([1.0, 1.0, 0.0, 0.0]))[1])
    assert not exceeds_target_kl(torch.tensor([0.0, 0.0, 0.0, 0.0]), 1e-9)  # no tokens: nothing to stop on


def test_the_update_summary_gives_means_over_steps_and_the_largest_step():
    first, second = torch.tensor([0.2, 10.0, 0.0, 0.0]), torch.tensor([0.6, 10.0, 0.5, 5.0])
    summary = kl_summary([first, second])
    assert summary["approx_kl_text"] == pytest.approx(0.04) and summary["approx_kl_text_max"] == pytest.approx(0.06)
    assert summary["approx_kl_verdicts"] == pytest.approx(0.1)  # the first step had no verdict token
    assert summary["approx_kl_verdicts_max"] == pytest.approx(0.1)
    assert all(math.isnan(v) for v in kl_summary([]).values())


def test_target_kl_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match="target_kl"):
        tiny_cfg(tmp_path, target_kl=0.0)
    assert tiny_cfg(tmp_path, target_kl=0.02).optim.target_kl == 0.02


def run_update(tmp_path, retriever, examples, name, **overrides):
    tok = tiny_tokenizer()
    cfg = tiny_cfg(tmp_path / name, advantage="grpo", ppo_epochs=2, mini_batches=2, temperature=1.0,
                   old_logprobs="recompute", lr_actor=5e-2, **overrides)
    torch.manual_seed(0)
    models = wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout)
    before = trainable(models.actor)
    result = train(cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)
    return result["history"][0], before, trainable(result["models"].actor)


def test_a_tiny_target_stops_after_the_first_step_and_none_takes_them_all(tmp_path, retriever, examples):
    full, start, after_full = run_update(tmp_path, retriever, examples, "full")
    assert full["actor_steps"] == 4 and full["kl_stopped"] == 0.0  # 2 epochs x 2 mini-batches
    assert full["approx_kl_text_max"] >= full["approx_kl_text"] > 0
    loose, _, after_loose = run_update(tmp_path, retriever, examples, "loose", target_kl=1e6)
    assert loose["actor_steps"] == 4 and loose["kl_stopped"] == 0.0
    assert all(torch.equal(after_loose[k], after_full[k]) for k in after_full)  # a target never reached changes nothing
    tight, start_tight, after_tight = run_update(tmp_path, retriever, examples, "tight", target_kl=1e-6)
    # the first mini-batch's forward runs the old weights (KL ~0, below 1e-6); its step moves
    # them, so the second mini-batch measures KL > 1e-6 and the update ends after its step
    assert tight["actor_steps"] == 2 and tight["kl_stopped"] == 1.0
    assert all(torch.equal(start_tight[k], start[k]) for k in start)
    moved = [k for k in after_tight if not torch.equal(after_tight[k], start[k])]
    assert moved, "the steps before the stop were taken"
    assert any(not torch.equal(after_tight[k], after_full[k]) for k in after_full), "the later steps were not"
