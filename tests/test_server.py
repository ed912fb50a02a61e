"""Retrieval server (FastAPI app, uvicorn engine): endpoints and shapes through FastAPI's test
client, validation and caps (4xx naming the reason), the bearer token, the command line's
refusal of an open non-loopback server, and the asyncio batcher (whole requests, one call per k).

Client-side behaviour over a real socket (RemoteRetriever, concurrency, retries) is in
tests/test_remote.py; the Ray Serve engine in tests/test_server_ray.py.
"""
from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from fastapi.testclient import TestClient
from server_helpers import (  # noqa: F401  (fixtures)
    QUERIES,
    TEXTS,
    FlakyRetriever,
    StubRetriever,
    as_json,
    index_dir,
    local,
    private_cache,
    reference,
    serve,
)

from envs.retrieval.batching import AsyncBatcher
from envs.retrieval.remote import RemoteRetrievalError, RemoteRetriever
from envs.retrieval.server import RetrievalServer, ServerLimits, uvicorn_app
from envs.retrieval.server import main as server_main
from envs.types import Hit

LIMITS = {"max_queries_per_request": 4, "max_k": 6, "max_body_bytes": 2000, "max_query_chars": 100}


@pytest.fixture
def app(local):
    return uvicorn_app(local, ServerLimits(**LIMITS))


@pytest.fixture
def client(app):
    with TestClient(app) as test_client:
        yield test_client


# ------------------------------------------------------------------------------ endpoints


def test_search_round_trip(client, reference):
    response = client.post("/search", json={"queries": ["capital of Japan", "river Spree"], "k": 3})
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    results = response.json()["results"]
    expected = reference.search(["capital of Japan", "river Spree"], 3)
    assert results == [[as_json(h) for h in hits] for hits in expected]
    assert results[0][0]["title"] == "Tokyo" and [h["rank"] for h in results[0]] == [1, 2, 3]
    assert len(client.post("/search", json={"queries": ["capital"]}).json()["results"][0]) == 5  # k defaults to 5
    assert client.post("/search", json={"queries": []}).json() == {"results": []}


def test_retrieve_has_search_r1_shape(client, reference):
    """What Search-R1's agent reads: result[q][i]['document']['contents'] = '"Title"\\ntext'."""
    body = {"queries": ["capital of Japan", "river Spree"], "topk": 2, "return_scores": True}
    result = client.post("/retrieve", json=body).json()["result"]
    expected = reference.search(body["queries"], 2)
    assert len(result) == 2 and all(len(docs) == 2 for docs in result)
    for docs, hits in zip(result, expected):
        for doc, hit in zip(docs, hits):
            assert set(doc) == {"document", "score"} and set(doc["document"]) == {"id", "contents"}
            assert doc["document"] == {"id": hit.id, "contents": f'"{hit.title}"\n{hit.text}'}
            assert doc["score"] == hit.score
    contents = result[0][0]["document"]["contents"]  # Search-R1's _passages2string
    assert contents.split("\n")[0].strip('"') == "Tokyo" and "\n".join(contents.split("\n")[1:]) == TEXTS[2][1]

    bare = client.post("/retrieve", json={"queries": ["capital of Japan"], "topk": 2}).json()["result"]
    assert bare == [[r["document"] for r in result[0]]]  # return_scores false: the documents alone
    assert len(client.post("/retrieve", json={"queries": ["capital of Japan"]}).json()["result"][0]) == 3  # topk 3
    null_topk = client.post("/retrieve", json={"queries": ["capital of Japan"], "topk": None}).json()["result"]
    assert len(null_topk[0]) == 3
    empty = client.post("/retrieve", json={"queries": ["", "river Spree"], "topk": 1}).json()["result"]
    assert empty[0] == [] and len(empty[1]) == 1  # an empty <search></search> does not fail the batch
    assert client.post("/retrieve", json={"queries": []}).json() == {"result": []}


