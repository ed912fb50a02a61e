"""Analyses of evaluation runs (folders written by ``python -m inference.evaluate``).

    python -m inference.analysis runs/seek [runs/kair runs/maps ...] [--vs runs/vanilla-llm]
        [--encoder NAME] [--plots DIR] [--fit-fraction 0.5] [--seed 0] [--split-metric cover_em]

Per run (= per method), from its ``predictions.jsonl``:

1. sub-query diversity (SEEK §5.3): mean pairwise cosine of a question's sub-queries, averaged
   over questions with >= 2 sub-queries (lower = more diverse);
2. retrieval redundancy (SEEK §5.3, Fig. 6b): mean pairwise Jaccard of the passage-id sets of a
   question's retrieval rounds, and per step t >= 2 the share of D_t already retrieved before;
3. maximum sub-query Recall@5 (SEEK A.5), answer-bearing passages standing in for gold evidence;
4. search momentum (MAPS §2, A.1): fitted beta_2..beta_4 and held-out alignment S_2..S_5;
5. with ``--vs``: scores on the questions the vanilla LLM got right (knowledge conflict) and
   wrong (knowledge utilisation) (SEEK §5.4, Table 3);
6. reached-step distribution (SEEK slots, KAIR steps, MAPS iterations; else rounds) and latency;
7. the matched-prefix hit-rate gain (SEEDS §4.3): the admitted passages' answer-bearing hit rate
   minus that of the same number of top-ranked candidates of the same search, with a paired
   bootstrap 95% interval (:func:`inference.paper_metrics.matched_prefix_gain`).

Embeddings come from the run's index encoder (``"index": "default"`` -> MiniLM, an index folder
-> its ``meta.json`` encoder) unless ``--encoder`` names one (``hash`` needs no model).
Tables are printed; ``analysis.json`` (every number) and PNG plots (per-step overlap, held-out
S_t, reached-step histogram; runs overlaid) are written to ``--plots`` or, by default, to
``<first run>/analysis/``. Records with missing fields are skipped and counted, never fatal.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from envs.atomic import atomic_write, write_json_atomic
from envs.question_match import QuestionMismatchError, check_same_questions, record_digests
from envs.retrieval.encoders import load_encoder
from envs.retrieval.index import read_meta
from inference import analysis_metrics as am
from inference.analysis_momentum import momentum_analysis
from inference.paper_metrics import matched_prefix_gain
from inference.predictions import PredictionsFileError, load_predictions

Embed = am.Embed
PLOT_FILES = ("overlap_by_step.png", "alignment_by_step.png", "reached_steps.png")


# ----- loading ----------------------------------------------------------------------------------


def read_records(path: Path) -> tuple[list, int]:
    """Records of a ``predictions.jsonl`` and the number of unreadable lines (never raises on content).

    The file is never modified (no repair of a torn last line).
    """
    try:
        return load_predictions(path, repair=False), 0
    except PredictionsFileError:
        records, bad = [], 0
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                bad += 1
        return records, bad


def load_run(run: str | Path) -> tuple[dict, list, int]:
    """(config, records, unreadable lines) of a run folder; SystemExit when it is not one."""
    run = Path(run)
    if not run.is_dir():
        raise SystemExit(f"{run}: no such run folder")
    predictions = run / "predictions.jsonl"
    if not predictions.is_file():
        raise SystemExit(f"{run}: no predictions.jsonl (is it a run folder of inference.evaluate?)")
    config_path = run / "config.json"
    try:
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    except ValueError:
        config = {}
    records, bad = read_records(predictions)
    return (config if isinstance(config, dict) else {}), records, bad


def encoder_name(config: dict, override: str | None = None) -> str:
    """``override``, else the run's index encoder: ``"default"`` (or none) -> ``"minilm"``, a folder -> its meta."""
    if override:
        return override
    index = config.get("index") or "default"
    if index == "default":
        return "minilm"
    try:
        return read_meta(index)["encoder"]
    except (FileNotFoundError, KeyError, ValueError) as err:
        raise SystemExit(f"cannot tell the encoder of index {index!r} ({err}); pass --encoder NAME") from err


def encoder_embed(name: str) -> Embed:
    """``texts -> (n, D)`` query embeddings of the encoder ``name`` (envs.retrieval.encoders.load_encoder)."""
    try:
        encoder = load_encoder(name, show_progress=False)
    except (ImportError, OSError, ValueError) as err:
        raise SystemExit(f"cannot load encoder {name!r} ({err}); pass --encoder NAME (e.g. hash)") from err
    return lambda texts: encoder.encode_queries(list(texts), show_progress=False)


