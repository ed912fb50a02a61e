"""Before/after over several runs: the two-level bootstrap (runs, then questions) and the
``python -m training.seed_spread`` report."""
from __future__ import annotations

import json

import numpy as np
import pytest

from envs.bootstrap import mean_of, multi_run_paired_bootstrap, paired_bootstrap, pooled_ratio, runs_and_questions_rows
from training.seed_spread import main, read_run, verdict_auc_spread


def outcomes(reward, positives, docs) -> dict[str, np.ndarray]:
    reward = np.asarray(reward, dtype=np.float64)
    return {"reward": reward, "em": (reward > 0).astype(np.float64),
            "positives_opened": np.asarray(positives, dtype=np.float64),
            "docs_read": np.asarray(docs, dtype=np.float64)}


def test_each_resample_draws_runs_and_one_question_set_shared_by_them():
    rows = runs_and_questions_rows(runs=3, n=5, resamples=200, seed=1)
    assert rows.shape == (200, 3, 5)
    runs, questions = rows // 5, rows % 5
    assert (runs == runs[:, :, :1]).all()  # one run per block
    assert (questions == questions[:, :1, :]).all()  # the same questions in every block of a resample
    assert len(np.unique(runs)) == 3 and len(np.unique(questions)) == 5


def test_the_pooled_interval_carries_the_spread_between_seeds():
    n = 40
    zero = outcomes(np.zeros(n), np.zeros(n), np.ones(n))
    up, down = outcomes(np.ones(n), np.ones(n), np.ones(n)), outcomes(-np.ones(n), np.zeros(n), np.ones(n))
    change = multi_run_paired_bootstrap([zero, zero], [up, down], mean_of("reward"), resamples=400)
    assert change.diff == 0.0
    assert change.lo == pytest.approx(-1.0) and change.hi == pytest.approx(1.0)  # one seed up, one down
    # pooled as if one run, the questions alone would call the same data a certain zero
    flat = paired_bootstrap({k: np.concatenate([zero[k], zero[k]]) for k in zero},
                            {k: np.concatenate([up[k], down[k]]) for k in up}, mean_of("reward"))
    assert flat.hi - flat.lo < 0.6 * (change.hi - change.lo)
    agreeing = multi_run_paired_bootstrap([zero, zero], [up, up], mean_of("reward"), resamples=400)
    assert agreeing.lo == agreeing.hi == 1.0


def test_a_run_that_opens_nothing_counts_as_its_zero_precision():
    n = 20
    opens_two_one_right = outcomes(np.zeros(n), np.ones(n), 2 * np.ones(n))  # precision 0.5
    opens_nothing = outcomes(np.zeros(n), np.zeros(n), np.zeros(n))  # precision 0
    precision = pooled_ratio("positives_opened", "docs_read")
    change = multi_run_paired_bootstrap([opens_two_one_right] * 2, [opens_two_one_right, opens_nothing], precision,
                                        resamples=400)
    # Σ/Σ over both runs would say 0.5 -> 0.5: the run that stopped opening would vanish
    assert (change.before, change.after, change.diff) == pytest.approx((0.5, 0.25, -0.25))
    assert change.lo == pytest.approx(-0.5) and change.hi == pytest.approx(0.0)


def test_runs_must_share_their_questions():
    with pytest.raises(ValueError, match="same non-empty question set"):
        multi_run_paired_bootstrap([outcomes([0, 1], [0, 0], [1, 1])], [outcomes([0, 1, 1], [0, 0, 0], [1, 1, 1])],
                                   mean_of("reward"))
    with pytest.raises(ValueError, match="number of runs"):
        multi_run_paired_bootstrap([], [], mean_of("reward"))


def write_eval(folder, before, after):
    folder.mkdir()
    per_question = {side: {k: v.tolist() for k, v in run.items()} for side, run in (("before", before),
                                                                                   ("after", after))}
    (folder / "eval.json").write_text(json.dumps({"per_question": per_question, "questions": len(before["reward"])}))
    return folder