def test_passages_by_row(client, local):
    passages = client.post("/passages", json={"rows": [3, 0, 3]}).json()["passages"]
    assert passages == [{"row": p.row, "id": p.id, "title": p.title, "text": p.text}
                        for p in local.corpus.get_many([3, 0, 3])]


def test_health_reports_index_limits_and_counters(client, app):
    client.post("/search", json={"queries": ["capital"], "k": 1})
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["engine"] == "uvicorn" and health["auth"] == "none"
    assert health["passages"] == len(TEXTS) and health["encoder"] == "hash"
    assert health["index_type"] == "Flat" and health["dim"] == 512
    assert health["max_batch"] == 256 and health["max_queries_per_request"] == 4 and health["max_k"] == 6
    assert health["max_query_chars"] == 100 and health["max_body_bytes"] == 2000
    served = health["served"]
    assert served["requests_search"] == 1 and served["queries"] == 1 and served["batches"] == 1
    assert served["retriever_calls"] == 1 and app.state.served()["requests_health"] == 1


def test_docs_show_the_models_and_their_caps(client):
    schema = client.get("/openapi.json").json()
    assert {"/search", "/retrieve", "/passages", "/health"} <= set(schema["paths"])
    search = schema["components"]["schemas"]["SearchRequest"]["properties"]
    assert search["queries"]["maxItems"] == 4 and search["queries"]["items"]["maxLength"] == 100
    assert search["k"]["maximum"] == 6 and search["k"]["minimum"] == 1


def test_the_docs_page_is_off_unless_asked_for(client, local):
    """Swagger UI loads its scripts from a CDN (a blank page offline): off by default."""
    for path in ("/docs", "/redoc"):
        response = client.get(path)
        assert response.status_code == 404 and "cdn" not in response.text.lower()
    with TestClient(uvicorn_app(local, docs=True)) as with_docs:
        assert with_docs.get("/docs").status_code == 200 and with_docs.get("/redoc").status_code == 404


BAD_REQUESTS = [
    ("POST", "/search", b"{not json", 400, "not valid JSON"),
    ("POST", "/search", b"[1, 2]", 400, "JSON object"),
    ("POST", "/search", b"", 400, "JSON body is required"),
    ("POST", "/search", b'{"queries": ["a"], "k": NaN}', 400, "k: Input should be a valid integer"),
    ("POST", "/search", json.dumps({"k": 2}).encode(), 400, "missing field 'queries'"),
    ("POST", "/search", json.dumps({"queries": "capital"}).encode(), 400, "queries: Input should be a valid list"),
    ("POST", "/search", json.dumps({"queries": ["ok", 3]}).encode(), 400, "queries[1]: Input should be a valid str"),
    ("POST", "/search", json.dumps({"queries": ["ok", "  "]}).encode(), 400, "queries[1] is empty"),
    ("POST", "/search", json.dumps({"queries": ["a"], "k": 0}).encode(), 400, "k: Input should be greater than"),
    ("POST", "/search", json.dumps({"queries": ["a"], "k": "3"}).encode(), 400, "k: Input should be a valid int"),
    ("POST", "/search", json.dumps({"queries": ["a"], "k": True}).encode(), 400, "k: Input should be a valid int"),
    ("POST", "/search", json.dumps({"queries": ["a"], "k": 7}).encode(), 400, "k=7 is over the server's cap max_k=6"),
    ("POST", "/search", json.dumps({"queries": ["a"] * 5, "k": 1}).encode(), 413, "cap max_queries_per_request=4"),
    ("POST", "/search", json.dumps({"queries": ["x" * 101]}).encode(), 413,
     "queries[0]: 101 characters in one query is over the server's cap max_query_chars=100"),
    ("POST", "/search", json.dumps({"queries": ["x" * 3000]}).encode(), 413, "cap max_body_bytes=2000"),
    ("POST", "/retrieve", json.dumps({"queries": ["a"], "topk": -1}).encode(), 400, "topk: Input should be greater"),
    ("POST", "/retrieve", json.dumps({"queries": ["a"], "return_scores": "yes"}).encode(), 400, "valid boolean"),
    ("POST", "/retrieve", json.dumps({"queries": ["a"], "topk": 9}).encode(), 400, "topk=9 is over"),
    ("POST", "/passages", json.dumps({"rows": [99]}).encode(), 400, "rows[0]=99 is out of range"),
    ("POST", "/passages", json.dumps({"rows": ["1"]}).encode(), 400, "rows[0]: Input should be a valid integer"),
    ("POST", "/nowhere", b"{}", 404, "unknown path /nowhere"),
    ("GET", "/", None, 404, "unknown path"),
    ("GET", "/search", None, 405, "takes POST"),
    ("DELETE", "/search", None, 405, "takes POST"),
    ("POST", "/health", b"{}", 405, "takes GET"),
]


