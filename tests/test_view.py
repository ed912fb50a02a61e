"""The run viewer (inference.view) and paired comparisons (inference.compare, --compare): the
page's data from real evaluation runs, training samples old and new, injection-safe embedding,
and the page itself in headless Chromium (skipped where no browser is installed)."""
import json
import math
import os
import shutil
from pathlib import Path

import pytest
from conftest import PASSAGES
from fake_llm import FakeLLM
from test_methods import competent
from test_ppo_loop import tiny_cfg

from envs.retrieval.corpus import load_corpus
from envs.retrieval.encoders import load_encoder
from envs.retrieval.index import build_index
from inference import evaluate as ev
from inference import view
from inference.compare import compare_records, compare_runs
from inference.predictions import load_predictions
from inference.view_records import evaluation_question, training_sample
from tests.tiny_models import tiny_llama, tiny_tokenizer
from training.evaluation.ppo_report import episode_turns, sample_record
from training.models.policy_models import wrap_models
from training.ppo import train
from training.rollouts.rollout import Episode

INJECTION = '</script><img src=x onerror="window.__pwned=1"><!--'
QUESTIONS = [
    {"id": "a", "question": "What is the capital of France?", "golden_answers": ["Paris"]},
    {"id": "b", "question": "Which river flows through Vienna?", "golden_answers": ["Danube"]},
    {"id": "x", "question": f"Capital of Japan? {INJECTION}", "golden_answers": [INJECTION, "Tokyo"]},
]


