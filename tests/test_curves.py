"""training.evaluation.curves: metrics.jsonl + eval.json -> curves.png, tolerant of gaps, strict on broken lines."""
from __future__ import annotations

import json
import math

import matplotlib.image
import pytest
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from training.evaluation import curves
from training.evaluation.curves import RunFileError, read_metrics, write_curves

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def update_record(update: int, critic_only: bool = False) -> dict:
    return {"update": update, "reward_mean": 0.1 * update, "em": 0.05 * update, "precision": 0.5,
            "kl": 0.0 if critic_only else 0.01 * update, "entropy": math.nan if critic_only else 1.0,
            "value_loss": 0.2, "explained_variance": 0.1 * update, "critic_only": float(critic_only)}


def write_metrics(run_dir, records: list[dict], extra_lines: tuple[str, ...] = ()) -> None:
    lines = [json.dumps(record) for record in records] + list(extra_lines)  # json writes NaN as NaN
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_eval(run_dir, evaluation: dict) -> None:
    (run_dir / "eval.json").write_text(json.dumps(evaluation), encoding="utf-8")


BEFORE_OUTCOMES = {"reward": [0.0, 0.2, -0.1, 0.3], "em": [0.0, 0.0, 0.0, 1.0],
                   "positives_opened": [1.0, 0.0, 1.0, 2.0], "docs_read": [2.0, 2.0, 3.0, 2.0]}
AFTER_OUTCOMES = {"reward": [0.5, 0.4, 0.1, 0.6], "em": [1.0, 0.0, 0.0, 1.0],
                  "positives_opened": [1.0, 1.0, 1.0, 2.0], "docs_read": [1.0, 1.0, 2.0, 2.0]}
# as training.ppo writes it (comparison rows from training.evaluation.policy_eval.compare_runs)
EVALUATION = {
    "before": {"reward_mean": 0.1, "em": 0.25, "precision": 4 / 9},
    "after": {"reward_mean": 0.4, "em": 0.5, "precision": 5 / 6},
    "questions": 4,
    "comparison": {"reward": {"before": 0.1, "after": 0.4, "diff": 0.3, "lo": 0.1, "hi": 0.5},
                   "em": {"before": 0.25, "after": 0.5, "diff": 0.25, "lo": 0.0, "hi": 0.5},
                   "precision": {"before": 0.44, "after": 0.83, "diff": 0.39, "lo": 0.2, "hi": 0.6}},
    "per_question": {"before": BEFORE_OUTCOMES, "after": AFTER_OUTCOMES},
}


