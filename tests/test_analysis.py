"""inference.analysis: every analysis on hand-made records with hand-computed answers, and a CLI round trip."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from envs.retrieval.encoders import HashEncoder
from inference import analysis
from inference import analysis_metrics as am
from inference import analysis_momentum as mom

SQ2 = math.sqrt(2.0)


def search(query, ids, ranks=None, bearing=None, distractor=None):
    ranks = ranks or list(range(1, len(ids) + 1))
    out = {"query": query, "ids": list(ids), "ranks": list(ranks),
           "answer_bearing": list(bearing or [False] * len(ids)), "expanded": []}
    if distractor is not None:
        out["distractor"] = distractor
    return out


def record(qid, searches=(), rounds=None, question="q?", **extra):
    out = {"id": qid, "question": question, "golden_answers": ["a"], "prediction": "a",
           "metrics": {"em": 1.0, "f1": 1.0, "cover_em": 1.0, "acc": 1.0}, "searches": list(searches),
           "latency_s": 1.0, "method_stats": {}}
    if rounds is not None:
        out["search_rounds"] = rounds
    out.update(extra)
    return out


def stub_embed(table):
    """texts -> the fixed vectors of ``table``."""
    return lambda texts: np.array([table[t] for t in texts], dtype=float)


# ----- 1. diversity -----------------------------------------------------------------------------


def test_mean_pairwise_cosine_by_hand():
    vectors = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert am.mean_pairwise_cosine(vectors) == pytest.approx((0 + 1 / SQ2 + 1 / SQ2) / 3)


def test_query_diversity_with_fixed_vectors():
    embed = stub_embed({"a": [1, 0], "b": [0, 1], "c": [1, 1]})
    records = [record("1", [search("a", ["x"]), search("b", ["y"]), search("c", ["z"])]),
               record("2", [search("a", ["x"]), search("a", ["y"])]),
               record("3", [search("b", ["x"])]),
               record("4", [])]
    out = am.query_diversity(records, embed)
    assert out["n_questions"] == 2 and out["n_excluded_lt2"] == 2
    assert out["mean_similarity"] == pytest.approx(((SQ2 / 3) + 1.0) / 2)


def test_query_diversity_with_hash_encoder():
    encoder = HashEncoder(64)
    embed = encoder.encode_queries
    same = [record("1", [search("capital of France", ["x"]), search("capital of France", ["y"])])]
    different = [record("1", [search("capital of France", ["x"]), search("Mount Fuji height", ["y"])])]
    assert am.query_diversity(same, embed)["mean_similarity"] == pytest.approx(1.0, abs=1e-6)
    assert am.query_diversity(different, embed)["mean_similarity"] < 0.5


# ----- 2. redundancy ----------------------------------------------------------------------------


def test_jaccard_and_cumulative_overlap_by_hand():
    sets = [{"a", "b", "c"}, {"b", "c", "d"}, {"e"}]
    assert am.jaccard(sets[0], sets[1]) == pytest.approx(0.5)
    assert am.mean_pairwise_jaccard(sets) == pytest.approx(0.5 / 3)
    assert am.cumulative_overlap(sets) == pytest.approx([2 / 3, 0.0])
    assert math.isnan(am.jaccard(set(), set()))
    assert math.isnan(am.cumulative_overlap([{"a"}, set()])[0])


def test_retrieval_redundancy_uses_rounds():
    # question 1: rounds {a,b}+{c} | {b,c,d} | {e}  -> D = [{a,b,c}, {b,c,d}, {e}]
    q1 = record("1", [search("s0", ["a", "b"]), search("s1", ["c"]), search("s2", ["b", "c", "d"]),
                      search("s3", ["e"])], rounds=[[0, 1], [2], [3]])
    # question 2 (old run: no search_rounds): each search is a round -> D = [{x}, {x}]
    q2 = record("2", [search("t0", ["x"]), search("t1", ["x"])])
    q3 = record("3", [search("u0", ["y"])])  # one round: excluded from the Jaccard mean
    out = am.retrieval_redundancy([q1, q2, q3])
    assert out["mean_jaccard"] == pytest.approx((1 / 6 + 1.0) / 2)
    assert out["n_questions"] == 2 and out["n_excluded_lt2"] == 1
    assert out["overlap_by_step"] == pytest.approx({"2": (2 / 3 + 1.0) / 2, "3": 0.0})
    assert out["overlap_counts"] == {"2": 2, "3": 1}


def test_rounds_of_falls_back_on_malformed_rounds():
    good = record("1", [search("a", ["x"]), search("b", ["y"])], rounds=[[0, 1]])
    bad = record("2", [search("a", ["x"]), search("b", ["y"])], rounds=[[0, 5]])
    assert am.rounds_of(good) == ([[0, 1]], True)
    assert am.rounds_of(bad) == ([[0], [1]], False)
    assert am.count_bad_rounds([good, bad]) == 1


# ----- 3. max sub-query Recall@5 ----------------------------------------------------------------


def test_subquery_recall_uses_ranks_not_shown_order():
    # seven candidates shown shuffled; the only answer-bearing one is shown first but ranked 6th
    miss = search("m", list("abcdefg"), ranks=[6, 2, 7, 1, 3, 4, 5], bearing=[True] + [False] * 6)
    # the answer-bearing one is shown last but ranked 5th: inside the top 5
    hit = search("h", list("abcdefg"), ranks=[6, 2, 7, 1, 3, 4, 5], bearing=[False] * 6 + [True])
    # answer-bearing but an injected distractor: not retrieved, does not count
    fake = search("f", list("abc"), bearing=[True, False, False], distractor=[True, False, False])
    assert am.subquery_recall(miss) == 0.0
    assert am.subquery_recall(hit) == 1.0
    assert am.subquery_recall(fake) == 0.0
    assert am.max_subquery_recall([miss, hit]) == 1.0
    assert am.max_subquery_recall([miss, fake]) == 0.0
    assert math.isnan(am.max_subquery_recall([]))


def test_recall_summary_counts_questions_without_search():
    hit = search("h", ["a", "b"], bearing=[False, True])
    miss = search("m", ["a", "b"])
    out = am.recall_summary([record("1", [miss, hit]), record("2", [miss]), record("3", [])])
    assert out["mean_max_recall"] == pytest.approx(0.5)
    assert out["n_questions"] == 2 and out["n_no_search"] == 1
    assert out["mean_max_recall_all"] == pytest.approx(1 / 3)


# ----- 4. search momentum -----------------------------------------------------------------------


def test_momentum_recursion_by_hand():
    disp = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    m = mom.momentum(disp, [0.0, 0.5, 0.25])
    assert m == pytest.approx(np.array([[1.0, 0.0], [0.5, 0.5], [0.125 + 1.5, 0.125 + 1.5]]))


def test_alignment_scores_tiny_2d_example():
    # e0=(0,0), e1=(1,0), e2=(1,1), e3=(2,1): d1=(1,0), d2=(0,1)
    E = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [2.0, 1.0]])
    # m1 = d1 = (1,0): S2 = cos((1,0),(1,1)); beta2=0.5: m2 = (0.5,0.5): S3 = cos((1,1),(2,1)) = 3/sqrt(10)
    assert mom.alignment_scores(E, [0.0, 0.5]) == pytest.approx([1 / SQ2, 3 / math.sqrt(10)])
    # beta2=0.25: m2 = (0.25,0.75) ~ (1,3): S3 = 5/(sqrt(10) sqrt(5)) = 1/sqrt(2)
    assert mom.alignment_scores(E, [0.0, 0.25]) == pytest.approx([1 / SQ2, 1 / SQ2])
    # beta1 only rescales m1, so S2 does not move
    assert mom.alignment_scores(E, [0.7, 0.5])[0] == pytest.approx(1 / SQ2)


def test_round_embedding_is_normalised_mean():
    assert mom.round_embedding(np.array([[1.0, 0.0], [0.0, 1.0]])) == pytest.approx([1 / SQ2, 1 / SQ2])
    assert mom.round_embedding(np.array([[1.0, 0.0], [-1.0, 0.0]])) == pytest.approx([0.0, 0.0])


def test_batched_alignment_matches_per_trajectory():
    rng = np.random.default_rng(1)
    trajectories = [rng.normal(size=(n + 1, 4)) for n in (3, 5, 4, 7)]
    betas = [0.0, 0.3, 0.6, 0.9]
    E, rounds = mom.pad_trajectories(trajectories)
    assert list(rounds) == [3, 5, 4, 5]
    batched = mom.batch_alignment(E, rounds, betas)
    for row, trajectory in zip(batched, trajectories):
        single = mom.alignment_scores(trajectory[:6], betas)
        assert row[: len(single)] == pytest.approx(single)
        assert np.all(np.isnan(row[len(single):]))
    means, counts = mom.stepwise_alignment(E, rounds, betas)
    assert list(counts) == [4, 4, 3, 2]
    assert means[3] == pytest.approx(np.mean([batched[1, 3], batched[3, 3]]))


def synthetic_trajectories(n, free_betas, rounds=5, dim=16, noise=0.3, seed=0):
    """e_1 random; for t >= 2, e_t = e_0 + m_{t-1}(beta_true) + noise, m built from the generated d's."""
    rng = np.random.default_rng(seed)
    betas = mom.full_betas(free_betas)
    out = {}
    for k in range(n):
        e0 = rng.normal(size=dim)
        E = [e0, e0 + rng.normal(size=dim)]
        m = np.zeros(dim)
        for t in range(1, rounds):
            m = betas[t - 1] * m + (1 - betas[t - 1]) * (E[t] - E[t - 1])
            E.append(e0 + m + noise * rng.normal(size=dim))
        out[f"q{k:03d}"] = np.stack(E)
    return out