# ----- one run ----------------------------------------------------------------------------------


def analyse_records(records: Sequence, embed: Embed, method: str = "", vs_records: Sequence | None = None,
                    fit_fraction: float = 0.5, seed: int = 0, split_metric: str = "cover_em",
                    split_threshold: float = 0.5) -> dict:
    """Every analysis of one run's records (see the module docstring); JSON-ready apart from NaN."""
    good, skipped = am.split_records(records)
    out = {"method": method, "n_records": len(records), "n_analysed": len(good), "skipped": skipped,
           "bad_search_rounds": am.count_bad_rounds(good)}
    out["diversity"] = am.query_diversity(good, embed)
    out["redundancy"] = am.retrieval_redundancy(good)
    out["recall"] = am.recall_summary(good)
    out["momentum"] = momentum_analysis(am.momentum_trajectories(good, embed), fit_fraction, seed)
    out["steps"] = am.step_distribution(good, method)
    out["latency"] = am.latency_summary(good)
    out["matched_prefix"] = matched_prefix_gain(good)  # SEEDS §4.3: admission vs a prefix of the same size
    if vs_records is not None:
        out["conflict"] = am.conflict_split(good, vs_records, split_metric, split_threshold)
    return out


def jsonable(value):
    """NaN/inf -> None and numpy scalars -> Python, recursively (strict JSON)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ----- tables -----------------------------------------------------------------------------------


def _fmt(value, spec: str = "{:.3f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return spec.format(value) if isinstance(value, (int, float)) else str(value)


def format_rows(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Plain aligned text: first column left-aligned, the others right-aligned, a rule under the header."""
    lines = [list(header)] + [list(r) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    rendered = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths)))
                for line in lines]
    rendered.insert(1, "-" * len(rendered[0]))
    return "\n".join(rendered)


def summary_table(results: dict[str, dict]) -> str:
    header = ["run", "N", "skipped", "QuerySim", "nSim", "Jaccard", "MaxR@5", "MaxR@5(all)",
              "Steps", "AB-gain", "Lat-mean", "Lat-p50", "Lat-p90", "Lat-max"]
    rows = []
    for name, r in results.items():
        lat = r["latency"]
        rows.append([name, str(r["n_analysed"]), str(sum(r["skipped"].values())),
                     _fmt(r["diversity"]["mean_similarity"]), str(r["diversity"]["n_questions"]),
                     _fmt(r["redundancy"]["mean_jaccard"]), _fmt(r["recall"]["mean_max_recall"]),
                     _fmt(r["recall"]["mean_max_recall_all"]), _fmt(r["steps"]["mean"], "{:.2f}"),
                     _fmt(r.get("matched_prefix", {}).get("matched_prefix_hit_rate_gain"), "{:+.3f}"),
                     _fmt(lat["mean"], "{:.2f}"), _fmt(lat["median"], "{:.2f}"), _fmt(lat["p90"], "{:.2f}"),
                     _fmt(lat["max"], "{:.2f}")])
    return format_rows(header, rows)


def _step_columns(results: dict[str, dict], getter: Callable[[dict], dict]) -> list[str]:
    steps = sorted({int(t) for r in results.values() for t in (getter(r) or {})})
    return [str(t) for t in steps]


def overlap_table(results: dict[str, dict]) -> str:
    steps = _step_columns(results, lambda r: r["redundancy"]["overlap_by_step"])
    if not steps:
        return "(no question reached a second retrieval step)"
    rows = []
    for name, r in results.items():
        red = r["redundancy"]
        rows.append([name] + [f"{_fmt(red['overlap_by_step'].get(t))} ({red['overlap_counts'].get(t, 0)})"
                              for t in steps])
    return format_rows(["run"] + [f"t={t} (n)" for t in steps], rows)


def momentum_table(results: dict[str, dict]) -> str:
    header = ["run", "fit/held", "beta2", "beta3", "beta4", "S2", "S3", "S4", "S5", "S-mean", "note"]
    rows = []
    for name, r in results.items():
        m = r["momentum"]
        if m["status"] != "ok":
            rows.append([name, f"{m['n_fit']}/{m['n_heldout']}"] + ["-"] * 8 + [m["message"]])
            continue
        rows.append([name, f"{m['n_fit']}/{m['n_heldout']}"]
                    + [_fmt(m["betas"].get(str(t))) for t in (2, 3, 4)]
                    + [_fmt(m["heldout_alignment"].get(str(t))) for t in (2, 3, 4, 5)]
                    + [_fmt(m["heldout_mean"]), f"dropped {m['n_dropped_short']} short"])
    return format_rows(header, rows)


