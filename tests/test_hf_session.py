"""HFSession: multi-turn generation that keeps each row's KV cache, compared with
``HFBackend.generate`` on the same requests (tiny random Llama, CPU)."""
from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_llama, tiny_tokenizer

from inference.backends.hf import HFBackend
from inference.backends.hf_session import common_prefix, session_supported, shared_prefix_groups
from methods.llm import GenerationRequest
from training.models.frozen_prefix import prefix_hidden
from training.rollouts.rollout_states import FrozenStateRecorder


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_llama(tokenizer, init=0.3)


def same_completion(a, b) -> None:
    assert (a.token_ids, a.text, a.finish_reason, a.stop_string) == (b.token_ids, b.text, b.finish_reason,
                                                                      b.stop_string)
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_turns_match_generate_for_mixed_rows(model, tokenizer):
    backend = HFBackend(model, tokenizer, max_batch_size=2)  # five rows: three batches per call
    session = backend.session()
    contexts = {k: tokenizer(f"What is the capital {'of France ' * k}?")["input_ids"] for k in range(5)}
    for turn in range(3):
        keys = sorted(contexts)
        requests = [GenerationRequest(list(contexts[k]), stop=("</search>",), max_tokens=2 + k + turn,
                                      temperature=0.0 if k % 2 else 1.0, top_k=5 if k == 4 else 0, seed=10 * k + turn)
                    for k in keys]
        for k, cached, fresh in zip(keys, session.generate(requests, keys), backend.generate(requests)):
            same_completion(cached.completions[0], fresh.completions[0])
            observation = tokenizer(f"\n obs {turn} {'x ' * k * turn}\n", add_special_tokens=False)["input_ids"]
            contexts[k] = contexts[k] + fresh.completions[0].token_ids + observation
        if turn == 1:  # a row whose context is rewritten reuses the common prefix only; one ends
            contexts[0] = contexts[0][:5] + tokenizer(" rewritten", add_special_tokens=False)["input_ids"]
            session.release([3])
            del contexts[3]
    assert set(session.parked) == {0, 1, 2, 4}
    # The logits after a sequence, from the cache, equal a full forward pass.
    logits = session.next_logits([contexts[1], contexts[4]], [1, 4])
    with torch.no_grad():
        expected = torch.stack([model(torch.tensor([contexts[k]])).logits[0, -1] for k in (1, 4)])
    assert torch.allclose(logits, expected, atol=1e-4)
    assert [len(session.parked[k].ids) for k in (1, 4)] == [len(contexts[1]), len(contexts[4])]


def test_text_prompts_are_tokenised_once_per_call(model, tokenizer, monkeypatch):
    """A session finds each prompt's ids to share prefixes, and hands them on: the backend does not
    tokenise a text prompt again. The completions are those of plain generate."""
    import inference.backends.hf as hf_module
    import inference.backends.hf_session as session_module

    tokenised, original = [], hf_module.prompt_token_ids

    def counting(tokenizer_, prompt, thinking=None):
        if isinstance(prompt, str):
            tokenised.append(prompt)
        return original(tokenizer_, prompt, thinking)

    monkeypatch.setattr(session_module, "prompt_token_ids", counting)
    monkeypatch.setattr(hf_module, "prompt_token_ids", counting)
    backend = HFBackend(model, tokenizer, max_batch_size=4)
    prompts = [f"Shared instructions for every row. Question {k}: where is it?" for k in range(3)]
    requests = [GenerationRequest(text, max_tokens=3, temperature=1.0, seed=k) for k, text in enumerate(prompts)]
    got = backend.session().generate(requests, list(range(3)))
    assert sorted(tokenised) == sorted(prompts)  # once each
    tokenised.clear()
    for a, b in zip(got, backend.generate(requests)):
        same_completion(a.completions[0], b.completions[0])
    assert len(tokenised) == 3


def test_errors_and_limits(model, tokenizer):
    backend = HFBackend(model, tokenizer, max_context=40)
    session = backend.session()
    with pytest.raises(ValueError, match="n must be 1"):
        session.generate([GenerationRequest([1, 2, 3], n=2)], ["a"])
    with pytest.raises(ValueError, match="distinct key"):
        session.generate([GenerationRequest([1, 2]), GenerationRequest([1, 3])], ["a", "a"])
    requests = [GenerationRequest(list(range(5, 45))), GenerationRequest([1, 7, 8], max_tokens=100)]
    (too_long,), (capped,) = [r.completions for r in session.generate(requests, ["a", "b"])]
    assert too_long.finish_reason == "error" and "context" in too_long.error
    assert capped.finish_reason == "length" and len(capped.token_ids) == 40 - 3  # stops at the context
    assert set(session.parked) == {"b"}
    assert session_supported(backend) and common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2


def test_shared_prefix_groups():
    instructions = list(range(100, 120))  # 20 tokens
    contexts = [instructions + [1, 2, 3] + [7] * 20 + [8], instructions + [1, 2, 3] + [7] * 20 + [9],
                instructions + [4, 5], [50] * 30, instructions + [1, 2, 3] + [7] * 20]
    # every row that starts with the instructions; the short one keeps a token of its own to run
    assert shared_prefix_groups(contexts, [0] * 5) == [([4, 0, 1, 2], 20)]
    # once they hold the instructions: the rows of one question, the shortest keeping a token to run
    assert shared_prefix_groups(contexts, [20, 20, 20, 0, 20]) == [([4, 0, 1], 42)]
    assert shared_prefix_groups(contexts, [42, 42, 20, 0, 42]) == []  # nothing left to share
    assert shared_prefix_groups(contexts, [0] * 5, min_shared=22) == [([4, 0, 1], 42)]
    assert shared_prefix_groups([[1, 2], [1, 2]], [0, 0], min_shared=1) == [([0, 1], 1)]
    assert shared_prefix_groups([], []) == []


