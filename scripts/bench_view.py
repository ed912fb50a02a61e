"""How large and how fast the run viewer's page is for a large run (inference/view.py).

    python scripts/bench_view.py --questions 5000

Writes N synthetic evaluation records (each: 2 searches of 10 candidates, 4 LLM calls, 4 env
steps with passages, like a SEEDS-ReAct question) to a temporary run, times writing the page, and,
where Chromium and playwright are installed, times loading it to the first table rows, a filter
over all questions, and opening one question. Last line: name=value pairs.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference import view  # noqa: E402


def synthetic_record(i: int) -> dict:
    search = {"query": f"query {i}", "ids": [f"d{j}" for j in range(10)], "rows": list(range(10)),
              "titles": [f"Title {j}" for j in range(10)], "ranks": list(range(1, 11)),
              "scores": [1.0 - j / 10 for j in range(10)], "positive": [j in (1, 6) for j in range(10)],
              "distractor": [j == 4 for j in range(10)], "answer_bearing": [j == 1 for j in range(10)],
              "expanded": [1, 2], "doc_tokens": 120}
    passage = "A passage about something. " * 20
    trace = []
    for kind, observation in (("search", "<snapshot>\n" + "\n".join(f"[{j}] Title: preview" for j in range(10))
                               + "\n</snapshot>"), ("expand", f"<information>{passage}</information>")) * 2:
        trace += [{"type": "llm", "tag": "turn", "output": f"<think>step</think><{kind}>x</{kind}>",
                   "finish_reason": "stop"},
                  {"type": "env", "kind": kind, "action": f"<{kind}>x</{kind}>", "observation": observation}]
    return {"id": f"q{i}", "question": f"Question number {i}?", "golden_answers": ["gold"],
            "prediction": "gold" if i % 3 else "other", "metrics": {"em": float(i % 3 > 0), "f1": 0.5},
            "finish_reason": "answered" if i % 7 else "env_limit", "n_searches": 2, "n_actions": 5,
            "n_invalid": int(i % 11 == 0), "docs_read": 4, "docs_shown": 20, "positives_shown": 4,
            "positives_opened": 2, "negatives_opened": 2, "positives_missed": 2, "doc_tokens": 240,
            "reward": 1.0, "reward_breakdown": {"answer": 1.0, "selection": 0.0, "format": 0.0, "total": 1.0},
            "searches": [search, search], "llm_calls": 4, "llm_prompt_tokens": 3000, "llm_completion_tokens": 80,
            "latency_s": 1.0, "trace": trace}


def browser_timings(page_path: Path) -> dict[str, float]:
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return {}
    if executable is None:
        return {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page()
        started = time.perf_counter()
        page.goto(page_path.as_uri())
        page.wait_for_selector(".qrow")
        load = time.perf_counter() - started
        started = time.perf_counter()
        page.check("#filter-wrong")
        page.wait_for_function("document.getElementById('count').textContent.includes(' of ')")
        filtering = time.perf_counter() - started
        started = time.perf_counter()
        page.locator(".qrow").first.click()
        page.wait_for_selector("#detail .turn")
        opening = time.perf_counter() - started
        browser.close()
    return {"load_s": load, "filter_s": filtering, "open_question_s": opening}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        run.mkdir()
        with open(run / "predictions.jsonl", "w", encoding="utf-8") as handle:
            for i in range(args.questions):
                handle.write(json.dumps(synthetic_record(i)) + "\n")
        started = time.perf_counter()
        page_path = view.write_view([run], Path(tmp) / "view.html")
        figures = {"questions": args.questions, "write_s": time.perf_counter() - started,
                   "page_mb": page_path.stat().st_size / 1e6}
        figures.update(browser_timings(page_path))
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
