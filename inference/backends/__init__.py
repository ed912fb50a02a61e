"""LLM backends behind one interface, chosen by a spec string.

``load_backend("hf:gemma3-270m")`` (the default), ``"hf:smollm2-135m"``, ``"hf:/path/to/model"``,
``"vllm:<model>"`` (the packaged names work here too: their converted folder is passed on) or
``"openai:<model>"``; keyword options go to the backend's constructor.
Backends are imported only when asked for, so vLLM and the HTTP client stay optional.
"""
from __future__ import annotations

from methods.llm import Completion, GenerationRequest, GenerationResult, LLMBackend

DEFAULT_BACKEND = "hf:gemma3-270m"
KINDS = ("hf", "vllm", "openai")

__all__ = ["DEFAULT_BACKEND", "Completion", "GenerationRequest", "GenerationResult", "LLMBackend", "load_backend"]


def load_backend(spec: str = DEFAULT_BACKEND, **options) -> LLMBackend:
    """Build the backend a ``"<kind>:<model>"`` spec names (``"hf:"`` alone means the default model)."""
    kind, sep, model = spec.partition(":")
    if not sep or kind not in KINDS:
        raise ValueError(f"backend spec {spec!r} should look like 'hf:<model>', 'vllm:<model>' or 'openai:<model>'")
    if kind == "hf":
        from inference.backends.hf import HFBackend

        return HFBackend(model or DEFAULT_BACKEND.partition(":")[2], **options)
    if not model:
        raise ValueError(f"backend spec {spec!r} names no model")
    if kind == "vllm":
        from inference.backends.vllm_backend import VLLMBackend
        from inference.models import PACKAGED_MODELS, resolve_model

        return VLLMBackend(str(resolve_model(model)) if model in PACKAGED_MODELS else model, **options)
    from inference.backends.openai_backend import OpenAIBackend

    return OpenAIBackend(model, **options)
