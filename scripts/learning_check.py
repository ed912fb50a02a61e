"""Learning check: does the product trainer (``training/ppo.py``) teach SmolLM2 to CHOOSE which
candidates to open on the embedded default, not to stop reading? A thin driver of the main job:
its recipe, seeds, and the selection profile's verdict (:mod:`training.evaluation.selection_profile`).

    python scripts/learning_check.py                     # configs/ppo/learning_check.yaml (= the main job), seed 0
    python scripts/learning_check.py --seeds 0 1 2       # pooled over seeds (training.seed_spread)
    python scripts/learning_check.py --updates 12        # any PPOConfig override, as training.ppo takes it

Every seed is one run of :func:`training.ppo.train` (SFT warm start, greedy evaluation on the
held-out questions, PPO, greedy evaluation again) with ``seed`` set; the warm start of the first
seed is reused by the others (``sft_checkpoint``), so the seeds differ in PPO only, and with
``cache_warm_start`` a second call reuses the warm start and its evaluation. One seed is the main
job's size: about 15-25 minutes on 2 cores at the 6 updates of the previous default, about twice
the PPO phase at today's 12 (the first call also trains the warm start). Over several
seeds the before/after comparison is pooled with the two-level paired bootstrap of
:mod:`training.seed_spread`. Results go to ``<out>/result.json``.

Targets: the selection profile of :class:`training.evaluation.selection_profile.SelectionTargets` (recall kept,
precision and selection F1 up, 1-3 documents read, EM not worse, no question copies). The exit
status is 0 when every target is met, 1 otherwise; the last line is
``selection_misses=… recall_after=… precision_diff=… f1_diff=… docs_after=…``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml

from envs.atomic import write_json_atomic
from training.config import PPOConfig, load_config, with_values
from training.evaluation.selection_profile import selection_misses
from training.seed_spread import read_run, spread

RECIPE = Path(__file__).resolve().parent.parent / "configs" / "ppo" / "learning_check.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(RECIPE), help="PPO recipe (default: %(default)s)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="PPO seeds (default: 0)")
    parser.add_argument("--out", default="runs/learning_check", help="output folder (one sub-folder per seed)")
    parser.epilog = "Any other --section.field value is a PPOConfig override, as `python -m training.ppo` takes it."
    args, overrides = parser.parse_known_args(argv)
    args.overrides = overrides
    return args


def seed_config(args: argparse.Namespace, seed: int, sft_checkpoint: str | None) -> PPOConfig:
    """The recipe with the overrides, this seed and its own output folder."""
    try:
        cfg = load_config(PPOConfig, ["--config", args.config, *args.overrides])
    except ValueError as error:  # ConfigError: an unknown key or a value of the wrong kind
        raise SystemExit(f"learning_check: {error}") from None
    cfg = with_values(cfg, {"run.seed": seed, "run.output_dir": str(Path(args.out) / f"seed{seed}")})
    if sft_checkpoint and not cfg.model.sft_checkpoint:
        cfg = with_values(cfg, {"model.sft_checkpoint": sft_checkpoint})
    return cfg


SHOWN = ("reward", "precision", "recall", "f1", "docs", "em")  # per seed


def pooled_comparison(runs: list[dict]) -> dict:
    """The before/after comparison the targets read: the run's own for one seed; over several, the
    change in the mean over runs with its two-level paired bootstrap interval (``training.seed_spread``)."""
    if len(runs) == 1:
        return runs[0]["comparison"]
    return spread([read_run(Path(run["output_dir"])) for run in runs])["pooled"]


def summary_line(comparison: dict, misses: list[str]) -> str:
    def value(stat: str, side: str) -> str:
        return f"{comparison[stat][side]:.4f}" if stat in comparison else "nan"
    return (f"selection_misses={len(misses)} recall_after={value('recall', 'after')} "
            f"precision_diff={value('precision', 'diff')} f1_diff={value('f1', 'diff')} "
            f"docs_after={value('docs', 'after')} em_diff={value('em', 'diff')}")


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
        saved = yaml.safe_load((Path(cfg.run.output_dir) / "config.yaml").read_text())
        sft_checkpoint = sft_checkpoint or saved["model"].get("sft_checkpoint")
        runs.append({"seed": seed, "minutes": (time.perf_counter() - start) / 60,
                     "comparison": result["comparison"], "output_dir": cfg.run.output_dir})
    comparison = pooled_comparison(runs)
    misses = selection_misses(comparison)
    path = write_json_atomic({"runs": runs, "comparison": comparison, "misses": misses, "config": args.config,
                              "overrides": args.overrides}, Path(args.out) / "result.json")
    print(f"learning check: {len(runs)} seed(s) of {args.config}; results in {path}")
    for run in runs:
        print(f"  seed {run['seed']} ({run['minutes']:.1f} min): " + ", ".join(
            f"{name} {row['before']:.3f} -> {row['after']:.3f} [{row['lo']:+.3f}, {row['hi']:+.3f}]"
            for name, row in run["comparison"].items() if name in SHOWN))
    print("targets: " + ("all met" if not misses else "missed: " + "; ".join(misses)))
    print(summary_line(comparison, misses))
    return {"runs": runs, "comparison": comparison, "misses": misses}


if __name__ == "__main__":
    sys.exit(1 if main()["misses"] else 0)