@pytest.mark.parametrize("method,path,body,status,reason", BAD_REQUESTS,
                         ids=[f"{m} {p} {s} {r}" for m, p, _, s, r in BAD_REQUESTS])
def test_bad_requests_get_4xx_with_a_reason(client, app, method, path, body, status, reason):
    response = client.request(method, path, content=body)  # no Content-Type: read as JSON all the same
    assert response.status_code == status
    assert reason in response.json()["error"]
    assert client.get("/health").status_code == 200
    assert app.state.served()["errors_4xx"] == 1


def test_a_two_million_character_query_is_refused_naming_the_cap(local):
    """Default caps: the body cap (4 MiB) lets a 2,000,000-character query through; the query cap does not."""
    with TestClient(uvicorn_app(local)) as default_client:
        response = default_client.post("/search", json={"queries": ["x" * 2_000_000]})
        assert response.status_code == 413 and "max_query_chars=4096" in response.json()["error"]
        assert default_client.get("/health").json()["max_query_chars"] == 4096


def test_a_chunked_body_over_the_cap_is_refused(local):
    def chunks():
        for _ in range(10):
            yield b'{"queries": ["' + b"x" * 400

    with serve(local, **LIMITS) as running, httpx.Client(base_url=running.url, trust_env=False) as http:
        response = http.post("/search", content=chunks())  # no Content-Length: Transfer-Encoding chunked
        assert response.status_code == 413 and "max_body_bytes=2000" in response.json()["error"]
        assert http.get("/health").status_code == 200


def test_retriever_failure_is_a_500_and_the_server_keeps_running(local):
    app = uvicorn_app(FlakyRetriever(local))
    with TestClient(app) as flaky:
        failed = flaky.post("/search", json={"queries": ["capital"], "k": 1})
        assert failed.status_code == 500 and "index shard went away" in failed.json()["error"]
        assert flaky.post("/search", json={"queries": ["capital"], "k": 1}).status_code == 200
        assert app.state.served()["errors_5xx"] == 1 and app.state.served()["failed_batches"] == 1


# ------------------------------------------------------------------------------ the token


def test_every_endpoint_wants_the_token(local, reference):
    app = uvicorn_app(local, token="s3cret")
    with TestClient(app) as protected:
        for method, path, body in [("POST", "/search", {"queries": ["a"]}), ("POST", "/retrieve", {"queries": ["a"]}),
                                   ("POST", "/passages", {"rows": [0]}), ("GET", "/health", None),
                                   ("GET", "/nowhere", None)]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
                refused = protected.request(method, path, json=body, headers=headers)
                assert refused.status_code == 401, (path, headers)
                assert "token" in refused.json()["error"] and refused.headers["www-authenticate"] == "Bearer"
        ok = protected.post("/search", json={"queries": ["capital of Japan"], "k": 2},
                            headers={"Authorization": "Bearer s3cret"})
        assert ok.json()["results"] == [[as_json(h) for h in reference.search(["capital of Japan"], 2)[0]]]
        assert protected.get("/openapi.json").status_code == 200  # the API's description is public
        assert protected.get("/health", headers={"Authorization": "Bearer s3cret"}).json()["auth"] == "bearer"