def test_a_group_that_falls_short_keeps_the_members_that_can_share():
    """Neighbours pairwise worth sharing, but one member already holds more than the group's common
    beginning leaves: it leaves, and the others still share (the old rule dropped all three)."""
    head = list(range(100, 130))  # 30 tokens
    contexts = [head + [1] * 20 + [2], head + [1] * 20 + [3], head + [4] * 5]
    # 0-1 share 50 tokens (row 0 holds 40 of them), 1-2 share 30: all three only 30, less than 40 + 8
    assert shared_prefix_groups(contexts, [40, 0, 0], min_shared=8) == [([1, 2], 30)]
    assert shared_prefix_groups(contexts, [0, 0, 0], min_shared=8) == [([0, 1, 2], 30)]
    assert shared_prefix_groups(contexts, [40, 0, 25], min_shared=8) == [([0, 1], 50)]  # 1-2: 30 < 25 + 8
    assert shared_prefix_groups(contexts, [40, 0, 20], min_shared=8) == [([1, 2], 30)]  # the 40 leaves first


def sharing_requests(tokenizer, questions: int = 2, samples: int = 3) -> tuple[list[GenerationRequest], list]:
    """Several samples of each question after the same instructions (a GRPO rollout's first turn)."""
    instructions = tokenizer("Solve the question below by searching a search engine, then answer it. "
                             "Write the query inside search tags. Question:")["input_ids"]
    requests, keys = [], []
    for q in range(questions):
        question = tokenizer(f" {('what', 'which')[q]} is the capital city of the large country that lies north of "
                             "the sea?", add_special_tokens=False)["input_ids"]
        for s in range(samples):
            requests.append(GenerationRequest(instructions + question, max_tokens=5, temperature=1.0, seed=10 * q + s))
            keys.append((q, s))
    return requests, keys


def spy_on_prefill(session) -> list[int]:
    """The input columns times rows of every prefill pass the session runs."""
    columns: list[int] = []
    prefill_group = session._prefill_group

    def spy(contexts, parked, new, room, keys):
        columns.append(len(contexts) * new)
        return prefill_group(contexts, parked, new, room, keys)

    session._prefill_group = spy
    return columns


def test_rows_that_begin_alike_run_their_common_prefix_once(model, tokenizer):
    backend = HFBackend(model, tokenizer, max_batch_size=4)
    requests, keys = sharing_requests(tokenizer)
    sharing, alone = backend.session(), backend.session()
    alone.share_prefixes = False
    ran_sharing, ran_alone = spy_on_prefill(sharing), spy_on_prefill(alone)
    got, fresh = sharing.generate(requests, keys), backend.generate(requests)
    for a, b, c in zip(got, alone.generate(requests, keys), fresh):
        same_completion(a.completions[0], c.completions[0])
        same_completion(b.completions[0], c.completions[0])
    prompt = [len(r.prompt) for r in requests]
    instructions = common_prefix(requests[0].prompt, requests[-1].prompt)
    # the instructions once, each question's rest once (but its last token), each sample its last token
    shared = prompt[0] - 1 + prompt[-1] - 1 - instructions
    assert sharing.templates_run == 3 and sharing.shared_tokens_run == shared
    assert sum(ran_alone) >= sum(prompt) and shared + len(requests) <= sum(ran_sharing) < sum(prompt) / 2
    assert (sharing.prefill_tokens_run, alone.prefill_tokens_run) == (sum(ran_sharing), sum(ran_alone))
    assert not [k for k in sharing.parked if k not in keys]  # no template row stays
    # the next turn continues each row's own cache (the template's copy was not written into)
    follow = [GenerationRequest(r.prompt + g.completions[0].token_ids + [5, 6], max_tokens=3, seed=1)
              for r, g in zip(requests, got)]
    for a, b in zip(sharing.generate(follow, keys), backend.generate(follow)):
        same_completion(a.completions[0], b.completions[0])


def test_shared_prefixes_reach_the_frozen_state_recorder(model, tokenizer):
    backend = HFBackend(model, tokenizer, max_batch_size=4)
    requests, keys = sharing_requests(tokenizer, samples=2)
    recorder = FrozenStateRecorder(model, depth=1)
    session = backend.session(observer=recorder)
    assert session.share_prefixes
    with recorder.capturing():
        results = session.generate(requests, keys)
    assert session.templates_run >= 2
    for key, request, result in zip(keys, requests, results):
        ids = list(request.prompt) + result.completions[0].token_ids[:-1]
        states = recorder.take(key, len(ids))
        assert states.shape[0] == len(ids)  # every position, the shared ones from the template rows
        full = torch.tensor([ids])
        expected = prefix_hidden(model, full, torch.ones_like(full), 1)[0]
        torch.testing.assert_close(states, expected, atol=2e-4, rtol=1e-3)
    # an observer that cannot take forks sees every row run its whole context
    assert not backend.session(observer=lambda ran: None).share_prefixes
