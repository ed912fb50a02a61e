"""Token-in/token-out SEEDS-R1 rollouts on tiny models built in the test (CPU, fast).

The tokenizer is a byte-level BPE trained here, with the protocol tags and the turn-ending
pieces (``?\\n`` ending the prompt, ``</snapshot>\\n`` and ``</information>\\n`` ending the
observations) added as single tokens. Two tiny Llama models share it:

- ``script_lm``: attention and MLP outputs zeroed, so the next token depends on the current
  token only; the lm_head maps each state token to a scripted action:
  prompt → ``<search> capital France</search>``, snapshot → ``<expand> 1</expand>``,
  information → ``<answer> Paris</answer>`` → EOS;
- ``random_lm``: random weights; sampled turns are mostly invalid, which exercises the
  ``length`` path, the action limit and log-prob alignment with context-dependent logits.
"""
from __future__ import annotations

from itertools import pairwise
from types import SimpleNamespace

import pytest
import torch
from tiny_models import STATES, TAGS, WORDS, script_weights, tiny_llama, tiny_tokenizer

from envs.config import EnvConfig
from envs.protocol import CLOSING_TAGS
from envs.vector_env import SearchVectorEnv
from inference.backends.hf import HFBackend
from methods.seeds import SeedsR1
from training.rollouts.rollout import (
    Episode,
    RolloutConfig,
    collect_rollouts,
    eos_logprobs,
    rollout_stats,
)

SCRIPT = {
    "?\n": ["<search>", " capital", " France", "</search>"],
    "</snapshot>\n": ["<expand>", " 1", "</expand>"],
    "</information>\n": ["<answer>", " Paris", "</answer>"],
}
CONTEXT = 4096


@pytest.fixture(scope="module")
def tokenizer():
    tok = tiny_tokenizer()
    for piece in STATES + TAGS + WORDS:
        assert len(tok(piece, add_special_tokens=False)["input_ids"]) == 1, piece
    return tok


def _id(tokenizer, piece: str) -> int:
    return tokenizer.convert_tokens_to_ids(piece)


@pytest.fixture(scope="module")
def script_lm(tokenizer):
    model = tiny_llama(tokenizer, init=0.02)
    chain: dict[int, int] = {}
    for state, actions in SCRIPT.items():
        pieces = [state] + actions
        for a, b in pairwise(pieces):
            chain[_id(tokenizer, a)] = _id(tokenizer, b)
    chain[_id(tokenizer, "</answer>")] = tokenizer.eos_token_id
    return script_weights(model, chain, 2.0)  # logit 16 after the RMSNorm (x8): near-certain, log-prob still < 0


@pytest.fixture(scope="module")
def random_lm(tokenizer):
    return tiny_llama(tokenizer, init=0.3)


@pytest.fixture(scope="module")
def script_backend(script_lm, tokenizer):
    return HFBackend(script_lm, tokenizer, max_batch_size=8)


@pytest.fixture(scope="module")
def random_backend(random_lm, tokenizer):
    return HFBackend(random_lm, tokenizer, max_batch_size=8)


class CountingEnv(SearchVectorEnv):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = 0

    def step(self, actions):
        self.steps += 1
        return super().step(actions)


