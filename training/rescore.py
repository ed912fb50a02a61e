"""A finished run's before/after PPO under other selection-reward weights, from its ``eval.json``.

    python -m training.rescore RUN_DIR --negative_opened_penalty 0.05 [--positive_opened_bonus 0.25]

Runs trained under different weights α (per positive opened) and β (per negative opened) print
rewards on different scales: a run that charges more per negative opened starts lower and gains
more from opening less. This puts a run's two greedy evaluations on the scale of other weights
without playing anything again: the selection term is linear in the counts every question keeps
(``positives_opened``, and ``docs_read`` − ``positives_opened`` negatives), so per question

    reward' = reward + (α' − α)·positives_opened − (β' − β)·negatives_opened

(the same for ``selection_reward``), exactly. γ (per positive missed when the answer is wrong), the
answer term and the format penalty depend on what ``eval.json`` does not keep per question, so
they cannot be changed here. α and β of the run are read from its ``config.yaml`` (its
``env_config`` recipe with its ``env`` overrides, as the trainer built them). Printed: the reward
and the selection term before -> after with the paired bootstrap 95% interval of the change, the
same resamples as the run's own report (its ``seed``), so the run's own weights reproduce its
printed intervals. Last line: ``reward_before=… reward_after=… reward_diff_lo=… reward_diff_hi=…
precision_before=… precision_after=…``.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np

from envs.rewards import RewardConfig
from envs.typed_config import ConfigError, load_config
from training.config import PPOConfig
from training.evaluation.policy_eval import compare_runs, result_line
from training.seed_spread import RunFolderError, read_run


def run_reward_config(folder: Path) -> tuple[RewardConfig, int]:
    """The reward weights the run trained and evaluated under, and its seed (the report's bootstrap
    seed), from ``folder/config.yaml``."""
    path = Path(folder) / "config.yaml"
    if not path.is_file():
        raise RunFolderError(f"{path}: no config.yaml (not a training.ppo run folder)")
    try:
        cfg = load_config(PPOConfig, ["--config", str(path)])
        return cfg.env.reward, cfg.run.seed
    except (ConfigError, TypeError, ValueError) as error:
        raise RunFolderError(f"{path}: not a PPO config this version reads ({error})") from error


def rescored(outcomes: dict[str, np.ndarray], run: RewardConfig, other: RewardConfig) -> dict[str, np.ndarray]:
    """Per-question outcomes (n,) with ``reward`` (and ``selection_reward`` where present) moved from
    the run's α, β to ``other``'s; every other outcome unchanged. Refuses weights it cannot move."""
    fixed = [f.name for f in dataclasses.fields(RewardConfig)
             if f.name not in ("positive_opened_bonus", "negative_opened_penalty")
             and getattr(run, f.name) != getattr(other, f.name)]
    if fixed:
        raise ValueError(f"cannot rescore {', '.join(fixed)}: eval.json keeps no per-question counts for them "
                         f"(only α, positive_opened_bonus, and β, negative_opened_penalty, can change)")
    positives = outcomes["positives_opened"]
    negatives = outcomes["docs_read"] - positives
    shift = ((other.positive_opened_bonus - run.positive_opened_bonus) * positives
             - (other.negative_opened_penalty - run.negative_opened_penalty) * negatives)
    out = dict(outcomes)
    for key in ("reward", "selection_reward"):
        if key in out:
            out[key] = outcomes[key] + shift
    return out


def rescore_run(folder: Path, positive_opened_bonus: float | None = None,
                negative_opened_penalty: float | None = None, resamples: int = 2000) -> dict:
    """{"run": the run's (α, β), "as": the weights applied, "comparison": :func:`compare_runs` of the
    rescored outcomes} for one run folder."""
    reward, seed = run_reward_config(folder)
    asked: dict[str, Any] = {"positive_opened_bonus": positive_opened_bonus,
                             "negative_opened_penalty": negative_opened_penalty}
    other = dataclasses.replace(reward, **{name: value for name, value in asked.items() if value is not None})
    sides = read_run(folder)
    before, after = (rescored(sides[side], reward, other) for side in ("before", "after"))
    return {"run": (reward.positive_opened_bonus, reward.negative_opened_penalty),
            "as": (other.positive_opened_bonus, other.negative_opened_penalty),
            "comparison": compare_runs(before, after, resamples=resamples, seed=seed)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a PPO run folder with its config.yaml and eval.json")
    parser.add_argument("--positive_opened_bonus", type=float, help="α to score with (default: the run's)")
    parser.add_argument("--negative_opened_penalty", type=float, help="β to score with (default: the run's)")
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args(argv)
    try:
        result = rescore_run(args.run, args.positive_opened_bonus, args.negative_opened_penalty, args.resamples)
    except (RunFolderError, ValueError) as error:
        print(f"rescore: {error}", file=sys.stderr)
        return 2
    (a, b), (a2, b2) = result["run"], result["as"]
    print(f"[rescore] {args.run}: trained with α {a:g}, β {b:g}; scored with α {a2:g}, β {b2:g} "
          f"(after − before, paired bootstrap 95% interval):")
    for name in ("reward", "selection", "precision"):
        row = result["comparison"].get(name)
        if row is not None:
            print(f"[rescore]   {name:9s} {row['before']:.3f} -> {row['after']:.3f}  "
                  f"diff {row['diff']:+.3f} [{row['lo']:+.3f}, {row['hi']:+.3f}]")
    print(result_line(result["comparison"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
