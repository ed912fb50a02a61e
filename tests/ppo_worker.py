"""One PPO run in each process of a multi-process launch (tests/test_ppo_deepspeed.py).

    accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml tests/ppo_worker.py --config tiny.yaml

Builds the Accelerator and the models the way ``training.ppo.train`` does, notes the process's
rank and world size as torch.distributed has them (accelerate was seen reporting rank 0 on every
process), trains, and writes ``<output_dir>/worker_<rank>.json``: those numbers, accelerate's own
view, and whether the actor's weights moved while its frozen base and the reference stayed.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
torch.set_num_threads(1)


def skip_deepspeed_shm_kernel() -> None:
    """DeepSpeed compiles a shared-memory all-reduce kernel for CPU the first time it starts (a
    minute or two of g++); torch's gloo, which it falls back to, does the same job here."""
    try:
        import deepspeed.ops
    except ImportError:
        return
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def weights(module: torch.nn.Module, trainable: bool) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad == trainable}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main(argv: list[str]) -> int:
    skip_deepspeed_shm_kernel()
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    from training.config import PPOConfig, load_config
    from training.models.policy_models import build_models
    from training.ppo import train
    from training.runtime.distributed import accelerator_handlers

    cfg = load_config(PPOConfig, argv)
    accelerator = Accelerator(kwargs_handlers=accelerator_handlers())
    seen = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "backend": dist.get_backend(),
            "accelerate_rank": accelerator.process_index, "accelerate_processes": accelerator.num_processes,
            "distributed_type": accelerator.distributed_type.value}
    set_seed(cfg.run.seed)  # as train() does before it builds the models
    models = build_models(cfg.model, cfg.algorithm, cfg.rollout, device=str(accelerator.device))
    probe = models.tokenizer(["<search> capital France</search>"], return_tensors="pt")
    ids, attention = probe["input_ids"], probe["attention_mask"]
    trained, base = weights(models.actor, True), weights(models.actor, False)
    reference = models.reference_logprobs(ids, attention)
    train(cfg, models=models, accelerator=accelerator)
    seen.update(actor_moved=not same(trained, weights(models.actor, True)),
                base_unchanged=same(base, weights(models.actor, False)),
                reference_unchanged=torch.equal(reference, models.reference_logprobs(ids, attention)))
    Path(cfg.run.output_dir, f"worker_{seen['rank']}.json").write_text(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
