"""Which advantage estimator, and which loss aggregation, learns the search task? A measured comparison
on the learning test's world (:mod:`scripts.box_world`: five boxes per search, one full; the reward
counts what was opened), both tables from one run.

    python scripts/compare_estimators.py                          # 7 estimators + 4 aggregations, seeds 0 1 2
    python scripts/compare_estimators.py --estimators grpo rloo --seeds 0 1 2 3 4 --updates 10
    python scripts/compare_estimators.py --tables aggregations --agg-estimator grpo

One SFT warm start (the scripted teacher that opens two random boxes) is shared by every run, so
runs differ in the estimator or aggregation and the PPO seed only, with the same budget (updates,
episodes, PPO epochs, learning rate) as the learning test. Each run evaluates greedily on the 24
held-out questions before and after PPO. Estimators (the ``estimators`` table):

- ``gae``: a critic (a second tiny decoder), GAE with γ = λ = 1, whitened; no critic-only warm-up
  updates, so every estimator gets the same actor updates;
- ``grpo``: group mean and std over a question's 8 samples;
- ``dr_grpo``: Dr. GRPO, the group mean only, and the loss summed over each sequence's tokens divided
  by a constant (``loss_agg: seq_mean_token_sum_norm``);
- ``rloo``: leave-one-out group mean;
- ``reinforce_pp``: REINFORCE++, the batch-whitened token-level return-to-go;
- ``reinforce_pp_baseline``: REINFORCE++-baseline, the group mean subtracted, then whitened over the batch;
- ``gspo``: GSPO, grpo's advantages with one length-normalised ratio per sequence clipped per sequence
  (``policy_loss: gspo``), its paper's ``loss_agg: seq_mean_token_mean`` and clip range 3e-4 / 4e-4.

The ``aggregations`` table runs one estimator (``--agg-estimator``, default ``rloo``) with each
``loss_agg`` (token_mean, seq_mean_token_mean, seq_mean_token_sum, seq_mean_token_sum_norm; formulas in
``training.algorithm.ppo_core.aggregate_loss``). A run whose resolved config equals one already run (``rloo``
with its default ``token_mean``) is not run twice: its row points at the same ``run_dir``.

It prints each table of reward and precision after training (mean ± std over seeds, with the mean gain
over the warm start), writes ``<out>/result.json`` and ``<out>/compare_estimators.png``, and ends with
``best_estimator=<name> precision_gain=<x> best_loss_agg=<name> loss_agg_precision_gain=<x>`` (the
pairs of the tables run; best: the highest mean precision after PPO, ties broken by reward, then order).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from envs.atomic import write_json_atomic  # noqa: E402
from envs.typed_config import to_dict  # noqa: E402
from scripts.box_world import build, ppo_config, warm_start  # noqa: E402
from training.algorithm.ppo_core import LOSS_AGGREGATIONS  # noqa: E402
from training.ppo import train  # noqa: E402

ESTIMATORS = {  # PPOConfig overrides by dotted name (envs.typed_config.with_values)
    "gae": {"algorithm.advantage": "gae", "optim.critic_warmup_updates": 0, "optim.lr_critic": 1e-3},
    "grpo": {"algorithm.advantage": "grpo"},
    "dr_grpo": {"algorithm.advantage": "grpo", "algorithm.grpo_std_normalize": False,
                "algorithm.loss_agg": "seq_mean_token_sum_norm"},
    "rloo": {"algorithm.advantage": "rloo"},
    "reinforce_pp": {"algorithm.advantage": "reinforce_pp"},
    "reinforce_pp_baseline": {"algorithm.advantage": "reinforce_pp_baseline"},
    "gspo": {"algorithm.advantage": "grpo", "algorithm.policy_loss": "gspo",
             "algorithm.loss_agg": "seq_mean_token_mean", "algorithm.clip_low": 3e-4, "algorithm.clip_high": 4e-4},
}
TABLES = ("estimators", "aggregations")
ROW_LABEL = {"estimators": "estimator", "aggregations": "loss_agg"}
LAST_LINE_KEYS = {"estimators": ("best_estimator", "precision_gain"),
                  "aggregations": ("best_loss_agg", "loss_agg_precision_gain")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", nargs="+", default=list(TABLES), choices=TABLES,
                        help="which tables to measure (default both)")
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=list(ESTIMATORS))
    parser.add_argument("--aggregations", nargs="+", default=list(LOSS_AGGREGATIONS), choices=LOSS_AGGREGATIONS)
    parser.add_argument("--agg-estimator", default="rloo", choices=list(ESTIMATORS),
                        help="the estimator every row of the aggregations table uses (default rloo)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--out", default="runs/compare_estimators")
    return parser.parse_args(argv)


def variants(args: argparse.Namespace) -> dict[str, dict[str, dict]]:
    """{table: {row name: PPOConfig overrides}} for the tables asked for, in TABLES order."""
    rows = {"estimators": {name: ESTIMATORS[name] for name in args.estimators},
            "aggregations": {agg: {**ESTIMATORS[args.agg_estimator], "algorithm.loss_agg": agg}
                             for agg in args.aggregations}}
    return {table: rows[table] for table in TABLES if table in args.tables}


def run_dir(table: str, name: str, seed: int) -> str:
    return f"{name}-seed{seed}" if table == "estimators" else f"agg-{name}-seed{seed}"


def config_key(config) -> str:
    """The resolved config without its output folder: two runs with the same key are the same run."""
    values = to_dict(config)
    values["run"].pop("output_dir")
    return json.dumps(values, sort_keys=True, default=str)


def run_one(world: dict, config) -> dict:
    """One PPO run; its greedy reward and precision before and after on the held-out questions."""
    t0 = time.perf_counter()
    comparison = train(config, retriever=world["retriever"], examples=world["train"],
                       eval_examples=world["held_out"])["comparison"]
    row = {"seconds": round(time.perf_counter() - t0, 1)}
    for metric in ("reward", "precision"):
        row[f"{metric}_before"] = comparison[metric]["before"]
        row[f"{metric}_after"] = comparison[metric]["after"]
    return row


def run_all(args: argparse.Namespace) -> dict[str, dict[str, list[dict]]]:
    """{table: {row name: [{seed, run_dir, reward_before, reward_after, precision_before, precision_after,
    seconds}]}}; a config already run (same key) is reused, not run again."""
    out = Path(args.out)
    world = build(out)
    sft_dir = warm_start(world)
    done: dict[str, dict] = {}
    results: dict[str, dict[str, list[dict]]] = {}
    for table, rows in variants(args).items():
        for name, overrides in rows.items():
            for seed in args.seeds:
                folder = run_dir(table, name, seed)
                config = ppo_config(world, sft_dir, {"run.seed": seed, "optim.updates": args.updates,
                                                     "run.output_dir": str(out / folder), **overrides})
                key = config_key(config)
                if key not in done:
                    done[key] = {"seed": seed, "run_dir": folder, **run_one(world, config)}
                row = done[key]
                results.setdefault(table, {}).setdefault(name, []).append(row)
                print(f"[compare] {table} {name} seed {seed}: reward {row['reward_before']:.3f} -> "
                      f"{row['reward_after']:.3f}, precision {row['precision_before']:.3f} -> "
                      f"{row['precision_after']:.3f} ({row['seconds']} s, {row['run_dir']})", flush=True)
    return results


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(results: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """One table: {row name: {reward|precision _mean, _std (after PPO, over seeds), _gain (mean after − before)}}."""
    table = {}
    for name, rows in results.items():
        summary = {}
        for metric in ("reward", "precision"):
            summary[f"{metric}_mean"], summary[f"{metric}_std"] = mean_std([r[f"{metric}_after"] for r in rows])
            summary[f"{metric}_gain"] = statistics.fmean(r[f"{metric}_after"] - r[f"{metric}_before"] for r in rows)
        table[name] = summary
    return table


def best(table: dict[str, dict[str, float]]) -> str:
    """The highest mean precision after PPO, ties broken by reward, then by the order of the table."""
    return max(table, key=lambda n: (table[n]["precision_mean"], table[n]["reward_mean"]))


def print_table(kind: str, table: dict[str, dict[str, float]], seeds: list[int]) -> None:
    label = ROW_LABEL[kind]
    print(f"\n{label:<26}{'reward after':>18}{'gain':>8}{'precision after':>20}{'gain':>8}   (seeds {seeds})")
    for name, row in table.items():
        print(f"{name:<26}{row['reward_mean']:>10.3f} ± {row['reward_std']:.3f}{row['reward_gain']:>+8.3f}"
              f"{row['precision_mean']:>12.3f} ± {row['precision_std']:.3f}{row['precision_gain']:>+8.3f}")


def plot(tables: dict[str, dict[str, dict[str, float]]], path: Path) -> None:
    """One row of bar charts (reward, precision after PPO) per table."""
    figure = Figure(figsize=(9, 3.5 * len(tables)))
    FigureCanvasAgg(figure)
    for row, (kind, table) in enumerate(tables.items()):
        names = list(table)
        for k, metric in enumerate(("reward", "precision")):
            axes = figure.add_subplot(len(tables), 2, 2 * row + k + 1)
            axes.bar(names, [table[n][f"{metric}_mean"] for n in names],
                     yerr=[table[n][f"{metric}_std"] for n in names], capsize=4,
                     color="tab:blue" if kind == "estimators" else "tab:orange")
            axes.set_title(f"{ROW_LABEL[kind]}: greedy {metric} after PPO (mean ± std over seeds)", fontsize=9)
            axes.tick_params(axis="x", labelsize=7, labelrotation=15)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    args = parse_args(argv)
    t0 = time.perf_counter()
    results = run_all(args)
    tables = {kind: summarise(results[kind]) for kind in TABLES if kind in results}
    out = Path(args.out)
    for kind, table in tables.items():
        print_table(kind, table, args.seeds)
    wall = round(time.perf_counter() - t0, 1)
    write_json_atomic({"seeds": args.seeds, "updates": args.updates, "agg_estimator": args.agg_estimator,
                       "wall_seconds": wall, "runs": results, "tables": tables}, out / "result.json")
    plot(tables, out / "compare_estimators.png")
    print(f"\nwall time {wall} s")
    pairs = []
    for kind, table in tables.items():
        name_key, gain_key = LAST_LINE_KEYS[kind]
        winner = best(table)
        pairs.append(f"{name_key}={winner} {gain_key}={table[winner]['precision_gain']:.3f}")
    print(" ".join(pairs))
    return tables


if __name__ == "__main__":
    main()
