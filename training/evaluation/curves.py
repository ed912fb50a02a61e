"""Training curves of a PPO run: ``<run>/metrics.jsonl`` and ``<run>/eval.json`` -> ``<run>/curves.png``.

    python -m training.evaluation.curves runs/ppo_default

Nine panels, one point per PPO update (the training rollouts, sampled): reward, EM, selection
precision, recall (positives opened / positives shown), documents read per question, the verdicts'
AUC of π(yes), KL to the reference, policy entropy and the critic's explained variance (the paper's
Fig. 7 is the first five). With ``eval_every``, the greedy held-out evaluations made on the way
(``eval/<metric>`` in metrics.jsonl) are drawn as squares joined by a dashed line. Updates that
trained the critic only (``critic_only``) are shaded; their entropy is NaN and shows as a gap.
The held-out evaluations (greedy) of ``eval.json`` are drawn as two markers on the panels whose
metric they report: "before" just left of the first update, "after" at the last one.

Inputs, all optional except that a run needs at least one of the two files:

- ``metrics.jsonl``: one JSON object per update, as ``training.ppo`` appends them. A line that is
  not a JSON object is an error naming the file and the line (the plot would silently lose points
  otherwise). Values that are not finite numbers (NaN, null, text) are gaps. When an update
  appears twice (a run resumed from an earlier checkpoint logs those updates again), the later
  record wins. Records without ``update`` are placed by their position.
- ``eval.json``, as ``training.ppo`` writes it: ``{"before": {stats}, "after": {stats},
  "questions": n, "comparison": {...}, "per_question": {...}}``; any part may be missing or null.
  ``per_question`` (``{"before"|"after": {"reward": [...], "em": [...], "positives_opened": [...],
  "docs_read": [...]}}``, one entry per held-out question) gives each marker an error bar: the 95%
  percentile bootstrap interval of that evaluation's statistic (questions resampled, the
  statistics of :mod:`training.evaluation.policy_eval`: mean reward, mean EM, pooled selection precision).
  ``comparison`` (``{"reward"|"em"|"precision": {"diff", "lo", "hi", ...}}``, the paired bootstrap
  of after − before) is written into the panel titles.

The PNG is written atomically (a temp file in the run folder, then renamed), drawn with
matplotlib's Agg canvas directly: no pyplot state, no display needed.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

if __package__ in (None, ""):  # `python training/evaluation/curves.py RUN_DIR`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from envs.atomic import atomic_write
from envs.bootstrap import bootstrap_interval as shared_bootstrap_interval
from envs.report import with_current_names
from training.evaluation.policy_eval import CORE_OUTCOME_KEYS, OPTIONAL_OUTCOME_KEYS, STATISTIC_KEYS, STATISTICS

METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.json"
CURVES_FILE = "curves.png"
EVAL_SIDES = ("before", "after")

# (key in metrics.jsonl / eval.json, panel title)
PANELS = (
    ("reward_mean", "reward"),
    ("em", "EM"),
    ("precision", "precision (positives / documents opened)"),
    ("recall", "recall (positives opened / shown)"),
    ("docs_read_per_question", "documents read per question"),
    ("verdict_auc", "verdict AUC of π(yes)"),
    ("kl", "KL to reference"),
    ("entropy", "entropy"),
    ("explained_variance", "explained variance (critic)"),
)
# the greedy held-out evaluations made on the way (``eval_every``): ``eval/<metric>`` in metrics.jsonl
PERIODIC_PREFIX = "eval/"

# the statistic of training.evaluation.policy_eval (eval.json's comparison / per_question) behind a panel's metric
STATISTIC_OF_METRIC = {"reward_mean": "reward", "em": "em", "precision": "precision", "recall": "recall",
                       "docs_read_per_question": "docs"}
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_LEVEL = 0.95

TRAIN_COLOR = "tab:blue"
EVAL_COLORS = {"before": "tab:orange", "after": "tab:green"}
PERIODIC_COLOR = "tab:purple"


class RunFileError(ValueError):
    """A run file exists but cannot be read as documented; the message names the file (and line)."""


# ============================================================================== reading


def finite_or_nan(value) -> float:
    """A finite number as float; anything else (NaN, inf, None, text, bool) as NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    value = float(value)
    return value if math.isfinite(value) else math.nan


