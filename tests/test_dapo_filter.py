"""DAPO's dynamic-sampling filter compares the reward the advantage is formed from (overlong
shaping included) and keeps tied groups whose verdicts still have a reward gap of their own."""
from __future__ import annotations

from training.algorithm.dapo import dynamic_sample, has_verdict_signal, shaped_reward
from training.rollouts.rollout import Episode
from training.rollouts.rollout_judge import VerdictRow


def episode(group: int, reward: float, model_tokens: int, gaps: tuple[float, ...] = ()) -> Episode:
    n = model_tokens + 1
    return Episode(token_ids=list(range(n)), loss_mask=[0] + [1] * model_tokens, sampler_logprobs=[0.0] * n,
                   turn_ids=[0] * n, prompt_length=1, example_id=f"q{group}", group_id=group, reward=reward,
                   verdict_rows=[VerdictRow(token_ids=[1, 2], logprob=-0.5, reward_gap=g) for g in gaps])


def test_shaped_reward_adds_the_overlong_penalty():
    assert shaped_reward(episode(0, 1.0, 10), overlong_max_tokens=20, overlong_buffer=0) == 1.0
    assert shaped_reward(episode(0, 1.0, 15), overlong_max_tokens=20, overlong_buffer=10) == 0.5  # (10 − 15)/10
    assert shaped_reward(episode(0, 1.0, 25), overlong_max_tokens=20, overlong_buffer=10) == 0.0  # −1 past the max


def test_equal_env_rewards_that_overlong_shaping_separates_are_kept():
    group = [episode(0, 1.0, 5), episode(0, 1.0, 15)]
    never = lambda r: []  # noqa: E731
    assert dynamic_sample(group, never, want=1, max_rounds=0)[1]["groups_kept"] == 0.0  # env reward only: tied
    kept, stats = dynamic_sample(group, never, want=1, max_rounds=0,
                                 reward_of=lambda e: shaped_reward(e, 20, 10))
    assert stats["groups_kept"] == 1.0 and kept == group


def test_tied_groups_with_their_own_verdict_signal_are_kept():
    tied_with_gap = [episode(0, 0.5, 3, gaps=(0.0, 0.25)), episode(0, 0.5, 3, gaps=(0.0,))]
    tied_without = [episode(1, 0.5, 3, gaps=(0.0,)), episode(1, 0.5, 3)]
    assert has_verdict_signal(tied_with_gap[0]) and not has_verdict_signal(tied_without[0])
    stream = Episode(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], sampler_logprobs=[0.0] * 3, turn_ids=[0] * 3,
                     prompt_length=1, example_id="q", group_id=2, choice_mask=[0, 1, 0],
                     choice_reward_gap=[0.0, -0.15, 0.0])
    assert has_verdict_signal(stream)
    kept, stats = dynamic_sample(tied_with_gap + tied_without, lambda r: [], want=2, max_rounds=0,
                                 own_signal=has_verdict_signal)
    assert stats["groups_kept"] == 1.0 and [e.example_id for e in kept] == ["q0", "q0"]
