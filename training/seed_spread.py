"""Before/after PPO over several runs (seeds): each run's paired change and the change pooled over
runs with a two-level bootstrap interval (runs, then questions).

    python -m training.seed_spread runs/seed0 runs/seed1 runs/seed2 [--out spread.json] [--check]

Every run folder holds the ``eval.json`` the trainer writes (:func:`training.evaluation.ppo_report.report_before_after`:
per-question outcomes before and after PPO, in the same question order in every run that used the
same ``eval_questions`` and ``eval_seed``). Printed per run: before -> after, the difference and its
paired bootstrap 95% interval (as the run itself printed it); then over the runs: the standard
deviation of the differences, how many runs' intervals exclude 0 on the side of a gain, and the
change over runs with :func:`envs.bootstrap.multi_run_paired_bootstrap` (the mean over runs of each
run's own statistic, so a run whose greedy policy opened nothing counts with its precision 0; runs
resampled with replacement, then questions, the same draw before and after), which carries the spread
between seeds as well as between questions. The last line is machine-readable:
``runs=R reward_diff=… reward_diff_lo=… reward_diff_hi=… precision_diff=… precision_diff_lo=… precision_diff_hi=…``,
the selection profile's statistics where recorded, and ``selection_misses=N``, the targets of
:mod:`training.evaluation.selection_profile` the pooled change misses. With ``--check`` this is the learning
check: the exit status is 1 when N > 0 (the main job is its one-seed form: it prints the same verdict).

Runs evaluated on different questions are refused by name (:func:`check_same_eval_questions`: the
question digests of ``eval.json`` where every run recorded them, else the ``config.yaml`` settings
that choose the held-out questions).

Where every run judged its candidates alone (``eval.json``'s ``before``/``after`` summaries hold
``verdict_auc``), the report adds how the verdicts RANK candidates, apart from where greedy decoding
cuts: each run's AUC of π(yes) before -> after, and over the runs the mean change, the runs that
rose, and a 95% interval resampling runs only (eval.json keeps each run's AUC, not its verdicts, so
the spread between questions inside a run is not in that interval).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from envs.atomic import write_json_atomic
from envs.bootstrap import bootstrap_interval, mean_of, multi_run_paired_bootstrap
from envs.typed_config import upgrade
from training.config import PPOConfig
from training.evaluation.policy_eval import (
    CORE_OUTCOME_KEYS,
    OPTIONAL_OUTCOME_KEYS,
    STATISTICS,
    compare_runs,
    statistics_of,
)
from training.evaluation.selection_profile import selection_misses, selection_verdict


class RunFolderError(ValueError):
    """A run folder without a usable ``eval.json``."""


def read_run(folder: Path) -> dict[str, dict[str, np.ndarray]]:
    """A run's per-question outcomes {"before": {key: (n,)}, "after": {key: (n,)}} from its ``eval.json``:
    :data:`~training.evaluation.policy_eval.CORE_OUTCOME_KEYS`, and the optional ones (the reward's parts, the
    reading outcomes) where both sides have them."""
    path = Path(folder) / "eval.json"
    if not path.is_file():
        raise RunFolderError(f"{path}: no eval.json (the run has not finished its evaluation after PPO, or "
                             f"ran with eval_questions: 0)")
    try:
        per_question = json.loads(path.read_text())["per_question"]
        parts = [k for k in OPTIONAL_OUTCOME_KEYS if all(k in per_question[side] for side in ("before", "after"))]
        return {side: {k: np.asarray(per_question[side][k], dtype=np.float64) for k in (*CORE_OUTCOME_KEYS, *parts)}
                for side in ("before", "after")}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise RunFolderError(f"{path}: not an eval.json with per-question outcomes ({error!r})") from error


# the PPOConfig fields that choose the held-out questions (dotted; an old run folder's flat keys are read as these)
EVAL_SET_KEYS = ("data.train_data", "evaluation.eval_data", "evaluation.eval_questions", "evaluation.eval_seed",
                 "data.question_seed", "data.train_questions")


def eval_digests(folder: Path) -> list[str] | None:
    """The digests of the held-out question texts, in order, where ``eval.json`` lists them."""
    try:
        digests = json.loads((Path(folder) / "eval.json").read_text()).get("question_digests")
    except (OSError, AttributeError, json.JSONDecodeError):
        return None
    return [str(d) for d in digests] if isinstance(digests, list) else None


def eval_settings(folder: Path) -> dict | None:
    """The ``config.yaml`` settings that choose the run's held-out questions (:data:`EVAL_SET_KEYS`)."""
    path = Path(folder) / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text()) if path.is_file() else None
    except yaml.YAMLError as error:
        raise RunFolderError(f"{path}: not YAML ({error})") from error
    if not isinstance(config, dict):
        return None
    config = upgrade(PPOConfig, config)
    return {key: (config.get(key.partition(".")[0]) or {}).get(key.partition(".")[2]) for key in EVAL_SET_KEYS}