def full_logprobs(model, ids: list[int]) -> list[float]:
    """log_softmax(model(ids))[t-1, ids[t]] for every t >= 1 (index 0 gets 0.0)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    values = logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
    return [0.0] + values


def segments(episode: Episode) -> list[tuple[int, int, int]]:
    """Maximal runs ``(start, end, mask)`` of equal mask after the prompt."""
    runs, start = [], episode.prompt_length
    for t in range(episode.prompt_length + 1, len(episode.token_ids) + 1):
        if t == len(episode.token_ids) or episode.loss_mask[t] != episode.loss_mask[start]:
            runs.append((start, t, episode.loss_mask[start]))
            start = t
    return runs


def check_layout(episode: Episode, tokenizer, model) -> None:
    n = len(episode.token_ids)
    assert len(episode.loss_mask) == len(episode.sampler_logprobs) == len(episode.turn_ids) == n
    p = episode.prompt_length
    assert episode.loss_mask[:p] == [0] * p and episode.turn_ids[:p] == [-1] * p
    assert all(t >= 0 for t in episode.turn_ids[p:])
    assert episode.turn_ids[p:] == sorted(episode.turn_ids[p:])  # turns only move forward
    assert all(lp == 0.0 for lp, m in zip(episode.sampler_logprobs, episode.loss_mask) if m == 0)
    tag_ids = {_id(tokenizer, tag) for tag in CLOSING_TAGS}
    for start, end, mask in segments(episode):
        if mask == 0:  # an observation: "\n" + text + "\n", never generated
            text = tokenizer.decode(episode.token_ids[start:end])
            assert text.startswith("\n") and text.endswith("\n")
            assert len(set(episode.turn_ids[start:end])) == 1
            continue
        segment = episode.token_ids[start:end]
        if segment[-1] == tokenizer.eos_token_id:  # EOS right after the accepted </answer>
            assert end == n and segment[-2] == _id(tokenizer, "</answer>")
            segment = segment[:-1]
        closing = [k for k, t in enumerate(segment) if t in tag_ids]
        if closing:  # a tag ends the turn: it is generated (mask 1) and nothing follows it
            assert closing == [len(segment) - 1]
    # Alignment: the sampler's log-probs equal a fresh full forward pass at every model token.
    expected = full_logprobs(model, episode.token_ids)
    model_positions = [t for t in range(n) if episode.loss_mask[t]]
    assert [episode.sampler_logprobs[t] for t in model_positions] == pytest.approx(
        [expected[t] for t in model_positions], abs=1e-4)


# ------------------------------------------------------------------------------ tests

def test_scripted_episodes_layout_rewards_and_groups(script_backend, script_lm, tokenizer, retriever, examples):
    venv = CountingEnv(retriever, tokenizer=tokenizer, num_envs=3, config=EnvConfig())
    config = RolloutConfig(temperature=1.0, samples_per_question=2, seed=7, max_turn_tokens=16)
    episodes = collect_rollouts(script_backend, venv, examples, config)
    assert len(episodes) == 8  # 4 questions x 2 samples, in batches of 3, 3, 2
    assert [e.group_id for e in episodes] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [e.example_id for e in episodes] == [ex.id for ex in examples for _ in range(2)]
    eos = tokenizer.eos_token_id
    for episode in episodes:
        check_layout(episode, tokenizer, script_lm)
        assert episode.finish_reason == "answer"
        assert episode.token_ids[-1] == eos and episode.loss_mask[-1] == 1
        assert episode.sampler_logprobs[-1] < 0.0  # a real log-prob, computed, not a placeholder
        assert episode.num_turns == 3  # search, expand, answer
        assert episode.prompt_length == len(tokenizer(SeedsR1.prompt(
            next(ex.question for ex in examples if ex.id == episode.example_id), EnvConfig()))["input_ids"])
        assert episode.reward == episode.info["reward"]["total"]
        assert episode.info["answer"] == "Paris" and episode.info["n_searches"] == 1
        assert "<answer> Paris</answer></s>" in episode.text
    assert [e.info["metrics"]["em"] for e in episodes] == [1.0, 1.0] + [0.0] * 6
    # One retrieval call per env step at most; here only the search turn of each batch retrieves.
    assert venv.retrieval_calls == len(retriever.calls) == 3 and venv.steps == 9
    assert [len(q) for q in retriever.calls] == [3, 3, 2]
    stats = rollout_stats(episodes)
    assert stats["em"] == 0.25 and stats["finish/answer"] == 1.0
    assert stats["searches_per_question"] == 1.0 and stats["docs_read_per_question"] == 1.0
    assert stats["reward_mean"] == pytest.approx(sum(e.reward for e in episodes) / 8)
    assert stats["model_tokens_mean"] == 4 + 3 + 3 + 1


def test_random_policy_sampled_logprobs_align(random_backend, random_lm, tokenizer, retriever, examples):
    venv = CountingEnv(retriever, tokenizer=tokenizer, num_envs=2, config=EnvConfig(max_actions=4))
    config = RolloutConfig(temperature=1.0, max_turn_tokens=6, seed=3)
    episodes = collect_rollouts(random_backend, venv, examples[:2], config)
    assert len(episodes) == 2 and [e.group_id for e in episodes] == [0, 1]
    for episode in episodes:
        check_layout(episode, tokenizer, random_lm)
        assert episode.finish_reason in {"answer", "action_limit"}
        assert episode.reward == episode.info["reward"]["total"]
        assert 1 <= episode.num_turns <= 4
    assert len(retriever.calls) == venv.retrieval_calls <= venv.steps
    # Same seed, same episodes (per-request generation seeds).
    again_env = SearchVectorEnv(retriever, tokenizer=tokenizer, num_envs=2, config=EnvConfig(max_actions=4))
    again = collect_rollouts(random_backend, again_env, examples[:2], config)
    assert [e.token_ids for e in again] == [e.token_ids for e in episodes]


def test_context_cap_truncates(script_backend, script_lm, tokenizer, retriever, examples):
    prompt_len = len(tokenizer(SeedsR1.prompt(examples[0].question, EnvConfig()))["input_ids"])
    venv = SearchVectorEnv(retriever, tokenizer=tokenizer, num_envs=1)
    cap = prompt_len + 8 + 1 + 20  # the first turn fits, the snapshot then leaves no room for another
    config = RolloutConfig(max_turn_tokens=8, max_context_tokens=cap, temperature=0.0)
    (episode,) = collect_rollouts(script_backend, venv, examples[:1], config)
    check_layout(episode, tokenizer, script_lm)
    assert episode.finish_reason == "context_limit" and len(episode.token_ids) <= cap
    assert episode.loss_mask[-1] == 1 and episode.num_turns == 1  # ends on the search turn, no observation
    assert episode.info["n_searches"] == 1 and episode.reward == episode.info["reward"]["total"]
    # A prompt that leaves no room for one turn: an episode without model tokens.
    tight = RolloutConfig(max_turn_tokens=8, max_context_tokens=prompt_len + 5, temperature=0.0)
    (empty,) = collect_rollouts(script_backend, SearchVectorEnv(retriever, tokenizer=tokenizer, num_envs=1),
                                examples[:1], tight)
    assert empty.finish_reason == "context_limit" and empty.num_model_tokens == 0
    assert len(empty.token_ids) == empty.prompt_length == prompt_len


def test_eos_logprob_processed_mode_and_vllm_path(script_lm, tokenizer):
    ids = tokenizer("<answer> Paris</answer>")["input_ids"]
    eos = tokenizer.eos_token_id
    raw = HFBackend(script_lm, tokenizer)
    (value,) = eos_logprobs(raw, [ids], eos)
    assert value == pytest.approx(full_logprobs(script_lm, ids + [eos])[-1], abs=1e-5)
    processed = HFBackend(script_lm, tokenizer, logprobs_mode="processed")
    assert eos_logprobs(processed, [ids], eos, temperature=0.0) == [0.0]
    assert eos_logprobs(processed, [ids], eos, temperature=1.0)[0] == pytest.approx(value, abs=1e-5)
    # After "<answer>" the top-1 token is " Paris": top_k=1 cuts EOS out of the sampled distribution.
    assert eos_logprobs(processed, [tokenizer("<answer>")["input_ids"]], eos, temperature=1.0, top_k=1) == [
        float("-inf")]

    class FakeLLM:  # the vLLM engine's generate with prompt_logprobs
        def generate(self, prompts, params, use_tqdm=False):
            assert params.prompt_logprobs == 0 and params.max_tokens == 1
            return [SimpleNamespace(prompt_logprobs=[None] + [{t: SimpleNamespace(logprob=-0.5)} for t in
                                                             p["prompt_token_ids"][1:]]) for p in prompts]

    fake_vllm = SimpleNamespace(SamplingParams=lambda **kw: SimpleNamespace(**kw),
                                inputs=SimpleNamespace(TokensPrompt=dict))
    backend = SimpleNamespace(llm=FakeLLM(), _vllm=fake_vllm, name="vllm")
    assert eos_logprobs(backend, [ids, ids[:2]], eos) == [-0.5, -0.5]


def test_episode_asserts_parallel_arrays():
    with pytest.raises(AssertionError):
        Episode([1, 2], [0], [0.0, 0.0], [-1, -1], 1, "q", 0)
