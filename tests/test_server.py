"""Retrieval server and client: endpoints and shapes, refusals, micro-batching without cross-talk,
RemoteRetriever = local Retriever, retries, and a SearchEnv episode over HTTP.

Everything runs on loopback against a tiny hash-encoder index built in tmp_path; servers bind
port 0 and run in a background thread.
"""
from __future__ import annotations

import argparse
import json
import socket
import threading
import time

import httpx
import pytest
from test_retriever import TEXTS, index_dir, private_cache, write_corpus  # noqa: F401,F811  (shared fixtures)

from envs.config import EnvConfig
from envs.retrieval.defaults import open_retriever
from envs.retrieval.remote import RemoteRetrievalError, RemoteRetriever
from envs.retrieval.retriever import Retriever
from envs.retrieval.server import MicroBatcher, RetrievalServer, ServerLimits
from envs.retrieval.server import main as server_main
from envs.search_env import SearchEnv
from envs.types import Hit, QAExample

QUERIES = ["capital of Japan", "river Spree", "highest mountain", "currency of France", "Danube Vienna",
           "largest city", "English Channel", "Austria capital"]


@pytest.fixture
def local(index_dir):
    return Retriever.from_dir(index_dir, device="cpu")


@pytest.fixture
def reference(index_dir):
    """A second, independent retriever over the same index: the expected answers."""
    return Retriever.from_dir(index_dir, device="cpu")


def serve(retriever, **limits) -> RetrievalServer:
    return RetrievalServer(retriever, "127.0.0.1", 0, ServerLimits(**limits)).start()


@pytest.fixture
def server(local):
    with serve(local, max_queries_per_request=4, max_k=6, max_body_bytes=2000) as running:
        yield running


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, trust_env=False, timeout=10) as client:
        yield client


def as_json(hit: Hit) -> dict:
    return {"id": hit.id, "title": hit.title, "text": hit.text, "score": hit.score, "rank": hit.rank, "row": hit.row}


# ------------------------------------------------------------------------------ endpoints


def test_search_round_trip(http, reference):
    response = http.post("/search", json={"queries": ["capital of Japan", "river Spree"], "k": 3})
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    results = response.json()["results"]
    expected = reference.search(["capital of Japan", "river Spree"], 3)
    assert results == [[as_json(h) for h in hits] for hits in expected]
    assert results[0][0]["title"] == "Tokyo" and [h["rank"] for h in results[0]] == [1, 2, 3]


def test_retrieve_has_search_r1_shape(http, reference):
    """What Search-R1's agent reads: result[q][i]['document']['contents'] = '"Title"\\ntext'."""
    body = {"queries": ["capital of Japan", "river Spree"], "topk": 2, "return_scores": True}
    result = http.post("/retrieve", json=body).json()["result"]
    expected = reference.search(body["queries"], 2)
    assert len(result) == 2 and all(len(docs) == 2 for docs in result)
    for docs, hits in zip(result, expected):
        for doc, hit in zip(docs, hits):
            assert set(doc) == {"document", "score"} and set(doc["document"]) == {"id", "contents"}
            assert doc["document"] == {"id": hit.id, "contents": f'"{hit.title}"\n{hit.text}'}
            assert doc["score"] == hit.score
    contents = result[0][0]["document"]["contents"]  # Search-R1's _passages2string
    assert contents.split("\n")[0].strip('"') == "Tokyo" and "\n".join(contents.split("\n")[1:]) == TEXTS[2][1]

    bare = http.post("/retrieve", json={"queries": ["capital of Japan"], "topk": 2}).json()["result"]
    assert bare == [[r["document"] for r in result[0]]]  # return_scores false: the documents alone
    assert len(http.post("/retrieve", json={"queries": ["capital of Japan"]}).json()["result"][0]) == 3  # topk 3
    empty = http.post("/retrieve", json={"queries": ["", "river Spree"], "topk": 1}).json()["result"]
    assert empty[0] == [] and len(empty[1]) == 1  # an empty <search></search> does not fail the batch
    assert http.post("/retrieve", json={"queries": []}).json() == {"result": []}


def test_passages_by_row(http, local):
    passages = http.post("/passages", json={"rows": [3, 0, 3]}).json()["passages"]
    assert passages == [{"row": p.row, "id": p.id, "title": p.title, "text": p.text}
                        for p in local.corpus.get_many([3, 0, 3])]


