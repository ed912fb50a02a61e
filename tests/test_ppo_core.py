"""training.algorithm.ppo_core against numbers derived by hand (derivations in the comments)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from training.algorithm import advantages as adv_mod
from training.algorithm import kl_estimators as K
from training.algorithm import ppo_core as pc


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# --------------------------------------------------------------------------- masked statistics


def test_masked_mean_sum_var_ignore_masked_entries():
    x = t([1.0, 3.0, 5.0, 100.0], [2.0, 2.0, -50.0, 7.0])
    m = t([1, 1, 1, 0], [1, 0, 0, 0])
    close(pc.masked_sum(x, m), 1 + 3 + 5 + 2)  # 11
    close(pc.masked_mean(x, m), 11 / 4)
    close(pc.masked_mean(x, m, dim=1), [3.0, 2.0])
    # values 1,3,5,2: mean 2.75; squared deviations 3.0625 + 0.0625 + 5.0625 + 0.5625 = 8.75; /3
    close(pc.masked_var(x, m), 8.75 / 3)
    close(pc.masked_mean(x, torch.zeros_like(m)), 0.0)  # empty mask -> 0, not NaN


def test_masked_whiten_ignores_masked_tokens():
    x = t([1.0, 3.0, 5.0, 100.0])
    m = t([1, 1, 1, 0])
    # over 1,3,5: mean 3, unbiased var (4 + 0 + 4)/2 = 4, std 2 -> (-1, 0, 1); the 100 is ignored and zeroed
    close(pc.masked_whiten(x, m), [[-1.0, 0.0, 1.0, 0.0]], atol=1e-6)
    # scale only: (x - 3)/2 + 3 -> (2, 3, 4)
    close(pc.masked_whiten(x, m, shift_mean=False), [[2.0, 3.0, 4.0, 0.0]], atol=1e-6)


# --------------------------------------------------------------------------- rewards and KL


def test_token_level_rewards_terminal_on_last_model_token_with_kl():
    mask = t([1, 1, 0, 0, 1, 1, 0], [0, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0])
    kl = torch.full((3, 7), 0.5)
    r = pc.token_level_rewards(torch.tensor([1.0, -0.5, 3.0]), mask, kl, kl_coef=0.1)
    # every model token pays 0.1 * 0.5 = 0.05; the last model token also gets R; non-model tokens 0;
    # the row without model tokens gets nothing
    close(r, [[-0.05, -0.05, 0, 0, -0.05, 0.95, 0], [0, -0.55, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]])
    close(pc.token_level_rewards(torch.tensor([2.0]), t([1, 1, 0])), [[0.0, 2.0, 0.0]])


def test_kl_estimators_on_small_vector():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.5, -1.0, -0.5])
    # d = logp - ref = (0.5, -1, 0)
    close(K.kl_k1(logp, ref), [0.5, -1.0, 0.0])
    close(K.kl_k2(logp, ref), [0.125, 0.5, 0.0])  # d^2 / 2
    # x = ref - logp = (-0.5, 1, 0): e^-0.5 + 0.5 - 1 = 0.1065306597, e - 2 = 0.7182818285, 0
    close(K.kl_k3(logp, ref), [0.1065306597, 0.7182818285, 0.0])
    close(K.kl_penalty(logp, ref, "k3"), [0.1065306597, 0.7182818285, 0.0])
    close(K.kl_penalty(logp, ref, "low_var_kl"), [0.1065306597, 0.7182818285, 0.0])
    close(K.kl_penalty(logp, ref, "k2"), [0.125, 0.5, 0.0])
    with pytest.raises(ValueError):
        K.kl_penalty(logp, ref, "k4")
    # k3 stays finite for an extreme token (capped at 10)
    assert K.kl_k3(torch.tensor([0.0]), torch.tensor([-1e4])).item() == pytest.approx(10.0)


# --------------------------------------------------------------------------- GAE


def test_gae_skips_observation_tokens_in_the_middle():
    # mask 1 1 0 0 1 1; observation values 9 and rewards 7 must not leak in
    rewards = t([0.0, 0.5, 7.0, 7.0, 0.0, 1.0])
    values = t([0.2, 0.4, 9.0, 9.0, 0.5, 0.6])
    mask = t([1, 1, 0, 0, 1, 1])
    adv, ret = adv_mod.gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    # gamma*lam = 0.72
    # t=5: d = 1 + 0.9*0 - 0.6 = 0.4                     A5 = 0.4
    # t=4: d = 0 + 0.9*0.6 - 0.5 = 0.04                  A4 = 0.04 + 0.72*0.4 = 0.328
    # t=3,2: observation, skipped (next value stays V4 = 0.5, running advantage stays 0.328)
    # t=1: d = 0.5 + 0.9*0.5 - 0.4 = 0.55                A1 = 0.55 + 0.72*0.328 = 0.78616
    # t=0: d = 0 + 0.9*0.4 - 0.2 = 0.16                  A0 = 0.16 + 0.72*0.78616 = 0.7260352
    close(adv, [[0.7260352, 0.78616, 0.0, 0.0, 0.328, 0.4]], atol=1e-6)
    # returns = A + V on model tokens
    close(ret, [[0.9260352, 1.18616, 0.0, 0.0, 0.828, 1.0]], atol=1e-6)


def test_gae_row_with_one_model_token_and_batching():
    rewards = t([0.0, 0.5, 7.0, 7.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    values = t([0.2, 0.4, 9.0, 9.0, 0.5, 0.6], [5.0, 5.0, 0.3, 5.0, 5.0, 5.0])
    mask = t([1, 1, 0, 0, 1, 1], [0, 0, 1, 0, 0, 0])
    adv, ret = adv_mod.gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    # single model token: next value 0 after it, so A = 1 - 0.3 = 0.7, return 1.0
    close(adv[1], [0.0, 0.0, 0.7, 0.0, 0.0, 0.0])
    close(ret[1], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    close(adv[0], [0.7260352, 0.78616, 0.0, 0.0, 0.328, 0.4])  # rows do not interact


def test_gae_gamma_lambda_one_is_reward_to_go_minus_value():
    rewards = t([0.1, 0.0, 0.2, 1.0])
    values = t([0.5, 5.0, 0.25, 0.75])
    mask = t([1, 0, 1, 1])
    adv, ret = adv_mod.gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    # reward-to-go over model tokens: G = (1.3, -, 1.2, 1.0); A = G - V = (0.8, 0, 0.95, 0.25)
    close(adv, [[0.8, 0.0, 0.95, 0.25]], atol=1e-6)
    close(ret, [[1.3, 0.0, 1.2, 1.0]], atol=1e-6)


def test_gae_estimator_whitens_over_model_tokens():
    rewards = t([0.1, 0.0, 0.2, 1.0])
    values = t([0.5, 5.0, 0.25, 0.75])
    mask = t([1, 0, 1, 1])
    adv, ret = adv_mod.compute_advantages("gae", token_rewards=rewards, values=values, model_mask=mask,
                                          scores=torch.tensor([1.0]))  # fields it does not read are ignored
    # raw A on model tokens (0.8, 0.95, 0.25): mean 2/3; deviations 2/15, 17/60, -5/12;
    # squares 0.0177778 + 0.0802778 + 0.1736111 = 0.2716667, /2 = 0.1358333, std 0.3685557;
    # deviations / std = 0.3617725, 0.7687666, -1.1305391
    close(adv, [[0.3617725, 0.0, 0.7687666, -1.1305391]], atol=1e-5)
    close(ret, [[1.3, 0.0, 1.2, 1.0]], atol=1e-6)  # returns stay un-whitened


# --------------------------------------------------------------------------- GRPO / REINFORCE / registry


def test_grpo_two_interleaved_groups():
    scores = torch.tensor([1.0, 2.0, 0.0, 0.0, 1.0])
    groups = ["a", "b", "a", "b", "a"]
    mask = t([1, 1, 0], [0, 1, 1], [1, 0, 0], [1, 1, 1], [0, 0, 1])
    adv, ret = adv_mod.compute_advantages("grpo", scores=scores, group_ids=groups, model_mask=mask)
    # group a = (1, 0, 1): mean 2/3, unbiased var (1/9 + 4/9 + 1/9)/2 = 1/3, std 0.5773503
    #   -> (1/3)/0.5773503 = 0.5773503, (-2/3)/0.5773503 = -1.1547005
    # group b = (2, 0): mean 1, unbiased std sqrt(2) -> +-0.7071068
    a = [0.5773503, 0.7071068, -1.1547005, -0.7071068, 0.5773503]
    expected = torch.tensor(a)[:, None] * mask
    close(adv, expected, atol=1e-5)
    close(ret, scores[:, None] * mask)
    # integer tensor ids give the same answer
    adv2, _ = adv_mod.grpo_advantages(scores, torch.tensor([7, 3, 7, 3, 7]), mask)
    close(adv2, expected, atol=1e-5)
    # equal scores and singleton groups carry no signal
    adv3, _ = adv_mod.grpo_advantages(torch.tensor([1.0, 1.0, 5.0]), [0, 0, 1], torch.ones(3, 2))
    close(adv3, torch.zeros(3, 2))


def test_reinforce_batch_mean_and_given_baseline():
    scores = torch.tensor([1.0, 0.0, 0.5, 0.5])
    mask = t([1, 0, 1], [1, 1, 0], [0, 0, 1], [1, 1, 1])
    adv, ret = adv_mod.compute_advantages("reinforce", scores=scores, model_mask=mask)
    # batch mean 0.5 -> R - b = (0.5, -0.5, 0, 0)
    close(adv, [[0.5, 0, 0.5], [-0.5, -0.5, 0], [0, 0, 0], [0, 0, 0]])
    close(ret, scores[:, None] * mask)
    # per-token value baseline: A_t = R - V_t on model tokens
    values = t([0.2, 9.0, 0.7], [0.1, -0.3, 9.0], [9.0, 9.0, 0.0], [0.5, 1.0, 0.25])
    adv, _ = adv_mod.reinforce_advantages(scores, mask, baseline=values)
    close(adv, [[0.8, 0, 0.3], [-0.1, 0.3, 0], [0, 0, 0.5], [0, -0.5, 0.25]], atol=1e-6)
    # per-episode baseline
    adv, _ = adv_mod.reinforce_advantages(scores, mask, baseline=torch.tensor([1.0, 1.0, 0.0, 0.0]))
    close(adv, [[0, 0, 0], [-1, -1, 0], [0, 0, 0.5], [0.5, 0.5, 0.5]])


def test_register_estimator_and_unknown_name():
    assert set(adv_mod.ADVANTAGE_ESTIMATORS) >= {"gae", "grpo", "reinforce"}

    @adv_mod.register_estimator("_test_const")
    def const(batch):
        m = batch.model_mask.float()
        return 3.0 * m, m

    try:
        adv, _ = adv_mod.compute_advantages("_test_const", model_mask=t([1, 0]), scores=torch.ones(1))
        close(adv, [[3.0, 0.0]])
        with pytest.raises(ValueError):
            adv_mod.register_estimator("_test_const")(const)
    finally:
        del adv_mod.ADVANTAGE_ESTIMATORS["_test_const"]
    with pytest.raises(ValueError):
        adv_mod.compute_advantages("nope", model_mask=t([1]))
    with pytest.raises(TypeError, match="group_ids"):  # a field the estimator needs is missing
        adv_mod.compute_advantages("grpo", scores=torch.ones(1), model_mask=t([1]))
    with pytest.raises(ValueError, match="one AdvantageBatch"):  # one signature for every estimator
        adv_mod.register_estimator("_test_two")(lambda model_mask, scores: (model_mask, model_mask))


# --------------------------------------------------------------------------- policy and value loss


def _one(ratio, adv, **kw):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    terms, stats = pc.policy_loss_terms(logp, torch.zeros(1, 1), torch.tensor([[adv]]), torch.ones(1, 1), **kw)
    loss = pc.masked_sum(terms, torch.ones(1, 1))
    loss.backward()
    return loss.item(), logp.grad.item(), stats


def test_policy_loss_cases():
    kw = {"clip_low": 0.2, "clip_high": 0.3}
    # inside the clip range: L = -A*rho = -2*1.1 = -2.2; dL/dlogp = -A*rho = -2.2
    loss, grad, st = _one(1.1, 2.0, **kw)
    assert loss == pytest.approx(-2.2) and grad == pytest.approx(-2.2) and st["clip_frac"].item() == 0
    # A > 0 above 1 + 0.3: max(-2*1.5, -2*1.3) = -2.6, no gradient
    loss, grad, st = _one(1.5, 2.0, **kw)
    assert loss == pytest.approx(-2.6) and grad == 0.0 and st["clip_frac"].item() == 1
    # A < 0 below 1 - 0.2: max(1*0.5, 1*0.8) = 0.8, no gradient
    loss, grad, st = _one(0.5, -1.0, **kw)
    assert loss == pytest.approx(0.8) and grad == 0.0 and st["clip_frac"].item() == 1
    # A < 0 with rho = 5: without dual clip max(5, 1.3) = 5 (gradient -A*rho = 5)
    loss, grad, st = _one(5.0, -1.0, **kw)
    assert loss == pytest.approx(5.0) and grad == pytest.approx(5.0)
    # dual clip c = 3: min(5, -c*A = 3) = 3, constant -> no gradient
    loss, grad, st = _one(5.0, -1.0, dual_clip=3.0, **kw)
    assert loss == pytest.approx(3.0) and grad == 0.0 and st["dual_clip_frac"].item() == 1
    # dual clip leaves A > 0 alone: rho = 5, A = 1 -> max(-5, -1.3) = -1.3
    loss, _, _ = _one(5.0, 1.0, dual_clip=3.0, **kw)
    assert loss == pytest.approx(-1.3)
    with pytest.raises(ValueError):
        _one(1.0, 1.0, dual_clip=1.0)


def test_policy_loss_sums_over_mask_and_reports_stats():
    ratios = torch.tensor([[1.1, 1.5, 0.5, 5.0, 42.0]])
    adv = torch.tensor([[2.0, 2.0, -1.0, -1.0, -100.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    terms, st = pc.policy_loss_terms(ratios.log(), torch.zeros(1, 5), adv, mask, clip_low=0.2, clip_high=0.3,
                                     dual_clip=3.0)
    loss = pc.masked_sum(terms, mask)
    # -2.2 - 2.6 + 0.8 + 3.0 = -1.0 (the masked token is excluded)
    assert loss.item() == pytest.approx(-1.0, abs=1e-5)
    assert st["clip_frac"].item() == pytest.approx(0.5)  # tokens 2 and 3 of 4
    assert st["dual_clip_frac"].item() == pytest.approx(0.25)
    # approx_kl = mean(rho - 1 - log rho): 0.1-0.0953102, 0.5-0.4054651, -0.5+0.6931472, 4-1.6094379
    assert st["approx_kl"].item() == pytest.approx((0.0046898 + 0.0945349 + 0.1931472 + 2.3905621) / 4, abs=1e-5)
    assert st["ratio_max"].item() == pytest.approx(5.0)


def test_value_loss_clipped_vs_unclipped():
    old = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    v = torch.tensor([[1.1, 1.5, 0.5, 1.5]], requires_grad=True)
    ret = torch.tensor([[2.0, 2.0, 2.0, 0.0]])
    mask = torch.ones(1, 4)
    loss, st = pc.value_loss(v, old, ret, mask, clip=0.2)
    # tok0: inside clip, 0.5*(0.9)^2 = 0.405
    # tok1: V_clip = 1.2; max((0.5)^2, (0.8)^2) = 0.64 -> 0.32, clipped term wins (no gradient)
    # tok2: V_clip = 0.8; max((1.5)^2, (1.2)^2) = 2.25 -> 1.125, unclipped wins
    # tok3: V_clip = 1.2; max((1.5)^2, (1.2)^2) = 2.25 -> 1.125
    assert loss.item() == pytest.approx(0.405 + 0.32 + 1.125 + 1.125)
    assert st["clip_frac"].item() == pytest.approx(0.25)
    loss.backward()
    # d/dV of 0.5*(V-R)^2 = V - R where unclipped wins, 0 where the clipped term wins
    close(v.grad, [[-0.9, 0.0, -1.5, 1.5]], atol=1e-6)
    loss_noclip, _ = pc.value_loss(v.detach(), old, ret, torch.tensor([[1, 1, 0, 0]]), clip=None)
    assert loss_noclip.item() == pytest.approx(0.405 + 0.125)  # 0.5*0.81 + 0.5*0.25


# --------------------------------------------------------------------------- global token mean


def test_global_token_mean_vs_mean_of_micro_batch_means():
    # per-token losses of one mini-batch split into two micro-batches / "processes"
    loss_a, mask_a = t([1.0, 1.0, 1.0, 1.0]), t([1, 1, 1, 0])  # 3 tokens, sum 3
    loss_b, mask_b = t([4.0, 4.0, 4.0, 4.0]), t([1, 0, 0, 0])  # 1 token, sum 4
    full_loss, full_mask = torch.cat([loss_a, loss_b]), torch.cat([mask_a, mask_b])
    full_mean = pc.masked_mean(full_loss, full_mask)  # 7 / 4 = 1.75
    assert full_mean.item() == pytest.approx(1.75)

    class TwoProcessAccelerator:  # process A's view: reduce adds process B's count
        def reduce(self, tensor, reduction):
            assert reduction == "sum"
            return tensor + mask_b.sum()

    n = pc.global_token_count(mask_a, accelerator=TwoProcessAccelerator())
    assert n.item() == 4.0
    token_mean = (pc.masked_sum(loss_a, mask_a) + pc.masked_sum(loss_b, mask_b)) / n
    assert token_mean.item() == pytest.approx(1.75)
    # the biased alternative: (3/3 + 4/1) / 2 = 2.5
    mean_of_means = (pc.masked_mean(loss_a, mask_a) + pc.masked_mean(loss_b, mask_b)) / 2
    assert mean_of_means.item() == pytest.approx(2.5)
    # without a process group the count is local; an empty mask still gives a safe denominator
    assert pc.global_token_count(full_mask).item() == 4.0
    assert pc.global_token_count(torch.zeros(2, 3)).item() == 1.0


def test_global_token_count_all_reduce_path(tmp_path):
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        assert pc.global_token_count(t([1, 1, 0], [1, 0, 0])).item() == 3.0
    finally:
        dist.destroy_process_group()


def test_explained_variance():
    r = t([1.0, 2.0, 3.0, 50.0])
    mask = t([1, 1, 1, 0])
    # R - V = (0, 0, 1): var 1/3; var R = 1 -> 1 - 1/3
    assert pc.explained_variance(t([1.0, 2.0, 2.0, 0.0]), r, mask).item() == pytest.approx(2 / 3)
    assert pc.explained_variance(r, r, mask).item() == pytest.approx(1.0)
    assert math.isnan(pc.explained_variance(r, t([1.0, 1.0, 1.0, 0.0]), mask).item())


# --------------------------------------------------------------------------- logits


def test_logprobs_and_entropy_hand_values():
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])  # p = (1/4, 3/4) and (1/2, 1/2)
    lp = pc.logprobs_from_logits(logits, torch.tensor([[1, 0]]), chunk=1)
    close(lp, [[math.log(0.75), math.log(0.5)]])  # -0.2876821, -0.6931472
    # H = 0.25 ln 4 + 0.75 ln(4/3) = 0.3465736 + 0.2157616 = 0.5623351; uniform over 2: ln 2
    close(pc.entropy_from_logits(logits, chunk=1), [[0.5623351, 0.6931472]], atol=1e-6)
    close(pc.masked_sum(pc.entropy_from_logits(logits), t([1, 0])), 0.5623351, atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 3, 5, None])
def test_logprobs_chunked_equals_unchunked(chunk):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 11, generator=g).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, 11, (2, 7), generator=g)
    direct = torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    (gd,) = torch.autograd.grad(direct.sum(), logits)
    got = pc.logprobs_from_logits(logits, labels, chunk=chunk)
    assert got.dtype == torch.float32 and got.shape == (2, 7)
    close(got, direct, atol=1e-6)
    (gc,) = torch.autograd.grad(got.sum(), logits)
    torch.testing.assert_close(gc, gd)


@pytest.mark.parametrize("chunk", [1, 4, None])
def test_entropy_chunked_equals_direct(chunk):
    g = torch.Generator().manual_seed(1)
    logits = (3 * torch.randn(3, 5, 13, generator=g)).requires_grad_(True)
    p = torch.softmax(logits, -1)
    direct = -(p * torch.log_softmax(logits, -1)).sum(-1)
    (gd,) = torch.autograd.grad(direct.sum(), logits)
    got = pc.entropy_from_logits(logits, chunk=chunk)
    close(got, direct, atol=1e-5)
    (gc,) = torch.autograd.grad(got.sum(), logits)
    torch.testing.assert_close(gc, gd, atol=1e-5, rtol=1e-5)


def test_whitening_uses_the_statistics_of_all_processes():
    """Two fake ranks: rank 0 holds advantages [1, 2], rank 1 holds [3, 10] (plus a masked 99).

    Global μ = 16/4 = 4, unbiased σ² = ((−3)² + (−2)² + (−1)² + 6²)/3 = 50/3; every rank must whiten
    with these, not with its own [1, 2] or [3, 10] moments."""
    import math

    from training.algorithm.ppo_core import global_masked_moments, masked_whiten

    rank0 = (torch.tensor([[1.0, 2.0]]), torch.tensor([[1, 1]]))
    rank1 = (torch.tensor([[3.0, 10.0, 99.0]]), torch.tensor([[1, 1, 0]]))

    class TwoRanks:
        def __init__(self, other):
            self.other = other

        def reduce(self, t, reduction="sum"):
            x, m = self.other
            m = m.to(torch.float64)
            x = x.to(torch.float64)
            return t + torch.stack([m.sum(), (m * x).sum(), (m * x * x).sum()])

    mean, var = global_masked_moments(*rank0, accelerator=TwoRanks(rank1))
    assert float(mean) == pytest.approx(4.0) and float(var) == pytest.approx(50 / 3)
    white0 = masked_whiten(*rank0, accelerator=TwoRanks(rank1))
    expected = [(1 - 4) / math.sqrt(50 / 3 + 1e-8), (2 - 4) / math.sqrt(50 / 3 + 1e-8)]
    assert white0[0].tolist() == pytest.approx(expected)
    # one process: identical to the local formula
    x, m = rank1
    alone = type("One", (), {"reduce": lambda self, t, reduction: t})()
    assert masked_whiten(x, m)[0].tolist() == pytest.approx(masked_whiten(x, m, accelerator=alone)[0].tolist())
