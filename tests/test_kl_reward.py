"""KL in the reward reaches every estimator (issue: ``kl_mode: reward`` did nothing for the outcome
estimators, nor for verdict rows judged alone), the KL settings that cannot work are refused, and the
two-way verdicts' exact KL."""
from __future__ import annotations

import math

import pytest
import torch
from accelerate import Accelerator

from envs.protocol import judge_token_ids
from tests.tiny_models import tiny_llama, tiny_tokenizer
from tests.update_worker import default_shape_config, make_episodes
from training.algorithm import advantages as A
from training.algorithm.kl_estimators import kl_penalty
from training.config import ConfigError, PPOConfig, with_values
from training.models.policy_models import wrap_models
from training.ppo_loop.ppo_score import episode_kl_sums, episode_rewards, score
from training.ppo_loop.ppo_setup import Run


def test_episode_rewards_charge_each_episode_its_own_and_its_verdicts_kl():
    # rows: episode 0 (3 tokens), episode 1 (3 tokens), then a verdict row of episode 1 and one of episode 0
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.4, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    owner = torch.tensor([-1, -1, 1, 0])
    reward = torch.tensor([1.0, 0.5])
    torch.testing.assert_close(episode_kl_sums(kl, mask, owner), torch.tensor([0.3 + 2.0, 0.4 + 1.0]))
    token_rewards, scores = episode_rewards(reward, kl, mask, owner, kl_coef=0.5)
    torch.testing.assert_close(scores, torch.tensor([1.0 - 0.5 * 2.3, 0.5 - 0.5 * 1.4]))
    # own KL per token; the verdicts' KL and the reward on each episode's last model token
    expected = torch.tensor([[-0.05, 1.0 - 0.5 * 2.0 - 0.1, 0.0], [0.0, -0.2, 0.5 - 0.5 * 1.0]])
    torch.testing.assert_close(token_rewards, expected)
    torch.testing.assert_close(token_rewards.sum(dim=1), scores)  # the same total either way
    plain, plain_scores = episode_rewards(reward, None, mask, owner, kl_coef=0.5)
    torch.testing.assert_close(plain_scores, reward)
    torch.testing.assert_close(plain.sum(dim=1), reward)


def scored(cfg: PPOConfig) -> dict[str, torch.Tensor]:
    """The update's batch for the default shape's episodes (verdicts judged alone) under ``cfg``."""
    tok = tiny_tokenizer()
    models = wrap_models(tiny_llama(tok, seed=0), tok, cfg.model, cfg.algorithm, cfg.rollout)
    choice_ids = torch.tensor(judge_token_ids(tok))
    run = Run(model=cfg.model, rollout=cfg.rollout, optim=cfg.optim, algorithm=cfg.algorithm, run_settings=cfg.run,
              accelerator=Accelerator(cpu=True), out=None, retriever=None, examples=[],
              eval_examples=[], models=models, env_config=None, prompt_fn=None, local_questions=4,
              choice_ids=choice_ids, actor=models.actor, policy=models.actor)
    episodes = [e for group in make_episodes(tok, tuple(choice_ids.tolist())) for e in group]
    return score(run, episodes)[0]


@pytest.mark.parametrize("advantage", ["grpo", "rloo", "reinforce"])
def test_kl_in_the_reward_moves_the_outcome_estimators_advantages(advantage):
    base = with_values(default_shape_config(), {
        "algorithm.advantage": advantage, "algorithm.kl_mode": "reward", "algorithm.kl_estimator": "k1",
        "algorithm.kl_coef": 0.5, "algorithm.verdict_credit": 0.0, "model.cache_frozen_layers": False})
    with_kl, without = scored(base), scored(with_values(base, {"algorithm.kl_coef": 0.0}))
    E = int((with_kl["owner"] < 0).sum())
    mask = with_kl["model_mask"]
    kl = kl_penalty(with_kl["old_logp"], with_kl["ref_logp"], "k1") * with_kl["choice_mask"] * mask
    scores = with_kl["reward"][:E] - 0.5 * episode_kl_sums(kl, mask, with_kl["owner"])
    expected = A.compute_advantages(advantage, A.AdvantageBatch(model_mask=mask[:E], scores=scores,
                                                                group_ids=with_kl["group_id"][:E]))[0]
    torch.testing.assert_close(with_kl["advantages"][:E], expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(with_kl["advantages"][:E], without["advantages"][:E], atol=1e-4)


def test_kl_settings_that_cannot_work_are_refused():
    with pytest.raises(ConfigError, match="k1"):
        with_values(PPOConfig, {"algorithm.kl_mode": "loss", "algorithm.kl_estimator": "k1", "algorithm.kl_coef": 0.1})
    with_values(PPOConfig,
                {"algorithm.kl_mode": "loss", "algorithm.kl_estimator": "k1",
                 "algorithm.kl_coef": 0.0})  # no KL term at all: nothing to refuse
    with pytest.raises(ConfigError, match="exact"):
        with_values(PPOConfig,
                    {"algorithm.kl_mode": "loss", "algorithm.kl_estimator": "exact", "algorithm.kl_tokens": "all"})
    with pytest.raises(ConfigError, match="kl_coef"):
        with_values(PPOConfig, {"algorithm.kl_coef": -0.1})
    with_values(PPOConfig,
                {"algorithm.kl_mode": "loss", "algorithm.kl_estimator": "exact", "algorithm.kl_tokens": "verdicts"})


def test_exact_two_way_kl_is_the_kl_whichever_option_was_taken_and_its_gradient_is_the_kls():
    p, q = 0.7, 0.4
    exact = p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))
    taken = torch.tensor([math.log(p), math.log(1 - p)], requires_grad=True)  # "yes" taken, then "no" taken
    ref = torch.tensor([math.log(q), math.log(1 - q)])
    values = kl_penalty(taken, ref, "exact")
    torch.testing.assert_close(values, torch.tensor([exact, exact]))
    # d KL / d logit of yes = p(1 − p)·(log(p/q) − log((1 − p)/(1 − q))); through logp_yes = log σ(z): d logp/dz = 1 − p
    values[0].backward()
    slope = p * (1 - p) * (math.log(p / q) - math.log((1 - p) / (1 - q)))
    assert float(taken.grad[0]) * (1 - p) == pytest.approx(slope, rel=1e-4)
    assert float(kl_penalty(torch.zeros(1), torch.zeros(1), "exact")) == 0.0  # off the choices: 0, finite
