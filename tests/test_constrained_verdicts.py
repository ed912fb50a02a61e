"""Constrained verdicts in the judgement form: each verdict is drawn among the yes/no tokens only,
with its log-prob renormalised over them, in the backend, the rollouts and the trainer alike."""
from __future__ import annotations

import functools

import pytest
import torch
from test_rollout import script_lm, tokenizer  # noqa: F401 (fixtures)
from tiny_models import tiny_llama

from envs.config import EnvConfig
from envs.protocol import JUDGE_WORDS, judge_token_ids
from envs.vector_env import SearchVectorEnv
from inference.backends.hf import HFBackend
from inference.backends.openai_backend import request_body
from inference.backends.vllm_backend import sampling_kwargs
from methods.llm import GenerationRequest
from methods.seeds import SeedsR1
from training.models.policy_models import sequence_logprobs
from training.ppo_loop.ppo_batch import episodes_to_batch
from training.rollouts.rollout import RolloutConfig, collect_rollouts


def test_judge_token_ids_are_single_tokens(tokenizer):  # noqa: F811
    ids = judge_token_ids(tokenizer)
    assert [tokenizer.decode([i]) for i in ids] == list(JUDGE_WORDS)

    def split_words(text, add_special_tokens=False):
        return {"input_ids": [7] * len(text)}

    with pytest.raises(ValueError, match="not one"):
        judge_token_ids(split_words)


def test_request_checks_allowed_ids():
    with pytest.raises(ValueError):
        GenerationRequest("x", allowed_token_ids=(-1,))
    assert GenerationRequest("x", allowed_token_ids=[3, 4]).allowed_token_ids == (3, 4)


def test_backend_samples_among_the_allowed_tokens_with_renormalised_logprobs(tokenizer):  # noqa: F811
    lm = tiny_llama(tokenizer, init=0.3)
    backend = HFBackend(lm, tokenizer)
    allowed = judge_token_ids(tokenizer)
    prompt = tokenizer("What is the capital of France?", add_special_tokens=True)["input_ids"]
    with torch.no_grad():
        logits = lm(torch.tensor([prompt])).logits[0, -1].float()
    renormalised = logits[list(allowed)].log_softmax(-1)  # (2,)
    sampled = backend.generate([GenerationRequest(prompt, max_tokens=1, temperature=1.0, seed=3, n=32,
                                                  allowed_token_ids=allowed)])[0]
    seen = set()
    for completion in sampled.completions:
        (token,), (logprob,) = completion.token_ids, completion.logprobs
        assert token in allowed
        assert logprob == pytest.approx(float(renormalised[allowed.index(token)]), abs=1e-4)
        seen.add(token)
    assert seen == set(allowed)  # neither choice is near-certain for a random model: both get drawn
    greedy = backend.generate([GenerationRequest(prompt, max_tokens=1, allowed_token_ids=allowed)])[0]
    assert greedy.completions[0].token_ids == [allowed[int(renormalised.argmax())]]
    outside = backend.generate([GenerationRequest(prompt, max_tokens=1, allowed_token_ids=(10**6,))])[0]
    assert outside.completions[0].finish_reason == "error"


def test_rollout_verdicts_are_marked_and_scored_like_the_sampler(script_lm, tokenizer, retriever,  # noqa: F811
                                                                  examples):
    """The trainer's log-probs with the episode's choice mask equal the sampler's at every model
    token; without the mask the verdicts would be scored over the whole vocabulary."""
    env_config = EnvConfig(expand_form="judge", max_actions=4, max_searches=1)
    venv = SearchVectorEnv(retriever, num_envs=4, config=env_config, tokenizer=tokenizer)
    config = RolloutConfig(max_turn_tokens=8, max_context_tokens=2048, temperature=1.0, samples_per_question=2,
                           seed=5)
    prompt = functools.partial(SeedsR1.prompt, env=env_config)
    episodes = collect_rollouts(HFBackend(script_lm, tokenizer), venv, examples[:2], config, prompt)
    allowed = judge_token_ids(tokenizer)
    for episode in episodes:
        verdicts = [t for t, c in zip(episode.token_ids, episode.choice_mask) if c]
        assert len(verdicts) == len(episode.info["searches"][0]["titles"]) > 0
        assert all(t in allowed for t in verdicts)
        assert all(m == 1 for m, c in zip(episode.loss_mask, episode.choice_mask) if c)
    batch = episodes_to_batch(episodes, tokenizer.pad_token_id, "cpu")
    mask, choice = batch["model_mask"], batch["choice_mask"]
    ids = torch.tensor(allowed)
    with torch.no_grad():
        logp, _ = sequence_logprobs(script_lm, batch["input_ids"], batch["attention_mask"], target_mask=mask,
                                    choice_mask=choice, choice_ids=ids)
        free, _ = sequence_logprobs(script_lm, batch["input_ids"], batch["attention_mask"], target_mask=mask)
    assert torch.allclose(logp * mask, batch["sampler_logp"] * mask, atol=1e-4)
    assert bool(((free - logp).abs() > 1e-3)[choice.bool()].all())  # the whole-vocabulary score differs


def test_unconstrained_rollouts_have_no_choice_mask(script_lm, tokenizer, retriever, examples):  # noqa: F811
    venv = SearchVectorEnv(retriever, num_envs=1, config=EnvConfig(expand_form="judge", max_actions=4),
                           tokenizer=tokenizer)
    config = RolloutConfig(max_turn_tokens=8, max_context_tokens=2048, temperature=0.0, constrain_verdicts=False)
    (episode,) = collect_rollouts(HFBackend(script_lm, tokenizer), venv, examples[:1], config)
    assert episode.choice_mask == []


def test_remote_backends_pass_the_choices_on():
    request = GenerationRequest([1, 2], max_tokens=1, allowed_token_ids=(5, 9))
    assert sampling_kwargs(request)["allowed_token_ids"] == [5, 9]
    assert request_body("m", request, vllm_extensions=True)[1]["allowed_token_ids"] == [5, 9]
    with pytest.raises(ValueError, match="vLLM"):
        request_body("m", request, vllm_extensions=False)
    assert "allowed_token_ids" not in sampling_kwargs(GenerationRequest([1], max_tokens=1))


def test_a_verdict_the_backend_cannot_give_ends_its_episode_as_an_error(script_lm, tokenizer, retriever,  # noqa: F811
                                                                        examples, monkeypatch):
    """An error completion at a verdict (here: choices outside the vocabulary) ends that episode
    with finish_reason "error" and the backend's message, instead of stopping the rollout."""
    import training.rollouts.rollout as rollout_module

    monkeypatch.setattr(rollout_module, "judge_token_ids", lambda tok: (10**6, 10**6 + 1))
    venv = SearchVectorEnv(retriever, num_envs=2, config=EnvConfig(expand_form="judge", max_actions=4),
                           tokenizer=tokenizer)
    config = RolloutConfig(max_turn_tokens=8, max_context_tokens=2048, temperature=0.0)
    episodes = collect_rollouts(HFBackend(script_lm, tokenizer), venv, examples[:2], config)
    assert [e.finish_reason for e in episodes] == ["error", "error"]
    assert all(e.info.get("error") for e in episodes)
