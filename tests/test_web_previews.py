"""Live web as SEEDS runs it: previews from the search API's snippets, a page fetched only when the
env opens (admits) its candidate, the reader given ~3,000 characters around the snippet, failed pages
as recorded observations, and the pages fetched per question in the episode summary and metrics.json.
Everything stays on loopback (the fake web of ``web_fake``; ``loopback_only``)."""
from __future__ import annotations

import pytest
from fake_llm import FakeLLM
from test_web_retriever import FRANCE, fresh, loopback_only, responder, web  # noqa: F401  (fixtures)
from web_fake import EIFFEL

import methods
from envs.config import EnvConfig
from envs.retrieval.web import parse_web_spec
from envs.retrieval.web_reader import DEFAULT_READER_CHARS, reader_window, snippet_span, unreadable_page_text
from envs.search_env import SearchEnv
from envs.types import QAExample
from envs.vector_env import SearchVectorEnv
from inference.run_metrics import summarize
from methods.runner import run_questions_sync

QUESTION = QAExample("q0", "What is the capital of France?", ("Paris",))


def env_over(retriever, **config) -> SearchEnv:
    env = SearchEnv(retriever, config=EnvConfig(**{"candidates_per_search": 7, "max_expand": 7,
                                                   "max_obs_tokens": 20_000, **config}))
    env.reset(seed=0, options={"example": QUESTION})
    return env


def test_previews_are_the_snippets_and_a_search_fetches_no_page(web, fresh):
    retriever = fresh()
    assert retriever.config.previews == "snippet" and retriever.config.reader_chars == DEFAULT_READER_CHARS == 3000
    (hits,) = retriever.search([FRANCE], k=5)
    assert [h.text for h in hits] == ["Paris is the capital of France", "France statistics in a PDF",
                                      "a page that no longer exists", "a very long page",
                                      "Rome is the capital of Italy"]
    assert [h.title for h in hits] == ["Paris", "A PDF", "Gone", "Huge", "Rome"]  # the engine's titles
    assert all(h.id.endswith("#page") for h in hits)
    assert web.page_fetches() == 0 and retriever.stats.pages_fetched == 0
    env = env_over(retriever)
    snapshot, *_ = env.step(f"<search>{FRANCE}</search>")
    assert "[1] Paris: Paris is the capital of France" in snapshot and web.page_fetches() == 0
    assert env.summary()["pages_fetched"] == 0


@pytest.mark.parametrize("cache", ["disk", "off"])
def test_expanding_k_candidates_fetches_exactly_k_pages(web, fresh, cache):
    retriever = fresh(options="cache=off" if cache == "off" else "")
    env = env_over(retriever)
    env.step(f"<search>{FRANCE}</search>")
    observation, *_ = env.step("<expand>1, 5, 6</expand>")  # paris.html, rome.html, plain.txt
    assert sorted(web.paths("/page/")) == ["/page/paris.html", "/page/plain.txt", "/page/rome.html"]
    assert "largest city of France" in observation and "river Spree" in observation
    assert env.summary()["pages_fetched"] == 3 and env.summary()["page_failures"] == 0
    env.step("<search>rome</search>")  # the same Rome page again: already read, not fetched
    observation, *_ = env.step("<expand>1</expand>")
    assert "already read above" in observation and web.page_fetches() == 3
    assert env.summary()["pages_fetched"] == 3
    # another question opening the same page: no HTTP request (the run's cache), but its page counts
    again = env_over(retriever)
    again.step("<search>rome</search>")
    observation, *_ = again.step("<expand>1</expand>")
    assert "Rome is the capital of Italy" in observation and web.page_fetches() == 3
    assert again.summary()["pages_fetched"] == 1
    snapshot, *_ = again.step("<search>seine</search>")  # the Paris page under another snippet: no fetch
    assert "[1] Paris on the Seine: on the river Seine" in snapshot  # this search's title and snippet
    observation, *_ = again.step("<expand>1</expand>")
    assert "on the river Seine" in observation and web.page_fetches() == 3
    assert again.summary()["pages_fetched"] == 2
    assert retriever.stats.pages_fetched == 3 and retriever.stats.pages_opened == 5