def test_remote_retriever_sends_the_token_from_argument_or_environment(local, reference, monkeypatch):
    with serve(local, token="s3cret") as running:
        with pytest.raises(RemoteRetrievalError, match="bearer token") as caught:
            RemoteRetriever(running.url, retries=0).search(["capital"], 2)
        assert caught.value.status == 401
        with RemoteRetriever(running.url, token="s3cret") as remote:
            assert remote.search(["capital of Japan"], 3) == reference.search(["capital of Japan"], 3)
        monkeypatch.setenv("SEEDS_RETRIEVAL_TOKEN", "s3cret")
        with RemoteRetriever(running.url) as remote:  # as PPO and evaluation open it: open_retriever(url)
            assert remote.corpus[1] == reference.corpus[1]


# ------------------------------------------------------------------------------ command line


@pytest.fixture
def no_serving(monkeypatch):
    """main() as far as serve_forever, with a stub index; records the servers it built."""
    built = []
    monkeypatch.setattr("envs.retrieval.server.open_retriever", lambda *a, **kw: StubRetriever())
    monkeypatch.setattr(RetrievalServer, "serve_forever", lambda self: built.append(self))
    monkeypatch.delenv("SEEDS_RETRIEVAL_TOKEN", raising=False)
    yield built
    for server in built:
        server.close()


def test_an_open_non_loopback_server_is_refused_unless_insecure(no_serving, monkeypatch, capsys, tmp_path):
    with pytest.raises(SystemExit, match="without a token"):
        server_main(["--host", "0.0.0.0", "--port", "0"])
    assert no_serving == []
    assert server_main(["--host", "0.0.0.0", "--port", "0", "--insecure"]) == 0
    assert "WARNING" in capsys.readouterr().err
    assert server_main(["--host", "0.0.0.0", "--port", "0", "--token", "t"]) == 0
    assert "--token is visible to every user" in capsys.readouterr().err  # works, with a warning
    (tmp_path / "token").write_text("t\n")
    assert server_main(["--host", "0.0.0.0", "--port", "0", "--token-file", str(tmp_path / "token")]) == 0
    monkeypatch.setenv("SEEDS_RETRIEVAL_TOKEN", "from-env")
    assert server_main(["--host", "0.0.0.0", "--port", "0"]) == 0
    assert server_main(["--port", "0"]) == 0  # loopback: no token needed
    assert "WARNING" not in capsys.readouterr().err
    assert [s.app.state.batcher is not None for s in no_serving] == [True] * 5
    with pytest.raises(SystemExit, match="max_query_chars"):
        server_main(["--max-query-chars", "0"])


# ------------------------------------------------------------------------------ the asyncio batcher


class GatedRecorder:
    """Records each search's (size, k); its first call waits until ``gate`` is set."""

    corpus = []

    def __init__(self):
        self.calls, self.gate, self.entered = [], threading.Event(), threading.Event()

    def search(self, queries, k):
        self.entered.set()
        self.gate.wait(10)
        self.calls.append((len(queries), k))
        return [[Hit(0, q, q, q, 1.0, r) for r in range(1, k + 1)] for q in queries]


def run_jobs(batcher: AsyncBatcher, jobs, recorder) -> list:
    """Submit ``jobs`` [(queries, k)] at once; the worker is held on the first until all queue up."""

    async def go():
        first = asyncio.create_task(batcher.search(*jobs[0]))
        assert await asyncio.to_thread(recorder.entered.wait, 10)  # the worker holds the first job
        rest = [asyncio.create_task(batcher.search(q, k)) for q, k in jobs[1:]]
        await asyncio.sleep(0.01)  # every request is in the queue
        recorder.gate.set()
        out = await asyncio.gather(first, *rest)
        await batcher.close()
        return out

    return asyncio.run(go())


