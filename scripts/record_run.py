"""Record a finished PPO run, or a seed spread over runs, in experiments/: its rows in runs.csv and its
evaluation files kept beside them, so that a later ``training.seed_spread`` can pool it again after the
run folder is gone.

    python scripts/record_run.py r104 runs/hpa-s1 --seed 1 \\
        --command "python -m training.ppo --config configs/ppo/hotpotqa.yaml --run.seed 1 ..." \\
        --note "HotpotQA recipe, seed 1"
    python -m training.seed_spread runs/hpa-s0 runs/hpa-s1 runs/hpa-s2 --out spread.json
    python scripts/record_run.py spread-r102-r105 spread.json --seed 0-2 --command "python -m training.seed_spread ..."

A run folder (``eval.json`` as the trainer writes it) gives one row per statistic of its before/after
comparison (reward, em, precision, recall, f1, docs, copy where recorded: before, after, diff and the
paired bootstrap interval), the verdict AUC (before, after, diff) and π(yes) on positives and negatives;
its ``eval.json`` and ``config.yaml`` are copied to ``experiments/evals/<run id>/``, a folder that
``training.seed_spread`` reads like the run's own. A ``seed_spread --out`` JSON gives the pooled rows with
the sd over runs, and is copied there as ``spread.json``. Refused: an id runs.csv already holds, a
folder or file that is neither. Rows are appended in one write (the csv is rewritten atomically).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

from envs.atomic import write_text_atomic
from training.seed_spread import finite_pair

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["run_id", "date", "commit", "machine", "command", "seed", "legacy", "metric",
           "before", "after", "diff", "lo", "hi", "sd", "note"]
STATISTIC_ROWS = ("reward", "em", "precision", "recall", "f1", "docs", "copy")  # in this order, where recorded


def fmt(value) -> str:
    """A figure as runs.csv writes it: three decimals; blank where there is none or it is undefined (NaN)."""
    return "" if value is None or not math.isfinite(float(value)) else f"{float(value):.3f}"


def figure_rows(table: dict, sd_key: str | None) -> list[dict[str, str]]:
    """Rows (metric, before, after, diff, lo, hi[, sd]) of a comparison keyed by statistic name."""
    return [{"metric": name, **{k: fmt(table[name][k]) for k in ("before", "after", "diff", "lo", "hi")},
             "sd": fmt(table[name][sd_key]) if sd_key else ""}
            for name in STATISTIC_ROWS if name in table]


def run_rows(evaluation: dict) -> list[dict[str, str]]:
    """A run's rows from its ``eval.json``: the comparison, then the verdicts' AUC and π(yes) levels."""
    rows = figure_rows(evaluation["comparison"], None)
    before, after = evaluation["before"], evaluation["after"]
    auc = finite_pair(before, after, "verdict_auc")  # undefined (NaN) where no verdicts or one class: no row
    if auc:
        before_auc, after_auc = auc
        rows.append({"metric": "verdict_auc", "before": fmt(before_auc), "after": fmt(after_auc),
                     "diff": fmt(after_auc - before_auc)})
    for metric, key in (("pi_yes_positives", "yes_prob_positive"), ("pi_yes_negatives", "yes_prob_negative")):
        pair = finite_pair(before, after, key)
        if pair:
            rows.append({"metric": metric, "before": fmt(pair[0]), "after": fmt(pair[1])})
    return rows


def spread_rows(result: dict) -> list[dict[str, str]]:
    """A seed spread's pooled rows (with the sd of the runs' differences) and its verdict AUC over runs."""
    rows = figure_rows(result["pooled"], "diff_sd")
    auc = result.get("verdict_auc")
    if auc:
        rows.append({"metric": "verdict_auc", **{k: fmt(auc[k]) for k in ("before", "after", "diff", "lo", "hi")},
                     "sd": fmt(auc["diff_sd"])})
    return rows


def read_source(source: Path) -> tuple[list[dict[str, str]], dict[str, Path]]:
    """The rows a run folder or a spread JSON gives, and the files to keep (name in the archive -> path)."""
    if source.is_dir():
        if not (source / "eval.json").is_file():
            raise SystemExit(f"record_run: {source} has no eval.json (is the run finished?)")
        keep = {name: source / name for name in ("eval.json", "config.yaml") if (source / name).is_file()}
        return run_rows(json.loads((source / "eval.json").read_text())), keep
    if source.is_file():
        result = json.loads(source.read_text())
        if "pooled" not in result:
            raise SystemExit(f"record_run: {source} is not a training.seed_spread --out JSON (no 'pooled')")
        return spread_rows(result), {"spread.json": source}
    raise SystemExit(f"record_run: {source} does not exist")


def head_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def append_rows(runs_csv: Path, rows: list[dict[str, str]]) -> None:
    """Append ``rows`` to ``runs_csv``, refusing a run id it already holds; one atomic rewrite."""
    text = runs_csv.read_text()
    held = {row["run_id"] for row in csv.DictReader(io.StringIO(text))}
    if rows[0]["run_id"] in held:
        raise SystemExit(f"record_run: {runs_csv} already holds run {rows[0]['run_id']!r}")
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writerows({column: row.get(column, "") for column in COLUMNS} for row in rows)
    write_text_atomic(text + ("" if text.endswith("\n") else "\n") + out.getvalue(), runs_csv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_id", help="a new id (r104, spread-r102-r105, ...)")
    parser.add_argument("source", type=Path, help="a run folder with eval.json, or a seed_spread --out JSON")
    parser.add_argument("--command", required=True, help="the command that produced it, as a user would type it")
    parser.add_argument("--seed", default="", help="the run's seed (a range such as 0-2 for a spread)")
    parser.add_argument("--note", default="", help="what the run was, in a sentence")
    parser.add_argument("--machine", default="epyc-avx512bf16", help="the machine's tag in runs.csv")
    parser.add_argument("--commit", default=None, help="the commit it ran at (default: HEAD)")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--experiments", type=Path, default=ROOT / "experiments", help="runs.csv and evals/ live here")
    args = parser.parse_args(argv)
    figures, keep = read_source(args.source)
    if not figures:
        raise SystemExit(f"record_run: {args.source} holds no figures")
    common = {"run_id": args.run_id, "date": args.date, "commit": args.commit if args.commit is not None
              else head_commit(), "machine": args.machine, "command": args.command, "seed": args.seed,
              "note": args.note}
    rows = [{**common, **figure} for figure in figures]
    append_rows(args.experiments / "runs.csv", rows)
    archive = args.experiments / "evals" / args.run_id
    archive.mkdir(parents=True, exist_ok=True)
    for name, path in keep.items():
        shutil.copyfile(path, archive / name)
    for row in rows:
        cell = {column: row.get(column, "") for column in ("before", "after", "diff", "lo", "hi", "sd")}
        print(f"{row['metric']:>16} {cell['before']:>7} -> {cell['after']:>7}  diff {cell['diff']:>7} "
              f"[{cell['lo']}, {cell['hi']}]  sd {cell['sd']}")
    print(f"record_run: {len(rows)} rows of {args.run_id} appended to {args.experiments / 'runs.csv'}; kept {archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
