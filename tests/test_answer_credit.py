"""The answer turn's own credit (PPOConfig.answer_credit "answer", training/algorithm/answer_credit.py): the
answering turn's tokens take the advantage of the reward's answer term alone; every other token
keeps the episode's."""
from __future__ import annotations

import copy
import functools
from types import SimpleNamespace

import pytest
import torch
from test_rollout import script_lm, tokenizer  # noqa: F401 (fixtures)

from envs.config import EnvConfig
from envs.vector_env import SearchVectorEnv
from inference.backends.hf import HFBackend
from methods.seeds import SeedsR1
from training import ppo
from training.algorithm.advantages import grpo_advantages
from training.algorithm.answer_credit import answer_term, answer_turn_advantages, answer_turn_mask
from training.config import ConfigError, LoraSettings, PPOConfig, with_values
from training.models.policy_models import wrap_models
from training.ppo_loop import ppo_score
from training.ppo_loop.ppo_batch import episodes_to_batch
from training.rollouts.rollout import RolloutConfig, collect_rollouts


def test_the_mask_marks_the_last_model_turn_of_an_answered_episode():
    #           prompt | turn 0 (model) | obs | turn 1 (model) | obs | turn 2 (model)
    turns = [-1, -1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    mask = [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1]
    answered = SimpleNamespace(loss_mask=mask, turn_ids=turns, finish_reason="answer")
    assert answer_turn_mask(answered) == [0] * 10 + [1, 1]
    # the forced "<answer>" written for the model is in the last turn but no model token: not marked
    forced = SimpleNamespace(loss_mask=mask[:10] + [0, 1], turn_ids=turns, finish_reason="answer")
    assert answer_turn_mask(forced) == [0] * 11 + [1]
    for reason in ("action_limit", "context_limit", "error"):  # no answer: nothing to credit
        assert answer_turn_mask(SimpleNamespace(loss_mask=mask, turn_ids=turns, finish_reason=reason)) == [0] * 12
    verdict_row = SimpleNamespace(loss_mask=[0, 0, 1])  # no turns, no finish reason
    assert answer_turn_mask(verdict_row) == [0, 0, 0]
    assert answer_term(SimpleNamespace(info={"reward": {"answer": 1.0, "selection": 0.3}})) == 1.0
    assert answer_term(SimpleNamespace(info={})) == 0.0 and answer_term(verdict_row) == 0.0


def test_answer_tokens_take_the_answer_terms_group_advantage_and_nothing_else_moves():
    totals = torch.tensor([1.3, 0.2, 0.5, 0.1])  # two questions, two samples each
    groups = torch.tensor([0, 0, 1, 1])
    model = torch.tensor([[1.0, 1, 0, 1, 1, 0]] * 4)
    answer_mask = torch.tensor([[0.0, 0, 0, 1, 1, 0]] * 4)
    episode_adv, _ = grpo_advantages(totals, groups, model)
    answers = torch.tensor([1.0, 0.0, 1.0, 1.0])  # question 0: one right, one wrong; question 1: both right
    out = answer_turn_advantages(episode_adv, answer_mask, answers, groups, "grpo")
    off = answer_mask == 0
    assert torch.equal(out[off], episode_adv.to(out.dtype)[off])  # query and padding untouched
    expected, _ = grpo_advantages(answers, groups, answer_mask)
    assert torch.allclose(out[answer_mask > 0], expected.to(out.dtype)[answer_mask > 0])
    assert out[0, 3] > 0 > out[1, 3] and float(out[0, 3]) == pytest.approx(2 ** -0.5, abs=1e-4)
    assert torch.all(out[2:, 3:5] == 0)  # both answers right: the answer turn learns nothing here
    with pytest.raises(ValueError, match="outcome estimator"):
        answer_turn_advantages(episode_adv, answer_mask, answers, groups, "gae")


def test_the_setting_is_checked_when_the_config_loads():
    assert with_values(PPOConfig,
                       {"algorithm.advantage": "grpo",
                        "algorithm.answer_credit": "answer"}).algorithm.answer_credit == "answer"
    assert PPOConfig().algorithm.answer_credit == "episode"
    with pytest.raises(ConfigError, match="outcome estimator"):
        with_values(PPOConfig, {"algorithm.advantage": "gae", "algorithm.answer_credit": "answer"})
    with pytest.raises(ConfigError, match="answer_credit"):
        with_values(PPOConfig, {"algorithm.advantage": "grpo", "algorithm.answer_credit": "verdicts"})


def test_rollout_batches_mark_the_answer_tokens_and_carry_the_answer_term(script_lm, tokenizer, retriever,  # noqa: F811
                                                                         examples):
    env_config = EnvConfig(max_actions=3, max_searches=1)
    venv = SearchVectorEnv(retriever, num_envs=4, config=env_config, tokenizer=tokenizer)
    config = RolloutConfig(max_turn_tokens=8, max_context_tokens=2048, samples_per_question=2, seed=3)
    episodes = collect_rollouts(HFBackend(script_lm, tokenizer), venv, examples, config,
                                functools.partial(SeedsR1.prompt, env=env_config))
    batch = episodes_to_batch(episodes, tokenizer.pad_token_id, "cpu")
    assert {e.finish_reason for e in episodes} == {"answer"}
    for row, episode in enumerate(episodes):
        marked = batch["answer_mask"][row].nonzero().squeeze(-1) + 1  # position t is about token t + 1
        assert bool((batch["model_mask"][row][marked - 1] == 1).all())  # model tokens only
        text = tokenizer.decode([episode.token_ids[i] for i in marked.tolist()])
        assert "Paris" in text and "<search>" not in text and "<expand>" not in text
        assert float(batch["answer_reward"][row]) == episode.info["reward"]["answer"]
    assert {float(r) for r in batch["answer_reward"]} == {0.0, 1.0}  # Paris is right for q0 only


def test_the_trainer_credits_answer_turns_by_the_answer_term(tmp_path, retriever, examples, monkeypatch,  # noqa: F811
                                                           script_lm, tokenizer):  # noqa: F811
    """The scripted policy answers every episode (search, expand, "Paris"); the answer terms are set
    to one right and one wrong answer per question inside the trainer's call, so the answer turns
    must take the answer term's own group advantage (±1/√2) and every other token keep its own."""
    seen = []

    def recording(algorithm, advantages, batch, mask, episodes):
        batch["answer_reward"][:episodes] = (torch.arange(episodes) % 2).to(batch["answer_reward"].dtype)
        out = real_with_answer_credit(algorithm, advantages, batch, mask, episodes)
        seen.append((advantages.clone(), out, batch["answer_mask"] * mask, batch, episodes))
        return out

    real_with_answer_credit = ppo_score.with_answer_credit
    monkeypatch.setattr(ppo_score, "with_answer_credit", recording)
    cfg = with_values(PPOConfig,
                      {"run.output_dir": str(tmp_path), "optim.updates": 2, "rollout.questions_per_update": 2,
                       "rollout.samples_per_question": 2, "optim.micro_batch_size": 2, "optim.mini_batches": 2,
                       "rollout.max_turn_tokens": 8, "rollout.max_context_tokens": 2048,
                       "env": {"max_actions": 3, "max_searches": 1}, "evaluation.eval_questions": 0,
                       "optim.lr_actor": 1e-2, "model.lora": LoraSettings(r=4, alpha=8), "run.export": False,
                       "warm_start.enabled": False, "run.log_samples": 0, "algorithm.advantage": "grpo",
                       "algorithm.answer_credit": "answer", "rollout.temperature": 1.0,
                       "model.cache_frozen_layers": False})
    result = ppo.train(cfg, retriever=retriever, examples=examples, eval_examples=[],
                       models=wrap_models(copy.deepcopy(script_lm), tokenizer, cfg.model, cfg.algorithm, cfg.rollout))
    assert len(seen) == 2 and all(torch.isfinite(torch.tensor(h["policy_loss"])) for h in result["history"])
    for before, after, answer_mask, batch, E in seen:
        answered = answer_mask[:E] > 0
        assert bool(answered.any(dim=1).all())  # every episode answered: its answer turn is marked
        expected, _ = grpo_advantages(batch["answer_reward"][:E], batch["group_id"][:E], answer_mask[:E])
        assert torch.allclose(after[:E][answered], expected.to(after.dtype)[answered])
        assert float(after[:E][answered].abs().min()) == pytest.approx(2 ** -0.5, abs=1e-3)
        assert torch.equal(before[answer_mask == 0], after[answer_mask == 0])  # only the answer turns change