def conflict_table(results: dict[str, dict]) -> str:
    metrics = am.SPLIT_METRICS
    header = ["run", "conflict-n"] + [f"C-{m}" for m in metrics] + ["util-n"] + [f"U-{m}" for m in metrics] \
        + ["missing(vs/run)"]
    rows = []
    for name, r in results.items():
        c = r.get("conflict")
        if c is None:
            continue
        rows.append([name, str(c["conflict"]["n"])] + [_fmt(c["conflict"][m]) for m in metrics]
                    + [str(c["utilisation"]["n"])] + [_fmt(c["utilisation"][m]) for m in metrics]
                    + [f"{c['missing_in_vs']}/{c['missing_in_run']}"])
    return format_rows(header, rows)


def steps_table(results: dict[str, dict]) -> str:
    rows = [[name, r["steps"]["stat"], _fmt(r["steps"]["mean"], "{:.2f}"),
             " ".join(f"{v}:{c}" for v, c in r["steps"]["histogram"].items()) or "-"]
            for name, r in results.items()]
    return format_rows(["run", "stat", "mean", "histogram (value:questions)"], rows)


def render_tables(results: dict[str, dict]) -> str:
    parts = ["Summary (QuerySim: mean pairwise sub-query cosine, lower = more diverse; latency in s)",
             summary_table(results), "",
             "Overlap of step t with all earlier steps: |D_t ∩ D_<t| / |D_t| (questions)", overlap_table(results), "",
             "Search momentum (beta_1 fixed at 0; S_t held out)", momentum_table(results), "",
             "Reached steps", steps_table(results)]
    if any(r.get("conflict") for r in results.values()):
        split = next(r["conflict"] for r in results.values() if r.get("conflict"))
        title = (f"Knowledge conflict (vanilla LLM right by {split['split_metric']} >= {split['threshold']}) / "
                 "utilisation (wrong)")
        parts += ["", title, conflict_table(results)]
    skipped = {n: r["skipped"] for n, r in results.items() if r["skipped"] or r.get("unreadable_lines")}
    for name, reasons in skipped.items():
        parts.append(f"{name}: skipped records {reasons}, unreadable lines {results[name].get('unreadable_lines', 0)}")
    return "\n".join(parts)


# ----- plots ------------------------------------------------------------------------------------


def _figure():
    from matplotlib.figure import (
        Figure,  # no pyplot: no global backend state; PNG via Agg
    )

    figure = Figure(figsize=(6, 4), dpi=100)
    return figure, figure.subplots()


def _save(figure, path: Path) -> Path:
    with atomic_write(path, "wb") as handle:
        figure.savefig(handle, format="png", bbox_inches="tight")
    return path


def plot_step_curves(series: dict[str, dict], title: str, ylabel: str, path: Path) -> Path:
    """One line per run: step -> value (None values left out)."""
    figure, ax = _figure()
    drawn = False
    for name, curve in series.items():
        points = sorted((int(t), v) for t, v in curve.items() if v is not None and not math.isnan(v))
        if points:
            ax.plot([t for t, _ in points], [v for _, v in points], marker="o", label=name)
            drawn = True
    if drawn:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(title=title, xlabel="step t", ylabel=ylabel)
    return _save(figure, path)


def plot_histograms(histograms: dict[str, dict], path: Path, title: str = "Reached steps") -> Path:
    """Grouped bars: value -> share of the run's questions."""
    figure, ax = _figure()
    values = sorted({int(v) for h in histograms.values() for v in h})
    width = 0.8 / max(len(histograms), 1)
    for k, (name, hist) in enumerate(histograms.items()):
        total = sum(hist.values()) or 1
        ax.bar([v + (k - (len(histograms) - 1) / 2) * width for v in values],
               [hist.get(str(v), 0) / total for v in values], width=width, label=name)
    if values:
        ax.legend()
        ax.set_xticks(values)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    ax.set(title=title, xlabel="steps reached", ylabel="share of questions")
    return _save(figure, path)


def write_plots(results: dict[str, dict], out_dir: Path) -> list[Path]:
    overlap = {n: r["redundancy"]["overlap_by_step"] for n, r in results.items()}
    alignment = {n: r["momentum"].get("heldout_alignment", {}) for n, r in results.items()}
    steps = {f"{n} ({r['steps']['stat']})": r["steps"]["histogram"] for n, r in results.items()}
    return [
        plot_step_curves(overlap, "Overlap with earlier steps", r"$|D_t \cap D_{<t}| \,/\, |D_t|$",
                         out_dir / PLOT_FILES[0]),
        plot_step_curves(alignment, "Search-momentum alignment (held out)", r"$S_t$", out_dir / PLOT_FILES[1]),
        plot_histograms(steps, out_dir / PLOT_FILES[2]),
    ]


