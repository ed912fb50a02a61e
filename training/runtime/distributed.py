"""One process or many: the Accelerator, and the DDP/DeepSpeed differences of a PPO update.

Under DDP the trainer calls ``accelerator.backward`` and steps its own optimizers; prepared
DeepSpeed engines (one per model) accumulate, clip and step themselves. Each helper hides that
difference for one moment of the update: :func:`accumulating` around a micro-batch,
:func:`backward` for its losses, :func:`optimizer_step` at the end of a mini-batch.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DistributedType, InitProcessGroupKwargs

from training.config import ConfigError, OptimSettings


def accelerator_handlers() -> list:
    """The Accelerator's ``kwargs_handlers``, and the environment it needs, for this launch.

    Launched by torchrun on a machine without CUDA, accelerate would start every rank as a lone
    single process (distributed type NO). Asking for CPU makes it join the gloo group. Asking for
    CPU also turns DeepSpeed off, so under DeepSpeed (``ACCELERATE_USE_DEEPSPEED``) the gloo
    backend is named instead: without it accelerate 1.x reports "process 0 of 1" on every rank
    while DeepSpeed trains on all of them."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or torch.cuda.is_available():
        return []
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return [InitProcessGroupKwargs(backend="gloo")]
    os.environ.setdefault("ACCELERATE_USE_CPU", "1")
    return []


def make_accelerator(report_to: str, output_dir: str) -> Accelerator:
    """The run's Accelerator; W&B logs offline under ``output_dir`` when no API key is set."""
    if report_to == "wandb" and not os.environ.get("WANDB_API_KEY"):
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_DIR", output_dir)
        print(f"[ppo] W&B: no WANDB_API_KEY, logging offline under {output_dir}/wandb "
              "(upload later with `wandb sync`)", flush=True)
    return Accelerator(log_with="wandb" if report_to == "wandb" else None, kwargs_handlers=accelerator_handlers())


def check_process_count(accelerator) -> None:
    """accelerate and torch.distributed must agree on how many processes train together."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() != accelerator.num_processes:
        raise RuntimeError(f"accelerate sees {accelerator.num_processes} process(es) ({accelerator.distributed_type}) "
                           f"but torch.distributed has {dist.get_world_size()}: every process would train on "
                           "the same data; launch with accelerate's config for this machine")


def reduce_mean(accelerator, stats: dict[str, float]) -> dict[str, float]:
    """Each value averaged over the processes."""
    if accelerator.num_processes == 1:
        return stats
    keys = sorted(stats)
    values = accelerator.reduce(torch.tensor([float(stats[k]) for k in keys], device=accelerator.device), "mean")
    return dict(zip(keys, values.tolist()))


def uses_deepspeed(accelerator) -> bool:
    """Prepared models are DeepSpeed engines (one per model), which accumulate, clip and step themselves."""
    return accelerator.distributed_type == DistributedType.DEEPSPEED


def configure_deepspeed(accelerator, optim: OptimSettings, episodes_per_process: int) -> None:
    """Set the DeepSpeed config's batch and clipping values from the PPO config's ``optim`` section before ``prepare``
    (with no dataloader prepared, accelerate cannot fill their "auto"). The trainer cuts its own
    micro-batches and marks the accumulation boundary itself, so these values are bookkeeping for
    DeepSpeed, except ``gradient_clipping``, which each engine applies in its ``step()``."""
    ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
    if ds_config.get("zero_optimization", {}).get("stage", 0) == 3:
        raise ConfigError("ZeRO-3 is not supported by the PPO trainer: rollouts on the HF backend, the "
                          "reference log-probs and the checkpoints need whole parameters on every process; "
                          "use configs/deepspeed/zero2.json (configs/accelerate/deepspeed_zero2.yaml)")
    if optim.micro_batch_tokens > 0:
        raise ConfigError("micro_batch_tokens cuts micro-batches of varying counts, and a DeepSpeed engine counts "
                          "its micro-steps: set micro_batch_tokens: 0 (micro_batch_size rows each) under DeepSpeed")
    rows_per_mini_batch = math.ceil(episodes_per_process / optim.mini_batches)
    settings = {"train_micro_batch_size_per_gpu": optim.micro_batch_size,
                "gradient_accumulation_steps": math.ceil(rows_per_mini_batch / optim.micro_batch_size),
                "gradient_clipping": optim.max_grad_norm}
    for key, value in settings.items():
        if ds_config.get(key, "auto") not in ("auto", value):
            raise ConfigError(f"the DeepSpeed config sets {key} to {ds_config[key]!r}, the PPO config implies "
                              f"{value}: set it to \"auto\"")
        ds_config[key] = value


@contextlib.contextmanager
def accumulating(accelerator, model, last: bool):
    """Around one micro-batch's forward/backward: gradients are all-reduced only on the ``last``
    micro-batch of a mini-batch (DDP: ``no_sync`` before it; DeepSpeed: the engine's boundary)."""
    if uses_deepspeed(accelerator):
        model.set_gradient_accumulation_boundary(last)
        yield
    elif last:
        yield
    else:
        with accelerator.no_sync(model):
            yield


def backward(accelerator, losses: list[tuple[Any, torch.Tensor]]) -> None:
    """Gradients of the summed losses, one (model, loss) pair per trained model. A DeepSpeed engine
    runs the backward of its own loss (the actor's and the critic's graphs are disjoint), without
    dividing it by its accumulation steps: the losses are already means over the whole mini-batch."""
    if uses_deepspeed(accelerator):
        for engine, loss in losses:
            engine.backward(loss, scale_wrt_gas=False)
    else:
        accelerator.backward(sum(loss for _, loss in losses))


def optimizer_step(accelerator, model, optimizer, scheduler, max_grad_norm: float) -> float:
    """Clip, step, advance the learning rate and clear the gradients; returns the gradient norm
    before clipping. A DeepSpeed engine does all but the learning rate in its ``step()``, clipping
    to its ``gradient_clipping`` (= ``max_grad_norm``, :func:`configure_deepspeed`)."""
    if uses_deepspeed(accelerator):
        model.step()
        norm = model.get_global_grad_norm()
    else:
        norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return float(norm)
