"""Benchmark: one PPO update of the default recipe with today's settings and with faster ones.

Both arms build the same run (``configs/ppo/default.yaml``: 8 questions × 3 samples, two PPO
epochs of 4 mini-batches) from the same warm start and seed, and time ``--updates`` updates each
(rollout, scoring, optimisation: the trainer's own functions). The first update of an arm pays
its one-time costs (``compile_trained_layers`` compiles there), so the speedup is taken over the
later updates; the first one is printed apart. Every update starts from the warm start's weights
(restored), so an update's questions, weights and sampling seeds are the same in both arms: where
the faster arm leaves the rollout as it is, both optimise the same batches (equal ``tokens``), and a
gain in the optimisation is not lost in the noise of diverging batches. The work is printed beside the times (episodes,
rows, real and model tokens trained, optimizer steps), so that a faster arm is seen not to do less.

    python scripts/bench_update.py --sft_checkpoint runs/ppo-default/sft/model \\
        [--updates 3] [--new --model.compile_trained_layers true ...]

``--sft_checkpoint`` defaults to the warm start the main job trains (taken from the warm-start
cache after the first run). Everything after ``--new`` is the faster arm's overrides
(``--section.field value``); default: ``--model.compile_trained_layers true``. Last line:
``update_speedup=<baseline seconds per update / new seconds per update>``. Run it alone on the
machine: two torch jobs on the same cores distort both arms.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from typing import Any

import torch

from envs.typed_config import load_config
from training.config import PPOConfig
from training.ppo import collect, optimize
from training.ppo_loop.ppo_score import score
from training.ppo_loop.ppo_setup import resolve_sft_checkpoint, set_up
from training.runtime.inputs import next_questions

DEFAULT_NEW = ["--model.compile_trained_layers", "true"]


def arm_config(sft_checkpoint: str | None, overrides: list[str], out: str) -> PPOConfig:
    argv = ["--config", "configs/ppo/default.yaml", "--evaluation.eval_questions", "0", "--run.output_dir", out,
            "--run.export", "false", "--warm_start.cache", "true", *overrides]
    if sft_checkpoint:
        argv += ["--model.sft_checkpoint", sft_checkpoint]
    return load_config(PPOConfig, argv)


def trained_state(run: Any) -> dict[str, Any]:
    """A copy of what an update changes: the trained models' trainable weights, their optimizers'
    and schedulers' states."""
    state: dict[str, Any] = {}
    for name, optimizer in run.optimizers.items():
        model = getattr(run, name)
        state[name] = ({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad},
                       copy.deepcopy(optimizer.state_dict()), copy.deepcopy(run.schedulers[name].state_dict()))
    return state


def restore(run: Any, state: dict[str, Any]) -> None:
    """Put back what :func:`trained_state` copied."""
    for name, (weights, optimizer, scheduler) in state.items():
        with torch.no_grad():
            for n, p in getattr(run, name).named_parameters():
                if n in weights:
                    p.copy_(weights[n])
        run.optimizers[name].load_state_dict(copy.deepcopy(optimizer))
        run.schedulers[name].load_state_dict(copy.deepcopy(scheduler))


def time_updates(cfg: PPOConfig, updates: int) -> list[dict[str, float]]:
    """``updates`` updates of a fresh run of ``cfg``: each one's phase seconds and work. Every update
    starts from the warm start's weights and optimizer state (restored), with its own questions and
    sampling seeds: both arms run the same questions from the same weights, so with the rollout left
    as it is they train on the same batches, and the comparison is paired."""
    run, cfg, _ = set_up(cfg, None, None, None, None, None)
    start = trained_state(run)
    rows = []
    for update in range(updates):
        restore(run, start)
        count = cfg.rollout.questions_per_update
        questions = next_questions(run.examples, update * count, count, cfg.run.seed)
        t0 = time.perf_counter()
        episodes, _, _ = collect(run, questions, update)
        t1 = time.perf_counter()
        batch, _ = score(run, episodes, True)
        t2 = time.perf_counter()
        trained = optimize(run, batch, update, True)
        t3 = time.perf_counter()
        rows.append({"rollout_s": t1 - t0, "score_s": t2 - t1, "optimize_s": t3 - t2, "update_s": t3 - t0,
                     "episodes": len(episodes), "rows": int(batch["input_ids"].shape[0]),
                     "tokens": int(batch["attention_mask"].sum()), "model_tokens": int(batch["model_mask"].sum()),
                     "steps": len(trained["grad_norms"]["actor"])})
        print(f"  update {update + 1}: " + " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                                   for k, v in rows[-1].items()), flush=True)
    return rows


def steady(rows: list[dict[str, float]], key: str) -> float:
    """Mean of ``key`` over the updates after the first (the first alone when there is one)."""
    later = rows[1:] or rows
    return statistics.fmean(r[key] for r in later)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    new = argv[argv.index("--new") + 1:] if "--new" in argv else DEFAULT_NEW
    argv = argv[:argv.index("--new")] if "--new" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft_checkpoint", default=None, help="warm start folder (default: the main job's)")
    parser.add_argument("--updates", type=int, default=3, help="updates per arm (the first is not in the speedup)")
    parser.add_argument("--out", default="/tmp/seeds-bench-update", help="scratch run folders")
    args = parser.parse_args(argv)
    checkpoint = args.sft_checkpoint
    if not checkpoint:  # the main job's warm start (trained once, then from the warm-start cache)
        checkpoint = resolve_sft_checkpoint(arm_config(None, [], f"{args.out}/ws")).model.sft_checkpoint
    results = {}
    for name, overrides in (("today", []), ("new", new)):
        print(f"[bench_update] {name}: {' '.join(overrides) or '(the default recipe)'}", flush=True)
        results[name] = time_updates(arm_config(checkpoint, overrides, f"{args.out}/{name}"), args.updates)
    for key in ("rollout_s", "score_s", "optimize_s", "update_s", "tokens", "model_tokens", "steps"):
        print(f"{key:>13}: today {steady(results['today'], key):8.1f}   new {steady(results['new'], key):8.1f}")
    print(f"first update (one-time costs included): today {results['today'][0]['update_s']:.1f} s, "
          f"new {results['new'][0]['update_s']:.1f} s")
    print(f"update_speedup={steady(results['today'], 'update_s') / steady(results['new'], 'update_s'):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
