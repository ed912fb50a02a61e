"""The rollout keeps the hidden states after the frozen bottom layers (``record_states_after``) for
every episode and verdict row, equal to what the trainer's own pass gives
(:func:`training.models.frozen_prefix.prefix_hidden` on the finished rows) at every position it reads,
and the trainer takes them instead of running those layers again."""
from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
from test_rollout import random_lm, script_lm, tokenizer  # noqa: F401 (fixtures)
from tiny_models import tiny_gemma3

from envs.config import EnvConfig
from envs.vector_env import SearchVectorEnv
from inference.backends.hf import HFBackend
from methods.seeds import SeedsR1
from training.models.frozen_prefix import prefix_hidden
from training.ppo_loop.ppo_batch import episodes_to_batch
from training.ppo_loop.ppo_score import frozen_prefix_states, recorded_states
from training.rollouts.rollout import RolloutConfig, collect_rollouts
from training.rollouts.rollout_states import FrozenStateRecorder, covers, last_needed_position


def alone_rollouts(model, tokenizer, retriever, examples, depth: int, reuse: bool = True):  # noqa: F811
    env_config = EnvConfig(expand_form="judge", judge_context="alone", max_actions=4, max_searches=2,
                           shuffle_candidates=True)
    venv = SearchVectorEnv(retriever, num_envs=3, config=env_config, tokenizer=tokenizer)
    config = RolloutConfig(max_turn_tokens=8, max_context_tokens=2048, samples_per_question=2, seed=3,
                           record_states_after=depth, reuse_kv_cache=reuse)
    prompt = functools.partial(SeedsR1.prompt, env=env_config)
    return collect_rollouts(HFBackend(model, tokenizer, max_batch_size=4), venv, examples[:3], config, prompt)


def own_states(model, token_ids: list[int], depth: int) -> torch.Tensor:
    ids = torch.tensor([token_ids])
    return prefix_hidden(model, ids, torch.ones_like(ids), depth)[0]


def check_rows(model, rows, depth: int) -> int:
    """Every row's recorded states equal the trainer's pass wherever the trainer reads; returns
    how many rows were checked."""
    checked = 0
    for token_ids, loss_mask, states in rows:
        last = max(t for t, m in enumerate(loss_mask) if m) - 1  # the position that predicts the last model token
        assert covers(states, last), (states.shape if states is not None else None, last)
        expected = own_states(model, token_ids, depth)
        torch.testing.assert_close(states, expected[:states.shape[0]], atol=2e-4, rtol=1e-3)
        checked += 1
    return checked


@pytest.mark.parametrize("depth", [1, 2])
def test_recorded_states_are_the_frozen_layers_output(script_lm, tokenizer, retriever, examples, depth):  # noqa: F811
    episodes = alone_rollouts(script_lm, tokenizer, retriever, examples, depth)
    episode_rows = [(e.token_ids, e.loss_mask, e.frozen_states) for e in episodes]
    verdict_rows = [(v.token_ids, [0] * (len(v.token_ids) - 1) + [1], v.frozen_states)
                    for e in episodes for v in e.verdict_rows]
    assert len(verdict_rows) >= len(episodes), "the rollouts judged too few candidates"
    assert check_rows(script_lm, episode_rows, depth) == len(episodes)
    assert check_rows(script_lm, verdict_rows, depth) == len(verdict_rows)
    # Episodes that searched, judged and answered over several turns (the KV session's pieces are
    # stitched together by position), EOS included.
    assert min(e.num_turns for e in episodes) >= 2 and all(e.finish_reason == "answer" for e in episodes)


def test_random_episodes_of_every_ending_record_too(random_lm, tokenizer, retriever, examples):  # noqa: F811
    episodes = alone_rollouts(random_lm, tokenizer, retriever, examples, depth=1)
    assert check_rows(random_lm, [(e.token_ids, e.loss_mask, e.frozen_states) for e in episodes], 1) == len(episodes)


def test_sliding_window_model_records_too(tokenizer, retriever, examples):  # noqa: F811
    model = tiny_gemma3(tokenizer)
    episodes = alone_rollouts(model, tokenizer, retriever, examples, depth=2)
    assert check_rows(model, [(e.token_ids, e.loss_mask, e.frozen_states) for e in episodes], 2) == len(episodes)


def test_nothing_recorded_when_off_or_without_the_session(random_lm, tokenizer, retriever, examples):  # noqa: F811
    for depth, reuse in ((0, True), (1, False)):
        episodes = alone_rollouts(random_lm, tokenizer, retriever, examples, depth, reuse=reuse)
        assert all(e.frozen_states is None for e in episodes)
        assert all(v.frozen_states is None for e in episodes for v in e.verdict_rows)


def test_recorder_keeps_the_longest_run_from_position_zero(random_lm):  # noqa: F811
    recorder = FrozenStateRecorder(random_lm, 1)
    recorder.last = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)  # (b, t, H)
    recorder([("a", 0, 3), ("b", 0, 2)])  # row a ran positions 0-2; row b positions 0-1 (left-padded)
    recorder.last = torch.full((2, 1, 2), -1.0)
    recorder([("a", 3, 1), ("b", 3, 1)])  # b skips position 2
    a, b = recorder.take("a", 5), recorder.take("b", 5)
    assert a.shape == (4, 2) and torch.equal(a[3], torch.tensor([-1.0, -1.0]))
    assert torch.equal(a[:3], torch.arange(6.0).reshape(3, 2))
    assert b.shape == (2, 2) and torch.equal(b, torch.tensor([[8.0, 9.0], [10.0, 11.0]]))
    assert recorder.take("a", 5).numel() == 0  # taken once
    assert not covers(b, 2) and covers(b, 1) and not covers(None, 0)


def test_last_needed_position_is_before_the_last_model_token():
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]], dtype=torch.float32)
    assert last_needed_position(mask).tolist() == [2, 4, -1]


def test_batch_rows_take_the_recorded_states(random_lm, tokenizer, retriever, examples):  # noqa: F811
    episodes = alone_rollouts(random_lm, tokenizer, retriever, examples, depth=1)
    batch = episodes_to_batch(episodes, tokenizer.pad_token_id, "cpu")
    run = SimpleNamespace(policy=SimpleNamespace(lm=random_lm), frozen_depth=1,
                          optim=SimpleNamespace(micro_batch_size=4))
    taken, share = frozen_prefix_states(run, batch, recorded_states(episodes))
    computed, none = frozen_prefix_states(run, batch, None)
    assert share == 1.0 and none == 0.0
    last = last_needed_position(batch["model_mask"])
    for i in range(batch["input_ids"].shape[0]):  # equal wherever the trainer reads
        torch.testing.assert_close(taken[i, :last[i] + 1], computed[i, :last[i] + 1], atol=2e-4, rtol=1e-3)
    # A row whose recorded states fall short runs the frozen layers itself.
    short = recorded_states(episodes)
    short[0] = short[0][:1]
    mixed, share = frozen_prefix_states(run, batch, short)
    assert share == pytest.approx(1 - 1 / len(short))
    torch.testing.assert_close(mixed[0], computed[0])
