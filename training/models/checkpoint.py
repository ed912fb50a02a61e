"""PPO checkpoints: atomic, resumable exactly, loadable with ``torch.load(weights_only=True)``.

Layout: ``<output_dir>/checkpoints/update_000012/``

- ``actor.pt``, ``critic.pt``: the TRAINABLE parameters only (LoRA + value head, or everything in
  a full fine-tune); the frozen rest is rebuilt from the SFT checkpoint / base model;
- ``optim_actor.pt``, ``optim_critic.pt``, ``sched_actor.pt``, ``sched_critic.pt``; under DeepSpeed
  ZeRO-1/2 each process holds only its partition of an optimizer's state (and of the fp32 master
  weights), so every process writes ``optim_actor_rank<r>.pt`` instead, and a resume needs the same
  number of processes;
- ``rng_<rank>.pt``: torch's CPU (and CUDA) generator states of each process;
- ``state.json``: update count, data position, Python's and NumPy's RNG states (per rank).

A checkpoint is written into ``.tmp-update_000012`` beside its final place and renamed into it,
so a killed job leaves either the previous checkpoints or a complete new one. The newest
``keep`` checkpoints are kept.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envs.atomic import write_json_atomic
from training.models.policy_models import load_trainable_state_dict, trainable_state_dict

CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^update_(\d+)$")


def checkpoint_root(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / CHECKPOINT_DIR


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _NAME.match(p.name)) and (p / "state.json").is_file()]
    return [p for _, p in sorted(found)]


def load_latest(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint folder in ``output_dir``, or None."""
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


# ------------------------------------------------------------------------------ RNG states