# ----- command line -----------------------------------------------------------------------------


def lazy_embed(embed_for: Callable[[str], Embed], name: str) -> Embed:
    """An embed callable that builds ``embed_for(name)`` on its first call (no model for a run without text)."""
    built: list[Embed] = []

    def embed(texts):
        if not built:
            built.append(embed_for(name))
        return built[0](texts)

    return embed


def run_names(runs: Sequence[str]) -> list[str]:
    """Folder names, or the paths as given where two folders share a name."""
    names = [Path(r).name or str(r) for r in runs]
    return [str(r) if names.count(n) > 1 else n for r, n in zip(runs, names)]


def analyse(runs: Sequence[str], vs: str | None = None, encoder: str | None = None, plots: str | None = None,
            fit_fraction: float = 0.5, seed: int = 0, split_metric: str = "cover_em", split_threshold: float = 0.5,
            embed_for: Callable[[str], Embed] = encoder_embed) -> tuple[dict, Path]:
    """Analyse ``runs``; write ``analysis.json`` and the plots. Returns (the JSON object, its folder).

    ``embed_for``: encoder name -> embed callable (tests inject a model-free one).
    """
    if not 0.0 < fit_fraction < 1.0:
        raise SystemExit("--fit-fraction must lie strictly between 0 and 1")
    loaded = [load_run(r) for r in runs]  # all checked before any work
    vs_records = load_run(vs)[1] if vs else None
    if vs_records is not None:
        for run, (_, records, _) in zip(runs, loaded):
            try:  # the split pairs the runs by question id
                check_same_questions(record_digests(records), record_digests(vs_records), str(run), f"--vs {vs}")
            except QuestionMismatchError as err:
                raise SystemExit(str(err)) from err
    embeds: dict[str, Embed] = {}
    results = {}
    for name, run, (config, records, bad) in zip(run_names(runs), runs, loaded):
        enc = encoder_name(config, encoder)
        if enc not in embeds:
            embeds[enc] = lazy_embed(embed_for, enc)
        method = str(config.get("method") or "")
        result = analyse_records(records, embeds[enc], method, vs_records, fit_fraction, seed, split_metric,
                                 split_threshold)
        results[name] = {"run": str(run), "encoder": enc, "unreadable_lines": bad, **result}
    out_dir = Path(plots) if plots else Path(runs[0]) / "analysis"
    files = write_plots(results, out_dir)
    report = {"runs": results, "plots": [f.name for f in files],
              "options": {"vs": vs, "encoder": encoder, "fit_fraction": fit_fraction, "seed": seed,
                          "split_metric": split_metric, "split_threshold": split_threshold}}
    report = jsonable(report)
    write_json_atomic(report, out_dir / "analysis.json")
    return report, out_dir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m inference.analysis", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run folders of inference.evaluate")
    parser.add_argument("--vs", metavar="RUN", help="a vanilla-LLM run: split scores into conflict / utilisation")
    parser.add_argument("--encoder", help="embedding encoder for diversity and momentum (default: the run's index "
                                          "encoder; 'hash' needs no model)")
    parser.add_argument("--plots", metavar="DIR", help="folder for the plots and analysis.json "
                                                       "(default: <first run>/analysis)")
    parser.add_argument("--fit-fraction", type=float, default=0.5,
                        help="share of the questions that fit the momentum betas (the rest are held out)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fit / held-out split")
    parser.add_argument("--split-metric", default="cover_em", choices=("em", "f1", "f1_hotpot", "cover_em", "acc"),
                        help="vanilla-LLM metric deciding right / wrong (default cover_em)")
    parser.add_argument("--split-threshold", type=float, default=0.5, help="right when the metric is >= this")
    return parser


def main(argv: list[str] | None = None, embed_for: Callable[[str], Embed] = encoder_embed) -> int:
    args = build_parser().parse_args(argv)
    report, out_dir = analyse(args.runs, vs=args.vs, encoder=args.encoder, plots=args.plots,
                              fit_fraction=args.fit_fraction, seed=args.seed, split_metric=args.split_metric,
                              split_threshold=args.split_threshold, embed_for=embed_for)
    print(render_tables(report["runs"]))
    print(f"\nanalysis.json and plots in {out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
