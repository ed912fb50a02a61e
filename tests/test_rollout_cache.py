"""Rollouts that keep each episode's KV cache across turns (``RolloutConfig.reuse_kv_cache``, an
:class:`inference.backends.hf_session.HFSession` under the hood) give exactly the episodes that
re-prefilling the whole context every turn gives, for a Llama and for a sliding-window Gemma 3,
greedy and seeded sampling, with episodes of different lengths ending at different turns."""
from __future__ import annotations

import pytest
from test_rollout import check_layout, random_lm, tokenizer  # noqa: F401 (fixtures)
from tiny_models import tiny_gemma3

from envs.config import EnvConfig
from envs.types import QAExample
from envs.vector_env import SearchVectorEnv
from inference.backends.hf import HFBackend
from training.rollouts.rollout import RolloutConfig, collect_rollouts

# Prompts of 195, 219 and 192 tokens; with a 340-token cap the long one ends a turn earlier.
QUESTIONS = [
    QAExample("q0", "What is the capital of France?", ("Paris",)),
    QAExample("q1", "Which river flows through Berlin, the capital of Germany and its most populous city, and then "
                    "on through the rest of eastern Germany?", ("Spree",)),
    QAExample("q2", "Capital of Japan?", ("Tokyo",)),
]


def rollouts(backend, retriever, tokenizer, temperature: float, reuse: bool) -> tuple[list, int]:
    """Episodes and the number of token positions the model ran to produce them."""
    ran = [0]

    def count(module, args, kwargs):
        ran[0] += kwargs["input_ids"].numel()

    hook = backend.model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        venv = SearchVectorEnv(retriever, num_envs=3, config=EnvConfig(max_actions=4), tokenizer=tokenizer)
        config = RolloutConfig(temperature=temperature, max_turn_tokens=8, max_context_tokens=340, seed=6,
                               reuse_kv_cache=reuse)
        episodes = collect_rollouts(backend, venv, QUESTIONS, config)
    finally:
        hook.remove()
    return episodes, ran[0]


def assert_same_episodes(cached: list, fresh: list) -> None:
    assert len(cached) == len(fresh)
    for a, b in zip(cached, fresh):
        assert a.token_ids == b.token_ids
        assert a.loss_mask == b.loss_mask and a.turn_ids == b.turn_ids and a.prompt_length == b.prompt_length
        assert a.sampler_logprobs == pytest.approx(b.sampler_logprobs, abs=1e-4)
        assert (a.finish_reason, a.reward, a.info, a.text) == (b.finish_reason, b.reward, b.info, b.text)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cached_rollouts_equal_reprefilled_ones(random_lm, tokenizer, retriever, temperature):  # noqa: F811
    backend = HFBackend(random_lm, tokenizer, max_batch_size=8)
    cached, ran_cached = rollouts(backend, retriever, tokenizer, temperature, reuse=True)
    fresh, ran_fresh = rollouts(backend, retriever, tokenizer, temperature, reuse=False)
    assert_same_episodes(cached, fresh)
    # Rows of different lengths that end at different turns, for different reasons.
    assert len({e.num_turns for e in cached}) > 1 and len({len(e.token_ids) for e in cached}) == 3
    assert {e.finish_reason for e in cached} == {"action_limit", "context_limit"}
    for episode in cached:  # and both match a plain full forward pass at every model token
        check_layout(episode, tokenizer, random_lm)
    # The prompt and earlier turns are not run again: about a third of the positions.
    assert ran_cached < ran_fresh / 2


def test_sliding_window_model_keeps_its_cache_too(tokenizer, retriever):  # noqa: F811
    model = tiny_gemma3(tokenizer, window=6)  # every turn reaches past the window of two layers
    backend = HFBackend(model, tokenizer, max_batch_size=2)  # two batches of rows per call
    cached, ran_cached = rollouts(backend, retriever, tokenizer, 1.0, reuse=True)
    fresh, ran_fresh = rollouts(backend, retriever, tokenizer, 1.0, reuse=False)
    assert_same_episodes(cached, fresh)
    for episode in cached:
        check_layout(episode, tokenizer, model)
    assert ran_cached < ran_fresh / 2