def check_same_eval_questions(folders: list[Path]) -> None:
    """Refuse runs evaluated on different held-out questions (the bootstrap pairs them by position):
    compared by the question digests where every ``eval.json`` has them, else by the ``config.yaml``
    settings that choose the questions (runs without either are not checked)."""
    digests = [eval_digests(folder) for folder in folders]
    by_digest = all(d is not None for d in digests)
    values = digests if by_digest else [eval_settings(folder) for folder in folders]
    named = [(folder, value) for folder, value in zip(folders, values) if value is not None]
    for folder, value in named[1:]:
        first_folder, first = named[0]
        if value == first:
            continue
        if isinstance(first, dict) and isinstance(value, dict):  # the config.yaml settings
            where = ", ".join(f"{key} {first.get(key)!r} vs {value.get(key)!r}"
                              for key in EVAL_SET_KEYS if first.get(key) != value.get(key))
        else:  # the question digests
            positions = [i for i, (a, b) in enumerate(zip(first, value)) if a != b]
            where = f"the questions at positions {positions[:5]} differ" if positions else \
                f"{len(first)} vs {len(value)} questions"
        raise RunFolderError(f"{first_folder} and {folder} were evaluated on different questions ({where}); "
                             f"their outcomes cannot be pooled question by question")


def finite_pair(before: Any, after: Any, key: str) -> tuple[float, float] | None:
    """(before[key], after[key]) where both sides record it as a finite number, else None (a side
    missing or not a mapping, the key missing, a value that is no number, NaN or infinite)."""
    try:
        pair = float(before[key]), float(after[key])
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return pair if all(math.isfinite(value) for value in pair) else None


