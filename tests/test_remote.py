"""RemoteRetriever against the uvicorn server on a loopback socket: the local Retriever's hits,
requests split at the server's caps, refusals raised at once, retries with back-off, bounded
concurrency, a SearchEnv episode over HTTP, and the URL specs of evaluation and training."""
from __future__ import annotations

import socket
import threading

import pytest
from server_helpers import (  # noqa: F401  (fixtures)
    QUERIES,
    TEXTS,
    FlakyRetriever,
    index_dir,
    local,
    private_cache,
    reference,
    serve,
)

from envs.config import EnvConfig
from envs.retrieval.defaults import open_retriever
from envs.retrieval.remote import RemoteRetrievalError, RemoteRetriever
from envs.retrieval.retriever import Retriever
from envs.search_env import SearchEnv
from envs.types import QAExample


@pytest.fixture
def server(local):
    with serve(local, max_queries_per_request=4, max_k=6, max_body_bytes=2000) as running:
        yield running


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
    with pytest.raises(RemoteRetrievalError, match="cap max_k=6") as caught:
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
    from inference.evaluate import load_retriever, resolve_args

    cfg = resolve_args(["--method.name", "react", "--run.output_dir", "x", "--data.retriever", server.url])
    assert isinstance(load_retriever(cfg.data), RemoteRetriever)
    cfg = resolve_args(["--method.name", "react", "--run.output_dir", "x", "--data.index", server.url])
    assert isinstance(load_retriever(cfg.data), RemoteRetriever)
    cfg = resolve_args(["--method.name", "react", "--run.output_dir", "x", "--data.index", str(index_dir)])
    assert isinstance(load_retriever(cfg.data), Retriever)


def test_training_configs_take_a_retriever_url(server):
    from training.config import PPOConfig, with_values
    from training.runtime.inputs import load_retriever as ppo_retriever
    from training.sft import WarmStartConfig, warm_start_config
    from training.sft import load_retriever as sft_retriever
    from training.sft_config import SFTDataSettings

    assert isinstance(ppo_retriever(with_values(PPOConfig, {"data.retriever": server.url}).data), RemoteRetriever)
    assert isinstance(sft_retriever(WarmStartConfig(data=SFTDataSettings(retriever=server.url))), RemoteRetriever)
    assert warm_start_config(with_values(PPOConfig, {"data.retriever": server.url,
                                                     "env_config": None})).data.retriever == server.url