def test_the_report_prints_each_run_and_a_machine_readable_last_line(tmp_path, capsys):
    rng = np.random.default_rng(0)
    folders = []
    for seed in range(3):
        n = 30
        before = outcomes(rng.choice([-0.1, 0.0], n), rng.integers(0, 2, n), np.full(n, 2))
        after = outcomes(before["reward"] + 0.2, np.minimum(before["positives_opened"] + 1, 2), np.full(n, 2))
        folders.append(write_eval(tmp_path / f"seed{seed}", before, after))
    assert main([str(f) for f in folders] + ["--out", str(tmp_path / "spread.json")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    fields = dict(item.split("=") for item in lines[-1].split())
    assert fields["runs"] == "3" and float(fields["reward_diff"]) == pytest.approx(0.2)
    assert float(fields["reward_diff_lo"]) == pytest.approx(0.2) and float(fields["precision_diff"]) > 0
    assert sum(line.endswith(":") and "seed" in line for line in lines) == 3
    saved = json.loads((tmp_path / "spread.json").read_text())
    assert saved["pooled"]["reward"]["runs_above_zero"] == 3 and len(saved["folders"]) == 3


def test_a_run_without_a_usable_eval_json_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "unfinished").mkdir()
    assert main([str(tmp_path / "unfinished")]) == 2
    assert "no eval.json" in capsys.readouterr().err
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "eval.json").write_text("{\"per_question\": {\"before\": {}}}")
    assert main([str(tmp_path / "broken")]) == 2
    assert "not an eval.json with per-question outcomes" in capsys.readouterr().err


def with_parts(run: dict[str, np.ndarray], selection, format_) -> dict[str, np.ndarray]:
    return {**run, "selection_reward": np.asarray(selection, dtype=np.float64),
            "format_reward": np.asarray(format_, dtype=np.float64)}


def test_the_reward_parts_are_compared_where_every_run_recorded_them(tmp_path, capsys):
    n = 20
    before = outcomes(np.zeros(n), np.zeros(n), np.ones(n))
    after = outcomes(np.full(n, 0.3), np.ones(n), np.ones(n))
    new = [write_eval(tmp_path / f"new{seed}", with_parts(before, np.zeros(n), np.zeros(n)),
                      with_parts(after, np.full(n, 0.4), np.full(n, -0.1))) for seed in range(2)]
    assert main([str(f) for f in new] + ["--out", str(tmp_path / "new.json")]) == 0
    pooled = json.loads((tmp_path / "new.json").read_text())["pooled"]
    assert pooled["selection"]["diff"] == pytest.approx(0.4) and pooled["format"]["diff"] == pytest.approx(-0.1)
    assert pooled["selection"]["runs_above_zero"] == 2 and pooled["format"]["runs_above_zero"] == 0
    old = write_eval(tmp_path / "old", before, after)  # an eval.json from before the parts were recorded
    assert main([str(f) for f in [*new, old]] + ["--out", str(tmp_path / "mixed.json")]) == 0
    mixed = json.loads((tmp_path / "mixed.json").read_text())
    assert set(mixed["pooled"]) == {"reward", "em", "precision", "docs"}
    assert "selection" in mixed["per_run"][0] and "selection" not in mixed["per_run"][2]
    assert "selection" in capsys.readouterr().out


def test_the_reading_outcomes_are_read_back_and_pooled_as_a_ratio(tmp_path):
    n = 20
    opened_before, opened_after = np.ones(n), np.r_[np.ones(5), np.zeros(n - 5)]  # after: opens on 5 only
    before = {**outcomes(np.zeros(n), np.zeros(n), np.ones(n)), "opened_any": opened_before,
              "answered_first_opened": np.r_[np.ones(5), np.zeros(n - 5)]}  # 5 of 20 read
    after = {**outcomes(np.zeros(n), np.zeros(n), np.ones(n)), "opened_any": opened_after,
             "answered_first_opened": np.r_[np.ones(4), np.zeros(n - 4)]}  # 4 of 5 read
    folders = [write_eval(tmp_path / f"run{seed}", before, after) for seed in range(2)]
    assert set(read_run(folders[0])["after"]) >= {"opened_any", "answered_first_opened"}
    assert main([str(f) for f in folders] + ["--out", str(tmp_path / "reading.json")]) == 0
    reading = json.loads((tmp_path / "reading.json").read_text())["pooled"]["reading"]
    assert (reading["before"], reading["after"]) == (pytest.approx(0.25), pytest.approx(0.8))


