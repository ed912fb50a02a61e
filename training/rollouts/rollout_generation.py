"""How a rollout batch calls the model: one batched generation per turn, and EOS log-probs.

:class:`TurnGenerator` is opened once per batch of episodes (keys: the episodes' env slots).
On an HF backend (:class:`~inference.backends.hf.HFBackend`, the merged LoRA copy of
:mod:`training.rollouts.rollout_engine` included) it keeps every episode's KV cache across turns through
an :class:`~inference.backends.hf_session.HFSession`: a turn runs only the tokens added since the
last one (the previous completion's last token, the observation, any forced text), instead of
prefilling the prompt, earlier turns and observations again. Completions (token ids, log-probs,
text, finish reason, stop string) are those ``backend.generate`` returns for the same requests,
up to floating-point noise; the session keeps no holes in a row's cache, so sliding-window models
(Gemma 3) use it too. Other backends (vLLM, whose prefix cache already reuses the prompt; the
HTTP ones) get ``backend.generate`` every turn, as does ``reuse_kv_cache=False``.

EOS log-probs (:func:`eos_logprobs`) after an accepted ``</answer>``: from the session's cache
(one token run per episode), else one forward pass over the whole sequence (HF) or vLLM's
``prompt_logprobs``.
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, cast

from inference.backends.hf_session import session_supported
from methods.llm import GenerationRequest, GenerationResult, LLMBackend

if TYPE_CHECKING:
    from inference.backends.hf import HFBackend


class TurnGenerator:
    """One batch of episodes' access to the model. ``keys`` name the episodes (stable across turns)."""

    def __init__(self, backend: LLMBackend, reuse_kv_cache: bool = True, recorder: Any = None):
        self.backend = backend
        self.session = (cast("HFBackend", backend).session(observer=recorder)  # session_supported: an HF backend
                        if reuse_kv_cache and session_supported(backend) else None)
        self.recorder = recorder if self.session is not None else None  # training.rollouts.rollout_states

    def frozen_states(self, key: Hashable, length: int) -> Any:
        """The recorded states of row ``key``'s first positions ((n, H), n ≤ ``length``), or None
        when nothing is recorded (no recorder, or a backend without a session)."""
        return self.recorder.take(key, length) if self.recorder is not None else None

    def generate(self, requests: list[GenerationRequest], keys: Sequence[Hashable]) -> list[GenerationResult]:
        """One completion per request, request ``i`` continuing episode ``keys[i]``."""
        if self.session is None:
            return self.backend.generate(requests)
        return self.session.generate(requests, keys)

    def eos_logprobs(self, sequences: list[list[int]], keys: Sequence[Hashable], eos_id: int, temperature: float,
                     top_k: int, top_p: float) -> list[float]:
        """The sampler's log-prob of ``eos_id`` after each sequence (see :func:`eos_logprobs`)."""
        if self.session is None or not sequences:
            return eos_logprobs(self.backend, sequences, eos_id, temperature, top_k, top_p)
        logits = self.session.next_logits(sequences, keys)  # [b, V] float32
        return _eos_from_logits(logits, eos_id, eos_sampling(self.backend, temperature, top_k, top_p))

    def release(self, keys: Sequence[Hashable]) -> None:
        """Episodes that ended: their caches (and any states not taken) are no longer needed."""
        if self.session is not None:
            self.session.release(keys)
        if self.recorder is not None:
            self.recorder.forget(list(keys))


def eos_logprobs(backend: LLMBackend, sequences: list[list[int]], eos_id: int, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0) -> list[float]:
    """Log-prob of ``eos_id`` right after each sequence, as the backend reports sampled tokens.

    HF (a backend with a torch ``model``): one batched, left-padded forward pass, last position
    only; ``logprobs_mode="raw"`` gives ``log_softmax(logits)[eos]``, ``"processed"`` applies
    temperature / top-k / top-p like the sampler (``0.0`` when greedy, ``-inf`` if EOS is cut),
    ``"sampled"`` does the same when ``temperature > 0`` and gives the raw value when greedy.
    vLLM (a backend with an ``llm`` engine): the sequence plus EOS is submitted with
    ``prompt_logprobs=0`` and ``max_tokens=1``; the last prompt position's entry is EOS's
    log-prob. vLLM computes prompt log-probs from the raw logits, so this matches the default
    ``raw_logprobs`` mode, not ``processed_logprobs``.
    """
    if not sequences:
        return []
    if getattr(backend, "llm", None) is not None and hasattr(backend, "_vllm"):
        return _vllm_eos_logprobs(backend, sequences, eos_id)
    if getattr(backend, "model", None) is not None:
        return _hf_eos_logprobs(backend, sequences, eos_id, eos_sampling(backend, temperature, top_k, top_p))
    raise NotImplementedError(f"EOS log-probs need a local model (hf) or engine (vllm), not {backend.name!r}")