def answers_the_injection(prompt: str) -> str:
    """``competent`` (always Paris), except that it answers the injection text about Japan."""
    reply = competent(prompt)
    return reply.replace("Paris</answer>", f"{INJECTION}</answer>") if "Capital of Japan?" in prompt else reply


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two real evaluation runs over the same questions (seeds-react and vanilla-rag)."""
    tmp = tmp_path_factory.mktemp("runs")
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "title": t, "text": x}) + "\n" for i, t, x in PASSAGES))
    build_index(load_corpus(corpus), load_encoder("hash"), tmp / "index", show_progress=False)
    data = tmp / "qa.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    llm = FakeLLM(answers_the_injection)
    ev.load_backend, original = (lambda spec, **kw: llm), ev.load_backend
    try:
        for method in ("seeds-react", "vanilla-rag"):
            ev.main(["--method", method, "--data", str(data), "--index", str(tmp / "index"), "--llm", "hf:fake",
                     "--out", str(tmp / method)])
    finally:
        ev.load_backend = original
    return tmp / "seeds-react", tmp / "vanilla-rag"


def page_json(page: str) -> dict:
    start = page.index('id="run-data">') + len('id="run-data">')
    return json.loads(page[start:page.index("</script>", start)])


def test_records_carry_the_reward_breakdown_and_turns_follow_the_searches(runs):
    record = next(r for r in load_predictions(runs[0] / "predictions.jsonl") if r["id"] == "a")
    assert set(record["reward_breakdown"]) >= {"answer", "selection", "format", "total"}
    assert record["reward_breakdown"]["total"] == pytest.approx(record["reward"])
    entry = evaluation_question(record, max_chars=20_000)
    kinds = [t["kind"] for t in entry["turns"]]
    assert kinds[:3] == ["search", "expand", "answer"]
    search, expand = entry["turns"][0], entry["turns"][1]
    assert search["search"] == expand["search"] == 0 and search["llm"][0]["output"].startswith("<think>")
    rows = entry["searches"][0]["candidates"]
    assert [row[0] for row in rows] == list(range(1, len(rows) + 1))
    assert [row[0] for row in rows if row[8]] == [1, 2]  # the fake expands [1] and [2]
    assert any(row[5] for row in rows) and all(isinstance(row[2], float) for row in rows)  # a positive; scores
    assert "Paris" in expand["observation"]  # the passages shown


def test_old_records_without_new_fields_still_load():
    old = {"id": "q", "question": "Q?", "golden_answers": ["A"], "prediction": None, "metrics": {"em": 0.0},
           "finish_reason": "env_limit", "n_invalid": 2, "reward": -0.2,
           "trace": [{"type": "env", "kind": "invalid", "action": "junk", "observation": "bad",
                      "invalid_reason": "no tag"}, {"type": "end", "reason": "no_answer"}]}
    entry = evaluation_question(old, max_chars=3)
    assert entry["flags"] == {"wrong": True, "invalid": True, "limit": True}
    assert entry["reward_parts"] is None and entry["searches"] == []
    assert entry["turns"][0]["reason"] == "no tag" and entry["turns"][1]["kind"] == "end"
    assert entry["question"].startswith("Q?") and "more characters" not in entry["question"]
    assert "1 more characters not shown" in evaluation_question({**old, "question": "Q??!"}, 3)["question"]


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def test_training_samples_record_turns_and_the_episode_and_old_samples_show_their_text():
    pieces = [("PROMPT", 0, -1), ("<search>q</search>", 1, 0), ("\nOBS\n", 0, 0), ("<answer>A</answer>", 1, 1)]
    text = "".join(piece for piece, _, _ in pieces)
    ids = [ord(c) for c in text]
    mask = [m for piece, m, _ in pieces for _ in piece]
    turns = [t for piece, _, t in pieces for _ in piece]
    info = {"question": "Q?", "golden_answers": ["A"], "answer": "A", "metrics": {"em": 1.0}, "n_invalid": 0,
            "reward": {"answer": 1.0, "total": 1.0}, "searches": [{"query": "q", "ids": ["d1"], "ranks": [1],
                                                                   "scores": [0.5], "positive": [True]}]}
    episode = Episode(ids, mask, [0.0] * len(ids), turns, prompt_length=6, example_id="e1", group_id=0, reward=1.0,
                      info=info, finish_reason="answer")
    assert episode_turns(episode, CharTokenizer()) == [
        [["model", "<search>q</search>"], ["env", "\nOBS\n"]], [["model", "<answer>A</answer>"]]]
    sample = json.loads(json.dumps(sample_record(episode, 3, CharTokenizer())))
    assert sample["question"] == "e1" and sample["text"] == text[6:]  # the W&B columns as before
    entry = training_sample(sample, 20_000)
    assert entry["id"] == "3:e1" and entry["question"] == "Q?" and entry["flags"]["wrong"] is False
    assert entry["searches"][0]["candidates"][0][:6] == [1, 1, 0.5, "", "d1", True]
    old = training_sample({"update": 1, "question": "e1", "reward": 0.0, "finish": "action_limit", "text": "T"}, 100)
    assert old["transcript"] == [[["model", "T"]]] and old["flags"]["limit"] and old["flags"]["wrong"] is None


def test_a_torn_last_sample_line_is_left_out_and_a_bad_line_elsewhere_is_an_error(tmp_path):
    good = json.dumps({"update": 1, "question": "e1", "reward": 0.0, "finish": "answer", "text": "T"})
    (tmp_path / "samples.jsonl").write_text(good + "\n" + '{"update": 2, "quest')
    assert [q["id"] for q in view.load_run(tmp_path)["questions"]] == ["1:e1"]
    (tmp_path / "samples.jsonl").write_text("not json\n" + good + "\n")
    with pytest.raises(view.RunViewError, match="line 1"):
        view.load_run(tmp_path)


def test_embedded_data_cannot_close_the_script_element(runs):
    page = view.render_page([view.load_run(runs[0])])
    data_start = page.index('id="run-data">')
    data = page[data_start:page.index("</script>", data_start)]
    assert "<" not in data.split(">", 1)[1] and "&" not in data
    questions = {q["id"]: q for q in page_json(page)["runs"][0]["questions"]}
    assert questions["x"]["golds"][0] == INJECTION and questions["x"]["answer"] == INJECTION  # round trip
    assert "http://" not in page and "https://" not in page  # nothing fetched


def test_compare_pairs_questions_and_says_whether_a_difference_is_real():
    def record(i, em):
        return {"id": f"q{i}", "prediction": "p", "metrics": {"em": float(em), "f1": float(em)}, "reward": em,
                "docs_read": 2, "positives_opened": em, "n_searches": 1}
    baseline = [record(i, 0) for i in range(60)]
    better = [record(i, 1) for i in range(59, -1, -1)] + [record(99, 1)]  # other order, one extra question
    report = compare_records(baseline, better)
    assert report["questions_paired"] == 60 and report["questions_only_in_other"] == 1
    em = report["metrics"]["em"]
    assert (em["before"], em["after"], em["diff"]) == (0.0, 1.0, 1.0) and em["significant"]
    assert report["metrics"]["precision"]["after"] == 0.5
    noisy = [record(i, i % 2) for i in range(60)]
    flipped = [record(i, (i + 1) % 2) for i in range(60)]
    same = compare_records(noisy, flipped)["metrics"]["em"]
    assert same["diff"] == 0.0 and same["lo"] < 0 < same["hi"] and not same["significant"]
    assert "cover_em" not in report["metrics"]  # a metric neither run has is not invented


def test_compare_cli_prints_intervals_and_writes_compare_json(runs, tmp_path, capsys):
    assert ev.main(["--compare", str(runs[1]), str(runs[0]), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "paired bootstrap 95% interval" in out and "3 questions in both runs" in out
    written = json.loads((tmp_path / "compare.json").read_text())
    assert written == json.loads(json.dumps(compare_runs([runs[1], runs[0]])))
    row = written["comparisons"][0]["metrics"]["docs_read_per_question"]
    assert row["lo"] <= row["diff"] <= row["hi"] and math.isfinite(row["lo"])


def test_view_cli_writes_one_page_for_a_run_or_two(runs, tmp_path):
    assert view.main([str(runs[0]), "--out", str(tmp_path / "one.html")]) == 0
    assert page_json((tmp_path / "one.html").read_text())["comparison"] is None
    assert view.main([str(runs[0]), str(runs[1] / "predictions.jsonl"), "--out", str(tmp_path / "two.html")]) == 0
    data = page_json((tmp_path / "two.html").read_text())
    assert [r["name"] for r in data["runs"]] == ["seeds-react", "vanilla-rag"]
    assert data["comparison"]["questions_paired"] == 3 and "em" in data["comparison"]["metrics"]
    with pytest.raises(SystemExit, match="neither predictions.jsonl"):
        view.main([str(tmp_path)])
    sharded = tmp_path / "sharded"  # a data-parallel run before its merge: the shard files are read
    (sharded / "shards").mkdir(parents=True)
    lines = (runs[0] / "predictions.jsonl").read_text().splitlines(keepends=True)
    (sharded / "shards" / "part-000-of-002.jsonl").write_text("".join(lines[:2]))
    (sharded / "shards" / "part-001-of-002.jsonl").write_text("".join(lines[2:]))
    assert sorted(q["id"] for q in view.load_run(sharded)["questions"]) == ["a", "b", "x"]


# ---------------------------------------------------------------------------------- the browser

def chromium_path() -> str | None:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the test extra) is not installed")
    executable = chromium_path()
    if executable is None:
        pytest.skip("no Chromium installed (apt-get install chromium)")
    with sync_api.sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=executable, headless=True,
                                              args=["--no-sandbox", "--disable-gpu"])
        yield instance
        instance.close()


def open_page(browser, path: Path):
    page = browser.new_page()
    problems = []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("request", lambda request: problems.append(f"fetched {request.url}")
            if not request.url.startswith(("file:", "data:", "about:")) else None)
    page.goto(path.as_uri())
    page.wait_for_selector(".qrow")
    return page, problems


def test_the_page_loads_filters_and_opens_a_question(browser, runs, tmp_path):
    path = view.write_view([runs[0], runs[1]], tmp_path / "view.html")
    page, problems = open_page(browser, path)
    assert page.locator("#compare-table tr").count() > 3
    assert page.locator("#count").inner_text() == "3 of 3 questions"
    page.check("#filter-wrong")
    assert page.locator("#count").inner_text() == "2 of 3 questions"  # b and x are wrong
    page.uncheck("#filter-wrong")
    page.check("#filter-disagree")
    assert [page.locator(".qrow").nth(i).get_attribute("data-id") for i in range(page.locator(".qrow").count())] \
        == ["x"]  # right in seeds-react, wrong in vanilla-rag
    page.uncheck("#filter-disagree")
    page.fill("#search", "vienna")
    assert page.locator(".qrow").count() == 1 and page.locator(".qrow").get_attribute("data-id") == "b"
    page.fill("#search", "")
    page.click('.qrow[data-id="x"]')
    page.wait_for_selector("#detail")
    assert INJECTION in page.locator("#detail h2").inner_text()  # shown as text ...
    assert page.evaluate("window.__pwned") is None and page.locator("#detail img").count() == 0  # ... never run
    assert page.locator("#detail .run-col").count() == 2
    page.go_back()
    page.click('.qrow[data-id="a"]')
    page.wait_for_selector("#detail")
    first = page.locator("#detail .run-col").first
    assert first.locator("table.candidates tr.positive").count() >= 1
    assert first.locator("table.candidates tr.expanded").count() == 2
    assert "passages shown" in first.inner_text()
    page.go_back()
    page.click('.qrow[data-id="b"]')
    page.wait_for_selector("#detail")
    assert "positives not opened: [3] Vienna (search 1)" in page.locator("#detail .why").first.inner_text()
    page.go_back()
    page.wait_for_selector("#home:not([hidden])")
    assert problems == []


def test_a_large_run_renders_only_the_rows_in_view(browser, runs, tmp_path):
    record = load_predictions(runs[0] / "predictions.jsonl")[0]
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "predictions.jsonl", "w") as handle:
        for i in range(4000):
            handle.write(json.dumps({**record, "id": f"q{i}", "finish_reason": "answered" if i % 3 else "env_limit"})
                         + "\n")
    page, problems = open_page(browser, view.write_view([big], tmp_path / "big.html"))
    assert page.locator("#count").inner_text() == "4000 of 4000 questions"
    assert 0 < page.locator(".qrow").count() < 100
    page.select_option("#filter-finish", "env_limit")
    assert page.locator("#count").inner_text() == "1334 of 4000 questions"
    page.locator("#list").evaluate("list => { list.scrollTop = list.scrollHeight; "
                                   "list.dispatchEvent(new Event('scroll')); }")
    page.wait_for_selector('.qrow[data-id="q3999"]')
    assert problems == []


def test_a_ppo_runs_samples_open_in_the_viewer(tmp_path, retriever, examples):
    tok = tiny_tokenizer()
    cfg = tiny_cfg(tmp_path, log_samples=2)
    train(cfg, retriever=retriever, examples=examples, eval_examples=[],
          models=wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout))
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and all(s["episode"]["question"] for s in samples)
    for sample in samples:  # the turns are the completion, cut where the model and the env take turns
        assert "".join(text for turn in sample["turns"] for _, text in turn) == sample["text"]
    run = view.load_run(tmp_path)
    assert run["kind"] == "training" and [q["id"] for q in run["questions"]] == [
        f"1:{s['question']}" for s in samples]
    assert run["questions"][0]["question"] == samples[0]["episode"]["question"]
