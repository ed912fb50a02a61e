"""A run as one self-contained HTML page: ``python -m inference.view RUN [RUN2] --out view.html``.

RUN is an evaluation run folder (``predictions.jsonl``, with ``metrics.json`` and ``config.json``
beside it), a PPO output folder (``samples.jsonl``), or one of those files. The page needs no
network: its styles, its script and the data (JSON in a ``<script type="application/json">``,
with ``<``, ``>`` and ``&`` written as JSON escapes, so no model output can close the element)
are inline, and the script renders every piece of data as text, never as HTML. The question
table renders only the rows in view, so runs of thousands of questions stay responsive.

What it shows is in docs/evaluation.md ("Viewing runs"). Records written before a field existed show
what they have: a turn without a search record shows its action and observation only.
"""
from __future__ import annotations

import argparse
import html
import json
import math
import sys
from pathlib import Path

from envs.atomic import atomic_write
from envs.question_match import QuestionMismatchError, check_same_questions, record_digests
from envs.report import with_current_names
from inference.compare import CompareError, compare_records
from inference.predictions import PredictionsFileError, load_predictions
from inference.run_metrics import summarize
from inference.shards import run_records, shard_files
from inference.view_records import evaluation_question, training_sample

ASSETS = Path(__file__).with_name("view_assets")
DEFAULT_MAX_TEXT_CHARS = 20_000


class RunViewError(ValueError):
    pass


def _read_json(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise RunViewError(f"{path}: not JSON ({err})") from err
    return value if isinstance(value, dict) else None


def _read_samples(path: Path) -> list[dict]:
    """The lines of ``samples.jsonl``; a torn last line (a run killed mid-write) is left out with a
    warning, a bad line elsewhere is an error."""
    samples = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            sample = json.loads(line)
        except ValueError as err:
            if number == len(lines):
                print(f"{path}: the last line is torn (a run stopped while writing it); left out", file=sys.stderr)
                break
            raise RunViewError(f"{path}: line {number} is not JSON ({err})") from err
        if not isinstance(sample, dict):
            raise RunViewError(f"{path}: line {number} is not a sample record")
        samples.append(sample)
    return samples


def locate_run(run: str | Path) -> tuple[str, Path]:
    """("evaluation" | "training", the records file) of a run folder or file."""
    path = Path(run)
    if path.is_dir():
        for name, kind in (("predictions.jsonl", "evaluation"), ("samples.jsonl", "training")):
            if (path / name).exists():
                return kind, path / name
        if shard_files(path):  # a data-parallel evaluation not merged yet
            return "evaluation", path / "predictions.jsonl"
        raise RunViewError(f"{run}: neither predictions.jsonl (evaluation) nor samples.jsonl (training) in it")
    if not path.exists():
        raise RunViewError(f"{run}: no such file or folder")
    return ("training" if path.name.startswith("samples") else "evaluation"), path


def load_run(run: str | Path, max_chars: int = DEFAULT_MAX_TEXT_CHARS, prompts: bool = False) -> dict:
    """A run as the page reads it: name, kind, config, metrics and one entry per question."""
    kind, path = locate_run(run)
    folder = path.parent
    name = folder.name if path.name in ("predictions.jsonl", "samples.jsonl") else path.stem
    if kind == "evaluation":
        try:
            records = run_records(folder) if path.name == "predictions.jsonl" else load_predictions(path, repair=False)
        except PredictionsFileError as err:
            raise RunViewError(str(err)) from err
        stored = _read_json(folder / "metrics.json")
        metrics = with_current_names(stored) if stored and stored.get("questions") == len(records) else None
        questions = [evaluation_question(r, max_chars, prompts) for r in records]
        return {"name": name, "kind": kind, "path": str(path), "config": _read_json(folder / "config.json") or {},
                "metrics": metrics or summarize(records), "questions": questions, "records": records}
    questions = [training_sample(s, max_chars) for s in _read_samples(path)]
    return {"name": name, "kind": kind, "path": str(path), "config": _read_json(folder / "config.json") or {},
            "metrics": with_current_names(_read_json(folder / "eval.json") or {}), "questions": questions,
            "records": None}


def embedded_json(data) -> str:
    """JSON safe inside a ``<script>`` element: ``<``, ``>``, ``&`` and the JS line separators
    escaped (they only occur inside strings, so the JSON still parses to the same value)."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, default=str)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return text


def _finite(value):
    """NaN and infinities (an empty denominator in metrics.json) as null, so the JSON is strict."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def page_data(runs: list[dict]) -> dict:
    """Everything the page script reads: the runs and, for two evaluation runs, their comparison."""
    comparison = None
    if len(runs) == 2 and all(r["kind"] == "evaluation" for r in runs):
        try:
            comparison = compare_records(runs[0]["records"], runs[1]["records"])
        except CompareError as err:
            comparison = {"error": str(err)}
    return _finite({"runs": [{k: v for k, v in r.items() if k != "records"} for r in runs],
                    "comparison": comparison})


def render_page(runs: list[dict]) -> str:
    title = "Run viewer: " + " vs ".join(r["name"] for r in runs)
    style = (ASSETS / "page.css").read_text(encoding="utf-8")
    script = (ASSETS / "page.js").read_text(encoding="utf-8")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<title>{html.escape(title)}</title>\n<style>\n{style}</style>\n</head>\n<body>\n'
            f'<noscript>This page needs JavaScript (it runs offline, nothing is fetched).</noscript>\n'
            f'<div id="app"></div>\n'
            f'<script type="application/json" id="run-data">{embedded_json(page_data(runs))}</script>\n'
            f'<script>\n{script}</script>\n</body>\n</html>\n')


def write_view(runs: list[str | Path], out: str | Path, max_chars: int = DEFAULT_MAX_TEXT_CHARS,
               prompts: bool = False) -> Path:
    loaded = [load_run(run, max_chars, prompts) for run in runs]
    if len(loaded) == 2 and all(r["kind"] == "evaluation" for r in loaded):  # the page pairs them by id
        try:
            left, right = loaded
            check_same_questions(record_digests(left["records"]), record_digests(right["records"]),
                                 left["path"], right["path"])
        except QuestionMismatchError as err:
            raise RunViewError(str(err)) from err
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out) as handle:
        handle.write(render_page(loaded))
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m inference.view", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN", help="one run, or two to see side by side")
    parser.add_argument("--out", help="the HTML file (default <first run>/view.html)")
    parser.add_argument("--max-text-chars", type=int, default=DEFAULT_MAX_TEXT_CHARS,
                        help="longer texts (observations, LLM outputs) are cut, with a visible mark")
    parser.add_argument("--prompts", action="store_true", help="include every LLM call's prompt (large pages)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if len(args.runs) > 2:
        raise SystemExit("inference.view shows one run, or two side by side")
    first = Path(args.runs[0])
    out = args.out or (first if first.is_dir() else first.parent) / "view.html"
    try:
        path = write_view(args.runs, out, args.max_text_chars, args.prompts)
    except RunViewError as err:
        raise SystemExit(str(err)) from err
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB); open it in a browser", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