def rng_state() -> tuple[dict, dict[str, torch.Tensor]]:
    """(JSON-able Python + NumPy states, tensor states of torch) of this process."""
    version, internal, gauss = random.getstate()
    numpy_state = np.random.get_state()
    assert isinstance(numpy_state, tuple)  # legacy=True (the default): the MT19937 tuple
    kind, keys, pos, has_gauss, cached = numpy_state
    plain = {"python": [version, list(internal), gauss],
             "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]}
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return plain, tensors


def set_rng_state(plain: dict, tensors: dict[str, torch.Tensor]) -> None:
    version, internal, gauss = plain["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = plain["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(tensors["cuda"]))


# ------------------------------------------------------------------------------ save / load


def _barrier(accelerator: Any) -> None:
    if accelerator is not None:
        accelerator.wait_for_everyone()


def save_checkpoint(output_dir: str | os.PathLike, update: int, *, actor: torch.nn.Module,
                    critic: torch.nn.Module | None, optimizers: dict[str, Any], schedulers: dict[str, Any],
                    state: dict[str, Any], keep: int = 2, accelerator: Any = None) -> Path:
    """Write checkpoint ``update`` (models unwrapped from DDP by the caller); returns its folder.

    Call on every process: each writes its RNG state (and, under DeepSpeed ZeRO, its optimizer
    partitions); the main process writes the rest.
    ``state``: JSON-able bookkeeping (update count, data position, ...). ``critic`` None: a
    critic-free run (group-baseline estimators), no ``critic.pt``.
    """
    rank = accelerator.process_index if accelerator is not None else 0
    main = accelerator.is_main_process if accelerator is not None else True
    root = checkpoint_root(output_dir)
    final = root / f"update_{update:06d}"
    tmp = root / f".tmp-update_{update:06d}"
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier(accelerator)
    plain, tensors = rng_state()
    torch.save(tensors, tmp / f"rng_{rank}.pt")
    write_json_atomic(plain, tmp / f"rng_{rank}.json")
    zero = {name: zero_optimizer(optimizer) for name, optimizer in optimizers.items()}
    for name, partition in zero.items():
        if partition is not None:  # DeepSpeed ZeRO: each process writes its own partition
            torch.save(partition.state_dict(), tmp / f"optim_{name}_rank{rank}.pt")
    _barrier(accelerator)
    if main:
        torch.save(trainable_state_dict(actor), tmp / "actor.pt")
        if critic is not None:
            torch.save(trainable_state_dict(critic), tmp / "critic.pt")
        for name, optimizer in optimizers.items():
            if zero[name] is None:
                torch.save(optimizer.state_dict(), tmp / f"optim_{name}.pt")
        for name, scheduler in schedulers.items():
            torch.save(scheduler.state_dict(), tmp / f"sched_{name}.pt")
        write_json_atomic({**state, "update": update}, tmp / "state.json")  # last: marks it complete
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in list_checkpoints(output_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    _barrier(accelerator)
    return final


def _load(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def load_checkpoint(path: str | os.PathLike, *, actor: torch.nn.Module, critic: torch.nn.Module | None,
                    optimizers: dict[str, Any], schedulers: dict[str, Any], accelerator: Any = None,
                    restore_rng: bool = True) -> dict[str, Any]:
    """Restore models, optimizers, schedulers and this process's RNG; returns ``state.json``."""
    path = Path(path)
    load_trainable_state_dict(actor, _load(path / "actor.pt"))
    if critic is not None:
        if not (path / "critic.pt").is_file():
            raise ValueError(f"{path} has no critic.pt (a critic-free run): "
                             "resume it with the same advantage estimator")
        load_trainable_state_dict(critic, _load(path / "critic.pt"))
    for name, optimizer in optimizers.items():
        zero = zero_optimizer(optimizer)
        if zero is not None:
            load_zero_partition(zero, path, name, accelerator)
        elif (path / f"optim_{name}.pt").is_file():
            optimizer.load_state_dict(_load(path / f"optim_{name}.pt"))
        else:
            raise ValueError(f"{path} holds the {name} optimizer's state in per-process DeepSpeed ZeRO partitions "
                             f"(optim_{name}_rank*.pt): resume it with the same DeepSpeed launch config")
    for name, scheduler in schedulers.items():
        scheduler.load_state_dict(_load(path / f"sched_{name}.pt"))
    if restore_rng:
        rank = accelerator.process_index if accelerator is not None else 0
        if not (path / f"rng_{rank}.pt").is_file():
            rank = 0  # resumed on more processes than saved: reuse rank 0's state
        set_rng_state(json.loads((path / f"rng_{rank}.json").read_text()), _load(path / f"rng_{rank}.pt"))
    return json.loads((path / "state.json").read_text())


# ------------------------------------------------------------------------------ DeepSpeed ZeRO partitions


def zero_optimizer(optimizer: Any) -> Any | None:
    """The DeepSpeed ZeRO-1/2 optimizer inside accelerate's wrapper, or None for any other optimizer.

    Raises NotImplementedError for ZeRO-3, whose partitioned parameters these checkpoints (the
    trainable weights written by the main process alone) would miss.
    """
    if "deepspeed" not in sys.modules:  # nothing of DeepSpeed was ever set up in this process
        return None
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's DeepSpeedOptimizerWrapper
    if isinstance(inner, DeepSpeedZeroOptimizer_Stage3):
        raise NotImplementedError("PPO checkpoints do not support DeepSpeed ZeRO-3 (partitioned parameters); "
                                  "use configs/deepspeed/zero2.json")
    return inner if isinstance(inner, DeepSpeedZeroOptimizer) else None


def _zero_state_classes() -> list[Callable[..., Any] | tuple[Callable[..., Any], str]]:  # safe_globals's form
    """The DeepSpeed classes a ZeRO optimizer's state_dict holds besides tensors and plain values:
    allowed by name for ``torch.load(weights_only=True)``."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def load_zero_partition(zero: Any, path: Path, name: str, accelerator: Any = None) -> None:
    """Restore this process's partition of a ZeRO-1/2 optimizer (moments and fp32 master weights)
    from ``optim_<name>_rank<r>.pt``; the checkpoint must come from as many processes as now."""
    import torch.distributed as dist

    world = accelerator.num_processes if accelerator is not None else 1
    saved = sorted(path.glob(f"optim_{name}_rank*.pt"))
    if not saved:
        raise ValueError(f"{path} has no DeepSpeed ZeRO partitions of the {name} optimizer "
                         f"(optim_{name}_rank*.pt): it was written without DeepSpeed; resume it the same way")
    if len(saved) != world:
        raise ValueError(f"{path} holds {len(saved)} ZeRO partitions of the {name} optimizer, "
                         f"but {world} processes are running: resume with {len(saved)} processes")
    dp_rank = dist.get_rank(group=zero.dp_process_group)
    with torch.serialization.safe_globals(_zero_state_classes()):
        state = torch.load(path / f"optim_{name}_rank{dp_rank}.pt", map_location="cpu", weights_only=True)
    partitions = [None] * world  # DeepSpeed reads only this process's entry when the world size is unchanged
    partitions[dp_rank] = state
    zero.load_state_dict(partitions, load_optimizer_states=True, load_from_fp32_weights=True)


# ------------------------------------------------------------------------------ export


def export_hf(actor: torch.nn.Module, tokenizer: Any, directory: str | os.PathLike, merge_lora: bool = True) -> Path:
    """Write the policy as a Hugging Face folder (atomically), for
    ``python -m inference.evaluate --method.name seeds-r1 --model.name hf:<directory>``.

    ``actor``: a :class:`training.models.policy_models.PolicyModel` or a (peft) causal LM. With LoRA and
    ``merge_lora`` the adapter is merged into a copy of the weights (the actor is untouched);
    ``merge_lora=False`` writes the adapter only (peft's format; it needs the base model).
    """
    import copy

    lm: Any = getattr(actor, "lm", actor)  # a transformers causal LM (plain or peft)
    directory = Path(directory)
    tmp = directory.parent / f".tmp-{directory.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if merge_lora and callable(getattr(lm, "merge_and_unload", None)):
        lm = copy.deepcopy(lm).merge_and_unload()
    with contextlib.suppress(AttributeError):
        lm.config.use_cache = True
    lm.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(tmp, directory)
    return directory