def read_metrics(path: Path) -> list[dict]:
    """The update records of ``metrics.jsonl``, one per update, sorted by update.

    Each record gets ``update`` as a float (its position when the line has none) and today's metric
    names (:func:`envs.report.with_current_names`). Blank lines are skipped; any other line that is
    not a JSON object raises :class:`RunFileError`.
    """
    by_update: dict[float, dict] = {}
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise RunFileError(f"{path}, line {line_number}: not valid JSON ({err.msg})") from err
            if not isinstance(record, dict):
                raise RunFileError(f"{path}, line {line_number}: expected a JSON object, "
                                   f"got {type(record).__name__}")
            update = finite_or_nan(record.get("update"))
            if math.isnan(update):
                update = float(len(by_update) + 1)
            by_update[update] = {**with_current_names(record), "update": update}  # a resumed run's wins
    return [by_update[update] for update in sorted(by_update)]


def read_evaluation(path: Path) -> dict | None:
    """``eval.json`` as a dict, its older metric names renamed to today's, or None when the file does not exist."""
    if not path.is_file():
        return None
    try:
        evaluation = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise RunFileError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from err
    if not isinstance(evaluation, dict):
        raise RunFileError(f"{path}: expected a JSON object, got {type(evaluation).__name__}")
    return with_current_names(evaluation)


def evaluation_value(evaluation: dict, side: str, metric: str) -> float:
    stats = evaluation.get(side)
    return finite_or_nan(stats.get(metric)) if isinstance(stats, dict) else math.nan


def question_outcomes(evaluation: dict, side: str) -> dict[str, np.ndarray] | None:
    """One side's per-question outcome arrays (the core ones, which every ``eval.json`` has, and the
    optional ones it recorded), or None unless every outcome is a list of finite numbers, all of the
    same non-zero length."""
    blocks = evaluation.get("per_question")
    block = blocks.get(side) if isinstance(blocks, dict) else None
    if not isinstance(block, dict):
        return None
    keys = [*CORE_OUTCOME_KEYS, *(key for key in OPTIONAL_OUTCOME_KEYS if isinstance(block.get(key), list))]
    columns = [column for column in map(block.get, keys) if isinstance(column, list) and column]
    if len(columns) != len(keys) or len({len(column) for column in columns}) != 1:
        return None
    arrays = {key: np.array([finite_or_nan(value) for value in column]) for key, column in zip(keys, columns)}
    return None if any(np.isnan(array).any() for array in arrays.values()) else arrays


