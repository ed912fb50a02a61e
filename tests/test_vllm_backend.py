"""VLLMBackend: output mapping (always) and a tiny random Llama on the real engine (when vLLM is installed).

The engine tests build a 2-layer Llama (hidden 64, 2 heads of 32) with a byte-level BPE tokenizer
trained here on ASCII text (so every token decodes to plain text), start one engine for the module
(in this process, unpinned, 1 GiB of KV cache on a CPU) and compare with transformers.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from inference.backends.vllm_backend import (
    completion_from_output,
    decode_tensor,
    encode_tensor,
    sampling_kwargs,
)
from methods.llm import GenerationRequest

# ---------------------------------------------------------------------- mapping (no engine needed)


def fake_output(text, token_ids, finish_reason, stop_reason=None):
    logprobs = [{t: SimpleNamespace(logprob=-0.1 * (i + 1))} for i, t in enumerate(token_ids)]
    return SimpleNamespace(text=text, token_ids=token_ids, logprobs=logprobs, finish_reason=finish_reason,
                           stop_reason=stop_reason)


def test_finish_reasons_are_mapped():
    stop = completion_from_output(fake_output("<search>x</search>", [4, 5], "stop", "</search>"))
    assert (stop.finish_reason, stop.stop_string, stop.token_ids, stop.logprobs) == (
        "stop", "</search>", [4, 5], [-0.1, -0.2])
    eos = completion_from_output(fake_output("done", [4, 2], "stop", None))
    assert (eos.finish_reason, eos.token_ids, eos.logprobs) == ("eos", [4], [-0.1])
    stop_token = completion_from_output(fake_output("done", [4, 9], "stop", 9))
    assert stop_token.finish_reason == "eos" and stop_token.token_ids == [4]
    length = completion_from_output(fake_output("abc", [4, 5, 6], "length"))
    assert length.finish_reason == "length" and length.token_ids == [4, 5, 6]
    aborted = completion_from_output(fake_output("", [], "abort"))
    assert aborted.finish_reason == "error" and "abort" in aborted.error


def test_sampling_kwargs():
    kwargs = sampling_kwargs(GenerationRequest("q", stop=("</answer>",), max_tokens=7, temperature=0.5, top_p=0.8,
                                               seed=4, n=3))
    assert kwargs == dict(n=3, temperature=0.5, top_p=0.8, top_k=-1, seed=4, max_tokens=7, stop=["</answer>"],
                          include_stop_str_in_output=True, logprobs=0)
    assert sampling_kwargs(GenerationRequest("q", top_k=40))["top_k"] == 40
    assert sampling_kwargs(GenerationRequest("q"))["stop"] is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tensor_encoding_round_trip(dtype):
    tensor = torch.randn(3, 5).to(dtype)
    name, dtype_name, shape, data = encode_tensor("w", tensor.t())  # non-contiguous input
    restored = decode_tensor(dtype_name, shape, data)
    assert name == "w" and restored.dtype == dtype and torch.equal(restored, tensor.t())


# ---------------------------------------------------------------------- the real engine

WORDS = (
    "the search agent reads a snapshot of five candidates and expands only the passages it needs "
    "before it writes an answer paris london river mountain science history music number question "
)


def build_tiny_llama(path) -> None:
    """A random 2-layer Llama and a byte-level BPE tokenizer (ASCII alphabet only), saved as HF files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    lines = ([WORDS[i:] + WORDS[:i] for i in range(0, len(WORDS), 7)]
             + ["<>/:.,?!0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ\n"])
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tokenizer.train_from_iterator(lines * 5, trainer)
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                           unk_token="<unk>")
    hf_tokenizer.save_pretrained(path)
    config = LlamaConfig(
        vocab_size=len(hf_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.1,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    pytest.importorskip("vllm")
    from transformers import LlamaForCausalLM

    from inference.backends.vllm_backend import VLLMBackend

    path = tmp_path_factory.mktemp("tiny-llama")
    build_tiny_llama(path)
    settings = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "VLLM_CPU_KVCACHE_SPACE": "1"}
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    threads = torch.get_num_threads()
    backend = VLLMBackend(str(path), dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
    reference = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    yield SimpleNamespace(backend=backend, reference=reference, path=path)
    backend.close()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    torch.set_num_threads(threads)


def reference_logprobs(model, prompt_ids, completion_ids) -> torch.Tensor:
    """log p(completion token | prefix) under a transformers model."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(completion_ids)[:, None])[:, 0]


def long_prompt(tokenizer, n_tokens=160) -> list[int]:
    """More tokens than one KV block (128 on the CPU), so the prefix cache holds a full block."""
    ids = tokenizer(WORDS * 8)["input_ids"]
    assert len(ids) >= n_tokens
    return ids[:n_tokens]


def test_greedy_generation_all_prompt_forms(engine):
    from inference.backends.chat import prompt_token_ids

    backend = engine.backend
    chat = [{"role": "user", "content": "where does the river go?"}]
    requests = [
        GenerationRequest("the search agent", max_tokens=12),
        GenerationRequest(chat, max_tokens=12),
        GenerationRequest([1, 10, 20, 30], max_tokens=12),
        GenerationRequest([1] * 600, max_tokens=4),  # longer than max_model_len: rejected alone
        GenerationRequest("a question", max_tokens=6, temperature=1.0, seed=7, n=2),
    ]
    results = backend.generate(requests)
    for request, result in zip(requests[:3], results[:3]):
        assert result.prompt_token_ids == prompt_token_ids(backend.tokenizer, request.prompt)
        [completion] = result.completions
        assert completion.finish_reason in ("length", "eos")
        assert 0 < len(completion.token_ids) == len(completion.logprobs) <= 12
        assert all(lp <= 0 for lp in completion.logprobs)
        assert completion.text == backend.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    rejected = results[3].completions[0]
    assert rejected.finish_reason == "error" and "max_model_len" in rejected.error
    assert len(results[4].completions) == 2
    again = backend.generate(requests[:1])[0].completions[0]
    assert again.token_ids == results[0].completions[0].token_ids  # greedy is deterministic


def test_stop_string_kept_and_nothing_after_it(engine):
    backend = engine.backend
    prompt = [1, 40, 41, 42, 43]
    free = backend.generate([GenerationRequest(prompt, max_tokens=24)])[0].completions[0].text
    assert len(free) >= 8, free
    start = len(free) // 2
    stop = free[start : start + 3]
    end = free.find(stop) + len(stop)
    [completion] = backend.generate([GenerationRequest(prompt, max_tokens=24, stop=(stop,))])[0].completions
    assert completion.finish_reason == "stop" and completion.stop_string == stop
    assert completion.text == free[:end] and completion.text.endswith(stop)


def test_logprobs_match_transformers(engine):
    backend = engine.backend
    prompt = [1, 50, 60, 70, 80, 90]
    greedy = GenerationRequest(prompt, max_tokens=16)
    sampled = GenerationRequest(prompt, max_tokens=16, temperature=1.0, seed=3, n=2)
    results = backend.generate([greedy, sampled])
    completions = results[0].completions + results[1].completions
    for completion in completions:
        expected = reference_logprobs(engine.reference, prompt, completion.token_ids)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=2e-3, rtol=0)


def test_weight_sync_changes_outputs_and_matches_perturbed_model(engine):
    from transformers import LlamaForCausalLM

    backend = engine.backend
    prompt = long_prompt(backend.tokenizer)
    request = GenerationRequest(prompt, max_tokens=8)
    before = backend.generate([request])[0].completions[0]
    backend.generate([request])  # the prompt's first block is now in the prefix cache

    perturbed = LlamaForCausalLM.from_pretrained(engine.path, dtype=torch.float32, attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in perturbed.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    try:
        backend.sync_weights(perturbed)
        after = backend.generate([request])[0].completions[0]
        assert (after.token_ids != before.token_ids
                or max(abs(a - b) for a, b in zip(after.logprobs, before.logprobs)) > 1e-3)
        expected = reference_logprobs(perturbed, prompt, after.token_ids)
        torch.testing.assert_close(torch.tensor(after.logprobs), expected, atol=2e-3, rtol=0)
    finally:
        backend.sync_weights(engine.reference)  # later tests see the original weights
    restored = backend.generate([request])[0].completions[0]
    assert restored.token_ids == before.token_ids
    torch.testing.assert_close(torch.tensor(restored.logprobs), torch.tensor(before.logprobs), atol=1e-4, rtol=0)