def test_health_reports_index_limits_and_counters(http, server):
    http.post("/search", json={"queries": ["capital"], "k": 1})
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["passages"] == len(TEXTS)
    assert health["encoder"] == "hash" and health["index_type"] == "Flat" and health["dim"] == 512
    assert health["max_batch"] == 256 and health["max_queries_per_request"] == 4 and health["max_k"] == 6
    served = health["served"]
    assert served["requests_search"] == 1 and served["queries"] == 1 and served["batches"] == 1
    assert served["retriever_calls"] == 1


BAD_REQUESTS = [
    ("POST", "/search", b"{not json", 400, "not valid JSON"),
    ("POST", "/search", b"[1, 2]", 400, "JSON object"),
    ("POST", "/search", b'{"queries": ["a"], "k": NaN}', 400, "not valid JSON"),
    ("POST", "/search", json.dumps({"k": 2}).encode(), 400, "missing field 'queries'"),
    ("POST", "/search", json.dumps({"queries": "capital"}).encode(), 400, "must be a list"),
    ("POST", "/search", json.dumps({"queries": ["ok", 3]}).encode(), 400, "queries[1] must be a string"),
    ("POST", "/search", json.dumps({"queries": ["ok", "  "]}).encode(), 400, "queries[1] is empty"),
    ("POST", "/search", json.dumps({"queries": ["a"], "k": 0}).encode(), 400, "positive integer"),
    ("POST", "/search", json.dumps({"queries": ["a"], "k": "3"}).encode(), 400, "positive integer"),
    ("POST", "/search", json.dumps({"queries": ["a"], "k": True}).encode(), 400, "positive integer"),
    ("POST", "/search", json.dumps({"queries": ["a"], "k": 7}).encode(), 400, "cap of 6"),
    ("POST", "/search", json.dumps({"queries": ["a"] * 5, "k": 1}).encode(), 413, "cap is 4"),
    ("POST", "/search", json.dumps({"queries": ["x" * 3000]}).encode(), 413, "cap of 2000 bytes"),
    ("POST", "/retrieve", json.dumps({"queries": ["a"], "topk": -1}).encode(), 400, "positive integer"),
    ("POST", "/retrieve", json.dumps({"queries": ["a"], "return_scores": "yes"}).encode(), 400, "true or false"),
    ("POST", "/passages", json.dumps({"rows": [99]}).encode(), 400, "out of range"),
    ("POST", "/passages", json.dumps({"rows": ["1"]}).encode(), 400, "must be an integer"),
    ("POST", "/nowhere", b"{}", 404, "unknown path"),
    ("GET", "/", None, 404, "unknown path"),
    ("GET", "/search", None, 405, "takes POST"),
    ("DELETE", "/search", None, 405, "takes POST"),
    ("POST", "/health", b"{}", 405, "takes GET"),
]


@pytest.mark.parametrize("method,path,body,status,reason", BAD_REQUESTS,
                         ids=[f"{m} {p} {s} {r}" for m, p, _, s, r in BAD_REQUESTS])
def test_bad_requests_get_4xx_with_a_reason(http, server, method, path, body, status, reason):
    response = http.request(method, path, content=body)
    assert response.status_code == status
    assert reason in response.json()["error"]
    assert http.get("/health").status_code == 200  # still serving, on this or a new connection
    assert server.served()["errors_4xx"] == 1


