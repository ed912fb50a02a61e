"""Automatic prefix reuse (HFBackend prefix_cache): same results as plain generate, only the new
tokens run for a prompt that continues a cached row, no stealing between prompts that merely
share instructions, least recently used rows dropped."""
from __future__ import annotations

import pytest
from test_hf_session import model, spy_on_prefill, tokenizer  # noqa: F401 (the same tiny model, module-scoped fixtures)

from inference.backends.hf import HFBackend
from inference.backends.hf_prefix import PrefixCache
from inference.backends.hf_session import MIN_SHARED_PREFIX, common_prefix
from methods.llm import GenerationRequest

INSTRUCTIONS = "Find the answer to the question by searching. What is the capital"


def counting(backend: HFBackend) -> list[int]:
    """Spy on the prefix cache's prefills; returns the prompt tokens each one ran (all rows)."""
    return spy_on_prefill(backend._prefix_cache.session)


def same_completion(a, b) -> None:
    assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_continuing_prompts_reuse_their_rows_and_match_generate(model, tokenizer):
    plain = HFBackend(model, tokenizer, max_batch_size=4)
    cached = HFBackend(model, tokenizer, max_batch_size=4, prefix_cache=8)
    columns = counting(cached)
    texts = [f"{INSTRUCTIONS} of France?", f"{INSTRUCTIONS} of Japan? Think first."]
    for turn in range(3):
        requests = [GenerationRequest(t, max_tokens=4 + turn, temperature=1.0 if i else 0.0, seed=turn)
                    for i, t in enumerate(texts)]
        before = len(columns)
        got, want = cached.generate(requests), plain.generate(requests)
        for a, b in zip(got, want):
            same_completion(a.completions[0], b.completions[0])
            assert a.prompt_token_ids == b.prompt_token_ids
        ran = sum(columns[before:])  # prompt tokens prefilled in this call, padding included
        lengths = [len(r.prompt_token_ids) for r in want]
        if turn == 0:  # nothing cached yet: the two prompts' common beginning runs once (hf_session), the rest all
            shared = common_prefix(*[r.prompt_token_ids for r in want])
            assert ran >= sum(lengths) - (shared if shared >= MIN_SHARED_PREFIX else 0)
        else:  # only the tokens after each row's cache ran (its last completion token and the observation)
            assert ran < sum(lengths) / 2
        texts = [t + r.text + f"\n<information>obs {turn}</information>\n" for t, r in zip(texts, want)]
    assert len(cached._prefix_cache.session.parked) == 2


def test_shared_instructions_are_copied_not_taken(model, tokenizer):
    instructions = INSTRUCTIONS * 3  # over MIN_SHARED tokens
    plain, cached = HFBackend(model, tokenizer), HFBackend(model, tokenizer, prefix_cache=8)
    columns = counting(cached)
    cached.generate([GenerationRequest(f"{instructions} of France? Tell me more about it.", max_tokens=3)])
    prefix = cached._prefix_cache
    (first,) = prefix._recent
    other = GenerationRequest(f"{instructions} of Peru? Tell me more about it.", max_tokens=3)
    (got,), (want,) = cached.generate([other]), plain.generate([other])  # not a continuation
    same_completion(got.completions[0], want.completions[0])
    assert first in prefix._recent and len(prefix._recent) == 2  # the first row stays
    assert columns[-1] < len(want.prompt_token_ids) / 2  # the shared instructions were not run again


def test_oldest_rows_are_dropped_and_multi_sample_requests_bypass(model, tokenizer):
    cached = HFBackend(model, tokenizer, prefix_cache=2)
    for question in ("of France?", "river flows through Vienna, and why?", "is the tallest mountain of Japan?"):
        cached.generate([GenerationRequest(f"{INSTRUCTIONS} {question}", max_tokens=2)])
    prefix = cached._prefix_cache
    assert len(prefix._recent) == len(prefix.session.parked) == 2 and 1 not in prefix._recent
    (result,) = cached.generate([GenerationRequest("Paris is", max_tokens=2, n=3, temperature=1.0, seed=1)])
    assert len(result.completions) == 3 and len(prefix._recent) == 2
    bad, good = cached.generate([GenerationRequest([10**9], max_tokens=2), GenerationRequest("Paris is", max_tokens=2)])
    assert bad.completions[0].finish_reason == "error" and good.completions[0].finish_reason != "error"
    with pytest.raises(ValueError, match="at least one row"):
        PrefixCache(cached, 0)
