"""The level-free verdict KL (PPOConfig.algorithm.kl_verdict_level: free): the reference's open logits
shifted by the batch's mean shift of the policy from them, so the KL holds the verdicts' spread and
not the yes level they share."""
from __future__ import annotations

import math

import pytest
import torch
from test_rollout import script_lm, tokenizer  # noqa: F401 (fixtures)

from training.algorithm.kl_estimators import kl_two_way_exact, level_free_reference, open_logits
from training.config import ConfigError, PPOConfig, with_values


def _chosen_logp(z: torch.Tensor, opened: torch.Tensor) -> torch.Tensor:
    """log π(option taken) of two-way verdicts with open logits z. z, opened: (1, N) -> (1, N)."""
    return torch.where(opened, torch.nn.functional.logsigmoid(z), torch.nn.functional.logsigmoid(-z))


def test_open_logits_read_the_logit_back_from_either_option():
    z = torch.tensor([[-2.0, -0.3, 0.0, 1.5, 3.0]])
    for opened in (torch.ones_like(z, dtype=torch.bool), torch.zeros_like(z, dtype=torch.bool)):
        assert torch.allclose(open_logits(_chosen_logp(z, opened), opened), z, atol=1e-5)


def test_the_reference_moves_by_the_batch_mean_shift_and_keeps_its_spread():
    z_ref = torch.tensor([[-1.0, 0.2, 0.8, 0.0, 5.0]])
    z_old = z_ref + torch.tensor([[-0.5, -1.0, -1.5, 0.0, 9.0]])  # the last position is no verdict
    opened = torch.tensor([[True, False, True, False, True]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]])
    ref = _chosen_logp(z_ref, opened)
    shifted, shift = level_free_reference(_chosen_logp(z_old, opened), ref, opened, mask)
    assert shift == pytest.approx(-1.0, abs=1e-5)  # mean of −0.5, −1.0, −1.5 over the three verdicts
    z_new = open_logits(shifted, opened)
    assert torch.allclose(z_new[0, :3], z_ref[0, :3] - 1.0, atol=1e-5)
    assert torch.equal(shifted[0, 3:], ref[0, 3:])  # off the verdicts the reference is untouched
    # a policy that only moved its shared level has no KL to the shifted reference, and some to the warm start
    moved = _chosen_logp(z_ref - 1.0, opened)
    assert float((kl_two_way_exact(moved, shifted) * mask).sum()) == pytest.approx(0.0, abs=1e-6)
    assert float((kl_two_way_exact(moved, ref) * mask).sum()) > 0.05


def test_a_batch_without_verdicts_keeps_its_reference():
    logp = torch.log(torch.tensor([[0.3, 0.6]]))
    shifted, shift = level_free_reference(logp, logp - 0.1, torch.ones_like(logp, dtype=torch.bool),
                                          torch.zeros_like(logp))
    assert shift == 0.0 and torch.equal(shifted, logp - 0.1)


def test_a_free_level_needs_the_exact_credit_and_constrained_verdicts():
    with pytest.raises(ConfigError, match="verdict_credit_centred"):
        with_values(PPOConfig, {"algorithm.kl_verdict_level": "free", "algorithm.verdict_credit": 1.0,
                                "algorithm.verdict_credit_centred": True})
    with pytest.raises(ConfigError, match="constrain_verdicts"):
        with_values(PPOConfig, {"algorithm.kl_verdict_level": "free", "rollout.constrain_verdicts": False})
    with pytest.raises(ConfigError, match="kl_verdict_level"):
        with_values(PPOConfig, {"algorithm.kl_verdict_level": "floating"})
    assert with_values(PPOConfig, {"algorithm.kl_verdict_level": "free"}).algorithm.kl_verdict_level == "free"
    held = with_values(PPOConfig, {"algorithm.kl_verdict_level": "free", "algorithm.verdict_credit": 1.0,
                                   "algorithm.verdict_credit_centred": True, "algorithm.kl_coef": 1.0,
                                   "algorithm.verdict_level_coef": 2.0, "algorithm.verdict_level_target": 0.0})
    assert held.algorithm.verdict_level_target == 0.0  # the level held by its own term: free and centred agree


