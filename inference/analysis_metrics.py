"""Pure per-question analyses of evaluation records (used by :mod:`inference.analysis`).

A record is one line of ``predictions.jsonl`` (``methods.runner.prediction_record``) that
:func:`split_records` kept; each search is ``envs.episode.SearchRecord.to_dict``. A *step* (or
round) is one retrieval round: ``record["search_rounds"]`` groups searches made together (e.g. MAPS's
parallel sub-queries); runs written before it existed count each search as its own round.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from envs.question_match import mismatched_ids, record_digests
from inference.analysis_momentum import cosine, round_embedding

Embed = Callable[[Sequence[str]], np.ndarray]  # texts -> (n, D)
RECALL_K = 5
SPLIT_METRICS = ("em", "f1", "cover_em")
# method name -> method_stats key holding its reached-step count (else: the number of rounds)
STEP_STATS = {"seek": "slots", "kair": "steps", "maps": "iterations"}
SEARCH_FIELDS = ("query", "ids", "ranks", "answer_bearing")


# ----- records ----------------------------------------------------------------------------------


def record_problem(record) -> str | None:
    """Why a record cannot be analysed (a short reason), or None if it can."""
    if not isinstance(record, dict):
        return "not an object"
    if not isinstance(record.get("id"), (str, int)):
        return "no id"
    if not isinstance(record.get("question"), str):
        return "no question"
    searches = record.get("searches")
    if not isinstance(searches, list):
        return "no searches"
    if not all(_search_ok(s) for s in searches):
        return "malformed search"
    return None


def _search_ok(search) -> bool:
    """A search dict with a text query and equally long lists of ids, numeric ranks and flags."""
    if not isinstance(search, dict) or any(f not in search for f in SEARCH_FIELDS):
        return False
    ids, ranks, bearing = search["ids"], search["ranks"], search["answer_bearing"]
    if not isinstance(search["query"], str) or not all(isinstance(x, list) for x in (ids, ranks, bearing)):
        return False
    return (len(ranks) == len(ids) == len(bearing) and all(isinstance(i, (str, int)) for i in ids)
            and all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in ranks))


def split_records(records: Iterable) -> tuple[list[dict], dict[str, int]]:
    """(the analysable records, {reason: number skipped})."""
    kept: list[dict] = []
    skipped: Counter[str] = Counter()
    for record in records:
        problem = record_problem(record)
        if problem:
            skipped[problem] += 1
        else:
            kept.append(record)
    return kept, dict(skipped)


def rounds_of(record: dict) -> tuple[list[list[int]], bool]:
    """The record's retrieval rounds (lists of search indices) and whether ``search_rounds`` was valid.

    Absent or malformed (non-integer or out-of-range indices, an empty round) -> one search per round.
    """
    n = len(record["searches"])
    default = [[i] for i in range(n)]
    rounds = record.get("search_rounds")
    if rounds is None:
        return default, True
    valid = isinstance(rounds, list) and all(
        isinstance(r, list) and r and all(isinstance(i, int) and 0 <= i < n for i in r) for r in rounds)
    return (rounds, True) if valid else (default, False)


def _nanmean(values: Iterable[float | None]) -> float:
    kept = [v for v in values if v is not None and not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


# ----- 1. sub-query diversity -------------------------------------------------------------------


def mean_pairwise_cosine(vectors: np.ndarray) -> float:
    """Mean cosine similarity over the n(n-1)/2 unordered pairs. vectors ``(n, D)``, n >= 2 -> scalar."""
    vectors = np.asarray(vectors, dtype=np.float64)
    i, j = np.triu_indices(len(vectors), k=1)
    return float(np.mean(cosine(vectors[i], vectors[j])))


def query_diversity(records: Sequence[dict], embed: Embed) -> dict:
    """Per question, the mean pairwise cosine of its sub-queries (all searches' queries); the mean
    over questions (lower = more diverse). Questions with fewer than two sub-queries are excluded."""
    queries = {r["id"]: [s["query"] for s in r["searches"]] for r in records}
    eligible = {k: q for k, q in queries.items() if len(q) >= 2}
    vectors = embed_texts(embed, [q for qs in eligible.values() for q in qs])
    per_question = [mean_pairwise_cosine(np.stack([vectors[q] for q in qs])) for qs in eligible.values()]
    return {"mean_similarity": _nanmean(per_question), "n_questions": len(per_question),
            "n_excluded_lt2": len(queries) - len(eligible)}


def embed_texts(embed: Embed, texts: Iterable[str]) -> dict[str, np.ndarray]:
    """text -> embedding ``(D,)``, embedding each distinct text once (one ``embed`` call)."""
    unique = list(dict.fromkeys(texts))
    if not unique:
        return {}
    matrix = np.asarray(embed(unique), dtype=np.float64)
    return dict(zip(unique, matrix))


# ----- 2. retrieval redundancy ------------------------------------------------------------------


def round_doc_sets(searches: Sequence[dict], rounds: Sequence[Sequence[int]]) -> list[set]:
    """D_t: the passage ids retrieved by the searches of round t (shown candidates, any order)."""
    return [{pid for i in r for pid in searches[i]["ids"]} for r in rounds]


def jaccard(a: set, b: set) -> float:
    """|a ∩ b| / |a ∪ b|; NaN when both are empty."""
    union = a | b
    return len(a & b) / len(union) if union else math.nan


def mean_pairwise_jaccard(doc_sets: Sequence[set]) -> float:
    """Mean Jaccard over unordered pairs of rounds (pairs of two empty sets left out); NaN if none."""
    pairs = [jaccard(a, b) for k, a in enumerate(doc_sets) for b in doc_sets[k + 1:]]
    return _nanmean(pairs)


def cumulative_overlap(doc_sets: Sequence[set]) -> list[float]:
    """For t = 2..T: |D_t ∩ (D_1 ∪ ... ∪ D_{t-1})| / |D_t| (NaN when D_t is empty). -> ``(T-1,)``."""
    seen: set = set(doc_sets[0]) if doc_sets else set()
    out = []
    for current in doc_sets[1:]:
        out.append(len(current & seen) / len(current) if current else math.nan)
        seen |= current
    return out


def retrieval_redundancy(records: Sequence[dict]) -> dict:
    """Mean pairwise Jaccard between a question's rounds (averaged over questions with >= 2 rounds)
    and the per-step overlap curve: for step t >= 2, the mean over questions reaching t of
    :func:`cumulative_overlap`."""
    jaccards: list[float] = []
    by_step: dict[int, list[float]] = {}
    excluded = 0
    for record in records:
        rounds, _ = rounds_of(record)
        doc_sets = round_doc_sets(record["searches"], rounds)
        value = mean_pairwise_jaccard(doc_sets)
        if math.isnan(value):
            excluded += 1
        else:
            jaccards.append(value)
        for t, overlap in enumerate(cumulative_overlap(doc_sets), start=2):
            if not math.isnan(overlap):
                by_step.setdefault(t, []).append(overlap)
    return {"mean_jaccard": _nanmean(jaccards), "n_questions": len(jaccards), "n_excluded_lt2": excluded,
            "overlap_by_step": {str(t): _nanmean(v) for t, v in sorted(by_step.items())},
            "overlap_counts": {str(t): len(v) for t, v in sorted(by_step.items())}}


# ----- 3. maximum sub-query Recall@5 ------------------------------------------------------------


def subquery_recall(search: dict, k: int = RECALL_K) -> float:
    """Recall@k of one sub-query with answer-bearing passages as the gold evidence, under the
    single-evidence approximation: 1.0 if any of its k best-ranked retrieved passages (by the
    ``ranks`` field, not the shown order, which may be shuffled; injected distractors are not
    retrieved and are left out) is answer-bearing, else 0.0."""
    distractor = search.get("distractor")
    if not isinstance(distractor, list) or len(distractor) != len(search["ids"]):
        distractor = [False] * len(search["ids"])
    retrieved = [(rank, bearing) for rank, bearing, fake in zip(search["ranks"], search["answer_bearing"], distractor)
                 if not fake]
    top = sorted(retrieved, key=lambda pair: pair[0])[:k]
    return 1.0 if any(bearing for _, bearing in top) else 0.0


def max_subquery_recall(searches: Sequence[dict], k: int = RECALL_K) -> float:
    """SEEK A.5: the best :func:`subquery_recall` over a question's sub-queries; NaN with none."""
    return max((subquery_recall(s, k) for s in searches), default=math.nan)


def recall_summary(records: Sequence[dict], k: int = RECALL_K) -> dict:
    """Mean max sub-query Recall@k over questions with a search, and with no-search questions as 0."""
    values = [max_subquery_recall(r["searches"], k) for r in records]
    searched = [v for v in values if not math.isnan(v)]
    return {"k": k, "mean_max_recall": _nanmean(searched), "n_questions": len(searched),
            "n_no_search": len(values) - len(searched),
            "mean_max_recall_all": (sum(searched) / len(values)) if values else math.nan}


# ----- 5. knowledge conflict / utilisation ------------------------------------------------------


def _metric(record: dict, name: str) -> float | None:
    metrics = record.get("metrics")
    value = metrics.get(name) if isinstance(metrics, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def subset_scores(records: Sequence[dict], metrics: Sequence[str] = SPLIT_METRICS) -> dict:
    """n and the mean of each metric (over records that have it) on a subset."""
    out: dict = {"n": len(records)}
    for name in metrics:
        out[name] = _nanmean(_metric(r, name) for r in records)
    return out


def conflict_split(records: Sequence[dict], vs_records: Sequence[dict], metric: str = "cover_em",
                   threshold: float = 0.5) -> dict:
    """SEEK Table 3: score ``records`` on the questions the vanilla LLM (``vs_records``) got right
    (its ``metric`` >= ``threshold``: the knowledge-conflict set) and wrong (the utilisation set).

    Questions in only one run, or whose ``metric`` is missing in the vanilla run, are counted and left out.
    So are ids naming different question texts in the two runs (``mismatched_questions``; the
    command line refuses such runs outright).
    """
    mismatched = set(mismatched_ids(record_digests(records), record_digests(vs_records)))
    vs_score = {r["id"]: _metric(r, metric) for r in vs_records
                if isinstance(r, dict) and isinstance(r.get("id"), (str, int))}
    run_ids = {r["id"] for r in records}
    conflict, utilisation, no_metric = [], [], 0
    for record in records:
        if record["id"] not in vs_score or str(record["id"]) in mismatched:
            continue
        score = vs_score[record["id"]]
        if score is None:
            no_metric += 1
        elif score >= threshold:
            conflict.append(record)
        else:
            utilisation.append(record)
    return {"split_metric": metric, "threshold": threshold,
            "conflict": subset_scores(conflict), "utilisation": subset_scores(utilisation),
            "missing_in_vs": len(run_ids - set(vs_score)), "missing_in_run": len(set(vs_score) - run_ids),
            "vs_without_metric": no_metric, "mismatched_questions": len(mismatched)}


# ----- 6. distributions -------------------------------------------------------------------------


def step_stat_key(method: str) -> str | None:
    """The ``method_stats`` key of a method's reached-step count (``seek`` -> slots ...), or None."""
    family = (method or "").lower()
    for name, key in STEP_STATS.items():
        if family == name or family.startswith((name + "-", name + "_", name + ":")):
            return key
    return None


def reached_steps(record: dict, key: str | None) -> tuple[int, bool]:
    """(count, from the method stat?): ``method_stats[key]`` (an int, or a list's length), else the rounds."""
    stats = record.get("method_stats")
    value = stats.get(key) if key and isinstance(stats, dict) else None
    if isinstance(value, (list, tuple)):
        return len(value), True
    if isinstance(value, int) and not isinstance(value, bool):
        return value, True
    return len(rounds_of(record)[0]), False


def step_distribution(records: Sequence[dict], method: str) -> dict:
    """Histogram (value -> questions) and mean of :func:`reached_steps` over the records."""
    key = step_stat_key(method)
    pairs = [reached_steps(r, key) for r in records]
    values = [v for v, _ in pairs]
    return {"stat": key or "rounds", "n_fallback_rounds": sum(1 for _, own in pairs if not own) if key else 0,
            "histogram": {str(v): c for v, c in sorted(Counter(values).items())},
            "mean": _nanmean(values), "n": len(values)}


def latency_summary(records: Sequence[dict]) -> dict:
    """Mean, median, 90th percentile (linear interpolation) and max of ``latency_s``."""
    values = [float(r["latency_s"]) for r in records if isinstance(r.get("latency_s"), (int, float))
              and not isinstance(r.get("latency_s"), bool) and math.isfinite(r["latency_s"])]
    if not values:
        return {"n": 0, "n_missing": len(records), "mean": math.nan, "median": math.nan, "p90": math.nan,
                "max": math.nan}
    array = np.asarray(values)
    return {"n": len(values), "n_missing": len(records) - len(values), "mean": float(array.mean()),
            "median": float(np.median(array)), "p90": float(np.percentile(array, 90)), "max": float(array.max())}


def count_bad_rounds(records: Sequence[dict]) -> int:
    """Records whose ``search_rounds`` was present but malformed (one search per round used instead)."""
    return sum(1 for r in records if not rounds_of(r)[1])


def momentum_trajectories(records: Sequence[dict], embed: Embed) -> dict[str, np.ndarray]:
    """question id -> ``(T+1, D)``: the question, then each round's normalised mean sub-query embedding."""
    texts = [r["question"] for r in records] + [s["query"] for r in records for s in r["searches"]]
    vectors = embed_texts(embed, texts)
    out = {}
    for record in records:
        rounds, _ = rounds_of(record)
        steps = [round_embedding(np.stack([vectors[record["searches"][i]["query"]] for i in r])) for r in rounds]
        out[str(record["id"])] = np.stack([vectors[record["question"]]] + steps)
    return out