def test_prefix_admission_reads_every_candidate_page(web, fresh):
    """A baseline that reads all top-K (prefix admission) fetches K pages where SEEDS fetches its admitted ones."""
    env = env_over(fresh(), admission="prefix", candidates_per_search=3)
    observation, *_ = env.step(f"<search>{FRANCE}</search>")
    assert web.page_fetches() == 3 and env.summary()["pages_fetched"] == 3
    assert env.summary()["page_failures"] == 2  # the PDF and the missing page


def test_page_previews_count_the_pages_a_search_fetches(web, fresh):
    env = env_over(fresh(options="previews=page"), candidates_per_search=5)
    env.step(f"<search>{FRANCE}</search>")
    assert web.page_fetches() == 5 and env.summary()["pages_fetched"] == 5
    env.step("<expand>1, 2</expand>")  # the text is already whole: nothing more is fetched
    assert web.page_fetches() == 5 and env.summary()["pages_fetched"] == 5


@pytest.mark.parametrize("width", [DEFAULT_READER_CHARS, 500])
def test_the_reader_window_holds_the_snippet_and_fits(web, fresh, width):
    retriever = fresh(options=f"reader_chars={width}")
    env = env_over(retriever)
    env.step("<search>eiffel tower</search>")
    env.step("<expand>1, 2, 3</expand>")
    shown = env.episode.latest.shown
    assert all(0 < len(text) <= width for text in shown.values()), {n: len(t) for n, t in shown.items()}
    assert EIFFEL in shown[1]  # verbatim snippet, ~5,400 characters into the page
    assert "completed in 1889" in shown[2]  # a snippet shortened with "..." is found by its pieces
    assert shown[3].startswith("Tourists often visit")  # no match: the page's opening
    assert "Tourists" in shown[1]  # the window reaches around the snippet, not just the snippet


def test_reader_window_rules():
    page = "Alpha beta gamma. " * 200 + "The answer is forty two. " + "Delta epsilon. " * 200
    window = reader_window(page, "the answer is forty two", 300)
    assert "The answer is forty two." in window and len(window) <= 300
    assert window.split()[0] in ("Alpha", "beta", "gamma.") and window.split()[-1] in ("Delta", "epsilon.")
    assert reader_window(page, "answer forty", 300).count("answer is forty two") == 1  # best sentence
    opening = reader_window(page, "nothing alike", 100)
    assert opening == reader_window(page, "", 100) == page[:100] and opening.startswith("Alpha beta gamma.")
    assert reader_window("short page", "x", 300) == "short page"
    long_snippet = "Delta epsilon. " * 30
    assert len(reader_window(page, long_snippet, 50)) <= 50
    assert snippet_span("Some Text here", "text HERE") == (5, 14)
    with pytest.raises(ValueError):
        reader_window(page, "x", 0)
    note = unreadable_page_text("a snippet", "transient: ReadTimeout: timed out; more detail")
    assert note == "[The page could not be read (ReadTimeout: timed out); only the search result's snippet is " \
                   "available.] a snippet"


def test_a_page_that_cannot_be_read_gives_a_recorded_observation(web, fresh):
    retriever = fresh()
    env = env_over(retriever)
    env.step(f"<search>{FRANCE}</search>")
    observation, *_ = env.step("<expand>2, 3</expand>")  # a PDF and a 404
    assert "[2] A PDF\n[The page could not be read (not an HTML or text page (application/pdf))" in observation
    assert "France statistics in a PDF" in observation
    assert "[3] Gone\n[The page could not be read (HTTP 404); only the search result's snippet" in observation
    assert env.summary()["pages_fetched"] == 2 and env.summary()["page_failures"] == 2
    assert retriever.stats.page_errors == 2 and len(retriever.errors) == 2
    assert "HTTP 404" in env.episode.latest.shown[3]  # what a reader is handed says so too


def test_a_refused_address_is_an_observation_not_a_fetch(web, fresh):
    retriever = fresh(options="private_pages=false")
    env = env_over(retriever)
    env.step(f"<search>{FRANCE}</search>")
    observation, *_ = env.step("<expand>1</expand>")
    assert "[The page could not be read (refused: 127.0.0.1 is a non-public address (127.0.0.1)" in observation
    assert observation.rstrip().endswith("Paris is the capital of France\n</information>".rstrip())
    assert web.page_fetches() == 0 and env.summary()["page_failures"] == 1


def spy_on_prefetch(retriever) -> list[list[str]]:
    calls, real = [], retriever.prefetch_pages
    retriever.prefetch_pages = lambda hits: calls.append([h.id.rsplit("/", 1)[1] for h in hits]) or real(hits)
    return calls