def test_fit_recovers_known_betas():
    true = [0.3, 0.6, 0.8]
    trajectories = synthetic_trajectories(60, true)
    trajectories["short"] = np.zeros((3, 16))  # two rounds: dropped
    out = mom.momentum_analysis(trajectories, fit_fraction=0.5, seed=0)
    assert out["status"] == "ok"
    assert out["n_dropped_short"] == 1 and out["n_fit"] == 30 and out["n_heldout"] == 30
    fitted = [out["betas"][t] for t in ("2", "3", "4")]
    assert fitted == pytest.approx(true, abs=0.06)
    assert out["heldout_counts"] == {"2": 30, "3": 30, "4": 30, "5": 30}
    # the fitted betas beat clearly wrong ones on the held-out questions
    _, held = mom.split_ids([k for k in trajectories if k != "short"], 0.5, 0)
    E, rounds = mom.pad_trajectories([trajectories[k] for k in held])
    wrong = mom.alignment_objective(E, rounds, mom.full_betas([0.9, 0.1, 0.1]))
    assert out["heldout_mean"] > wrong + 0.05


def test_unreached_step_beta_is_not_reported():
    trajectories = synthetic_trajectories(12, [0.5, 0.5, 0.5], rounds=3)
    out = mom.momentum_analysis(trajectories, 0.5, 0)
    assert out["status"] == "ok"
    assert out["betas"]["3"] is None and out["betas"]["4"] is None and out["betas"]["2"] is not None
    assert out["heldout_alignment"]["4"] is None and out["heldout_alignment"]["5"] is None