def eos_sampling(backend: LLMBackend, temperature: float, top_k: int,
                 top_p: float) -> tuple[float, int, float] | None:
    """The sampling filters an HF backend's ``logprobs_mode`` applies to a token's log-prob:
    ``(temperature, top_k, top_p)`` for ``"processed"`` (greedy included) and for ``"sampled"``
    when ``temperature > 0``; None (the raw log-prob) otherwise."""
    mode = getattr(backend, "logprobs_mode", "raw")
    if mode == "processed" or (mode == "sampled" and temperature > 0):
        return temperature, top_k, top_p
    return None


def _hf_eos_logprobs(backend: Any, sequences: list[list[int]], eos_id: int,
                     processed: tuple[float, int, float] | None) -> list[float]:
    import inspect

    import torch

    model = backend.model
    device = getattr(backend, "device", None) or next(model.parameters()).device
    pad = getattr(backend, "pad_id", 0)
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    keep_last = "logits_to_keep" in inspect.signature(base.forward).parameters
    batch_size = max(1, int(getattr(backend, "max_batch_size", 8)))
    out: list[float] = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for first in range(0, len(sequences), batch_size):
                chunk = sequences[first:first + batch_size]
                width = max(len(s) for s in chunk)
                ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for i, seq in enumerate(chunk):
                    ids[i, width - len(seq):] = torch.tensor(seq)
                    mask[i, width - len(seq):] = 1
                ids, mask = ids.to(device), mask.to(device)
                position = (mask.cumsum(-1) - 1).clamp(min=0)
                options = {"logits_to_keep": 1} if keep_last else {}
                logits = model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=False,
                               **options).logits[:, -1, :].float()  # [b, V]
                out.extend(_eos_from_logits(logits, eos_id, processed))
    finally:
        model.train(was_training)
    return out


def _eos_from_logits(logits: Any, eos_id: int, processed: tuple[float, int, float] | None) -> list[float]:
    """``logits``: ``[b, V]`` float32 → EOS log-prob per row (raw, or under the sampling filters)."""
    if processed is None:
        return (logits[:, eos_id] - logits.logsumexp(-1)).tolist()
    temperature, top_k, top_p = processed
    if temperature == 0:
        return [0.0] * logits.shape[0]  # the backend's convention for greedy rows
    scores = logits / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        values, index = scores.sort(dim=-1, descending=True)
        probs = values.softmax(-1)
        drop = probs.cumsum(-1) - probs >= top_p
        scores = scores.scatter(1, index, values.masked_fill(drop, float("-inf")))
    return scores.log_softmax(-1)[:, eos_id].tolist()


def _vllm_eos_logprobs(backend: Any, sequences: list[list[int]], eos_id: int) -> list[float]:
    vllm = backend._vllm
    tokens_prompt = getattr(vllm.inputs, "TokensPrompt", dict)
    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    outputs = backend.llm.generate([tokens_prompt(prompt_token_ids=list(s) + [eos_id]) for s in sequences], params,
                                   use_tqdm=False)
    values = []
    for output in outputs:
        entry = output.prompt_logprobs[-1][eos_id]
        values.append(float(getattr(entry, "logprob", entry)))
    return values


def request_seed(seed: int | None, episode: int, turn: int) -> int | None:
    """The sampling seed of one request: a function of the run seed, the episode and the turn."""
    if seed is None:
        return None
    return (seed * 1_000_003 + episode * 10_007 + turn) % (2**31 - 1)


def end_episode(venv: Any, slot: Any, k: int, reason: str) -> None:
    """End an episode the env did not end: its reward is the env's summary as it stands."""
    slot.done, slot.finish_reason = True, reason
    slot.info = venv.envs[k].summary()
