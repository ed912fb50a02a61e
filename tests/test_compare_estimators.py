"""scripts/compare_estimators.py: the tables, the plot, the result file and the last line, from runs
given to it; and one tiny real run of both tables (the trainer itself is the learning test's, tested
there)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import compare_estimators  # noqa: E402


def rows(after: list[float]) -> list[dict]:
    return [{"seed": s, "run_dir": f"x-seed{s}", "seconds": 1.0, "reward_before": 0.0, "reward_after": a,
             "precision_before": 0.1, "precision_after": a} for s, a in enumerate(after)]


def test_summary_tables_plot_and_last_line(tmp_path, monkeypatch, capsys):
    results = {"estimators": {"grpo": rows([1.0, 0.5]), "rloo": rows([0.75, 0.75])},
               "aggregations": {"token_mean": rows([0.2, 0.4]), "seq_mean_token_sum": rows([0.5, 0.7])}}
    monkeypatch.setattr(compare_estimators, "run_all", lambda args: results)
    tables = compare_estimators.main(["--estimators", "grpo", "rloo", "--aggregations", "token_mean",
                                      "seq_mean_token_sum", "--seeds", "0", "1", "--out", str(tmp_path)])
    estimators, aggregations = tables["estimators"], tables["aggregations"]
    assert estimators["grpo"]["precision_mean"] == pytest.approx(0.75)
    assert estimators["grpo"]["precision_std"] == pytest.approx(0.3535534, abs=1e-6)  # stdev(1.0, 0.5)
    assert estimators["rloo"]["precision_std"] == 0.0
    assert estimators["grpo"]["precision_gain"] == pytest.approx(0.65)
    assert aggregations["seq_mean_token_sum"]["precision_mean"] == pytest.approx(0.6)
    assert aggregations["token_mean"]["precision_gain"] == pytest.approx(0.2)
    # equal precision means: the reward breaks the tie (also equal here), then the first listed wins
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        "best_estimator=grpo precision_gain=0.650 best_loss_agg=seq_mean_token_sum loss_agg_precision_gain=0.500")
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["runs"] == results and saved["seeds"] == [0, 1] and saved["agg_estimator"] == "rloo"
    assert set(saved["tables"]) == {"estimators", "aggregations"}
    assert (tmp_path / "compare_estimators.png").stat().st_size > 0


def test_one_table_only(tmp_path, monkeypatch, capsys):
    results = {"aggregations": {"token_mean": rows([0.2]), "seq_mean_token_mean": rows([0.3])}}
    monkeypatch.setattr(compare_estimators, "run_all", lambda args: results)
    tables = compare_estimators.main(["--tables", "aggregations", "--seeds", "0", "--out", str(tmp_path)])
    assert list(tables) == ["aggregations"]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "best_loss_agg=seq_mean_token_mean loss_agg_precision_gain=0.200"


def test_variants_fix_the_estimator_and_vary_the_aggregation():
    args = compare_estimators.parse_args(["--agg-estimator", "grpo", "--estimators", "gae"])
    found = compare_estimators.variants(args)
    assert found["estimators"] == {"gae": compare_estimators.ESTIMATORS["gae"]}
    assert list(found["aggregations"]) == ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum",
                                           "seq_mean_token_sum_norm"]
    assert all(v == {"algorithm.advantage": "grpo", "algorithm.loss_agg": agg}
               for agg, v in found["aggregations"].items())
    assert list(compare_estimators.variants(compare_estimators.parse_args(["--tables", "estimators"]))) == [
        "estimators"]


def test_the_estimator_table_names_valid_settings():
    """Every row is a valid PPOConfig override; the frontier rows are the named combinations they say."""
    from training.config import PPOConfig, with_values

    table = compare_estimators.ESTIMATORS
    assert list(table) == ["gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gspo"]
    for overrides in table.values():
        with_values(PPOConfig, overrides)
    assert table["reinforce_pp_baseline"] == {"algorithm.advantage": "reinforce_pp_baseline"}
    assert table["gspo"] == {"algorithm.advantage": "grpo", "algorithm.policy_loss": "gspo",
                             "algorithm.loss_agg": "seq_mean_token_mean", "algorithm.clip_low": 3e-4,
                             "algorithm.clip_high": 4e-4}
    default = compare_estimators.variants(compare_estimators.parse_args([]))
    assert {"reinforce_pp_baseline", "gspo"} <= set(default["estimators"])
    # gspo as the aggregation table's estimator: its loss_agg gives way to each row's
    found = compare_estimators.variants(compare_estimators.parse_args(["--agg-estimator", "gspo"]))
    assert found["aggregations"]["token_mean"] == {**table["gspo"], "algorithm.loss_agg": "token_mean"}


def test_real_runs_fill_both_tables(tmp_path, monkeypatch, capsys):
    """Two tiny PPO runs (1 update, 1 seed) from the random base policy instead of the SFT warm start
    (the warm start is the learning test's): rloo, then seq_mean_token_sum with rloo; rloo with its
    default token_mean is the same run and is reused."""
    monkeypatch.setattr(compare_estimators, "warm_start", lambda world: str(world["base"]))
    tables = compare_estimators.main(["--estimators", "rloo", "--aggregations", "token_mean", "seq_mean_token_sum",
                                      "--seeds", "0", "--updates", "1", "--out", str(tmp_path)])
    assert list(tables["aggregations"]) == ["token_mean", "seq_mean_token_sum"]
    saved = json.loads((tmp_path / "result.json").read_text())
    runs = saved["runs"]
    assert runs["aggregations"]["token_mean"] == runs["estimators"]["rloo"]  # one run, not two
    assert runs["aggregations"]["token_mean"][0]["run_dir"] == "rloo-seed0"
    for name, expected_agg in (("rloo", "token_mean"), ("agg-seq_mean_token_sum", "seq_mean_token_sum")):
        config = yaml.safe_load((tmp_path / f"{name}-seed0" / "config.yaml").read_text())
        algorithm = config["algorithm"]
        assert (algorithm["advantage"], algorithm["loss_agg"], config["optim"]["updates"]) == ("rloo", expected_agg, 1)
    assert not (tmp_path / "agg-token_mean-seed0").exists()
    for table in ("estimators", "aggregations"):
        for rows_ in runs[table].values():
            row = rows_[0]
            report = json.loads((tmp_path / row["run_dir"] / "eval.json").read_text())["comparison"]
            assert row["reward_after"] == report["reward"]["after"]
            assert row["precision_before"] == report["precision"]["before"]
            assert row["seconds"] > 0
    assert saved["tables"]["aggregations"]["seq_mean_token_sum"]["reward_mean"] == pytest.approx(
        runs["aggregations"]["seq_mean_token_sum"][0]["reward_after"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"best_estimator=rloo precision_gain=-?\d\.\d{3} "
                        r"best_loss_agg=(token_mean|seq_mean_token_sum) loss_agg_precision_gain=-?\d\.\d{3}", last)
    # eval.json names its held-out questions by digest, so runs pooled question by question can be checked
    from training.seed_spread import RunFolderError, check_same_eval_questions

    folders = [tmp_path / "rloo-seed0", tmp_path / "agg-seq_mean_token_sum-seed0"]
    digests = [json.loads((f / "eval.json").read_text())["question_digests"] for f in folders]
    assert digests[0] == digests[1] and len(digests[0]) == 24 and len(set(digests[0])) == 24
    check_same_eval_questions(folders)
    report = json.loads((folders[1] / "eval.json").read_text())
    report["question_digests"][3] = "0" * 16
    (folders[1] / "eval.json").write_text(json.dumps(report))
    with pytest.raises(RunFolderError, match="positions"):
        check_same_eval_questions(folders)
