"""Learning check: does the product trainer (``training/ppo.py``) teach a small policy which
candidates to open, in our env, on a CPU? A thin driver: a recipe, seeds, and the figures.

    python scripts/learning_check.py                     # configs/ppo/learning_check.yaml, seed 0
    python scripts/learning_check.py --seeds 0 1 2       # the spread over seeds
    python scripts/learning_check.py --set updates=40    # any PPOConfig override (repeatable)

Every seed is one run of :func:`training.ppo.train` (SFT warm start, greedy evaluation on the
held-out questions, PPO, greedy evaluation again) with ``seed`` set; the warm start of the first
seed is reused by the others (``sft_checkpoint``), so the seeds differ in PPO only. Per seed it
prints the before/after reward and selection precision with their paired bootstrap 95%
intervals; over seeds, mean ± std. Results go to ``<out>/result.json``.

Targets (from the issue that made this the trainer's yardstick): reward ×1.5 and precision +0.2
over the warm start. The last line is
``reward_start=… reward_end=… precision_start=… precision_end=…`` (means over seeds).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml

from envs.atomic import write_json_atomic
from training.config import PPOConfig, load_config

RECIPE = Path(__file__).resolve().parent.parent / "configs" / "ppo" / "learning_check.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(RECIPE), help="PPO recipe (default: %(default)s)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="PPO seeds (default: 0)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="PPOConfig override, e.g. --set updates=40 --set lora.r=8")
    parser.add_argument("--out", default="runs/learning_check", help="output folder (one sub-folder per seed)")
    return parser.parse_args(argv)


def seed_config(args: argparse.Namespace, seed: int, sft_checkpoint: str | None) -> PPOConfig:
    """The recipe with the overrides, this seed and its own output folder."""
    argv = ["--config", args.config]
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        argv += [f"--{key}", value]
    cfg = load_config(PPOConfig, argv)
    cfg = dataclasses.replace(cfg, seed=seed, output_dir=str(Path(args.out) / f"seed{seed}"))
    if sft_checkpoint and not cfg.sft_checkpoint:
        cfg = dataclasses.replace(cfg, sft_checkpoint=sft_checkpoint)
    return cfg


def summarize(runs: list[dict]) -> dict:
    """Mean ± std over seeds of the before/after figures (std 0 for one seed)."""
    out = {}
    for stat in ("reward", "precision", "em"):
        for side in ("before", "after", "diff", "lo", "hi"):
            values = [r["comparison"][stat][side] for r in runs]
            out[f"{stat}_{side}"] = {"mean": statistics.fmean(values),
                                     "std": statistics.stdev(values) if len(values) > 1 else 0.0}
    return out


def targets(summary: dict) -> dict:
    start, end = summary["reward_before"]["mean"], summary["reward_after"]["mean"]
    gain = summary["precision_after"]["mean"] - summary["precision_before"]["mean"]
    ratio = end / start if start > 0 else float("nan")
    return {"reward_ratio": ratio, "reward_x1.5": bool(start > 0 and ratio >= 1.5),
            "precision_gain": gain, "precision_+0.2": bool(gain >= 0.2)}


def main(argv: list[str] | None = None) -> dict:
    from training.ppo import train

    args = parse_args(argv)
    runs, sft_checkpoint = [], None
    for seed in args.seeds:
        cfg = seed_config(args, seed, sft_checkpoint)
        start = time.perf_counter()
        result = train(cfg)
        if result["comparison"] is None:
            raise SystemExit("the recipe evaluates nothing (eval_questions: 0): no before/after to report")
        saved = yaml.safe_load((Path(cfg.output_dir) / "config.yaml").read_text())
        sft_checkpoint = sft_checkpoint or saved.get("sft_checkpoint")
        runs.append({"seed": seed, "minutes": (time.perf_counter() - start) / 60,
                     "comparison": result["comparison"], "output_dir": cfg.output_dir})
    summary = summarize(runs)
    goals = targets(summary)
    path = write_json_atomic({"runs": runs, "summary": summary, "targets": goals, "config": args.config,
                              "overrides": args.set}, Path(args.out) / "result.json")
    print(f"learning check: {len(runs)} seed(s) of {args.config}; results in {path}")
    for run in runs:
        r, p = run["comparison"]["reward"], run["comparison"]["precision"]
        print(f"  seed {run['seed']}: reward {r['before']:.3f} -> {r['after']:.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]  "
              f"precision {p['before']:.3f} -> {p['after']:.3f} [{p['lo']:+.3f}, {p['hi']:+.3f}]  "
              f"({run['minutes']:.1f} min)")
    for stat in ("reward", "precision", "em"):
        b, a = summary[f"{stat}_before"], summary[f"{stat}_after"]
        print(f"  {stat:9s} {b['mean']:.3f} ± {b['std']:.3f} -> {a['mean']:.3f} ± {a['std']:.3f}")
    print(f"targets: reward x{goals['reward_ratio']:.2f} (>= 1.5: {goals['reward_x1.5']}), precision "
          f"{goals['precision_gain']:+.3f} (>= +0.2: {goals['precision_+0.2']})")
    print(f"reward_start={summary['reward_before']['mean']:.3f} reward_end={summary['reward_after']['mean']:.3f} "
          f"precision_start={summary['precision_before']['mean']:.3f} "
          f"precision_end={summary['precision_after']['mean']:.3f}")
    return {"runs": runs, "summary": summary, "targets": goals}


if __name__ == "__main__":
    main()