def bootstrap_interval(outcomes: dict[str, np.ndarray], statistic: str, resamples: int = BOOTSTRAP_RESAMPLES,
                       level: float = BOOTSTRAP_LEVEL, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of one evaluation's statistic (:func:`envs.bootstrap.bootstrap_interval`)."""
    return shared_bootstrap_interval(outcomes, STATISTICS[statistic], resamples, level, seed)


def evaluation_interval(evaluation: dict, side: str, metric: str) -> tuple[float, float] | None:
    """The error bar of one marker, when eval.json has that side's per-question outcomes."""
    statistic = STATISTIC_OF_METRIC.get(metric)
    outcomes = question_outcomes(evaluation, side) if statistic else None
    if statistic is None or outcomes is None or not all(key in outcomes for key in STATISTIC_KEYS[statistic]):
        return None
    return bootstrap_interval(outcomes, statistic)


def evaluation_difference(evaluation: dict, metric: str) -> tuple[float, float, float] | None:
    """(after − before, low, high) of the paired bootstrap in ``comparison``, or None."""
    comparisons = evaluation.get("comparison")
    row = comparisons.get(STATISTIC_OF_METRIC.get(metric)) if isinstance(comparisons, dict) else None
    if not isinstance(row, dict):
        return None
    diff, low, high = (finite_or_nan(row.get(key)) for key in ("diff", "lo", "hi"))
    values = (diff, low, high)
    return None if any(math.isnan(value) for value in values) else values


# ============================================================================== drawing


def critic_only_spans(records: list[dict]) -> list[tuple[float, float]]:
    """Contiguous runs of critic-only updates as (first, last) update numbers."""
    spans: list[tuple[float, float]] = []
    for record in records:
        if finite_or_nan(record.get("critic_only")) != 1.0:
            continue
        update = record["update"]
        if spans and update - spans[-1][1] <= 1.0:
            spans[-1] = (spans[-1][0], update)
        else:
            spans.append((update, update))
    return spans


def evaluation_positions(records: list[dict]) -> dict[str, float]:
    """Where the before/after markers go on the update axis."""
    if not records:
        return {"before": 0.0, "after": 1.0}
    return {"before": records[0]["update"] - 1.0, "after": records[-1]["update"]}


def draw_training_curve(axis, records: list[dict], metric: str) -> bool:
    """Plot one metric per update; False when no record has a finite value for it."""
    values = [finite_or_nan(record.get(metric)) for record in records]
    if all(math.isnan(value) for value in values):
        return False
    axis.plot([record["update"] for record in records], values, ".-", color=TRAIN_COLOR, linewidth=1,
              markersize=4)
    return True


def draw_periodic_evaluations(axis, records: list[dict], metric: str) -> bool:
    """The greedy held-out evaluations made every ``eval_every`` updates, joined by a dashed line;
    False when no record has one for this metric."""
    points = [(record["update"], finite_or_nan(record.get(PERIODIC_PREFIX + metric))) for record in records]
    points = [(update, value) for update, value in points if not math.isnan(value)]
    if not points:
        return False
    axis.plot(*zip(*points), "s--", color=PERIODIC_COLOR, linewidth=1, markersize=5, zorder=2)
    return True


def draw_evaluation(axis, evaluation: dict, metric: str, positions: dict[str, float]) -> bool:
    """The before/after markers (with interval bars when given); False when neither side has the metric."""
    drawn = False
    for side in EVAL_SIDES:
        value = evaluation_value(evaluation, side, metric)
        if math.isnan(value):
            continue
        interval = evaluation_interval(evaluation, side, metric)
        error = None if interval is None else [[max(0.0, value - interval[0])], [max(0.0, interval[1] - value)]]
        axis.errorbar([positions[side]], [value], yerr=error, fmt="D", color=EVAL_COLORS[side], markersize=6,
                      capsize=4, zorder=3)
        drawn = True
    return drawn


def panel_title(title: str, evaluation: dict | None, metric: str) -> str:
    difference = evaluation_difference(evaluation, metric) if evaluation else None
    if difference is None:
        return title
    delta, low, high = difference
    return f"{title}\nafter − before: {delta:+.3f} [{low:+.3f}, {high:+.3f}]"


def draw_panel(axis, metric: str, title: str, records: list[dict], evaluation: dict | None,
               spans: list[tuple[float, float]]) -> None:
    for first, last in spans:
        axis.axvspan(first - 0.5, last + 0.5, color="0.85", zorder=0)
    has_curve = draw_training_curve(axis, records, metric)
    has_curve = draw_periodic_evaluations(axis, records, metric) or has_curve
    has_eval = evaluation is not None and draw_evaluation(axis, evaluation, metric,
                                                          evaluation_positions(records))
    if not (has_curve or has_eval):
        axis.text(0.5, 0.5, "not logged", transform=axis.transAxes, ha="center", va="center", color="0.5")
    axis.set_title(panel_title(title, evaluation, metric), fontsize=10)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.tick_params(labelsize=8)
    axis.grid(True, alpha=0.3)


def legend_handles(records: list[dict], evaluation: dict | None, spans: list) -> list[Artist]:
    handles: list[Artist] = []
    if records:
        handles.append(Line2D([], [], color=TRAIN_COLOR, marker=".", label="training rollouts (per update)"))
    if any(key.startswith(PERIODIC_PREFIX) for record in records for key in record):
        handles.append(Line2D([], [], color=PERIODIC_COLOR, marker="s", linestyle="--",
                              label="held-out eval on the way (greedy, eval_every)"))
    for side in EVAL_SIDES:
        if evaluation is not None and isinstance(evaluation.get(side), dict):
            bars = " (95% bootstrap interval)" if question_outcomes(evaluation, side) is not None else ""
            handles.append(Line2D([], [], color=EVAL_COLORS[side], marker="D", linestyle="none",
                                  label=f"held-out eval {side}{bars}"))
    if spans:
        handles.append(Patch(color="0.85", label="critic-only updates"))
    return handles


def figure_title(run_dir: Path, records: list[dict], evaluation: dict | None) -> str:
    parts = [f"{run_dir.name}: {len(records)} updates" if records else f"{run_dir.name}: no {METRICS_FILE}"]
    questions = evaluation.get("questions") if evaluation else None
    if isinstance(questions, int) and not isinstance(questions, bool):
        parts.append(f"eval on {questions} held-out questions")
    elif evaluation is None:
        parts.append(f"no {EVAL_FILE}")
    return ", ".join(parts)


def build_figure(run_dir: Path, records: list[dict], evaluation: dict | None) -> Figure:
    figure = Figure(figsize=(14, 11), layout="constrained")
    FigureCanvasAgg(figure)
    spans = critic_only_spans(records)
    axes = figure.subplots(3, 3, sharex=True)
    for axis, (metric, title) in zip(axes.ravel(), PANELS):
        draw_panel(axis, metric, title, records, evaluation, spans)
    for axis in axes[-1]:
        axis.set_xlabel("update", fontsize=9)
    figure.suptitle(figure_title(run_dir, records, evaluation))
    handles = legend_handles(records, evaluation, spans)
    if handles:
        figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=9)
    return figure