def read_verdict_auc(folder: Path) -> tuple[float, float] | None:
    """The run's verdict AUC (before, after) from its ``eval.json`` summaries; None where either side
    has none or it is undefined (no verdicts judged alone, or one class missing)."""
    try:
        evaluation = json.loads((Path(folder) / "eval.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(evaluation, dict):
        return None
    return finite_pair(evaluation.get("before"), evaluation.get("after"), "verdict_auc")


def verdict_auc_spread(pairs: list[tuple[float, float]], resamples: int = 2000, seed: int = 0,
                       level: float = 0.95) -> dict:
    """Mean verdict AUC before and after over runs, the mean change with a percentile interval from
    resampling runs with replacement, its sd and the runs that rose. pairs: R (before, after)."""
    values = np.asarray(pairs, dtype=np.float64)  # (R, 2)
    diffs = values[:, 1] - values[:, 0]  # (R,)
    lo, hi = bootstrap_interval({"auc_diff": diffs}, mean_of("auc_diff"), resamples, level, seed)  # runs as rows
    return {"runs": len(diffs), "before": float(values[:, 0].mean()), "after": float(values[:, 1].mean()),
            "diff": float(diffs.mean()), "lo": float(lo), "hi": float(hi),
            "diff_sd": float(diffs.std(ddof=1)) if len(diffs) > 1 else 0.0, "runs_up": int((diffs > 0).sum())}


def spread(runs: list[dict[str, dict[str, np.ndarray]]], resamples: int = 2000, seed: int = 0) -> dict:
    """Per-run comparisons and, per statistic, the change in the mean over runs with its two-level
    bootstrap interval (its diff is the mean of the runs' differences), their standard deviation and
    the runs whose interval is above 0. Pooled: the statistics every run has the outcomes for (a run
    recorded before the reward's parts were has no ``selection`` or ``format``)."""
    per_run = [compare_runs(run["before"], run["after"], resamples, seed) for run in runs]
    sides = [run[side] for run in runs for side in ("before", "after")]
    common = [key for key in sides[0] if all(key in outcomes for outcomes in sides)]
    befores, afters = ([{key: run[side][key] for key in common} for run in runs] for side in ("before", "after"))
    pooled = {}
    for name in statistics_of(*sides):
        diffs = [comparison[name]["diff"] for comparison in per_run]
        change = multi_run_paired_bootstrap(befores, afters, STATISTICS[name], resamples, seed)
        pooled[name] = {**change.as_dict(),
                        "diff_sd": statistics.stdev(diffs) if len(diffs) > 1 else 0.0,
                        "runs_above_zero": sum(comparison[name]["lo"] > 0 for comparison in per_run)}
    return {"runs": len(runs), "per_run": per_run, "pooled": pooled}


def summary_line(result: dict) -> str:
    """The machine-readable last line: reward and precision, then the selection profile (recall,
    selection F1, documents read, answers copying the question) where every run recorded it."""
    pooled = result["pooled"]
    r, p = pooled["reward"], pooled["precision"]
    line = (f"runs={result['runs']} reward_diff={r['diff']:.4f} reward_diff_lo={r['lo']:.4f} "
            f"reward_diff_hi={r['hi']:.4f} precision_diff={p['diff']:.4f} precision_diff_lo={p['lo']:.4f} "
            f"precision_diff_hi={p['hi']:.4f}")
    for name in ("recall", "f1", "docs", "em", "copy"):
        if name in pooled:
            row = pooled[name]
            line += (f" {name}_before={row['before']:.4f} {name}_after={row['after']:.4f} "
                     f"{name}_diff_lo={row['lo']:.4f} {name}_diff_hi={row['hi']:.4f}")
    return line + f" selection_misses={len(selection_misses(pooled))}"


def print_report(folders: list[Path], result: dict) -> None:
    for folder, comparison in zip(folders, result["per_run"]):
        print(f"{folder}:")
        for name, row in comparison.items():
            print(f"  {name:9s} {row['before']:.3f} -> {row['after']:.3f}  diff {row['diff']:+.3f} "
                  f"[{row['lo']:+.3f}, {row['hi']:+.3f}]")
    print(f"over {result['runs']} runs (mean of the runs' statistics, 95% interval resampling runs then questions; "
          f"sd of the runs' differences; runs whose own interval is above 0):")
    for name, row in result["pooled"].items():
        print(f"  {name:9s} {row['before']:.3f} -> {row['after']:.3f}  diff {row['diff']:+.3f} "
              f"[{row['lo']:+.3f}, {row['hi']:+.3f}]  sd {row['diff_sd']:.3f}  "
              f"above 0: {row['runs_above_zero']}/{result['runs']}")
    print(selection_verdict(result["pooled"]))
    auc = result.get("verdict_auc")
    if auc:
        runs = ", ".join(f"{b:.3f} -> {a:.3f}" for b, a in auc["per_run"])
        print(f"verdict AUC of π(yes) (ranking, apart from the greedy cut) per run: {runs}")
        print(f"  over {auc['runs']} runs {auc['before']:.3f} -> {auc['after']:.3f}  diff {auc['diff']:+.3f} "
              f"[{auc['lo']:+.3f}, {auc['hi']:+.3f}] (runs resampled)  sd {auc['diff_sd']:.3f}  "
              f"up: {auc['runs_up']}/{auc['runs']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="PPO run folders, each with its eval.json")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's random seed")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    parser.add_argument("--check", action="store_true",
                        help="the learning check: exit status 1 when the pooled change misses a target of the "
                             "selection profile (training.evaluation.selection_profile)")
    args = parser.parse_args(argv)
    try:
        check_same_eval_questions(args.runs)
        result = spread([read_run(folder) for folder in args.runs], args.resamples, args.seed)
        aucs = [pair for pair in map(read_verdict_auc, args.runs) if pair is not None]
        if len(aucs) == len(args.runs):  # every run has one
            result["verdict_auc"] = {**verdict_auc_spread(aucs, args.resamples, args.seed), "per_run": aucs}
    except (RunFolderError, ValueError) as error:
        print(f"seed_spread: {error}", file=sys.stderr)
        return 2
    print_report(args.runs, result)
    if args.out is not None:
        write_json_atomic({**result, "folders": [str(f) for f in args.runs]}, args.out)
    print(summary_line(result))
    return 1 if args.check and selection_misses(result["pooled"]) else 0


if __name__ == "__main__":
    sys.exit(main())
