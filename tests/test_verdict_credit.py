"""Per-verdict credit in the judgement form: each yes/no verdict's advantage also gets its own
candidate's selection term, as the exact advantage of a two-way choice (PPOConfig.verdict_credit)."""
from __future__ import annotations

import functools
import math

import pytest
import torch
from test_rollout import script_lm, tokenizer  # noqa: F401 (fixtures)

from envs.config import EnvConfig
from envs.protocol import judge_token_ids
from envs.rewards import RewardConfig, verdict_reward_gap
from envs.vector_env import SearchVectorEnv
from inference.backends.hf import HFBackend
from methods.seeds import SeedsR1
from training.algorithm.advantages import centred_reward_gaps, two_choice_advantages
from training.config import ConfigError, PPOConfig, with_values
from training.ppo_loop.ppo_batch import episodes_to_batch
from training.rollouts.rollout import RolloutConfig, collect_rollouts

REWARD = RewardConfig(positive_opened_bonus=0.1, negative_opened_penalty=0.05, missed_positive_penalty=0.05)


@pytest.mark.parametrize(("opened", "positive", "correct", "gap"), [
    (True, True, False, 0.1 + 0.05),  # open a positive: +alpha, instead of the missed-positive −gamma
    (True, True, True, 0.1),  # a right answer pays no miss penalty, so skipping it costs 0
    (False, True, False, -0.15),
    (True, False, False, -0.05),  # open a negative: −beta, instead of 0
    (False, False, True, 0.05),
])
def test_verdict_reward_gap_is_the_candidates_own_term_under_both_verdicts(opened, positive, correct, gap):
    assert verdict_reward_gap(opened, positive, correct, REWARD) == pytest.approx(gap)


