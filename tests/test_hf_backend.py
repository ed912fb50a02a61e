"""HF backend on tiny models built in the test: batching, stop strings, log-probs, sampling, errors.

Two tiny Llama models (hidden 64, 2 layers) share a byte-level BPE tokenizer trained here:

- ``random_lm``: random weights (wide init, so greedy choices are clear-cut); its output depends
  on the whole context, which is what the left-padding and log-prob checks need;
- ``chain_lm``: attention and MLP outputs zeroed, so the next token depends on the current token
  only, and the lm_head maps each token of :data:`CHAIN` to the next one and the last to EOS.
  Greedy decoding from a prompt ending in the chain's first token therefore writes the rest of
  the chain, which runs past the stop string ``</search>``.
"""
from __future__ import annotations

import asyncio

import pytest
import torch
from tiny_models import bpe_tokenizer, script_weights
from tiny_models import tiny_llama as shared_tiny_llama
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from inference.backends import decoding, load_backend
from inference.backends.decoding import IncrementalText, sample_tokens
from inference.backends.hf import HFBackend
from inference.backends.hf_cache import prefill_groups
from methods.llm import GenerationRequest

TRAINING_TEXT = [
    "The capital of France is Paris. <search>capital of France</search>. The answer is <answer>Paris</answer>.",
    "Berlin is the capital of Germany. <search>river Berlin</search>. More words follow here and there.",
    "Tokyo is in Japan. Café au lait, naïve résumé. <answer>Tokyo</answer>.",
]
CHAIN = " Paris</search>. More words follow here"  # tokens: ĠParis </ search >. ĠMore Ġwords Ġfollow Ġhere
CONTEXT = 96  # max_position_embeddings of the tiny models


@pytest.fixture(scope="module")
def tokenizer():
    return bpe_tokenizer(TRAINING_TEXT, 400, repeats=20)


def tiny_llama(tokenizer, init: float) -> LlamaForCausalLM:
    return shared_tiny_llama(tokenizer, init=init, context=CONTEXT)


@pytest.fixture(scope="module")
def random_lm(tokenizer):
    return tiny_llama(tokenizer, init=0.3)


@pytest.fixture(scope="module")
def chain_ids(tokenizer) -> list[int]:
    ids = tokenizer(CHAIN, add_special_tokens=False)["input_ids"]
    assert len(set(ids)) == len(ids) and tokenizer.convert_ids_to_tokens(ids[3]) == ">."
    return ids


@pytest.fixture(scope="module")
def chain_lm(tokenizer, chain_ids):
    assert len(set(chain_ids)) == len(chain_ids)  # one successor per token
    successors = chain_ids[1:] + [tokenizer.eos_token_id]
    return script_weights(tiny_llama(tokenizer, init=0.02), dict(zip(chain_ids, successors)), 10.0)


@pytest.fixture(scope="module")
def backend(random_lm, tokenizer):
    return HFBackend(random_lm, tokenizer, max_batch_size=8)


@pytest.fixture(scope="module")
def chain_backend(chain_lm, tokenizer):
    return HFBackend(chain_lm, tokenizer, max_batch_size=8)


PROMPTS = ["The capital of France is", "Berlin is the capital of Germany. More words follow here and",
           "Tokyo", "<search>river Berlin</search>. The answer is <answer>"]