def test_a_batch_of_episodes_reads_its_opened_pages_in_one_call(web, fresh):
    retriever = fresh()
    calls = spy_on_prefetch(retriever)
    vector = SearchVectorEnv(retriever, 2, config=EnvConfig(candidates_per_search=5, max_obs_tokens=20_000))
    vector.reset(seed=0, examples=[QUESTION, QUESTION])
    vector.step([f"<search>{FRANCE}</search>"] * 2)
    assert calls == [] and web.page_fetches() == 0
    _, _, _, _, infos = vector.step(["<expand>1, 5</expand>", "<expand>5</expand>"])
    assert calls == [["paris.html#page", "rome.html#page", "rome.html#page"]]  # one call for the batch
    assert sorted(web.paths("/page/")) == ["/page/paris.html", "/page/rome.html"]  # each page once
    assert [env.summary()["pages_fetched"] for env in vector.envs] == [2, 1]


@pytest.mark.parametrize("distractor_rate", [0.0, 0.5])
def test_a_batch_of_prefix_searches_reads_its_pages_in_one_call(web, fresh, distractor_rate):
    """Prefix admission opens every candidate a search shows: read ahead, unless distractors may
    replace some (then each env reads its own, so no page that is not shown is fetched)."""
    retriever = fresh()
    calls = spy_on_prefetch(retriever)
    config = EnvConfig(candidates_per_search=2, admission="prefix", max_obs_tokens=20_000,
                       distractor_rate=distractor_rate)
    vector = SearchVectorEnv(retriever, 2, config=config)
    vector.reset(seed=0, examples=[QUESTION, QUESTION])
    vector.step([f"<search>{FRANCE}</search>", "<search>rome</search>"])
    assert calls == ([["paris.html#page", "doc.pdf#page", "rome.html#page"]] if distractor_rate == 0 else [])
    assert [env.summary()["pages_fetched"] for env in vector.envs] == [2, 1]  # every shown candidate opened
    assert web.page_fetches() == 3 if distractor_rate == 0 else web.page_fetches() <= 3  # distractors may repeat one


def test_questions_run_together_share_one_page_read_per_round(web, fresh):
    retriever = fresh()
    calls = spy_on_prefetch(retriever)
    examples = [QAExample(f"q{i}", "What is the capital of France?", ("Paris",)) for i in range(2)]
    records = run_questions_sync(methods.get("seeds-o1"), examples, FakeLLM(responder), retriever,
                                 methods.get("seeds-o1").env_config({"candidates_per_search": 5}))
    assert [r["pages_fetched"] for r in records] == [2, 2] and [r["prediction"] for r in records] == ["Paris"] * 2
    assert calls == [["paris.html#page", "rome.html#page"] * 2]  # both questions' expands in one call
    assert sorted(web.paths("/page/")) == ["/page/paris.html", "/page/rome.html"]
    assert summarize(records)["pages_fetched_per_question"] == 2.0


def test_pages_fetched_reach_metrics():
    records = [{"metrics": {"em": 1.0}, "pages_fetched": 2, "page_failures": 1, "llm_calls": 1,
                "llm_prompt_tokens": 1, "llm_completion_tokens": 1, "latency_s": 0.1, "finish_reason": "answered",
                "prediction": "x"},
               {"metrics": {"em": 0.0}, "pages_fetched": 5, "page_failures": 0, "llm_calls": 1,
                "llm_prompt_tokens": 1, "llm_completion_tokens": 1, "latency_s": 0.1, "finish_reason": "answered",
                "prediction": "y"}]
    metrics = summarize(records)
    assert metrics["pages_fetched_per_question"] == 3.5 and metrics["page_failures_per_question"] == 0.5
    corpus_run = summarize([{k: v for k, v in r.items() if not k.startswith("page")} for r in records])
    assert "pages_fetched_per_question" not in corpus_run  # a corpus reads no pages


def test_web_preview_options():
    base = "web:searxng:http://127.0.0.1:1"
    assert parse_web_spec(f"{base}?previews=page&reader_chars=1200").previews == "page"
    for bad in ("previews=pages", "previews=page&fetch=false", "reader_chars=0"):
        with pytest.raises(ValueError):
            parse_web_spec(f"{base}?{bad}")
    assert parse_web_spec(f"{base}?fetch=false").previews == "snippet"  # snippet-only: never fetches