def assert_valid_png(path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_writes_a_png_from_metrics_and_evaluation(tmp_path):
    write_metrics(tmp_path, [update_record(1, critic_only=True), update_record(2), update_record(3)])
    write_eval(tmp_path, EVALUATION)
    path = write_curves(tmp_path)
    assert path == tmp_path / "curves.png"
    assert_valid_png(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png", "eval.json", "metrics.jsonl"]  # no temp left


def test_missing_eval_json_still_plots_the_updates(tmp_path):
    write_metrics(tmp_path, [update_record(1), update_record(2)])
    assert_valid_png(write_curves(tmp_path))


def test_evaluation_alone_plots_and_partial_sides_are_tolerated(tmp_path):
    write_eval(tmp_path, {"before": None, "after": {"em": 0.3, "precision": "n/a"}, "comparison": [],
                          "per_question": {"after": {"em": [1.0]}}})
    assert_valid_png(write_curves(tmp_path))


def test_nan_null_and_text_values_are_gaps(tmp_path):
    record = {**update_record(2, critic_only=True), "reward_mean": None, "em": "high", "kl": math.inf}
    write_metrics(tmp_path, [update_record(1)], extra_lines=(json.dumps(record),))
    assert "NaN" in (tmp_path / "metrics.jsonl").read_text()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert all(math.isnan(curves.finite_or_nan(records[1][key])) for key in ("reward_mean", "em", "kl", "entropy"))
    assert_valid_png(write_curves(tmp_path))


def test_malformed_line_is_an_error_naming_file_and_line(tmp_path):
    write_metrics(tmp_path, [update_record(1), update_record(2)], extra_lines=('{"update": 3, "em": 0.',))
    with pytest.raises(RunFileError) as caught:
        write_curves(tmp_path)
    assert str(tmp_path / "metrics.jsonl") in str(caught.value)
    assert "line 3" in str(caught.value)
    assert not (tmp_path / "curves.png").exists()


def test_a_line_that_is_not_an_object_is_an_error(tmp_path):
    write_metrics(tmp_path, [update_record(1)], extra_lines=("", "[1, 2]"))
    with pytest.raises(RunFileError, match=r"line 3: expected a JSON object, got list"):
        read_metrics(tmp_path / "metrics.jsonl")


def test_malformed_eval_json_names_the_file(tmp_path):
    write_metrics(tmp_path, [update_record(1)])
    (tmp_path / "eval.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(RunFileError, match="eval.json"):
        write_curves(tmp_path)


def test_a_folder_with_nothing_to_plot_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither metrics.jsonl nor eval.json"):
        write_curves(tmp_path)


def test_a_resumed_run_keeps_the_last_record_of_each_update(tmp_path):
    first = [update_record(u) for u in (1, 2, 3)]
    resumed = {**update_record(3), "em": 0.9}  # the run was resumed from update 2's checkpoint
    write_metrics(tmp_path, first, extra_lines=(json.dumps(resumed), json.dumps(update_record(4))))
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["update"] for r in records] == [1.0, 2.0, 3.0, 4.0]
    assert records[2]["em"] == 0.9


def test_records_without_update_are_placed_by_position(tmp_path):
    write_metrics(tmp_path, [{"em": 0.1}, {"em": 0.2}])
    assert [r["update"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1.0, 2.0]


def test_failed_drawing_keeps_the_previous_png(tmp_path, monkeypatch):
    write_metrics(tmp_path, [update_record(1)])
    previous = write_curves(tmp_path).read_bytes()

    def broken_savefig(self, *args, **kwargs):
        raise RuntimeError("disk trouble")

    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    with pytest.raises(RuntimeError):
        write_curves(tmp_path)
    assert (tmp_path / "curves.png").read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png", "metrics.jsonl"]


def error_bars(axis) -> list[tuple[float, float, float]]:
    """(x, low, high) of every vertical error bar on the axis."""
    segments = [segment for c in axis.collections if isinstance(c, LineCollection) for segment in c.get_segments()]
    return sorted((s[0][0], min(s[0][1], s[1][1]), max(s[0][1], s[1][1])) for s in segments)


def test_panels_draw_bootstrap_error_bars_and_the_paired_difference(tmp_path):
    records = [update_record(1, critic_only=True), update_record(2, critic_only=True), update_record(3)]
    figure = curves.build_figure(tmp_path, records, EVALUATION)
    axes = {axis.get_title().splitlines()[0]: axis for axis in figure.axes}
    assert set(axes) == {title for _, title in curves.PANELS}
    assert axes["EM"].get_title().splitlines()[1] == "after − before: +0.250 [+0.000, +0.500]"
    assert axes["reward"].get_title().splitlines()[1] == "after − before: +0.300 [+0.100, +0.500]"
    bars = error_bars(axes["precision (positives / documents opened)"])
    assert [x for x, _, _ in bars] == [0.0, 3.0]  # before left of update 1, after at the last update
    for (_, low, high), side in zip(bars, ("before", "after")):
        expected = curves.bootstrap_interval(curves.question_outcomes(EVALUATION, side), "precision")
        assert (low, high) == pytest.approx(expected)
        assert low <= EVALUATION[side]["precision"] <= high
    assert error_bars(axes["KL to reference"]) == [] and list(axes["KL to reference"].texts) == []
    assert curves.critic_only_spans(records) == [(1.0, 2.0)]


def test_bootstrap_interval_of_a_constant_outcome_is_a_point():
    outcomes = {"reward": [0.5] * 5, "em": [1.0] * 5, "positives_opened": [1.0] * 5, "docs_read": [2.0] * 5}
    evaluation = {"per_question": {"after": outcomes}}
    assert curves.evaluation_interval(evaluation, "after", "em") == (1.0, 1.0)
    assert curves.evaluation_interval(evaluation, "after", "precision") == (0.5, 0.5)
    assert curves.evaluation_interval(evaluation, "after", "kl") is None  # no evaluation statistic
    assert curves.evaluation_interval(evaluation, "before", "em") is None


def test_a_metric_nobody_logged_says_so(tmp_path):
    figure = curves.build_figure(tmp_path, [{"update": 1.0, "em": 0.2}], None)
    entropy_axis = next(axis for axis in figure.axes if axis.get_title() == "entropy")
    assert [t.get_text() for t in entropy_axis.texts] == ["not logged"]
    assert "no eval.json" in figure.get_suptitle()


@pytest.mark.parametrize("broken", [
    {"reward": [0.1], "em": [0.0]},  # outcomes missing
    {**BEFORE_OUTCOMES, "em": [0.0, 1.0]},  # lengths differ
    {**BEFORE_OUTCOMES, "reward": [0.1, None, 0.2, 0.3]},  # not a number
    {key: [] for key in BEFORE_OUTCOMES},  # no questions
])
def test_unusable_per_question_outcomes_give_no_error_bar(broken):
    assert curves.question_outcomes({"per_question": {"before": broken}}, "before") is None


def test_paired_difference_reader_tolerates_missing_and_partial_rows():
    assert curves.evaluation_difference(EVALUATION, "em") == (0.25, 0.0, 0.5)
    assert curves.evaluation_difference(EVALUATION, "kl") is None
    assert curves.evaluation_difference({"comparison": {"em": {"diff": 0.1}}}, "em") is None
    assert curves.evaluation_difference({"comparison": "none"}, "em") is None


def test_cli_writes_the_png_and_reports_problems(tmp_path, capsys):
    write_metrics(tmp_path, [update_record(1)])
    assert curves.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "curves.png")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert curves.main([str(empty)]) == 1
    assert "neither metrics.jsonl nor eval.json" in capsys.readouterr().err


def test_end_of_training_helper_reports_instead_of_raising(tmp_path):
    write_metrics(tmp_path, [update_record(1)], extra_lines=("oops",))
    messages = []
    assert curves.write_curves_or_warn(tmp_path, log=messages.append) is None
    assert len(messages) == 1 and "line 2" in messages[0] and "metrics.jsonl" in messages[0]
    write_metrics(tmp_path, [update_record(1)])
    assert curves.write_curves_or_warn(tmp_path, log=messages.append) == tmp_path / "curves.png"
    assert messages[-1].endswith("curves.png")