def test_too_few_trajectories_is_reported_not_raised():
    out = mom.momentum_analysis(synthetic_trajectories(3, [0.5, 0.5, 0.5]), 0.5, 0)
    assert out["status"] == "too_few_trajectories" and "need" in out["message"]
    assert mom.momentum_analysis({}, 0.5, 0)["status"] == "too_few_trajectories"


def test_split_ids_is_disjoint_deterministic_and_order_free():
    ids = [f"q{i}" for i in range(10)]
    fit, held = mom.split_ids(ids, 0.3, seed=4)
    assert len(fit) == 3 and len(held) == 7 and not set(fit) & set(held) and set(fit) | set(held) == set(ids)
    assert mom.split_ids(list(reversed(ids)), 0.3, seed=4) == (fit, held)
    assert mom.split_ids(ids, 0.3, seed=5) != (fit, held)


def test_momentum_trajectories_average_parallel_subqueries():
    embed = stub_embed({"Q": [1, 0, 0], "a": [0, 1, 0], "b": [0, 0, 1], "c": [1, 1, 0]})
    r = record("1", [search("a", ["x"]), search("b", ["y"]), search("c", ["z"])], rounds=[[0, 1], [2]], question="Q")
    E = am.momentum_trajectories([r], embed)["1"]
    assert E == pytest.approx(np.array([[1, 0, 0], [0, 1 / SQ2, 1 / SQ2], [1 / SQ2, 1 / SQ2, 0]]))


# ----- 5. knowledge conflict / utilisation ------------------------------------------------------


def scored(qid, em, f1, cover_em, question="q?"):
    return record(qid, metrics={"em": em, "f1": f1, "cover_em": cover_em}, question=question)