# ============================================================================== entry points


def write_curves(output_dir: str | Path) -> Path:
    """Draw ``<output_dir>/curves.png`` from the run's metrics and evaluation; returns its path.

    Raises FileNotFoundError when the folder holds neither ``metrics.jsonl`` nor ``eval.json``,
    and :class:`RunFileError` (a ValueError) when one of them is malformed.
    """
    run_dir = Path(output_dir)
    metrics_path, eval_path = run_dir / METRICS_FILE, run_dir / EVAL_FILE
    if not metrics_path.is_file() and not eval_path.is_file():
        raise FileNotFoundError(f"{run_dir}: neither {METRICS_FILE} nor {EVAL_FILE} to plot")
    records = read_metrics(metrics_path) if metrics_path.is_file() else []
    evaluation = read_evaluation(eval_path)
    figure = build_figure(run_dir, records, evaluation)
    target = run_dir / CURVES_FILE
    with atomic_write(target, "wb") as handle:
        figure.savefig(handle, format="png", dpi=100)
    return target


def write_curves_or_warn(output_dir: str | Path, log: Callable[[str], None] = print) -> Path | None:
    """:func:`write_curves` for the end of training: a plot problem is reported, never raised,
    so it cannot cost a finished run its export or shutdown."""
    try:
        path = write_curves(output_dir)
    except (OSError, ValueError) as err:
        log(f"[curves] no {CURVES_FILE}: {err}")
        return None
    log(f"[curves] wrote {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.evaluation.curves", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a training output folder (holds metrics.jsonl)")
    args = parser.parse_args(argv)
    try:
        path = write_curves(args.run_dir)
    except (OSError, ValueError) as err:
        print(f"curves: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
