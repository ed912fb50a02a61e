"""scripts/record_run.py: a finished run's rows in runs.csv and its eval.json kept in experiments/evals/,
from which training.seed_spread pools it again once the run folder is gone."""
from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest

from scripts.record_run import COLUMNS
from scripts.record_run import main as record
from training.evaluation.ppo_report import report_before_after
from training.seed_spread import main as seed_spread


class Printer:
    is_main_process = True

    def print(self, *args, **kwargs) -> None:
        pass


def outcomes(opened, shown, docs, em) -> dict[str, np.ndarray]:
    opened, docs = np.asarray(opened, dtype=np.float64), np.asarray(docs, dtype=np.float64)
    return {"reward": opened - 0.5 * docs, "em": np.asarray(em, dtype=np.float64), "positives_opened": opened,
            "docs_read": docs, "positives_shown": np.asarray(shown, dtype=np.float64),
            "copied_question": np.zeros(len(docs))}


def finished_run(folder, seed: int, verdict_auc_before: float = 0.5):
    """A run folder as the trainer leaves it: eval.json (report_before_after) and config.yaml."""
    folder.mkdir()
    rng = np.random.default_rng(seed)
    n = 24
    shown = np.full(n, 2.0)
    before = outcomes(rng.integers(0, 2, n), shown, np.full(n, 3.0), rng.integers(0, 2, n))
    after = outcomes(rng.integers(1, 3, n), shown, np.full(n, 2.0), rng.integers(0, 2, n))
    summary = {"verdict_auc": verdict_auc_before, "yes_prob_positive": 0.7, "yes_prob_negative": 0.6, "verdicts": 40.0,
               "docs_read_per_question": 3.0}
    after_summary = {**summary, "verdict_auc": 0.75, "yes_prob_negative": 0.4, "docs_read_per_question": 2.0}
    report_before_after(Printer(), folder, summary, after_summary, before, after, seed=0,
                        questions=[f"question {i}" for i in range(n)])
    (folder / "config.yaml").write_text(f"run:\n  seed: {seed}\n")
    return folder


@pytest.fixture
def experiments(tmp_path):
    folder = tmp_path / "experiments"
    folder.mkdir()
    (folder / "runs.csv").write_text(",".join(COLUMNS) + "\n")
    return folder


def csv_rows(experiments) -> list[dict[str, str]]:
    with (experiments / "runs.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_run_is_recorded_with_its_figures_and_kept_for_pooling(tmp_path, experiments, capsys):
    run = finished_run(tmp_path / "s0", 0)
    evaluation = json.loads((run / "eval.json").read_text())
    assert record(["r9", str(run), "--command", "python -m training.ppo --run.seed 0", "--seed", "0",
                   "--commit", "abc1234", "--note", "tiny", "--experiments", str(experiments)]) == 0
    rows = {row["metric"]: row for row in csv_rows(experiments)}
    assert list(rows) == ["reward", "em", "precision", "recall", "f1", "docs", "copy", "verdict_auc",
                          "pi_yes_positives", "pi_yes_negatives"]
    for metric in ("precision", "recall", "em"):
        want = evaluation["comparison"][metric]
        assert [float(rows[metric][k]) for k in ("before", "after", "diff", "lo", "hi")] == pytest.approx(
            [want[k] for k in ("before", "after", "diff", "lo", "hi")], abs=5e-4)
    assert (rows["verdict_auc"]["before"], rows["verdict_auc"]["after"], rows["verdict_auc"]["diff"]) == (
        "0.500", "0.750", "0.250")
    assert rows["pi_yes_negatives"]["after"] == "0.400" and rows["pi_yes_negatives"]["diff"] == ""
    assert {row["commit"] for row in rows.values()} == {"abc1234"} and rows["em"]["seed"] == "0"
    kept = experiments / "evals" / "r9"
    assert json.loads((kept / "eval.json").read_text()) == evaluation and (kept / "config.yaml").is_file()


def test_the_kept_folders_pool_like_the_runs_and_the_spread_is_recorded(tmp_path, experiments, capsys):
    runs = [finished_run(tmp_path / f"s{seed}", seed) for seed in range(3)]
    for i, run in enumerate(runs):
        record([f"r{i}", str(run), "--command", "x", "--experiments", str(experiments)])
    for run in runs:
        shutil.rmtree(run)  # the machine is gone: only experiments/ is left
    kept = [str(experiments / "evals" / f"r{i}") for i in range(3)]
    spread_json = tmp_path / "spread.json"
    assert seed_spread([*kept, "--out", str(spread_json)]) == 0
    result = json.loads(spread_json.read_text())
    capsys.readouterr()
    assert record(["spread-r0-r2", str(spread_json), "--command", "python -m training.seed_spread",
                   "--seed", "0-2", "--experiments", str(experiments)]) == 0
    spread = {row["metric"]: row for row in csv_rows(experiments) if row["run_id"] == "spread-r0-r2"}
    assert float(spread["f1"]["diff"]) == pytest.approx(result["pooled"]["f1"]["diff"], abs=5e-4)
    assert float(spread["f1"]["sd"]) == pytest.approx(result["pooled"]["f1"]["diff_sd"], abs=5e-4)
    assert spread["verdict_auc"]["diff"] == "0.250" and spread["verdict_auc"]["sd"] == "0.000"
    assert (experiments / "evals" / "spread-r0-r2" / "spread.json").is_file()


def test_an_undefined_verdict_auc_gives_no_row_and_no_nan(tmp_path, experiments, capsys):
    run = finished_run(tmp_path / "s0", 0, verdict_auc_before=float("nan"))  # one class missing before PPO
    assert np.isnan(json.loads((run / "eval.json").read_text())["before"]["verdict_auc"])
    record(["r9", str(run), "--command", "x", "--experiments", str(experiments)])
    rows = {row["metric"]: row for row in csv_rows(experiments)}
    assert "verdict_auc" not in rows and rows["pi_yes_positives"]["after"] == "0.700"
    assert "nan" not in (experiments / "runs.csv").read_text().lower()
    pooled = experiments / "evals" / "r9"
    assert seed_spread([str(pooled), str(pooled), "--out", str(tmp_path / "s.json")]) == 0  # kept file still pools


def test_an_id_already_held_or_an_unfinished_run_is_refused(tmp_path, experiments):
    run = finished_run(tmp_path / "s0", 0)
    record(["r9", str(run), "--command", "x", "--experiments", str(experiments)])
    before = (experiments / "runs.csv").read_text()
    with pytest.raises(SystemExit, match="already holds run 'r9'"):
        record(["r9", str(run), "--command", "x", "--experiments", str(experiments)])
    (tmp_path / "unfinished").mkdir()
    with pytest.raises(SystemExit, match="no eval.json"):
        record(["r10", str(tmp_path / "unfinished"), "--command", "x", "--experiments", str(experiments)])
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a training.seed_spread"):
        record(["r10", str(tmp_path / "other.json"), "--command", "x", "--experiments", str(experiments)])
    assert (experiments / "runs.csv").read_text() == before