def test_the_trainer_anchors_the_verdicts_to_the_shifted_reference(script_lm, tokenizer, retriever, examples,  # noqa: F811
                                                                   tmp_path):
    """One judgement-form update from the same rollouts with the verdicts' reference anchored and free:
    the free run logs the shift it applied and its KL holds no level, and the shared open logit it
    logs is the sampled verdicts' (the same in both)."""
    import copy
    import math

    from envs.protocol import judge_token_ids
    from training.config import LoraSettings
    from training.models.policy_models import wrap_models
    from training.ppo import train

    undecided = copy.deepcopy(script_lm)  # small random yes/no rows: both verdicts get drawn
    with torch.no_grad():
        rows = list(judge_token_ids(tokenizer))
        undecided.lm_head.weight[rows] = 0.05 * torch.randn(len(rows), undecided.lm_head.weight.shape[1],
                                                             generator=torch.Generator().manual_seed(0))

    def update(level: str, out: str) -> dict:
        cfg = with_values(PPOConfig,
                          {"run.output_dir": str(tmp_path / out), "optim.updates": 2,
                           "rollout.questions_per_update": 2, "rollout.samples_per_question": 4,
                           "optim.micro_batch_size": 4, "rollout.max_turn_tokens": 8,
                           "rollout.max_context_tokens": 1024, "algorithm.advantage": "grpo",
                           "env": {"max_actions": 4, "max_searches": 1, "expand_form": "judge"},
                           "evaluation.eval_questions": 0, "optim.lr_actor": 5e-2,
                           "model.lora": LoraSettings(enabled=False), "run.export": False, "warm_start.enabled": False,
                           "run.log_samples": 0, "rollout.temperature": 1.0, "algorithm.kl_coef": 1.0,
                           "algorithm.kl_mode": "loss", "algorithm.kl_estimator": "exact",
                           "algorithm.kl_tokens": "verdicts", "algorithm.verdict_credit": 2.0,
                           "algorithm.kl_verdict_level": level, "run.seed": 3})
        torch.manual_seed(0)
        models = wrap_models(copy.deepcopy(undecided), tokenizer, cfg.model, cfg.algorithm, cfg.rollout)
        return train(cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)["history"]

    anchored, free = update("anchored", "a"), update("free", "f")
    assert anchored[0]["reward_mean"] == free[0]["reward_mean"]  # the same first rollouts
    assert anchored[0]["verdict_open_logit"] == pytest.approx(free[0]["verdict_open_logit"], abs=1e-6)
    for a, f in zip(anchored, free):  # the level's shift from the warm start is logged either way
        assert a["verdict_level_shift"] == pytest.approx(f["verdict_level_shift"], abs=1e-6)
    assert free[0]["verdict_level_shift"] == pytest.approx(0.0, abs=1e-5)  # the first update's policy is the reference
    assert math.isfinite(free[1]["verdict_level_shift"]) and free[1]["verdict_level_shift"] != 0.0
    # the first update moved the shared level (lr 5e-2): the same second rollouts, all of their KL to the warm
    # start is level, and none of it is left against the shifted reference
    assert anchored[1]["reward_mean"] == free[1]["reward_mean"]
    level_moved = free[1]["verdict_open_logit"] - free[0]["verdict_open_logit"]
    assert free[1]["verdict_level_shift"] == pytest.approx(level_moved, abs=0.5)
    assert anchored[1]["kl"] > 0.1 and abs(free[1]["kl"]) < 0.01



def _held_level_run(gain: float, steps: int = 60, coef: float = 0.0) -> tuple[float, float]:
    """Policy-gradient steps on verdicts whose open logit is z = bias + spread·y (y = +1 for the 17%
    positives, −1 for negatives), from the warm start's z = 0.4 for all, with the centred verdict credit
    (positives pay +0.30 opened, negatives −0.05) and an outside push toward skipping of 0.5 on every
    verdict (what an episode's advantage can add); the level held through the advantages (``gain``) or
    the loss (``coef``) -> (the batch's mean open logit, spread) at the end."""
    import types

    from training.algorithm.kl_estimators import level_hold_terms, verdict_level_shift
    from training.ppo_loop.ppo_score import verdict_advantages

    generator = torch.Generator().manual_seed(0)
    algo = types.SimpleNamespace(verdict_credit=2.0, verdict_credit_centred=True, verdict_level_gain=gain)
    bias, spread = torch.tensor(0.4, requires_grad=True), torch.tensor(0.0, requires_grad=True)
    optimizer = torch.optim.SGD([bias, spread], lr=0.5)
    y = (torch.rand(1, 600, generator=generator) < 0.17).float() * 2 - 1
    mask = torch.ones_like(y)
    for _ in range(steps):
        z = bias + spread * y
        opened = torch.rand(z.shape, generator=generator) < torch.sigmoid(z.detach())
        s = opened.float() * 2 - 1
        logp = torch.nn.functional.logsigmoid(s * z)
        ref_logp = torch.nn.functional.logsigmoid(s * torch.full_like(z, 0.4))
        shift = verdict_level_shift(logp.detach(), ref_logp, opened, mask)
        gap = s * torch.where(y > 0, 0.30, -0.05)  # r(taken) − r(other)
        advantages, _ = verdict_advantages(algo, logp.detach(), gap, opened, mask, shift, None)
        loss = -((advantages - 0.5 * s) * logp).mean() + coef * level_hold_terms(logp, ref_logp, opened, mask).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return float((bias + spread * y).mean()), float(spread)