def test_batches_hold_whole_requests_within_max_batch():
    recorder = GatedRecorder()
    jobs = [([f"q{i}a", f"q{i}b", f"q{i}c"], 2) for i in range(10)]
    batcher = AsyncBatcher(recorder, max_batch=7, max_wait_ms=0)
    out = run_jobs(batcher, jobs, recorder)
    assert [size for size, _ in recorder.calls] == [3, 6, 6, 6, 6, 3]  # the held first, then 2 whole requests
    for i, hits in enumerate(out):
        assert [[h.id for h in row] for row in hits] == [[f"q{i}{c}"] * 2 for c in "abc"]
    assert batcher.stats.as_dict()["batches"] == 6 and batcher.stats.largest_batch == 6


def test_a_batch_makes_one_call_per_distinct_k():
    recorder = GatedRecorder()
    jobs = [(["first"], 1)] + [([f"q{i}"], 1 + i % 2) for i in range(6)]
    out = run_jobs(AsyncBatcher(recorder, max_batch=100, max_wait_ms=0), jobs, recorder)
    assert recorder.calls == [(1, 1), (3, 1), (3, 2)]
    for i in range(6):
        assert [h.rank for h in out[i + 1][0]] == list(range(1, 2 + i % 2)) and out[i + 1][0][0].id == f"q{i}"


def test_max_batch_one_answers_one_request_at_a_time():
    recorder = GatedRecorder()
    jobs = [([f"q{i}"], 2) for i in range(5)]
    run_jobs(AsyncBatcher(recorder, max_batch=1, max_wait_ms=50), jobs, recorder)
    assert recorder.calls == [(1, 2)] * 5


def test_a_failed_call_fails_only_its_own_requests(local):
    class FailsOnK3:
        corpus = local.corpus

        def search(self, queries, k):
            if k == 3:
                raise RuntimeError("k=3 broke")
            return local.search(queries, k)

    async def go(batcher):
        results = await asyncio.gather(batcher.search(["capital"], 2), batcher.search(["river"], 3),
                                       return_exceptions=True)
        await batcher.close()
        return results

    batcher = AsyncBatcher(FailsOnK3(), max_batch=10, max_wait_ms=200)
    ok, failed = asyncio.run(go(batcher))
    assert ok == local.search(["capital"], 2) and isinstance(failed, RuntimeError)
    assert batcher.stats.failed_batches == 1 and batcher.stats.batches == 2


def test_concurrent_clients_get_their_own_results_in_fewer_retriever_calls(local, reference):
    """16 clients at once over uvicorn, each with its own query and k: each gets exactly its own
    hits, and the batcher answered them with fewer retriever calls than requests."""
    clients = 16
    queries = [f"{QUERIES[i % len(QUERIES)]} {TEXTS[i % len(TEXTS)][0]}" for i in range(clients)]
    ks = [1 + i % 5 for i in range(clients)]
    with serve(local, max_wait_ms=500) as running:
        start = threading.Barrier(clients)
        got: dict[int, list] = {}

        def client(i):
            with httpx.Client(base_url=running.url, trust_env=False, timeout=30) as http:
                http.get("/health")  # connected before the barrier
                start.wait()
                got[i] = http.post("/search", json={"queries": [queries[i], "river Spree"], "k": ks[i]}).json()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        served = running.served()
    for i in range(clients):
        expected = reference.search([queries[i], "river Spree"], ks[i])
        assert got[i]["results"] == [[as_json(h) for h in hits] for hits in expected], f"client {i}"
    assert served["requests_search"] == clients
    assert served["batches"] < clients and served["retriever_calls"] < clients
    assert served["largest_batch"] > 2
