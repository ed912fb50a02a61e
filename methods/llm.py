"""The one LLM interface used by every method, every backend (inference/backends/) and training rollouts.

A :class:`GenerationRequest` carries a prompt (chat messages, raw text or token ids), stop
strings (kept in the output), sampling settings and ``n``; a :class:`GenerationResult` holds
``n`` :class:`Completion` objects with text, token ids, per-token log-probs and why each
stopped. Backends implement :meth:`LLMBackend.generate_batch`; callers use
:meth:`LLMBackend.generate` (many requests at once) or ``await`` :meth:`LLMBackend.agenerate`
(one request; concurrent callers are batched together by the backend).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from methods.llm_batching import RequestBatcher

ChatMessages = list[dict[str, str]]
Prompt = ChatMessages | str | list[int]

FINISH_REASONS = ("stop", "eos", "length", "error")


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to complete.

    ``prompt``: chat messages (``[{"role", "content"}]``, rendered with the tokenizer's chat
    template or the plain-text fallback), raw text, or token ids (used as they are).
    ``stop``: strings that end a completion; the matched stop string stays in the text.
    ``top_k <= 0`` and ``top_p == 1`` disable those filters; ``temperature == 0`` is greedy.
    ``allowed_token_ids``: when not empty, every generated token is one of these (a constrained
    choice, e.g. the yes/no verdict of the judgement form); the completion's log-probs are then
    those of the distribution renormalised over these tokens (see each backend's notes).
    ``regex``: when set, the completion is constrained to match this regular expression in full
    (grammar-guided decoding; the hf backend through ``llguidance``, vllm through its structured
    outputs). A method's action format (:mod:`methods.guidance`) is the usual one; the
    completion then ends where the expression does (a closing tag, kept like a stop string).
    """

    prompt: Prompt
    stop: tuple[str, ...] = ()
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    n: int = 1
    allowed_token_ids: tuple[int, ...] = ()
    regex: str | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.n < 1:
            raise ValueError("n must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must lie in (0, 1]")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        allowed = tuple(self.allowed_token_ids)
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in allowed):
            raise ValueError(f"allowed_token_ids must be non-negative token ids, not {allowed!r}")
        object.__setattr__(self, "allowed_token_ids", allowed)


@dataclass
class Completion:
    """One sampled continuation.

    ``finish_reason``: ``"stop"`` (a stop string matched: ``stop_string`` says which, and it
    ends ``text``), ``"eos"`` (the model's end token; not included in ``text`` or
    ``token_ids``), ``"length"`` (``max_tokens`` reached) or ``"error"`` (``error`` says why).
    ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the model's own distribution
    (log-softmax of the raw logits, before temperature/top-k/top-p), which is what a trainer's
    forward pass computes; backends may offer the processed (sampled-from) distribution instead.
    ``thinking``: the leading ``<think>`` block a :class:`~methods.context.QuestionContext` took out
    of ``text`` (:mod:`methods.thinking`); backends leave it empty and ``text`` whole.
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"
    stop_string: str | None = None
    error: str | None = None
    thinking: str = ""


@dataclass
class GenerationResult:
    completions: list[Completion]
    prompt_token_ids: list[int] = field(default_factory=list)
    latency_s: float = 0.0

    @property
    def text(self) -> str:
        """Text of the first completion (the common n=1 case)."""
        return self.completions[0].text

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.completions)


class LLMBackend(ABC):
    """Base class of the ``hf``, ``vllm`` and ``openai`` backends."""

    name: str = "base"
    tokenizer: Any = None  # a Hugging Face tokenizer when the backend has one locally

    @property
    def count_tokenizer(self) -> Any:
        """The tokenizer the env counts observation caps and document tokens in: :attr:`tokenizer`
        unless a backend names another (the ``openai`` backend's ``tokenizer`` option); None: words."""
        return self.tokenizer

    max_batch_size: int = 32  # requests per batch formed from concurrent agenerate calls
    _batcher: RequestBatcher | None = None  # made by the first agenerate call

    @abstractmethod
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Complete every request (batched as the backend can); results in request order."""

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        """Complete one request from async code; concurrent calls are batched into ``generate``."""
        batcher = self._batcher
        if batcher is None:
            batcher = self._batcher = RequestBatcher(self.generate, max_batch_size=self.max_batch_size)
        return await batcher.submit(request)

    def close(self) -> None:
        """Release workers, engines and connections."""
        if self._batcher is not None:
            self._batcher.close()
            self._batcher = None