def test_two_choice_advantage_is_exact_and_unit_rms():
    p_chosen = torch.tensor([[0.9, 0.5, 0.2, 0.7]])  # (1, 4)
    gap = torch.tensor([[0.15, -0.05, 0.15, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last position is no choice
    out = two_choice_advantages(p_chosen.log(), gap, mask)
    raw = torch.tensor([0.1 * 0.15, 0.5 * -0.05, 0.8 * 0.15])  # (1 − π(a))·gap
    assert torch.allclose(out[0, :3], raw / raw.pow(2).mean().sqrt(), atol=1e-6)
    assert out[0, 3] == 0.0
    # the same as r(a) − E_π[r] written out, for the first choice (r(a) = gap, r(other) = 0)
    assert float(out[0, 0]) * float(raw.pow(2).mean().sqrt()) == pytest.approx(0.15 - 0.9 * 0.15, abs=1e-6)
    assert torch.equal(two_choice_advantages(p_chosen.log(), torch.zeros_like(gap), mask), torch.zeros_like(gap))


def test_centred_gaps_take_the_weighted_price_of_opening_out():
    p_chosen = torch.tensor([[0.9, 0.5, 0.2, 0.7, 0.6]])  # (1, 5)
    gap = torch.tensor([[0.25, -0.15, 0.15, -0.25, 9.0]])
    opened = torch.tensor([[1, 1, 0, 0, 1]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    out, price = centred_reward_gaps(p_chosen.log(), gap, opened, mask)
    w = p_chosen[0, :4] * (1 - p_chosen[0, :4])
    g = torch.tensor([0.25, -0.15, -0.15, 0.25])  # r(open) − r(skip) of each candidate
    assert price == pytest.approx(float((w * g).sum() / w.sum()), abs=1e-6)
    assert torch.allclose(out[0, :4], torch.tensor([0.25 - price, -0.15 - price, 0.15 + price, -0.25 + price]))
    assert out[0, 4] == 0.0
    assert float((w * (g - price)).sum()) == pytest.approx(0.0, abs=1e-6)  # the open logits' pushes sum to zero
    none, zero = centred_reward_gaps(p_chosen.log(), gap, opened, torch.zeros_like(mask))
    assert zero == 0.0 and torch.equal(none, torch.zeros_like(gap))


def _shared_bias_gradients(centred: bool, positives_share: float, discriminate: bool) -> torch.Tensor:
    """One policy-gradient step of the verdict credit alone on a policy whose open logit is one bias
    (or, with ``discriminate``, one bias for positives and one for negatives), from 4,000 sampled
    verdicts of a 0.55 open rate; positives pay +0.25 opened, negatives −0.15 -> d(loss)/d(biases)."""
    generator = torch.Generator().manual_seed(0)
    n = 4000
    positive = torch.rand(n, generator=generator) < positives_share
    bias = torch.zeros(2, requires_grad=True)
    start = torch.logit(torch.tensor(0.55))
    z = start + (bias[positive.long()] if discriminate else bias[0].expand(n))
    opened = torch.rand(n, generator=generator) < torch.sigmoid(start)
    logp = torch.where(opened, torch.nn.functional.logsigmoid(z), torch.nn.functional.logsigmoid(-z))
    open_gap = torch.where(positive, torch.tensor(0.25), torch.tensor(-0.15))
    gap = torch.where(opened, open_gap, -open_gap).unsqueeze(0)
    mask = torch.ones_like(gap)
    old = logp.detach().unsqueeze(0)
    if centred:
        gap, _ = centred_reward_gaps(old, gap, opened.unsqueeze(0), mask)
    advantages = two_choice_advantages(old, gap, mask)
    (-(advantages[0] * logp).mean()).backward()
    return bias.grad


def test_centred_credit_holds_the_open_rate_and_still_ranks():
    """15% positives: to a policy that cannot tell them apart, the exact credit says "open less" (the
    loss's gradient on the shared bias is positive: a descent step lowers it); centred, the push is
    about nil. With a bias per class, the centred credit still raises positives and lowers negatives."""
    exact = _shared_bias_gradients(False, 0.15, discriminate=False)[0]
    centred = _shared_bias_gradients(True, 0.15, discriminate=False)[0]
    assert exact > 0.05  # descent lowers the open logit
    assert abs(centred) < 0.1 * exact
    per_class = _shared_bias_gradients(True, 0.15, discriminate=True)
    assert per_class[1] < -0.01 and per_class[0] > 0.01  # positives' bias up, negatives' down (descent)


def test_rollout_records_each_verdicts_gap_at_its_token(script_lm, tokenizer, retriever, examples):  # noqa: F811
    env_config = EnvConfig(expand_form="judge", max_actions=4, max_searches=1, shuffle_candidates=True)
    venv = SearchVectorEnv(retriever, num_envs=4, config=env_config, tokenizer=tokenizer)
    config = RolloutConfig(max_turn_tokens=8, max_context_tokens=2048, samples_per_question=4, seed=5)
    prompt = functools.partial(SeedsR1.prompt, env=env_config)
    episodes = collect_rollouts(HFBackend(script_lm, tokenizer), venv, examples[:3], config, prompt)
    yes = judge_token_ids(tokenizer)[0]
    kinds = set()
    for episode in episodes:
        search = episode.info["searches"][0]
        correct = episode.info["metrics"]["em"] == 1.0
        positions = [i for i, c in enumerate(episode.choice_mask) if c]
        assert len(positions) == len(search["positive"]) > 0
        assert [i for i, g in enumerate(episode.choice_reward_gap) if g != 0.0] == positions
        for number, (position, positive) in enumerate(zip(positions, search["positive"]), start=1):
            opened = episode.token_ids[position] == yes
            assert opened == (number in search["expanded"])
            expected = verdict_reward_gap(opened, positive, correct, venv.config.reward)
            assert episode.choice_reward_gap[position] == pytest.approx(expected)
            kinds.add((opened, positive))
    assert len(kinds) >= 2  # the check saw verdicts of different kinds
    batch = episodes_to_batch(episodes, tokenizer.pad_token_id, "cpu")
    assert torch.equal(batch["choice_reward_gap"] != 0, batch["choice_mask"].bool())


def test_verdict_credit_needs_constrained_verdicts():
    with pytest.raises(ConfigError, match="constrain_verdicts"):
        with_values(PPOConfig, {"algorithm.verdict_credit": 1.0, "rollout.constrain_verdicts": False})
    with pytest.raises(ConfigError):
        with_values(PPOConfig, {"algorithm.verdict_credit": -1.0})
    assert math.isclose(with_values(PPOConfig, {"algorithm.verdict_credit": 0.5}).algorithm.verdict_credit, 0.5)
    with pytest.raises(ConfigError, match="verdict_episode_credit"):
        with_values(PPOConfig, {"algorithm.verdict_episode_credit": -0.5})
    with pytest.raises(ConfigError, match="no advantage"):
        with_values(PPOConfig,
                    {"algorithm.verdict_episode_credit": 0.0})  # and verdict_credit 0: the verdicts would learn nothing
    assert with_values(PPOConfig,
                       {"algorithm.verdict_episode_credit": 0.0,
                        "algorithm.verdict_credit": 2.0}).algorithm.verdict_episode_credit == 0.0
    with pytest.raises(ConfigError, match="verdict_credit_centred"):
        with_values(PPOConfig, {"algorithm.verdict_credit_centred": True})  # and verdict_credit 0: nothing to centre
    assert with_values(PPOConfig,
                       {"algorithm.verdict_credit": 1.0,
                        "algorithm.verdict_credit_centred": True}).algorithm.verdict_credit_centred


def test_the_trainer_adds_the_credit_to_the_verdict_tokens_only(script_lm, tokenizer, retriever, examples,  # noqa: F811
                                                                 tmp_path):
    """One update with and without verdict_credit from the same rollouts: the policy loss and the
    actor's gradient differ in the judgement form, and are identical where there are no verdicts
    (list form). (The parameters are not compared: Adam's first step is ±lr whatever the gradient.)"""
    import copy

    from training.config import LoraSettings
    from training.models.policy_models import wrap_models
    from training.ppo import train

    undecided = copy.deepcopy(script_lm)  # the scripted model, with small random yes/no rows: both get drawn
    with torch.no_grad():
        rows = list(judge_token_ids(tokenizer))
        undecided.lm_head.weight[rows] = 0.05 * torch.randn(len(rows), undecided.lm_head.weight.shape[1],
                                                             generator=torch.Generator().manual_seed(0))

    def update(expand_form: str, credit: float, out: str, centred: bool = False) -> dict:
        cfg = with_values(PPOConfig,
                          {"run.output_dir": str(tmp_path / out), "optim.updates": 1,
                           "rollout.questions_per_update": 2, "rollout.samples_per_question": 4,
                           "optim.micro_batch_size": 4, "rollout.max_turn_tokens": 8,
                           "rollout.max_context_tokens": 1024, "algorithm.advantage": "grpo",
                           "env": {"max_actions": 4, "max_searches": 1, "expand_form": expand_form},
                           "evaluation.eval_questions": 0, "optim.lr_actor": 1e-2,
                           "model.lora": LoraSettings(enabled=False), "run.export": False, "warm_start.enabled": False,
                           "run.log_samples": 0, "rollout.temperature": 1.0, "algorithm.kl_coef": 0.0,
                           "algorithm.verdict_credit": credit, "run.seed": 3,
                           "algorithm.verdict_credit_centred": centred})
        torch.manual_seed(0)  # the same LoRA initialisation in every run
        models = wrap_models(copy.deepcopy(undecided), tokenizer, cfg.model, cfg.algorithm, cfg.rollout)
        stats = train(cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)["history"][0]
        return {k: stats[k] for k in ("policy_loss", "grad_norm_actor", "reward_mean", "verdict_price")}

    without, credited = update("judge", 0.0, "j0"), update("judge", 1.0, "j1")
    assert without["reward_mean"] == credited["reward_mean"]  # the same rollouts
    assert abs(without["policy_loss"] - credited["policy_loss"]) > 1e-4
    assert abs(without["grad_norm_actor"] - credited["grad_norm_actor"]) > 1e-4
    assert math.isnan(credited["verdict_price"])  # logged only where the credit is centred
    centred = update("judge", 1.0, "jc", centred=True)
    assert centred["reward_mean"] == credited["reward_mean"] and math.isfinite(centred["verdict_price"])
    assert centred["verdict_price"] != 0.0 and abs(centred["policy_loss"] - credited["policy_loss"]) > 1e-6
    plain, listed = update("list", 0.0, "l0"), update("list", 1.0, "l1")
    assert {k: v for k, v in plain.items() if k != "verdict_price"} == {
        k: v for k, v in listed.items() if k != "verdict_price"}
