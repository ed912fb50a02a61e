"""The actor's per-micro-batch objective (training.ppo.actor_objective) against values computed by
hand: asymmetric clips, dual clip, a non-trivial importance weight, the entropy bonus, the KL term on
all tokens or on verdict tokens only, and two loss aggregations."""
from __future__ import annotations

import math

import pytest
import torch

from training.config import PPOConfig, dotted_keys, with_values
from training.ppo import actor_objective

# Five model tokens (row 0: a b c; row 1: d, a masked-out token, f); per token, by hand:
#   ratio ρ, advantage A, PPO loss with clip_low 0.1 / clip_high 0.3 / dual clip 3, weight w, entropy H,
#   logp − ref_logp (k2 = ½·diff²)
#   a: ρ 1.5, A +1: max(−1.5, −1.3)            = −1.3   w 0.5  H 1.0  diff  1 (k2 0.5)
#   b: ρ 0.8, A −1: max(0.8, 0.9)              =  0.9   w 2.0  H 2.0  diff  0
#   c: ρ 5.0, A −1: max(5, 1.3) = 5, dual: min(5, 3) = 3  w 1.0  H 0.5  diff  2 (k2 2.0)
#   d: ρ 1.0, A +2:                               −2    w 0.25 H 0.0  diff −1 (k2 0.5)
#   f: ρ 1.2, A 0.5: max(−0.6, −0.6)           = −0.6   w 1.0  H 1.0  diff  0
RATIOS = [[1.5, 0.8, 5.0], [1.0, 2.0, 1.2]]
ADVANTAGES = [[1.0, -1.0, -1.0], [2.0, 5.0, 0.5]]
WEIGHTS = [[0.5, 2.0, 1.0], [0.25, 1.0, 1.0]]
ENTROPY = [[1.0, 2.0, 0.5], [0.0, 3.0, 1.0]]
REF_DIFF = [[1.0, 0.0, 2.0], [-1.0, 4.0, 0.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]]
CHOICES = [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]  # c is a verdict token


def micro_batch() -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    old = torch.full((2, 3), -1.0)
    logp = (old + torch.tensor(RATIOS).log()).requires_grad_()
    mb = {"model_mask": torch.tensor(MASK), "old_logp": old, "advantages": torch.tensor(ADVANTAGES),
          "is_weight": torch.tensor(WEIGHTS), "ref_logp": logp.detach() - torch.tensor(REF_DIFF),
          "choice_mask": torch.tensor(CHOICES)}
    return logp, torch.tensor(ENTROPY), mb


def config(**overrides) -> PPOConfig:
    base = {"clip_low": 0.1, "clip_high": 0.3, "dual_clip": 3.0, "entropy_coef": 0.05, "kl_coef": 0.1,
            "kl_mode": "loss", "kl_estimator": "k2", "kl_tokens": "all", "loss_agg": "token_mean"}
    return with_values(PPOConfig, dotted_keys({**base, **overrides}))


# per token w·L − 0.05·H + 0.1·k2:
#   a −0.65 − 0.05 + 0.05;  b 1.8 − 0.1;  c 3 − 0.025 + 0.2;  d −0.5 + 0.05;  f −0.6 − 0.05
ALL_TOKENS = [-0.65, 1.7, 3.175, -0.45, -0.65]
VERDICTS_ONLY = [-0.70, 1.7, 3.175, -0.50, -0.65]  # the KL term at c only


@pytest.mark.parametrize(("overrides", "expected"), [
    ({}, sum(ALL_TOKENS) / 5),
    ({"kl_tokens": "verdicts"}, sum(VERDICTS_ONLY) / 5),
    ({"loss_agg": "seq_mean_token_mean"}, (sum(ALL_TOKENS[:3]) / 3 + sum(ALL_TOKENS[3:]) / 2) / 2),
    ({"kl_mode": "reward", "kl_estimator": "k1"}, (sum(ALL_TOKENS) - 0.05 - 0.2 - 0.05) / 5),  # no KL in the loss
])
def test_actor_objective_matches_hand_values(overrides, expected):
    logp, entropy, mb = micro_batch()
    cfg = config(**overrides)
    loss, policy_sum, entropy_sum, stats = actor_objective(cfg.algorithm, logp, entropy, mb, torch.tensor(5.0),
                                                           torch.tensor(2.0),
                                                           max_context_tokens=cfg.rollout.max_context_tokens)
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-5)
    assert policy_sum == pytest.approx(-0.65 + 1.8 + 3.0 - 0.5 - 0.6, abs=1e-5)  # w·L over model tokens
    assert entropy_sum == pytest.approx(4.5, abs=1e-6)
    assert float(stats["dual_clip_frac"]) == pytest.approx(1 / 5)  # token c
    assert float(stats["clip_frac"]) == pytest.approx(2 / 5)  # a (high side) and b (low side)


def test_actor_objective_gradient_matches_hand_values():
    """d loss / d logp per token (token_mean over 5): the clipped and dual-clipped tokens give no
    surrogate gradient, the others −w·A·ρ; plus the KL term's 0.1·diff (k2)."""
    logp, entropy, mb = micro_batch()
    loss, *_ = actor_objective(config().algorithm, logp, entropy, mb, torch.tensor(5.0), torch.tensor(2.0),
                               max_context_tokens=PPOConfig().rollout.max_context_tokens)
    loss.backward()
    expected = [[0.1 * 1.0, 0.0, 0.1 * 2.0], [-0.25 * 2.0 * 1.0 + 0.1 * -1.0, 0.0, -1.0 * 0.5 * 1.2]]
    torch.testing.assert_close(logp.grad, torch.tensor(expected) / 5, rtol=1e-5, atol=1e-6)
    assert math.isfinite(float(loss.detach()))
