"""scripts/compare_estimators.py: the table, the plot, the result file and the last line, from runs
given to it (the runs themselves are the learning test's trainer, tested there)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import compare_estimators  # noqa: E402


def rows(after: list[float]) -> list[dict]:
    return [{"seed": s, "seconds": 1.0, "reward_before": 0.0, "reward_after": a, "precision_before": 0.1,
             "precision_after": a} for s, a in enumerate(after)]


def test_summary_table_plot_and_last_line(tmp_path, monkeypatch, capsys):
    results = {"grpo": rows([1.0, 0.5]), "rloo": rows([0.75, 0.75])}
    monkeypatch.setattr(compare_estimators, "run_all", lambda args: results)
    table = compare_estimators.main(["--estimators", "grpo", "rloo", "--seeds", "0", "1", "--out", str(tmp_path)])
    assert table["grpo"]["precision_mean"] == pytest.approx(0.75)
    assert table["grpo"]["precision_std"] == pytest.approx(0.3535534, abs=1e-6)  # stdev(1.0, 0.5)
    assert table["rloo"]["precision_std"] == 0.0
    assert table["grpo"]["precision_gain"] == pytest.approx(0.65)
    # equal precision means: the reward breaks the tie (also equal here), then the first listed wins
    assert capsys.readouterr().out.strip().splitlines()[-1] == "best_estimator=grpo precision_gain=0.650"
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["runs"] == results and saved["seeds"] == [0, 1]
    assert (tmp_path / "compare_estimators.png").stat().st_size > 0
