"""GSPO (training.algorithm.policy_losses.gspo_loss_terms, ``policy_loss: gspo``): one length-normalised ratio per
sequence, clipped per sequence, a per-token gradient; against numbers derived by hand."""
from __future__ import annotations

import math

import pytest
import torch

from training.algorithm.policy_losses import gspo_loss_terms
from training.algorithm.ppo_core import policy_loss_terms
from training.config import ConfigError, PPOConfig, dotted_keys, with_values
from training.ppo import actor_objective

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]])
STEP = torch.tensor([[0.3, -0.1, 0.1], [-0.4, -0.2, 5.0]])  # logp − old_logp; the 5.0 is padding: ignored
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # 3 and 2 model tokens
ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
RHO = (math.exp(0.3 / 3), math.exp(-0.6 / 2))  # s_0 = 0.1, s_1 = −0.3: 1.1051709, 0.7408182


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def gspo(clip_low: float, clip_high: float):
    logp = (OLD + STEP).requires_grad_(True)
    loss, stats = gspo_loss_terms(logp, OLD, ADV, MASK, clip_low, clip_high)
    (loss * MASK).sum().backward()
    return loss.detach(), stats, logp.grad


def test_sequence_ratio_clipped_below_for_a_negative_advantage():
    loss, stats, grad = gspo(0.2, 0.2)
    # row 0: ρ = 1.1051709 inside [0.8, 1.2], L = −A·ρ; row 1: ρ = 0.7408182 < 0.8 with A = −2: the clipped
    # branch 2·0.8 = 1.6 beats 2·0.7408182 = 1.4816364, so the whole row is clipped and gets no gradient
    close(loss[0], [-RHO[0]] * 3)
    close(loss[1, :2], [1.6, 1.6])
    close(grad, [[-RHO[0]] * 3, [0.0, 0.0, 0.0]])  # ∂L_t/∂logp_t = −A·ρ_0 at every token of row 0
    close(stats["clip_frac"], 2 / 5)
    close(stats["ratio_max"], RHO[0])
    close(stats["dual_clip_frac"], 0.0)
    # approx_kl: mean of e^d − 1 − d over the five per-token log ratios d (the padding's 5.0 left out)
    close(stats["approx_kl"], sum(math.exp(d) - 1 - d for d in (0.3, -0.1, 0.1, -0.4, -0.2)) / 5)


def test_sequence_ratio_clipped_above_for_a_positive_advantage():
    loss, stats, grad = gspo(0.3, 0.05)
    # row 0: ρ = 1.1051709 > 1.05 with A = 1: L = −1.05, no gradient; row 1: ρ = 0.7408182 > 0.7, unclipped
    close(loss[0], [-1.05] * 3)
    close(loss[1, :2], [2 * RHO[1]] * 2)
    close(grad, [[0.0, 0.0, 0.0], [2 * RHO[1], 2 * RHO[1], 0.0]])  # −A·ρ_1 = 1.4816364 at both tokens
    close(stats["clip_frac"], 3 / 5)


def test_per_token_advantages_weigh_their_own_token():
    """GSPO-token: ∂L_t/∂logp_t = −A_t·ρ_i. (Differentiating through s_i instead would spread the row's
    mean advantage over its tokens: −mean(A)·ρ_i at each.)"""
    logp = (OLD + STEP).requires_grad_(True)
    advantages = torch.tensor([[1.0, 2.0, 3.0], [-2.0, -2.0, -2.0]])
    loss, _ = gspo_loss_terms(logp, OLD, advantages, MASK, 10.0, 10.0)
    (loss * MASK).sum().backward()
    close(loss[0], [-RHO[0], -2 * RHO[0], -3 * RHO[0]])
    close(logp.grad[0], [-RHO[0], -2 * RHO[0], -3 * RHO[0]])


def test_one_ratio_per_row_where_ppo_has_one_per_token():
    logp = (OLD + STEP).requires_grad_(True)
    loss, _ = policy_loss_terms(logp, OLD, ADV, MASK, 10.0, 10.0)
    (loss * MASK).sum().backward()
    close(logp.grad[0], [-math.exp(0.3), -math.exp(-0.1), -math.exp(0.1)])  # PPO: each token its own ratio
    _, _, grad = gspo(10.0, 10.0)
    close(grad[0], [-RHO[0]] * 3)


def test_extreme_log_ratios_stay_finite():
    logp = torch.tensor([[100.0, 0.0]], requires_grad=True)
    loss, stats = gspo_loss_terms(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), 0.2, 0.2)
    close(stats["ratio_max"], math.exp(10.0), atol=1.0)  # (20 + 0)/2: the token's log ratio clamped to 20
    assert bool(torch.isfinite(loss).all())


def objective(**overrides) -> float:
    cfg = with_values(PPOConfig,
                      dotted_keys(dict(entropy_coef=0.0, kl_coef=0.0, clip_low=0.2, clip_high=0.2, **overrides)))
    mb = {"model_mask": MASK, "old_logp": OLD, "advantages": ADV}
    loss, *_ = actor_objective(cfg.algorithm, OLD + STEP, torch.zeros(2, 3), mb, torch.tensor(5.0), torch.tensor(2.0),
                               max_context_tokens=cfg.rollout.max_context_tokens)
    return float(loss)


def test_the_trainer_objective_uses_the_configured_policy_loss():
    assert objective(policy_loss="gspo") == pytest.approx((-3 * RHO[0] + 2 * 1.6) / 5, abs=1e-6)  # token_mean
    # GSPO's own aggregation: the mean over sequences of each one's token mean
    assert objective(policy_loss="gspo", loss_agg="seq_mean_token_mean") == pytest.approx((-RHO[0] + 1.6) / 2,
                                                                                         abs=1e-6)
    # PPO, token by token: e^0.3 = 1.35 clipped to 1.2 (A > 0), e^−0.4 = 0.67 clipped to 0.8 (A < 0), the rest not
    ppo = (-1.2 - math.exp(-0.1) - math.exp(0.1) + 2 * 0.8 + 2 * math.exp(-0.2)) / 5
    assert objective(policy_loss="ppo") == pytest.approx(ppo, abs=1e-6)


def test_gspo_settings_are_checked():
    with pytest.raises(ConfigError, match="dual_clip"):
        with_values(PPOConfig, {"algorithm.policy_loss": "gspo", "algorithm.dual_clip": 3.0})
    with pytest.raises(ConfigError, match="policy_loss"):
        with_values(PPOConfig, {"algorithm.policy_loss": "grpo"})
    assert PPOConfig().algorithm.policy_loss == "ppo"