def test_conflict_split_counts_and_scores():
    vanilla = [scored("1", 0, 0.2, 1), scored("2", 0, 0, 0), scored("3", 1, 1, 1), scored("4", 1, 1, 1),
               record("6", metrics={})]
    run = [scored("1", 1, 1.0, 1), scored("2", 0, 0.5, 1), scored("3", 0, 0.0, 0), scored("5", 1, 1, 1),
           scored("6", 1, 1, 1)]
    out = am.conflict_split(run, vanilla, "cover_em")
    assert out["conflict"] == pytest.approx({"n": 2, "em": 0.5, "f1": 0.5, "cover_em": 0.5})
    assert out["utilisation"] == pytest.approx({"n": 1, "em": 0.0, "f1": 0.5, "cover_em": 1.0})
    assert out["missing_in_vs"] == 1 and out["missing_in_run"] == 1 and out["vs_without_metric"] == 1
    by_em = am.conflict_split(run, vanilla, "em")
    assert by_em["conflict"]["n"] == 1 and by_em["utilisation"]["n"] == 2


# ----- 6. distributions and bad records ---------------------------------------------------------


def test_step_distribution_prefers_method_stat_then_rounds():
    records = [record("1", [search("a", ["x"])], method_stats={"slots": ["s1", "s2", "s3"]}),
               record("2", [search("a", ["x"])], method_stats={"slots": 2}),
               record("3", [search("a", ["x"]), search("b", ["y"])], rounds=[[0, 1]], method_stats={})]
    out = am.step_distribution(records, "seek")
    assert out["stat"] == "slots" and out["histogram"] == {"1": 1, "2": 1, "3": 1}
    assert out["n_fallback_rounds"] == 1 and out["mean"] == pytest.approx(2.0)
    assert am.step_stat_key("kair") == "steps" and am.step_stat_key("maps") == "iterations"
    assert am.step_stat_key("vanilla-rag") is None
    assert am.step_distribution(records, "vanilla-rag")["histogram"] == {"1": 3}


def test_latency_summary_by_hand():
    records = [record(str(i), latency_s=v) for i, v in enumerate([1, 2, 3, 4, 10])] + [record("x", latency_s=None)]
    out = am.latency_summary(records)
    assert out == pytest.approx({"n": 5, "n_missing": 1, "mean": 4.0, "median": 3.0, "p90": 7.6, "max": 10.0})


def test_bad_records_are_skipped_and_counted():
    records = [record("1"), {"question": "no id"}, record("2", question=None), "text",
               record("3", [{"query": "q", "ids": ["a"]}]),  # search without ranks / answer_bearing
               record("4", [search("q", ["a"])])]
    records += [record("5", [dict(search("q", ["a"]), ids=None)]),  # ids not a list
                record("6", [dict(search("q", ["a"]), ranks=[None])])]  # rank not a number
    good, skipped = am.split_records(records)
    assert [r["id"] for r in good] == ["1", "4"]
    assert skipped == {"no id": 1, "no question": 1, "not an object": 1, "malformed search": 3}


def test_mutated_records_never_crash():
    rng = np.random.default_rng(0)
    junk = [None, 3, "x", [], {}, [None], [[1]], True, -1.5]
    records = []
    for base in maps_records(10) * 5:
        mutated = json.loads(json.dumps(base))
        target = mutated if rng.random() < 0.5 else mutated["searches"][int(rng.integers(5))]
        key = list(target)[int(rng.integers(len(target)))]
        if rng.random() < 0.3:
            del target[key]
        else:
            target[key] = junk[int(rng.integers(len(junk)))]
        records.append(mutated)
    vanilla = [scored(f"q{k}", 0, 0, k % 2, f"question {k} about Europe") for k in range(10)]
    out = analysis.analyse_records(records, HashEncoder(32).encode_queries, "maps", vanilla)
    assert out["n_analysed"] + sum(out["skipped"].values()) == len(records)
    json.dumps(analysis.jsonable(out), allow_nan=False)


# ----- command line -----------------------------------------------------------------------------


MAPS_QUERIES = ["river through Paris", "capital of France", "currency of France", "mountains in Japan",
                "largest city in Germany", "Danube cities"]