def full_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """Log-probs of ``tokens`` after ``prompt`` from one unbatched forward pass, no cache."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
    return logits.float().log_softmax(-1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


# --------------------------------------------------------------------------- batching and log-probs

def test_batched_greedy_equals_one_at_a_time(backend):
    requests = [GenerationRequest(p, max_tokens=12) for p in PROMPTS]
    batched = backend.generate(requests)
    for request, result in zip(requests, batched):
        alone = backend.generate([request])[0]
        assert result.completions[0].token_ids == alone.completions[0].token_ids
        assert result.completions[0].text == alone.completions[0].text
        assert result.prompt_token_ids == alone.prompt_token_ids
    assert len({r.prompt_tokens for r in batched}) > 1  # the batch really was padded


def test_prompts_of_very_different_lengths_prefill_in_groups_and_merge(backend, random_lm, tokenizer):
    words = " ".join(TRAINING_TEXT).split()
    prompts = [" ".join(words[:n]) for n in (3, 45, 25, 8, 44)]
    lengths = sorted((len(tokenizer(p)["input_ids"]) for p in prompts), reverse=True)
    assert len(prefill_groups(lengths)) >= 3 and lengths[0] + 8 < CONTEXT  # the merge path is exercised
    requests = [GenerationRequest(p, max_tokens=8, temperature=1.0, seed=i) for i, p in enumerate(prompts)]
    batched = backend.generate(requests)
    for request, result in zip(requests, batched):
        alone = backend.generate([request])[0].completions[0]
        completion = result.completions[0]
        assert completion.token_ids == alone.token_ids
        expected = full_logprobs(random_lm, result.prompt_token_ids, completion.token_ids)
        assert completion.logprobs == pytest.approx(expected, abs=1e-4)


def test_prefill_groups():
    assert prefill_groups([100, 95, 90, 80, 20, 10, 5]) == [(0, 3), (3, 4), (4, 7)]
    assert prefill_groups([500, 460, 449]) == [(0, 2), (2, 3)]
    assert prefill_groups([7]) == [(0, 1)]


def test_logprobs_match_a_full_forward_pass(backend, random_lm):
    requests = [GenerationRequest(p, max_tokens=10, temperature=1.0, seed=i) for i, p in enumerate(PROMPTS)]
    requests.append(GenerationRequest(PROMPTS[0], max_tokens=10))  # greedy
    for result in backend.generate(requests):
        completion = result.completions[0]
        expected = full_logprobs(random_lm, result.prompt_token_ids, completion.token_ids)
        assert len(completion.logprobs) == len(completion.token_ids) == 10
        assert completion.logprobs == pytest.approx(expected, abs=1e-4)


def test_processed_logprobs_use_the_sampling_distribution(random_lm, tokenizer):
    processed = HFBackend(random_lm, tokenizer, logprobs_mode="processed")
    greedy, top1 = processed.generate([
        GenerationRequest(PROMPTS[0], max_tokens=5),
        GenerationRequest(PROMPTS[0], max_tokens=5, temperature=0.7, top_k=1, seed=3),
    ])
    assert greedy.completions[0].logprobs == [0.0] * 5
    assert top1.completions[0].token_ids == greedy.completions[0].token_ids  # top-k 1 is greedy
    assert top1.completions[0].logprobs == pytest.approx([0.0] * 5, abs=1e-6)


# --------------------------------------------------------------------------- sampling

@pytest.mark.parametrize("filters", [{}, {"top_p": 0.9, "top_k": 50}, {"top_p": 0.8}])
def test_seeds_are_reproducible_and_independent_of_the_batch(backend, filters):
    request = GenerationRequest(PROMPTS[1], max_tokens=12, temperature=0.9, seed=7, **filters)
    alone = backend.generate([request])[0].completions[0].token_ids
    again = backend.generate([request])[0].completions[0].token_ids
    others = [GenerationRequest(p, max_tokens=12, temperature=1.0, seed=1) for p in PROMPTS]
    in_batch = backend.generate(others + [request])[-1].completions[0].token_ids
    other_seed = backend.generate([GenerationRequest(PROMPTS[1], max_tokens=12, temperature=0.9, seed=8, **filters)])
    assert alone == again == in_batch
    assert other_seed[0].completions[0].token_ids != alone


def test_sample_tokens_follows_the_filtered_distribution(monkeypatch):
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).repeat(4000, 1)
    generators = [torch.Generator().manual_seed(i) for i in range(4000)]
    probs = logits[0].softmax(-1)

    def draw(top_k, top_p, temperature=1.0):
        return sample_tokens(logits, [temperature] * 4000, [top_k] * 4000, [top_p] * 4000, generators)

    tokens, logprobs = draw(0, 1.0)
    assert torch.bincount(tokens, minlength=4).float().div(4000) == pytest.approx(probs.tolist(), abs=0.03)
    assert logprobs == pytest.approx(probs.log()[tokens].tolist(), abs=1e-5)
    nucleus = probs[[2, 1]] / probs[[2, 1]].sum()  # top-p 0.7: {2, 1}, as 0.64 alone is short of 0.7
    for candidates in (1024, 1):  # 1: the candidate set holds too little mass, so everything is sorted
        monkeypatch.setattr(decoding, "TOP_P_CANDIDATES", candidates)
        tokens, logprobs = draw(0, 0.7)
        assert set(tokens.tolist()) == {1, 2}
        assert logprobs[tokens == 2][0].item() == pytest.approx(nucleus[0].log().item(), abs=1e-5)
    tokens, _ = draw(1, 1.0)
    assert set(tokens.tolist()) == {2}
    tokens, _ = draw(0, 1.0, temperature=100.0)  # nearly uniform
    assert torch.bincount(tokens, minlength=4).min() > 800


def test_n_expands_into_distinct_samples(backend):
    sampled, greedy = backend.generate([
        GenerationRequest(PROMPTS[2], max_tokens=8, temperature=1.0, seed=0, n=3),
        GenerationRequest(PROMPTS[2], max_tokens=8, n=2),
    ])
    assert len(sampled.completions) == 3 and len(greedy.completions) == 2
    assert len({tuple(c.token_ids) for c in sampled.completions}) == 3
    assert greedy.completions[0].token_ids == greedy.completions[1].token_ids
    assert sampled.completion_tokens == 24


# --------------------------------------------------------------------------- stop strings and finish reasons

def test_stop_string_ends_generation_with_no_token_after_it(chain_backend, tokenizer, chain_ids):
    prompt = tokenizer("The answer is")["input_ids"] + chain_ids[:1]
    free, stopped = chain_backend.generate([
        GenerationRequest(prompt, max_tokens=20),
        GenerationRequest(prompt, stop=("</answer>", "</search>"), max_tokens=20),
    ])
    assert free.completions[0].token_ids == chain_ids[1:]  # unstopped, the chain runs past the tag
    assert free.completions[0].finish_reason == "eos"
    completion = stopped.completions[0]
    assert completion.finish_reason == "stop" and completion.stop_string == "</search>"
    assert completion.text == "</search>"  # cut right after the stop string ...
    assert completion.token_ids == chain_ids[1:4]  # ... although its last token ">." carries one more character
    assert tokenizer.decode(completion.token_ids) == "</search>."
    assert len(completion.logprobs) == 3


def test_earliest_stop_string_wins_and_finish_reasons(chain_backend, tokenizer, chain_ids):
    prompt = chain_ids[:1]
    both, length, eos = chain_backend.generate([
        GenerationRequest(prompt, stop=("More", "search"), max_tokens=20),
        GenerationRequest(prompt, max_tokens=3),
        GenerationRequest(prompt, stop=("never",), max_tokens=20),
    ])
    assert both.completions[0].text == "</search" and both.completions[0].stop_string == "search"
    assert length.completions[0].finish_reason == "length" and len(length.completions[0].token_ids) == 3
    assert eos.completions[0].finish_reason == "eos"
    assert eos.completions[0].text == tokenizer.decode(chain_ids[1:])
    assert tokenizer.eos_token_id not in eos.completions[0].token_ids


def test_incremental_text_holds_back_partial_characters(tokenizer):
    byte_ids = tokenizer.convert_tokens_to_ids(["Ã", "©"])  # the two UTF-8 bytes of "é"
    text = IncrementalText(tokenizer, tokenizer("caf")["input_ids"], stops=("é!",))
    assert text.push(byte_ids[0]) is None and text.text == ""
    assert text.push(byte_ids[1]) is None and text.text == "é"
    assert text.push(tokenizer.convert_tokens_to_ids("!")) == "é!" and text.final_text() == "é!"


# --------------------------------------------------------------------------- prompt forms and errors

def test_token_id_prompts_pass_through(backend, tokenizer):
    ids = tokenizer(PROMPTS[0])["input_ids"]
    from_ids, from_text = backend.generate([GenerationRequest(ids, max_tokens=6),
                                            GenerationRequest(PROMPTS[0], max_tokens=6)])
    assert from_ids.prompt_token_ids == ids
    assert from_ids.completions[0].token_ids == from_text.completions[0].token_ids


def test_chat_prompts_with_and_without_a_template(random_lm, tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]
    plain = HFBackend(random_lm, tokenizer).generate([GenerationRequest(messages, max_tokens=4)])[0]
    expected = tokenizer("Instructions: Be brief.\n\nUser: Capital of France?\n\nAssistant:")["input_ids"]
    assert plain.prompt_token_ids == expected

    templated = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, bos_token="<s>",
                                        eos_token="</s>", pad_token="<pad>")
    templated.chat_template = (
        "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    chat = HFBackend(random_lm, templated).generate([GenerationRequest(messages, max_tokens=4)])[0]
    rendered = "<s><system>Be brief.\n<user>Capital of France?\n<assistant>"
    assert chat.prompt_token_ids == templated(rendered, add_special_tokens=False)["input_ids"]
    assert chat.prompt_token_ids[0] == templated.bos_token_id and chat.prompt_token_ids[1] != templated.bos_token_id
    assert chat.completions[0].finish_reason in ("length", "eos")


def test_overlong_and_empty_prompts_give_error_completions(backend, tokenizer):
    long_prompt = list(range(10, 10 + CONTEXT))
    nearly_full = list(range(10, 10 + CONTEXT - 3))
    too_long, fine, empty, capped = backend.generate([
        GenerationRequest(long_prompt, max_tokens=4, n=2),
        GenerationRequest(PROMPTS[0], max_tokens=4),
        GenerationRequest("", max_tokens=4),
        GenerationRequest(nearly_full, max_tokens=10),
    ])
    assert [c.finish_reason for c in too_long.completions] == ["error", "error"]
    assert "context" in too_long.completions[0].error and too_long.prompt_token_ids == long_prompt
    assert fine.completions[0].finish_reason == "length" and len(fine.completions[0].token_ids) == 4
    assert empty.completions[0].finish_reason in ("length", "eos")  # "" still gets the BOS token
    assert len(capped.completions[0].token_ids) == 3 and capped.completions[0].finish_reason == "length"


def test_malformed_prompt_fails_only_its_request(backend):
    bad, outside, good = backend.generate([GenerationRequest([{"text": "no role"}], max_tokens=2),
                                           GenerationRequest([5, 10**6], max_tokens=2),
                                           GenerationRequest(PROMPTS[2], max_tokens=2)])
    assert bad.completions[0].finish_reason == "error" and "prompt" in bad.completions[0].error
    assert outside.completions[0].finish_reason == "error" and "vocabulary" in outside.completions[0].error
    assert good.completions[0].finish_reason in ("length", "eos")


# --------------------------------------------------------------------------- concurrency and loading

def test_concurrent_agenerate_calls_form_batches(random_lm, tokenizer):
    backend = HFBackend(random_lm, tokenizer, max_batch_size=8)

    async def run_all():
        requests = [GenerationRequest(PROMPTS[i % len(PROMPTS)], max_tokens=6) for i in range(12)]
        return await asyncio.gather(*(backend.agenerate(r) for r in requests))

    results = asyncio.run(run_all())
    assert len(results) == 12 and all(len(r.completions[0].token_ids) == 6 for r in results)
    assert max(backend._batcher.batch_sizes) > 1 and sum(backend._batcher.batch_sizes) == 12
    alone = backend.generate([GenerationRequest(PROMPTS[0], max_tokens=6)])[0]
    assert results[0].completions[0].token_ids == alone.completions[0].token_ids
    backend.close()


def test_load_backend_from_a_local_folder(random_lm, tokenizer, tmp_path):
    random_lm.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    backend = load_backend(f"hf:{tmp_path / 'tiny'}", device="cpu")
    result = backend.generate([GenerationRequest(PROMPTS[0], max_tokens=5)])[0]
    reference = HFBackend(random_lm, tokenizer).generate([GenerationRequest(PROMPTS[0], max_tokens=5)])[0]
    assert result.completions[0].token_ids == reference.completions[0].token_ids
    with pytest.raises(ValueError):
        load_backend("tiny-model")
    with pytest.raises(ValueError):
        load_backend("openai:")