def with_verdict_auc(folder, before: float, after: float):
    evaluation = json.loads((folder / "eval.json").read_text())
    evaluation.update(before={"verdict_auc": before}, after={"verdict_auc": after})
    (folder / "eval.json").write_text(json.dumps(evaluation))
    return folder


def test_the_verdict_auc_is_pooled_over_runs_where_every_run_has_it(tmp_path, capsys):
    n = 10
    before, after = outcomes(np.zeros(n), np.zeros(n), np.ones(n)), outcomes(np.zeros(n), np.ones(n), np.ones(n))
    aucs = [(0.5, 0.7), (0.45, 0.4), (0.5, 0.6)]
    folders = [with_verdict_auc(write_eval(tmp_path / f"run{i}", before, after), *pair) for i, pair in enumerate(aucs)]
    assert main([str(f) for f in folders] + ["--out", str(tmp_path / "spread.json")]) == 0
    auc = json.loads((tmp_path / "spread.json").read_text())["verdict_auc"]
    assert auc["diff"] == pytest.approx((0.2 - 0.05 + 0.1) / 3) and auc["runs_up"] == 2 and auc["runs"] == 3
    assert auc["lo"] < auc["diff"] < auc["hi"] and auc["lo"] >= -0.05 - 1e-9 and auc["hi"] <= 0.2 + 1e-9
    assert auc["per_run"] == [list(pair) for pair in aucs]
    assert "verdict AUC" in capsys.readouterr().out
    no_auc = write_eval(tmp_path / "stream", before, after)  # judged in the stream: no AUC recorded
    nan_auc = with_verdict_auc(write_eval(tmp_path / "one_class", before, after), float("nan"), 0.6)
    for extra in (no_auc, nan_auc):
        assert main([str(folders[0]), str(extra), "--out", str(tmp_path / "mixed.json")]) == 0
        assert "verdict_auc" not in json.loads((tmp_path / "mixed.json").read_text())


def test_equal_auc_gains_give_a_point_interval():
    result = verdict_auc_spread([(0.5, 0.6), (0.4, 0.5), (0.55, 0.65)])
    assert result["lo"] == pytest.approx(0.1) and result["hi"] == pytest.approx(0.1) and result["runs_up"] == 3


def profile_outcomes(em, positives, docs, n=20) -> dict[str, np.ndarray]:
    """One run's outcomes with every statistic the selection profile reads (one positive shown per question)."""
    return {**outcomes(np.full(n, em), np.full(n, positives), np.full(n, docs)),
            "positives_shown": np.ones(n), "copied_question": np.zeros(n)}


def test_the_learning_check_fails_runs_that_stop_opening(tmp_path, capsys):
    before = profile_outcomes(em=0.1, positives=1, docs=4)  # every positive opened, with three negatives
    chose = [write_eval(tmp_path / f"chose{seed}", before, profile_outcomes(em=0.1, positives=1, docs=2))
             for seed in range(3)]
    stopped = [write_eval(tmp_path / f"stopped{seed}", before, profile_outcomes(em=0.1, positives=0, docs=0))
               for seed in range(3)]
    assert main([str(f) for f in chose] + ["--check"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("selection_misses=0")
    assert main([str(f) for f in stopped]) == 0  # a report without --check
    assert main([str(f) for f in stopped] + ["--check"]) == 1
    out = capsys.readouterr().out
    assert "recall after 0.000 < 0.70" in out and "selection_misses=0" not in out