def write_run(folder, records, method="maps", index="default", bad_line=False):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"method": method, "index": index}))
    lines = [json.dumps(r) for r in records]
    if bad_line:
        lines.insert(1, "{not json")
    (folder / "predictions.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def maps_records(n=10):
    out = []
    for k in range(n):
        queries = [MAPS_QUERIES[(k + j) % len(MAPS_QUERIES)] + f" {k}" for j in range(5)]
        searches = [search(q, [f"p{(k + j) % 7}", f"p{(k + j + 1) % 7}"], bearing=[j == 2, False])
                    for j, q in enumerate(queries)]
        out.append(record(f"q{k}", searches, rounds=[[0, 1], [2], [3], [4]], question=f"question {k} about Europe",
                          method_stats={"iterations": 4}, latency_s=float(k),
                          metrics={"em": k % 2, "f1": k % 2, "cover_em": k % 2}))
    return out


def test_cli_round_trip(tmp_path, capsys):
    records = maps_records() + [{"id": "broken", "question": "q?"}]
    run = write_run(tmp_path / "maps-run", records, bad_line=True)
    vanilla = write_run(tmp_path / "vanilla", [scored(f"q{k}", 0, 0, 1 if k < 4 else 0, f"question {k} about Europe")
                                               for k in range(12)],
                        method="vanilla-llm")
    assert analysis.main([str(run), "--encoder", "hash:64", "--vs", str(vanilla), "--seed", "1"]) == 0
    out_dir = run / "analysis"
    report = json.loads((out_dir / "analysis.json").read_text())
    result = report["runs"]["maps-run"]
    assert result["encoder"] == "hash:64" and result["method"] == "maps"
    assert result["unreadable_lines"] == 1 and result["skipped"] == {"no searches": 1}
    assert result["n_analysed"] == 10
    assert result["steps"] == {"stat": "iterations", "n_fallback_rounds": 0, "histogram": {"4": 10}, "mean": 4.0,
                               "n": 10}
    assert result["recall"]["mean_max_recall"] == 1.0
    assert set(result["redundancy"]["overlap_by_step"]) == {"2", "3", "4"}
    assert result["momentum"]["status"] == "ok" and result["momentum"]["n_fit"] == 5
    assert result["conflict"]["conflict"]["n"] == 4 and result["conflict"]["utilisation"]["n"] == 6
    assert result["conflict"]["missing_in_run"] == 2
    assert 0.0 < result["diversity"]["mean_similarity"] < 1.0
    for name in analysis.PLOT_FILES:
        assert (out_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "maps-run" in printed and "Search momentum" in printed and "Knowledge conflict" in printed


def test_cli_several_runs_into_plots_dir_with_injected_embed(tmp_path):
    run_a = write_run(tmp_path / "a", maps_records(6))
    run_b = write_run(tmp_path / "b", [record("1", [search("x", ["p"])])], method="seek")
    asked = []

    def embed_for(name):
        asked.append(name)
        return HashEncoder(32).encode_queries

    out = tmp_path / "plots"
    assert analysis.main([str(run_a), str(run_b), "--plots", str(out)], embed_for=embed_for) == 0
    assert asked == ["minilm"]  # the default index's encoder, requested once, never loaded here
    report = json.loads((out / "analysis.json").read_text())
    assert set(report["runs"]) == {"a", "b"}
    assert report["runs"]["b"]["momentum"]["status"] == "too_few_trajectories"
    assert report["runs"]["b"]["steps"]["stat"] == "slots" and report["runs"]["b"]["steps"]["n_fallback_rounds"] == 1
    assert all((out / name).exists() for name in analysis.PLOT_FILES)
    assert not (run_a / "analysis").exists()


def test_encoder_name_resolution(tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    (index / "meta.json").write_text(json.dumps({"encoder": "hash:128"}))
    assert analysis.encoder_name({"index": "default"}) == "minilm"
    assert analysis.encoder_name({}) == "minilm"
    assert analysis.encoder_name({"index": str(index)}) == "hash:128"
    assert analysis.encoder_name({"index": str(index)}, "bge") == "bge"
    with pytest.raises(SystemExit, match="--encoder"):
        analysis.encoder_name({"index": str(tmp_path / "missing")})


def test_cli_bad_input_exits_with_a_message(tmp_path):
    with pytest.raises(SystemExit, match="no such run folder"):
        analysis.main([str(tmp_path / "nope"), "--encoder", "hash"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no predictions.jsonl"):
        analysis.main([str(tmp_path / "empty"), "--encoder", "hash"])
    run = write_run(tmp_path / "run", [record("1")])
    with pytest.raises(SystemExit, match="no such run folder"):
        analysis.main([str(run), "--encoder", "hash", "--vs", str(tmp_path / "nope")])


def test_empty_run_does_not_crash_nor_load_an_encoder(tmp_path):
    run = write_run(tmp_path / "run", [])

    def embed_for(name):
        raise AssertionError("no text to embed: the encoder must not be loaded")

    assert analysis.main([str(run)], embed_for=embed_for) == 0
    report = json.loads((run / "analysis" / "analysis.json").read_text())
    assert report["runs"]["run"]["n_analysed"] == 0
    assert report["runs"]["run"]["diversity"]["mean_similarity"] is None