def test_the_level_hold_keeps_the_shared_yes_level_while_the_verdicts_learn_to_rank():
    drifted_level, drifted_spread = _held_level_run(0.0)
    held_level, held_spread = _held_level_run(1.0)
    assert drifted_level < -2.0  # the outside push took the shared level far below the warm start's 0.4
    assert abs(held_level - 0.4) < 0.5  # the hold kept it near
    assert drifted_spread > 1.0 and held_spread > 1.0  # and the ranking was learnt either way
    loss_held_level, loss_held_spread = _held_level_run(0.0, coef=2.0)  # the same hold as a loss term
    assert abs(loss_held_level - 0.4) < 0.5 and loss_held_spread > 1.0


def test_the_level_hold_terms_have_the_gradient_of_the_squared_mean_shift():
    from training.algorithm.kl_estimators import level_hold_terms

    z_ref = torch.tensor([[0.4, -0.2, 1.0, 0.3, 7.0]])
    z = (z_ref + torch.tensor([[0.5, -0.1, 0.9, 0.2, 3.0]])).requires_grad_(True)  # the last: no verdict
    opened = torch.tensor([[True, False, False, True, True]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    terms = level_hold_terms(_chosen_logp(z, opened), _chosen_logp(z_ref, opened), opened, mask)
    (grad,) = torch.autograd.grad(terms.sum(), z)
    d = 0.375  # the mean shift over the four verdicts
    assert torch.allclose(grad, torch.tensor([[d, d, d, d, 0.0]]), atol=1e-4)  # ∂(½·4·d²)/∂z_i = d
    assert terms[0, 4] == 0.0
    to_cut = level_hold_terms(_chosen_logp(z, opened), _chosen_logp(z_ref, opened), opened, mask, target=0.0)
    (cut_grad,) = torch.autograd.grad(to_cut.sum(), z)
    level = float((z_ref[0, :4] + torch.tensor([0.5, -0.1, 0.9, 0.2])).mean())  # 0.75: held at 0, d = 0.75
    assert torch.allclose(cut_grad, torch.tensor([[level] * 4 + [0.0]]), atol=1e-4)
    spread_only = z_ref + torch.tensor([[0.5, -0.5, 0.2, -0.2, 0.0]])  # moved, but not the mean
    flat = level_hold_terms(_chosen_logp(spread_only, opened), _chosen_logp(z_ref, opened), opened, mask)
    assert float(flat.abs().sum()) == pytest.approx(0.0, abs=1e-5)
    with pytest.raises(ConfigError, match="verdict_level_coef"):
        with_values(PPOConfig, {"algorithm.verdict_level_coef": 1.0, "algorithm.kl_coef": 0.0})
    with pytest.raises(ConfigError, match="verdict_level_coef"):
        with_values(PPOConfig, {"algorithm.verdict_level_coef": 1.0, "rollout.constrain_verdicts": False})
    with pytest.raises(ConfigError, match="verdict_level_target"):  # a target without a hold would do nothing
        with_values(PPOConfig, {"algorithm.verdict_level_target": 0.0})
    assert with_values(PPOConfig, {"algorithm.verdict_level_target": 0.0, "algorithm.verdict_level_coef": 1.0})


def test_the_level_hold_prices_opening_by_the_shift():
    import types

    from training.algorithm.advantages import priced_gaps, two_choice_advantages
    from training.ppo_loop.ppo_score import verdict_advantages

    logp = torch.log(torch.tensor([[0.7, 0.4, 0.6, 0.5]]))
    opened = torch.tensor([[True, False, True, False]])
    gap = torch.tensor([[0.30, 0.05, -0.05, -0.30]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert torch.allclose(priced_gaps(gap, opened, mask, 0.1), torch.tensor([[0.20, 0.15, -0.15, 0.0]]))
    algo = types.SimpleNamespace(verdict_credit=2.0, verdict_credit_centred=False, verdict_level_gain=0.25)
    held, price = verdict_advantages(algo, logp, gap, opened, mask, 0.8, None)
    assert price == pytest.approx(0.2)  # 0.25 reward per logit × a level 0.8 above the warm start's
    assert torch.allclose(held, 2.0 * two_choice_advantages(logp, priced_gaps(gap, opened, mask, 0.2), mask))
    algo.verdict_level_gain = 0.0
    plain, none = verdict_advantages(algo, logp, gap, opened, mask, 0.8, None)
    assert math.isnan(none) and torch.allclose(plain, 2.0 * two_choice_advantages(logp, gap, mask))
    with pytest.raises(ConfigError, match="verdict_level_gain"):
        with_values(PPOConfig, {"algorithm.verdict_level_gain": 0.5, "algorithm.verdict_credit": 0.0})
    with pytest.raises(ConfigError, match="verdict_level_gain"):
        with_values(PPOConfig, {"algorithm.verdict_level_gain": 0.5, "algorithm.verdict_credit": 1.0,
                                "algorithm.kl_coef": 0.0})
    with pytest.raises(ConfigError, match="verdict_level_gain"):
        with_values(PPOConfig, {"algorithm.verdict_level_gain": -0.1})


def test_the_objective_adds_the_level_hold_at_the_verdicts():
    """actor_objective with verdict_level_coef c: the loss gains c·Σ level_hold_terms / tokens (token_mean),
    and its gradient pulls every verdict's open logit the same way."""
    from training.algorithm.kl_estimators import level_hold_terms
    from training.ppo import actor_objective

    opened = torch.tensor([[0.0, 1.0, 0.0, 1.0, 0.0]])
    choice = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0]])
    ref = _chosen_logp(torch.tensor([[0.0, 0.2, 0.2, 0.2, 0.0]]), opened.bool())
    logp = _chosen_logp(torch.tensor([[0.0, 1.2, 0.8, 1.0, 0.0]]), opened.bool())  # the level up by 0.8
    mb = {"model_mask": torch.ones(1, 5), "old_logp": logp.clone(), "advantages": torch.zeros(1, 5),
          "ref_logp": ref, "choice_mask": choice, "verdict_opened": opened}

    def objective(coef: float) -> tuple[float, torch.Tensor]:
        algo = with_values(PPOConfig, {"algorithm.verdict_level_coef": coef, "algorithm.kl_coef": 1e-9,
                                       "algorithm.kl_mode": "loss", "algorithm.kl_estimator": "k3",
                                       "algorithm.kl_tokens": "verdicts", "algorithm.loss_agg": "token_mean"}).algorithm
        x = logp.clone().requires_grad_(True)
        loss = actor_objective(algo, x, torch.zeros(1, 5), mb, torch.tensor(5.0), torch.tensor(1.0),
                               max_context_tokens=8)[0]
        return float(loss), torch.autograd.grad(loss, x)[0]

    (plain, plain_grad), (held, held_grad) = objective(0.0), objective(3.0)
    terms = level_hold_terms(logp, ref, opened, choice)
    assert held - plain == pytest.approx(3.0 * float(terms.sum()) / 5.0, rel=1e-4)
    pull = held_grad - plain_grad  # d loss / d log π(taken): opened verdicts down, skipped ones up (less yes)
    assert float(pull[0, 1]) > 0 and float(pull[0, 3]) > 0 and float(pull[0, 2]) < 0
    assert float(pull[0, 0]) == 0.0 and float(pull[0, 4]) == 0.0



@pytest.mark.parametrize("setting", [{"algorithm.verdict_level_coef": 1.0},
                                     {"algorithm.verdict_level_gain": 0.5, "algorithm.verdict_credit": 1.0},
                                     {"algorithm.verdict_credit_centred": True, "algorithm.verdict_credit": 1.0}])
def test_the_open_logit_options_need_the_judgement_form(setting, tokenizer):  # noqa: F811
    from envs.config import EnvConfig
    from training.ppo_loop.ppo_setup import verdict_choice_ids

    cfg = with_values(PPOConfig, {"algorithm.kl_coef": 1.0, **setting})
    with pytest.raises(ValueError, match="judgement form"):
        verdict_choice_ids(cfg.rollout, cfg.algorithm, EnvConfig(expand_form="list"), tokenizer, "cpu")
    assert verdict_choice_ids(cfg.rollout, cfg.algorithm, EnvConfig(expand_form="judge"), tokenizer, "cpu") is not None
