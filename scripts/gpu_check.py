"""GPU check: a tiny random model through the trainer's GPU code paths, one short script.

    python scripts/gpu_check.py                 # CUDA, bf16 (skips with a message where there is no GPU)
    python scripts/gpu_check.py --device cpu --dtype float32   # the same checks on a CPU (the test runs this)

Each check is one PPO update of :func:`training.ppo.train` on the learning test's world
(:mod:`scripts.box_world`: a 2-layer random Llama taught the protocol by 60 plain supervised
steps, five boxes per search, so rewards differ between samples), rolled out by the HF
engine (KV cache across turns, constrained verdicts) on the device, with LoRA:
every advantage estimator (gae with its critic, grpo, Dr. GRPO, rloo, reinforce, reinforce_pp,
reinforce_pp_baseline), GSPO's sequence-level policy loss, a sequence-level loss aggregation, truncated
importance sampling, and DeepSpeed ZeRO-2 when
``deepspeed`` is importable (one process). No SFT, no faiss, no vLLM, no network: it runs on an
image with torch, transformers, accelerate and peft only.

A check is ``ok`` when the update ran and gave a finite loss with a non-zero gradient. Per check it
prints ``ok`` or the error, the policy loss, the actor's gradient norm, the sampler's
log-prob gap to the trainer, the peak device memory and the seconds; the last line is
``gpu_check=<passed>/<total>`` (``gpu_check=skipped`` without a GPU).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

CHECKS = {  # PPOConfig overrides by dotted name (envs.typed_config.with_values)
    "gae": {"algorithm.advantage": "gae", "optim.critic_warmup_updates": 0},
    "grpo": {"algorithm.advantage": "grpo"},
    "dr_grpo": {"algorithm.advantage": "grpo", "algorithm.grpo_std_normalize": False,
                "algorithm.loss_agg": "seq_mean_token_sum_norm"},
    "rloo": {"algorithm.advantage": "rloo"},
    "reinforce": {"algorithm.advantage": "reinforce"},
    "reinforce_pp": {"algorithm.advantage": "reinforce_pp", "algorithm.kl_coef": 0.01},
    "reinforce_pp_baseline": {"algorithm.advantage": "reinforce_pp_baseline"},
    "gspo": {"algorithm.advantage": "grpo", "algorithm.policy_loss": "gspo",
             "algorithm.loss_agg": "seq_mean_token_mean", "algorithm.clip_low": 3e-4, "algorithm.clip_high": 4e-4},
    "grpo+tis": {"algorithm.advantage": "grpo", "algorithm.tis": "token", "algorithm.loss_agg": "seq_mean_token_mean"},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    names = list(CHECKS) + ["deepspeed"]
    parser.add_argument("--checks", nargs="+", default=names, choices=names,
                        help="which checks (DeepSpeed's always runs last)")
    return parser.parse_args(argv)


def one_update(world: dict, name: str, overrides: dict, args: argparse.Namespace, accelerator) -> dict:
    """One PPO update with ``overrides`` on ``args.device``, from the protocol-taught policy
    (``world["policy"]``, copied); returns the update's logged stats."""
    import copy

    from scripts.box_world import ppo_config
    from training.config import LoraSettings
    from training.models.policy_models import wrap_models
    from training.ppo import train

    dtype = getattr(torch, args.dtype)
    cfg = ppo_config(world, str(world["base"]), {
        "optim.updates": 1, "rollout.questions_per_update": 4, "rollout.samples_per_question": 4,
        "optim.ppo_epochs": 1, "optim.mini_batches": 2, "optim.micro_batch_size": 8, "evaluation.eval_questions": 0,
        "model.dtype": args.dtype, "model.lora": LoraSettings(r=4, alpha=8),
        "run.output_dir": str(world["folder"] / name), **overrides})
    lm = copy.deepcopy(world["policy"]).to(device=accelerator.device, dtype=dtype)
    models = wrap_models(lm, world["tok"], cfg.model, cfg.algorithm, cfg.rollout)
    return train(cfg, retriever=world["retriever"], examples=world["train"], eval_examples=[], models=models,
                 accelerator=accelerator)["history"][0]


def deepspeed_accelerator():
    """A one-process ZeRO-2 accelerator (the env variables a launcher would set)."""
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29531", "RANK": "0", "LOCAL_RANK": "0",
                       "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    return Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0))


def release_deepspeed() -> None:
    """Forget the ZeRO-2 accelerator after its check: accelerate's state is process-wide, so a later
    plain ``Accelerator()`` would otherwise inherit the DeepSpeed plugin (and its process group)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def ordered_checks(names: list[str]) -> list[str]:
    """The checks in the order asked, DeepSpeed's last (and each once)."""
    unique = list(dict.fromkeys(names))
    return [name for name in unique if name != "deepspeed"] + [name for name in unique if name == "deepspeed"]


def run_check(world: dict, name: str, args: argparse.Namespace) -> bool:
    from accelerate import Accelerator

    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        if name == "deepspeed":
            import deepspeed  # noqa: F401

            try:
                stats = one_update(world, name, {"algorithm.advantage": "grpo"}, args, deepspeed_accelerator())
            finally:
                release_deepspeed()
        else:
            stats = one_update(world, name, CHECKS[name], args, Accelerator(cpu=args.device == "cpu"))
    except ImportError as error:
        print(f"gpu_check {name}: skipped ({error})", flush=True)
        return True
    except Exception as error:  # a report, not a crash: every check runs
        traceback.print_exc()
        print(f"gpu_check {name}: FAILED {type(error).__name__}: {error}", flush=True)
        return False
    peak = torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else float("nan")
    if not (math.isfinite(stats["policy_loss"]) and stats["grad_norm_actor"] > 0):
        print(f"gpu_check {name}: FAILED no finite loss with a gradient (policy_loss={stats['policy_loss']}, "
              f"grad_norm={stats['grad_norm_actor']})", flush=True)
        return False
    print(f"gpu_check {name}: ok policy_loss={stats['policy_loss']:.4f} grad_norm={stats['grad_norm_actor']:.4f} "
          f"sampler_gap={stats['sampler_logp_gap']:.4f} reward={stats['reward_mean']:.3f} peak_MiB={peak:.0f} "
          f"s={time.perf_counter() - t0:.1f}", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device on this machine; nothing to check (try --device cpu)")
        print("gpu_check=skipped")
        return 0
    if args.device == "cuda":
        print(f"gpu_check: {torch.cuda.get_device_name()} torch {torch.__version__} CUDA {torch.version.cuda} "
              f"bf16 {torch.cuda.is_bf16_supported()}", flush=True)
    from scripts.box_world import build, protocol_policy

    with tempfile.TemporaryDirectory(prefix="gpu_check-") as folder:
        world = build(folder)
        t0 = time.perf_counter()
        device = "cuda" if args.device == "cuda" else "cpu"
        world["policy"] = protocol_policy(world, device, torch.float32)
        print(f"gpu_check: protocol taught to the random policy in {time.perf_counter() - t0:.1f} s", flush=True)
        checks = ordered_checks(args.checks)
        passed = sum(run_check(world, name, args) for name in checks)
    print(f"gpu_check={passed}/{len(checks)}")
    return 0 if passed == len(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
