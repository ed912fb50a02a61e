"""The ``web:`` retriever against a loopback fake web: specs, passages, cache, failures, rate limit,
SEEDS-o1 end to end, the evaluation CLI. No test may reach a host other than 127.0.0.1 (see ``loopback_only``)."""
from __future__ import annotations

import ipaddress
import json
import re
import socket
import threading
from pathlib import Path

import httpx
import pytest
from fake_llm import FakeLLM
from web_fake import PLAIN, SERPER_KEY, FakeWeb

import methods
from envs.config import EnvConfig
from envs.retrieval.defaults import open_retriever, open_run_retriever
from envs.retrieval.web import WebRetriever, WebSearchConfig, parse_web_spec
from envs.retrieval.web_http import RateLimiter, WebSearchError, fetch_page, html_to_text, page_client
from envs.search_env import SearchEnv
from envs.typed_config import ConfigError
from envs.types import QAExample
from inference import evaluate as ev
from methods.runner import run_questions_sync
from training.config import PPOConfig, with_values
from training.runtime.inputs import load_retriever as load_ppo_retriever

FRANCE = "capital of France"


class NonLoopbackConnection(AssertionError):
    pass


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Every name lookup and connection in these tests must stay on the loopback interface."""
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect

    def getaddrinfo(host, *args, **kwargs):
        if host is not None and not _loopback(host.decode() if isinstance(host, bytes) else str(host)):
            raise NonLoopbackConnection(f"a test looked up {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    def connect(sock, address):
        if isinstance(address, tuple) and not _loopback(str(address[0])):
            raise NonLoopbackConnection(f"a test connected to {address!r}")
        return real_connect(sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):  # httpx would send loopback requests to a proxy
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture(scope="module")
def web():
    server = FakeWeb()
    yield server
    server.close()


@pytest.fixture
def fresh(web, tmp_path, monkeypatch):
    """A factory of retrievers over the fake web, each test with its own cache folder and no waits."""
    web.requests.clear()
    web.bodies.clear()
    web.headers.clear()
    monkeypatch.setenv("SERPER_API_KEY", SERPER_KEY)
    made = []

    def make(engine="searxng", options="", **kwargs):
        url = f"{web.url}/serper" if engine == "serper" else web.url
        spec = (f"web:{engine}:{url}?rps=0&fetch_rps=0&backoff=0&max_page_bytes=100000&private_pages=true"
                f"&cache={tmp_path / 'cache'}")  # the fake web's pages are on 127.0.0.1
        retriever = WebRetriever(parse_web_spec(spec + (f"&{options}" if options else "")), **kwargs)
        made.append(retriever)
        return retriever

    yield make
    for retriever in made:
        retriever.close()


def test_specs_parse_to_typed_options(tmp_path, monkeypatch):
    config = parse_web_spec("web:searxng:http://127.0.0.1:8888?results=5&fetch=false&timeout=3&cache=off"
                            "&passage_words=50&rps=0.5")
    assert (config.engine, config.url, config.results, config.fetch, config.timeout, config.cache,
            config.passage_words, config.rps) == ("searxng", "http://127.0.0.1:8888", 5, False, 3.0, "off", 50, 0.5)
    assert parse_web_spec("web:serper").endpoint == "https://google.serper.dev/search"
    with pytest.raises(ValueError, match="unknown web search engine"):
        parse_web_spec("web:bing")
    with pytest.raises(ValueError, match="needs the instance's address"):
        parse_web_spec("web:searxng")
    with pytest.raises(ConfigError, match="unknown config key"):
        parse_web_spec("web:searxng:http://127.0.0.1:1?resuls=3")
    with pytest.raises(ConfigError, match="expects an integer"):
        parse_web_spec("web:searxng:http://127.0.0.1:1?results=many")
    with pytest.raises(ValueError, match="out of range"):
        parse_web_spec("web:searxng:http://127.0.0.1:1?passage_words=0")
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    with pytest.raises(WebSearchError, match="SERPER_API_KEY"):
        open_retriever("web:serper")
    with pytest.raises(ValueError, match="cannot be given"):
        open_retriever("web:searxng:http://127.0.0.1:1", corpus="corpus.jsonl")


def test_searxng_pages_become_passages_with_stable_ids(web, fresh):
    retriever = fresh(options="previews=page")  # pages fetched at search time (not the paper's setting)
    (hits,) = retriever.search([FRANCE], k=5)
    base = f"{web.url}/page"
    # one candidate per distinct result (the #history fragment is dropped), in engine order
    assert [h.id for h in hits] == [f"{base}/paris.html#1", f"{base}/doc.pdf#snippet", f"{base}/missing#snippet",
                                    f"{base}/huge.html#0", f"{base}/rome.html#0"]
    assert [h.rank for h in hits] == [1, 2, 3, 4, 5]
    assert [h.score for h in hits] == [1.0, 0.5, pytest.approx(1 / 3), 0.25, 0.2]
    paris = hits[0]
    assert paris.title == "Paris - City Guide" and "Paris is the capital and largest city of France" in paris.text
    assert len(paris.text.split()) <= 100
    page = retriever.passages([f"{base}/paris.html#{i}" for i in range(3)])
    for junk in ("tracking", "Login", "header", "footer", "color"):  # script, nav, header, footer, style
        assert all(junk not in p.text for p in page)
    assert page[0].text.startswith("Paris Tourists often visit")
    assert (page[1].id, page[1].text) == (paris.id, paris.text)
    with pytest.raises(KeyError, match="not seen"):
        retriever.passages([f"{base}/paris.html#3"])  # the page has three passages
    assert hits[1].text == "France statistics in a PDF"  # not HTML: the snippet stands in
    assert len({h.row for h in hits}) == 5 and all(retriever.corpus[h.row].id == h.id for h in hits)
    errors = {e["url"].rsplit("/", 1)[1]: e["error"] for e in retriever.errors}
    assert errors == {"doc.pdf": "not an HTML or text page (application/pdf)", "missing": "HTTP 404"}
    assert retriever.stats.page_errors == 2 and retriever.stats.pages_truncated == 1
    # every passage of a fetched page can be looked up by id, also by a new retriever over the cache
    later = fresh()
    assert later.passages([paris.id])[0].text == paris.text and later.corpus.row_of(paris.id) == 0
    with pytest.raises(KeyError, match="not seen"):
        later.passages([f"{base}/doc.pdf#snippet"])


def test_snippet_only_mode_fetches_no_page(web, fresh):
    retriever = fresh(options="fetch=false")
    (hits,) = retriever.search([FRANCE], k=3)
    assert [h.text for h in hits] == ["Paris is the capital of France", "France statistics in a PDF",
                                      "a page that no longer exists"]
    assert all(h.id.endswith("#snippet") for h in hits) and web.paths("/page") == []


def test_serper_sends_the_key_and_never_stores_it(web, fresh, tmp_path, caplog):
    retriever = fresh("serper", "results=4&language=en&passages_per_result=2&previews=page")
    (hits,) = retriever.search([FRANCE + " malformed"], k=10)
    assert web.bodies[0] == {"q": FRANCE + " malformed", "num": 4, "hl": "en"}
    assert web.headers[0]["X-API-KEY"] == SERPER_KEY and retriever.stats.malformed_results == 3
    assert [h.id.rsplit("/", 1)[1] for h in hits] == ["paris.html#0", "paris.html#1", "doc.pdf#snippet",
                                                     "missing#snippet", "huge.html#0", "huge.html#1"]
    stored = "".join(p.read_text() for p in (tmp_path / "cache").rglob("*.json"))
    assert stored and SERPER_KEY not in stored + repr(retriever) + caplog.text


def test_a_cached_query_makes_no_http_call(web, fresh, tmp_path):
    first = fresh(options="previews=page")
    expected = first.search([FRANCE, "rome"], k=5)
    assert web.paths("/search") == ["/search", "/search"]
    assert not list((tmp_path / "cache").rglob("*.tmp"))  # atomic writes leave no temp files
    web.requests.clear()
    again = fresh(options="previews=page")  # a new process would see the same: memory is empty, the disk cache is not
    assert again.search([FRANCE, "rome", FRANCE], k=5) == [expected[0], expected[1], expected[0]]
    assert [(h.row, h.id) for h in again.search(["rome"], k=5)[0]] == [(h.row, h.id) for h in expected[1]]
    assert sorted(web.requests) == [("GET", "/page/doc.pdf"), ("GET", "/page/missing")]  # failures: not cached
    assert again.stats.searches == 0 and again.stats.search_cache_hits == 3
    assert first.search(["empty"], k=5) == again.search(["empty"], k=5) == [[]]
    assert len(web.paths("/search")) == 2  # an empty reply is not stored: each retriever asked


@pytest.mark.parametrize("word, reason", [("boom", "HTTP 500"), ("notjson", "not JSON"),
                                          ("slow", "ReadTimeout|over the total deadline")])
def test_transient_failures_are_retried_then_recorded_as_empty(web, fresh, word, reason):
    """A slow peer fails by the read timeout or, on a loaded machine, by the total deadline of the
    same length that closes the socket first: either is the recorded timeout."""
    retriever = fresh(options="retries=1&timeout=0.2&fetch=false")
    assert retriever.search([f"{word} query", "rome"], k=3)[0] == []
    assert len(web.paths("/search")) == 3  # two tries for the failing query, one for the other
    assert retriever.stats.failed_searches == 1 and re.search(reason, retriever.errors[0]["error"])
    web.requests.clear()
    assert retriever.search([f"{word} query"], k=3) == [[]]
    assert len(web.paths("/search")) == 2  # a failure is not cached: the next search asks again


def test_refusals_raise_a_clear_error(fresh, monkeypatch):
    with pytest.raises(WebSearchError, match="HTTP 403"):
        fresh().search(["denied"], k=3)
    monkeypatch.setenv("SERPER_API_KEY", "wrong")
    with pytest.raises(WebSearchError, match="HTTP 401") as caught:
        fresh("serper").search(["anything"], k=3)
    assert caught.value.status == 401 and "wrong" not in str(caught.value)
    # in a run, a refusal is the question's recorded error, not a crash of the run
    example = QAExample("q0", "What is the capital of France?", ("Paris",))
    (record,) = run_questions_sync(methods.get("seeds-o1"), [example], FakeLLM(responder),
                                   fresh("serper"), EnvConfig())
    assert record["finish_reason"] == "error: WebSearchError" and record["metrics"]["em"] == 0.0


def test_pages_on_non_public_hosts_are_refused_by_default(web, fresh):
    """The fake web's result pages are on 127.0.0.1: without private_pages none is fetched, each
    candidate is its snippet, and every refusal is recorded (the search API itself is on loopback too)."""
    retriever = fresh(options="private_pages=false&previews=page")
    (hits,) = retriever.search([FRANCE], k=3)
    assert [h.text for h in hits] == ["Paris is the capital of France", "France statistics in a PDF",
                                      "a page that no longer exists"]
    assert web.paths("/page") == [] and web.paths("/search")
    assert retriever.stats.page_errors == 3 and all("non-public address (127.0.0.1)" in e["error"]
                                                    for e in retriever.errors)


def test_a_redirect_to_a_private_host_is_refused():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        if request.url.host == "93.184.216.34":  # a public address (no name lookup: a literal)
            return httpx.Response(302, headers={"location": "http://169.254.169.254/latest/meta-data/"})
        return httpx.Response(200, text="secret", headers={"content-type": "text/plain"})

    with page_client(5.0, httpx.MockTransport(handler)) as client:
        page = fetch_page(client, "http://93.184.216.34/start", 1000)
        assert "non-public address (169.254.169.254)" in page.error and not page.error.startswith("transient")
        assert seen == ["http://93.184.216.34/start"]  # the redirect target was never requested
        assert "non-public" in fetch_page(client, "http://[::1]:8080/", 1000).error
        assert "non-public" in fetch_page(client, "http://localhost/", 1000).error
    with page_client(5.0, httpx.MockTransport(handler), private_pages=True) as client:
        assert fetch_page(client, "http://93.184.216.34/start", 1000).text == "secret"


def test_pages_are_capped_and_typed(web):
    with httpx.Client() as client:
        huge = fetch_page(client, f"{web.url}/page/huge.html", max_bytes=50_000)
        assert huge.truncated and huge.error is None and 0 < len(huge.text) <= 50_000
        assert fetch_page(client, f"{web.url}/page/plain.txt", 1000).text == " ".join(PLAIN.split())
        assert fetch_page(client, "file:///etc/passwd", 1000).error.startswith("not an http(s) address")
        assert fetch_page(client, "http://127.0.0.1:9/closed", 1000).error.startswith("transient: ConnectError")
    title, text = html_to_text("<html><head><title> A  title </title></head><body><p>One</p><p>Two</p></body>")
    assert (title, text) == ("A title", "One\nTwo")


def test_rate_limiter_spaces_requests_on_a_fake_clock():
    now, slept = [100.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    limiter = RateLimiter(2.0, clock=lambda: now[0], sleep=sleep)
    assert [limiter.acquire() for _ in range(3)] == [0.0, 0.5, 0.5]
    now[0] += 10.0  # a long pause refills the bucket up to its burst only
    assert [limiter.acquire() for _ in range(2)] == [0.0, 0.5]
    assert RateLimiter(0, clock=lambda: 0.0, sleep=sleep).acquire() == 0.0 and len(slept) == 3


def test_rate_limiter_reserves_slots_for_threads_in_turn():
    waits, lock = [], threading.Lock()
    limiter = RateLimiter(4.0, burst=2, clock=lambda: 0.0, sleep=lambda s: None)  # time stands still

    def worker():
        wait = limiter.acquire()
        with lock:
            waits.append(wait)

    threads = [threading.Thread(target=worker) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # two from the burst, then one slot every quarter second, each reserved exactly once
    assert sorted(waits) == [0.0, 0.0] + [0.25 * i for i in range(1, 9)]


def test_the_retriever_waits_through_its_limiters(fresh):
    calls = []
    limiter = type("Limiter", (), {"acquire": lambda self: calls.append(1) or 0.5})()
    retriever = fresh(options="previews=page", search_limiter=limiter, fetch_limiter=limiter)
    retriever.search(["rome"], k=2)
    assert len(calls) == 2 and retriever.stats.waited_seconds == 1.0  # one search, one page


def responder(prompt: str) -> str:
    """A SEEDS-o1 reasoner that searches, opens candidates 1 and 5, and answers from what the reader says."""
    if "Final Information:" in prompt and "Search query:" in prompt:
        return ("Final Information: Paris is the capital of France." if "largest city of France" in prompt
                else "Final Information: nothing useful.")
    tail = prompt.rstrip()
    if tail.endswith("</snapshot>"):
        return "The first preview looks useful. <expand>1, 5</expand>"
    if tail.endswith("</result>") or tail.endswith("</information>"):
        return "<think>The reader says Paris.</think><answer>Paris</answer>"
    if tail.endswith("<answer>"):
        return "Paris</answer>"
    return f"<think>I should look this up.</think><search>{FRANCE}</search>"


@pytest.mark.parametrize("previews, chunks, pages", [("snippet", ("page", "page"), 2), ("page", ("1", "0"), 5)])
def test_seeds_o1_runs_end_to_end_over_the_web(web, fresh, previews, chunks, pages):
    """Snippet previews (the paper's) fetch the two opened pages only; page previews all five."""
    retriever = fresh(options=f"previews={previews}")
    example = QAExample("q0", "What is the capital of France?", ("Paris",))
    llm = FakeLLM(responder)
    (record,) = run_questions_sync(methods.get("seeds-o1"), [example], llm, retriever,
                                   methods.get("seeds-o1").env_config({"candidates_per_search": 5}))
    assert record["prediction"] == "Paris" and record["metrics"]["em"] == 1.0, record["trace"]
    (search,) = record["searches"]
    assert search["expanded_ids"] == [f"{web.url}/page/paris.html#{chunks[0]}", f"{web.url}/page/rome.html#{chunks[1]}"]
    reader = next(p for p in llm.prompts if "Final Information:" in p)
    assert "largest city of France" in reader and "Rome is the capital of Italy" in reader
    assert [p.text for p in retriever.passages(search["expanded_ids"])][1].startswith("Rome is the capital")
    assert record["docs_read"] == 2
    assert record["pages_fetched"] == pages == len(web.paths("/page")) and record["page_failures"] == 0


def test_env_distractors_draw_from_web_passages(fresh):
    retriever = fresh()
    retriever.search([FRANCE], k=5)
    env = SearchEnv(retriever, config=EnvConfig(distractor_rate=1.0, candidates_per_search=1, admission="prefix"))
    env.reset(seed=0, options={"example": QAExample("q", "Rome?", ("Rome",))})
    *_, info = env.step("<search>rome</search>")
    (shown,) = info["search"]["ids"]
    assert info["search"]["distractor"] == [True] and shown != f"{retriever.config.url}/page/rome.html#page"
    assert retriever.corpus[retriever.corpus.row_of(shown)].id == shown


def test_cli_and_run_configs_take_a_web_spec(web, tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDS_RL_CACHE", str(tmp_path / "home-cache"))
    spec = f"web:searxng:{web.url}?rps=0&fetch_rps=0&max_page_bytes=100000&private_pages=true"
    assert isinstance(open_run_retriever(spec, None), WebRetriever)
    assert isinstance(load_ppo_retriever(with_values(PPOConfig, {"data.retriever": spec}).data),
                      WebRetriever)  # --retriever of training/ppo.py
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "What is the capital of France?",
                                "golden_answers": ["Paris"]}) + "\n")
    monkeypatch.setattr("inference.evaluate.load_backend", lambda spec, **kw: FakeLLM(responder))
    out = tmp_path / "run"
    assert ev.main(["--method.name", "seeds-o1", "--env.candidates_per_search", "5", "--data.path", str(data),
                    "--data.retriever", spec, "--model.name", "hf:fake", "--run.output_dir", str(out)]) == 0
    (record,) = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert record["prediction"] == "Paris" and json.loads((out / "config.json").read_text())["index"] == spec
    assert list((tmp_path / "home-cache" / "web" / "search").rglob("*.json"))  # the project cache by default


def test_the_eval_recipe_names_a_valid_web_spec():
    recipe = Path(__file__).resolve().parents[1] / "configs" / "eval" / "seeds_o1_web.yaml"
    args = ev.resolve_args(["--config", str(recipe), "--data.path", "qa.jsonl"])
    config = parse_web_spec(args.data.retriever)
    assert (args.method.name, config.engine, config.url, config.results) == ("seeds-o1", "searxng",
                                                                        "http://127.0.0.1:8888", 10)
    assert (config.previews, config.reader_chars) == ("snippet", 3000)  # the paper's live-web reading
    assert ev.build_env(args, methods.get("seeds-o1")).max_obs_tokens == 8000  # room for ten opened pages


def test_the_loopback_guard_refuses_other_hosts():
    with pytest.raises(NonLoopbackConnection):
        socket.getaddrinfo("google.serper.dev", 443)
    with pytest.raises(NonLoopbackConnection):
        socket.create_connection(("10.255.255.1", 80), timeout=0.1)
    assert WebSearchConfig(engine="serper").endpoint.startswith("https://google.serper.dev")
