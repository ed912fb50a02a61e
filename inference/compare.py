"""Paired comparison of evaluation runs: ``python -m inference.evaluate --compare A B``.

Questions are paired by id, after checking that each shared id names the same question text in
both runs (a mismatch is refused: :class:`envs.question_match.QuestionMismatchError`). For each
metric the difference B − A on the questions both runs hold is reported with a paired bootstrap
95% interval (:mod:`envs.bootstrap`: questions resampled with replacement, the same draw for both
runs); an interval that excludes 0 marks a difference unlikely to be noise of the question sample.
Answer metrics, reward and per-question counts are means over questions; precision and recall are
pooled, as :func:`envs.report.summarize_episodes` pools them.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from envs.bootstrap import RESAMPLES, Statistic, mean_of, paired_bootstrap, pooled_ratio
from envs.question_match import check_same_questions, record_digests
from envs.report import episode_reward
from inference.shards import run_records, shard_files

# (metric name as in metrics.json, statistic over per-question outcomes, printed format)
COMPARED_METRICS: tuple[tuple[str, Statistic, str], ...] = (
    ("em", mean_of("em"), "{:+.3f}"),
    ("f1", mean_of("f1"), "{:+.3f}"),
    ("cover_em", mean_of("cover_em"), "{:+.3f}"),
    ("acc", mean_of("acc"), "{:+.3f}"),
    ("reward_mean", mean_of("reward"), "{:+.3f}"),
    ("answered", mean_of("answered"), "{:+.3f}"),
    ("precision", pooled_ratio("positives_opened", "docs_read"), "{:+.3f}"),
    ("recall", pooled_ratio("positives_opened", "positives_shown"), "{:+.3f}"),
    ("searches_per_question", mean_of("n_searches"), "{:+.2f}"),
    ("docs_read_per_question", mean_of("docs_read"), "{:+.2f}"),
    ("doc_tokens_per_question", mean_of("doc_tokens"), "{:+.0f}"),
    ("invalid_per_question", mean_of("n_invalid"), "{:+.2f}"),
    ("llm_tokens_in_per_question", mean_of("llm_prompt_tokens"), "{:+.0f}"),
    ("llm_tokens_out_per_question", mean_of("llm_completion_tokens"), "{:+.0f}"),
    ("mean_latency_s", mean_of("latency_s"), "{:+.2f}"),
)
COUNT_KEYS = ("n_searches", "docs_read", "doc_tokens", "n_invalid", "positives_opened", "positives_shown",
              "llm_prompt_tokens", "llm_completion_tokens", "latency_s")
ANSWER_KEYS = ("em", "f1", "cover_em", "acc")


class CompareError(ValueError):
    pass


def _number(value) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) else 0.0


def question_outcomes(records: Sequence[dict]) -> dict[str, np.ndarray]:
    """Per-question arrays (n,) of what :data:`COMPARED_METRICS` reads, from ``predictions.jsonl``
    records; a value a record lacks (an errored question) counts 0, as in ``metrics.json``."""
    columns: dict[str, list[float]] = {key: [] for key in (*ANSWER_KEYS, "reward", "answered", *COUNT_KEYS)}
    for record in records:
        metrics = record.get("metrics")
        if not isinstance(metrics, dict):
            metrics = {}
        for key in ANSWER_KEYS:
            columns[key].append(_number(metrics.get(key)))
        columns["reward"].append(_number(episode_reward(record)))
        columns["answered"].append(float(record.get("prediction") is not None))
        for key in COUNT_KEYS:
            columns[key].append(_number(record.get(key)))
    return {key: np.array(values, dtype=np.float64) for key, values in columns.items()}


def load_run_records(run: str | Path) -> list[dict]:
    """A run's per-question records: ``predictions.jsonl`` and, for a data-parallel run not merged
    yet, its shard files (:func:`inference.shards.run_records`)."""
    folder = Path(run)
    if not (folder / "predictions.jsonl").exists() and not shard_files(folder):
        raise CompareError(f"{run}: no predictions.jsonl (a paired comparison needs per-question results)")
    return run_records(folder)


def compare_records(baseline: Sequence[dict], other: Sequence[dict], resamples: int = RESAMPLES,
                    seed: int = 0, baseline_name: str = "the baseline", other_name: str = "the other run") -> dict:
    """The paired comparison of two runs' records: ``other`` − ``baseline`` per metric. Raises
    :class:`envs.question_match.QuestionMismatchError` when an id names different questions in the two runs."""
    check_same_questions(record_digests(baseline), record_digests(other), baseline_name, other_name)
    by_id = {r["id"]: r for r in baseline}
    shared = [r["id"] for r in other if r["id"] in by_id]
    other_by_id = {r["id"]: r for r in other}
    report: dict[str, Any] = {"questions_paired": len(shared), "questions_only_in_baseline": len(by_id) - len(shared),
              "questions_only_in_other": len(other_by_id) - len(shared), "resamples": resamples, "level": 0.95,
              "metrics": {}}
    if not shared:
        return report
    before = question_outcomes([by_id[i] for i in shared])
    after = question_outcomes([other_by_id[i] for i in shared])
    report["both_answered"] = int((before["answered"] * after["answered"]).sum())
    present = {k for k in ANSWER_KEYS if any(k in (r.get("metrics") or {}) for r in (*baseline, *other))}
    for name, statistic, _ in COMPARED_METRICS:
        if name in ANSWER_KEYS and name not in present | {"em", "f1"}:
            continue
        difference = paired_bootstrap(before, after, statistic, resamples=resamples, seed=seed)
        report["metrics"][name] = {**difference.as_dict(), "significant": difference.significant}
    return report


def compare_runs(runs: Sequence[str | Path], resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """Every run after the first against the first (the baseline); what ``compare.json`` holds."""
    if len(runs) < 2:
        raise CompareError("a paired comparison needs two runs or more")
    baseline = load_run_records(runs[0])
    comparisons = []
    for run in runs[1:]:
        report = compare_records(baseline, load_run_records(run), resamples, seed, str(runs[0]), str(run))
        comparisons.append({"baseline": str(runs[0]), "run": str(run), **report})
    return {"baseline": str(runs[0]), "comparisons": comparisons}


def format_comparison(comparison: dict) -> str:
    """One block per compared run: metric, baseline, run, difference [95% interval], real or noise."""
    formats = {name: fmt for name, _, fmt in COMPARED_METRICS}
    blocks = []
    for entry in comparison["comparisons"]:
        head = (f"{Path(entry['run']).name} − {Path(entry['baseline']).name}: {entry['questions_paired']} questions "
                f"in both runs")
        if entry["questions_paired"]:
            head += f" ({entry['both_answered']} answered by both)"
        if entry["questions_only_in_baseline"] or entry["questions_only_in_other"]:
            head += (f"; left out: {entry['questions_only_in_baseline']} only in the baseline, "
                     f"{entry['questions_only_in_other']} only in the other run")
        lines = [head + "; paired bootstrap 95% interval"]
        width = max((len(n) for n in entry["metrics"]), default=0)
        for name, row in entry["metrics"].items():
            fmt = formats[name]
            plain = fmt.replace("+", "")
            verdict = "differs" if row["significant"] else "within noise"
            lines.append(f"  {name.ljust(width)}  {plain.format(row['before'])} -> {plain.format(row['after'])}  "
                         f"diff {fmt.format(row['diff'])} [{fmt.format(row['lo'])}, {fmt.format(row['hi'])}]  "
                         f"{verdict}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
