"""HFSession: multi-turn generation that keeps each row's KV cache, compared with
``HFBackend.generate`` on the same requests (tiny random Llama, CPU)."""
from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_llama, tiny_tokenizer

from inference.backends.hf import HFBackend
from inference.backends.hf_session import common_prefix, session_supported
from methods.llm import GenerationRequest


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
