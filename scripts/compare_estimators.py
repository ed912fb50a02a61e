"""Which advantage estimator learns the search task? A measured comparison on the learning test's
world (:mod:`training.box_world`: five boxes per search, one full; the reward counts what was opened).

    python scripts/compare_estimators.py                          # 5 estimators x seeds 0 1 2, 20 updates
    python scripts/compare_estimators.py --estimators grpo rloo --seeds 0 1 2 3 4 --updates 10

One SFT warm start (the scripted teacher that opens two random boxes) is shared by every run, so
runs differ in the estimator and the PPO seed only, with the same budget (updates, episodes, PPO
epochs, learning rate) as the learning test. Each run evaluates greedily on the 24 held-out questions
before and after PPO. Estimators:

- ``gae``: a critic (a second tiny decoder), GAE with γ = λ = 1, whitened; no critic-only warm-up
  updates, so every estimator gets the same actor updates;
- ``grpo``: group mean and std over a question's 8 samples;
- ``dr_grpo``: Dr. GRPO, the group mean only, and the loss summed over each sequence's tokens divided
  by a constant (``loss_agg: seq_mean_token_sum_norm``);
- ``rloo``: leave-one-out group mean;
- ``reinforce_pp``: REINFORCE++, the batch-whitened token-level return-to-go.

It prints a table of reward and precision after training (mean ± std over seeds, with the mean gain
over the warm start), writes ``<out>/result.json`` and ``<out>/compare_estimators.png``, and ends with
``best_estimator=<name> precision_gain=<x>`` (the highest mean precision after PPO, ties broken by reward).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from envs.atomic import write_json_atomic  # noqa: E402
from training.box_world import build, ppo_config, warm_start  # noqa: E402

ESTIMATORS = {
    "gae": {"advantage": "gae", "critic_warmup_updates": 0, "lr_critic": 1e-3},
    "grpo": {"advantage": "grpo"},
    "dr_grpo": {"advantage": "grpo", "grpo_std_normalize": False, "loss_agg": "seq_mean_token_sum_norm"},
    "rloo": {"advantage": "rloo"},
    "reinforce_pp": {"advantage": "reinforce_pp"},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=list(ESTIMATORS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--out", default="runs/compare_estimators")
    return parser.parse_args(argv)


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def run_all(args: argparse.Namespace) -> dict:
    """{estimator: [{seed, reward_before, reward_after, precision_before, precision_after, seconds}]}"""
    from training.ppo import train

    world = build(Path(args.out))
    sft_dir = warm_start(world)
    results: dict[str, list[dict]] = {}
    for name in args.estimators:
        for seed in args.seeds:
            config = ppo_config(world, sft_dir, seed=seed, updates=args.updates,
                                output_dir=str(Path(args.out) / f"{name}-seed{seed}"), **ESTIMATORS[name])
            t0 = time.perf_counter()
            comparison = train(config, retriever=world["retriever"], examples=world["train"],
                               eval_examples=world["held_out"])["comparison"]
            row = {"seed": seed, "seconds": round(time.perf_counter() - t0, 1)}
            for metric in ("reward", "precision"):
                row[f"{metric}_before"] = comparison[metric]["before"]
                row[f"{metric}_after"] = comparison[metric]["after"]
            results.setdefault(name, []).append(row)
            print(f"[compare] {name} seed {seed}: reward {row['reward_before']:.3f} -> {row['reward_after']:.3f}, "
                  f"precision {row['precision_before']:.3f} -> {row['precision_after']:.3f} ({row['seconds']} s)",
                  flush=True)
    return results


def summarise(results: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    table = {}
    for name, rows in results.items():
        summary = {}
        for metric in ("reward", "precision"):
            summary[f"{metric}_mean"], summary[f"{metric}_std"] = mean_std([r[f"{metric}_after"] for r in rows])
            summary[f"{metric}_gain"] = statistics.fmean(r[f"{metric}_after"] - r[f"{metric}_before"] for r in rows)
        table[name] = summary
    return table


def plot(table: dict[str, dict[str, float]], path: Path) -> None:
    figure = Figure(figsize=(8, 3.5))
    FigureCanvasAgg(figure)
    names = list(table)
    for k, metric in enumerate(("reward", "precision")):
        axes = figure.add_subplot(1, 2, k + 1)
        axes.bar(names, [table[n][f"{metric}_mean"] for n in names],
                 yerr=[table[n][f"{metric}_std"] for n in names], capsize=4, color="tab:blue")
        axes.set_title(f"greedy {metric} after PPO (mean ± std over seeds)", fontsize=9)
        axes.tick_params(axis="x", labelsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    results = run_all(args)
    table = summarise(results)
    out = Path(args.out)
    print(f"\n{'estimator':<14}{'reward after':>18}{'gain':>8}{'precision after':>20}{'gain':>8}"
          f"   (seeds {args.seeds})")
    for name, row in table.items():
        print(f"{name:<14}{row['reward_mean']:>10.3f} ± {row['reward_std']:.3f}{row['reward_gain']:>+8.3f}"
              f"{row['precision_mean']:>12.3f} ± {row['precision_std']:.3f}{row['precision_gain']:>+8.3f}")
    write_json_atomic({"seeds": args.seeds, "updates": args.updates, "runs": results, "table": table},
                      out / "result.json")
    plot(table, out / "compare_estimators.png")
    best = max(table, key=lambda n: (table[n]["precision_mean"], table[n]["reward_mean"]))
    print(f"best_estimator={best} precision_gain={table[best]['precision_gain']:.3f}")
    return table


if __name__ == "__main__":
    main()