def test_request_without_content_length_is_refused(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = sock.recv(4096).decode()
    assert reply.startswith("HTTP/1.1 411") and "Content-Length" in reply


class FlakyRetriever:
    """Fails its first ``failures`` searches, then answers like ``inner``."""

    def __init__(self, inner, failures=1):
        self.inner, self.corpus, self.failures, self.calls = inner, inner.corpus, failures, 0

    def search(self, queries, k):
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("index shard went away")
        return self.inner.search(queries, k)


def test_retriever_failure_is_a_500_and_the_server_keeps_running(local):
    with serve(FlakyRetriever(local)) as running, httpx.Client(base_url=running.url, trust_env=False) as http:
        failed = http.post("/search", json={"queries": ["capital"], "k": 1})
        assert failed.status_code == 500 and "index shard went away" in failed.json()["error"]
        assert http.post("/search", json={"queries": ["capital"], "k": 1}).status_code == 200
        assert running.served()["errors_5xx"] == 1 and running.served()["failed_batches"] == 1


def test_binding_elsewhere_than_loopback_warns(monkeypatch, capsys):
    def stop(self):
        raise KeyboardInterrupt

    monkeypatch.setattr("envs.retrieval.server.open_retriever", lambda *a, **kw: FlakyRetriever(local_stub(), 0))
    monkeypatch.setattr(RetrievalServer, "serve_forever", stop)
    assert server_main(["--host", "0.0.0.0", "--port", "0"]) == 0
    assert "WARNING" in capsys.readouterr().err
    assert server_main(["--port", "0"]) == 0
    assert "WARNING" not in capsys.readouterr().err


def local_stub():
    class Stub:
        corpus = []

        def search(self, queries, k):
            return [[] for _ in queries]

    return Stub()


# ------------------------------------------------------------------------------ micro-batching


def test_concurrent_clients_get_their_own_results_in_fewer_retriever_calls(local, reference):
    """16 clients at once, each with its own query and k: each gets exactly its own hits, and the
    worker answered them with fewer retriever calls than requests."""
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


def test_max_batch_one_serves_one_request_at_a_time(local):
    with serve(local, max_batch=1, max_wait_ms=500) as running:
        remote = RemoteRetriever(running.url)
        threads = [threading.Thread(target=remote.search, args=([q], 2)) for q in QUERIES]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert running.served()["batches"] == len(QUERIES) and running.served()["largest_batch"] == 1
        remote.close()


class GatedRecorder:
    """Records each search's (size, k); its first call waits until ``release()``."""

    corpus = []

    def __init__(self):
        self.calls, self.gate, self.entered = [], threading.Event(), threading.Event()

    def search(self, queries, k):
        self.entered.set()
        self.gate.wait(10)
        self.calls.append((len(queries), k))
        return [[Hit(0, q, q, q, 1.0, r) for r in range(1, k + 1)] for q in queries]


def run_jobs(batcher, jobs, recorder):
    """Submit ``jobs`` [(queries, k)] at once; the worker is held on the first until all queue up."""
    out: dict[int, list] = {}
    threads = [threading.Thread(target=lambda i=i, q=q, k=k: out.__setitem__(i, batcher.search(q, k)))
               for i, (q, k) in enumerate(jobs)]
    threads[0].start()
    assert recorder.entered.wait(10)  # the worker holds the first job inside search()
    for thread in threads[1:]:
        thread.start()
    deadline = time.monotonic() + 10
    while batcher._queue.qsize() < len(jobs) - 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    recorder.gate.set()
    for thread in threads:
        thread.join()
    batcher.close()
    return out


def test_batches_hold_whole_requests_within_max_batch():
    recorder = GatedRecorder()
    jobs = [([f"q{i}a", f"q{i}b", f"q{i}c"], 2) for i in range(10)]
    out = run_jobs(MicroBatcher(recorder, max_batch=7, max_wait_ms=0), jobs, recorder)
    sizes = [size for size, _ in recorder.calls]
    assert sizes == [3, 6, 6, 6, 6, 3]  # the held first, then two whole requests (6 <= 7) per call
    for i, hits in out.items():
        assert [[h.id for h in row] for row in hits] == [[f"q{i}{c}"] * 2 for c in "abc"]


def test_a_batch_makes_one_call_per_distinct_k():
    recorder = GatedRecorder()
    jobs = [(["first"], 1)] + [([f"q{i}"], 1 + i % 2) for i in range(6)]
    out = run_jobs(MicroBatcher(recorder, max_batch=100, max_wait_ms=0), jobs, recorder)
    assert recorder.calls == [(1, 1), (3, 1), (3, 2)]
    for i in range(6):
        assert [h.rank for h in out[i + 1][0]] == list(range(1, 2 + i % 2)) and out[i + 1][0][0].id == f"q{i}"


# ------------------------------------------------------------------------------ the client


def test_remote_retriever_returns_the_local_hits(server, reference):
    remote = RemoteRetriever(server.url)
    queries = QUERIES + QUERIES[:3]  # 11 queries: more than the server's cap of 4 per request
    for k in (1, 3, 6):
        assert remote.search(queries, k) == reference.search(queries, k)
    assert server.served()["requests_search"] == 9  # 3 requests of at most 4 queries, per k
    assert remote.search([], 3) == []
    assert len(remote.corpus) == len(TEXTS)
    assert remote.corpus[2] == reference.corpus[2] and remote.corpus[-1] == reference.corpus[len(TEXTS) - 1]
    assert remote.corpus.get_many([5, 1, 5]) == reference.corpus.get_many([5, 1, 5])
    with pytest.raises(IndexError):
        remote.corpus[len(TEXTS)]
    assert remote.health()["encoder"] == "hash"
    remote.close()


def test_a_refusal_raises_at_once_with_the_servers_reason(server, monkeypatch):
    sleeps = []
    monkeypatch.setattr("envs.retrieval.remote.time.sleep", sleeps.append)
    remote = RemoteRetriever(server.url, retries=3)
    with pytest.raises(RemoteRetrievalError, match="cap of 6") as caught:
        remote.search(["capital"], 50)
    assert caught.value.status == 400 and sleeps == []  # 4xx: no retry
    with pytest.raises(RemoteRetrievalError, match="queries\\[0\\] is empty"):
        remote.search([""], 2)
    with pytest.raises(ValueError):
        remote.search(["capital"], 0)


def test_a_closed_port_fails_clearly_after_the_retries(monkeypatch):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sleeps = []
    monkeypatch.setattr("envs.retrieval.remote.time.sleep", sleeps.append)
    remote = RemoteRetriever(f"http://127.0.0.1:{port}", retries=2, backoff=0.01, timeout=2)
    with pytest.raises(RemoteRetrievalError, match=r"after 3 attempt\(s\).*Connect") as caught:
        remote.search(["capital"], 2)
    assert caught.value.status is None
    assert sleeps == [0.01, 0.02]  # exponential back-off between the attempts


def test_server_errors_are_retried(local, reference, monkeypatch):
    monkeypatch.setattr("envs.retrieval.remote.time.sleep", lambda s: None)
    flaky = FlakyRetriever(local, failures=2)
    with serve(flaky) as running:
        remote = RemoteRetriever(running.url, retries=2)
        assert remote.search(["capital of Japan"], 2) == reference.search(["capital of Japan"], 2)
        assert flaky.calls == 3
        flaky.calls, flaky.failures = 0, 5
        with pytest.raises(RemoteRetrievalError, match="HTTP 500.*index shard went away"):
            remote.search(["river Spree"], 2)


def test_concurrency_is_bounded(server):
    remote = RemoteRetriever(server.url, max_concurrency=2)
    inside, peak, lock = [0], [0], threading.Lock()
    real = remote._client.request

    def counting(*args, **kwargs):
        with lock:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                inside[0] -= 1

    remote._client.request = counting
    threads = [threading.Thread(target=remote.search, args=([q], 2)) for q in QUERIES * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 1 <= peak[0] <= 2


# ------------------------------------------------------------------------------ wiring


def test_search_env_episode_over_http_matches_local(server, reference):
    example = QAExample("q", "What is the capital of Japan?", ("Tokyo",), positive_ids=("d2",))
    config = EnvConfig(distractor_rate=0.5, shuffle_candidates=True)  # exercises corpus[row] remotely
    actions = ["<search>capital of Japan</search>", "<expand>1, 2</expand>", "<answer>Tokyo</answer>"]

    def episode(retriever):
        env = SearchEnv(retriever, config=config)
        steps = [env.reset(seed=7, options={"example": example})]
        steps += [env.step(action) for action in actions]
        return steps

    remote = RemoteRetriever(server.url)
    over_http, in_process = episode(remote), episode(reference)
    assert over_http == in_process
    assert over_http[-1][2] is True and over_http[-1][4]["episode"]["metrics"]["em"] == 1.0
    assert server.served()["passages"] > 0  # distractors were read through /passages


def test_open_retriever_specs(index_dir, server):
    assert isinstance(open_retriever(server.url), RemoteRetriever)
    assert isinstance(open_retriever(str(index_dir), device="cpu"), Retriever)
    with pytest.raises(ValueError, match="cannot be given"):
        open_retriever(server.url, corpus="corpus.jsonl")


def test_evaluate_takes_a_retriever_url(server, index_dir):
    from inference.evaluate import build_parser, load_retriever

    args = build_parser().parse_args(["--method", "react", "--out", "x", "--retriever", server.url])
    assert isinstance(load_retriever(args), RemoteRetriever)
    args = build_parser().parse_args(["--method", "react", "--out", "x", "--index", server.url])
    assert isinstance(load_retriever(args), RemoteRetriever)
    args = argparse.Namespace(retriever=None, index=str(index_dir), corpus=None)
    assert isinstance(load_retriever(args), Retriever)


def test_training_configs_take_a_retriever_url(server):
    from training.config import PPOConfig
    from training.inputs import load_retriever as ppo_retriever
    from training.sft import WarmStartConfig, warm_start_config
    from training.sft import load_retriever as sft_retriever

    assert isinstance(ppo_retriever(PPOConfig(retriever=server.url)), RemoteRetriever)
    assert isinstance(sft_retriever(WarmStartConfig(retriever=server.url)), RemoteRetriever)
    assert warm_start_config(PPOConfig(retriever=server.url, env_config=None)).retriever == server.url
