"""The Ray Serve engine with one replica on CPU: the same endpoints, shapes, token and refusals as
the uvicorn engine, hits identical to the local retriever, searches batched by ``@serve.batch``.

Skipped without the ``ray`` extra (``pip install -e '.[ray]'``). Ray starts once for the module
(two CPUs, a free loopback port) and is shut down at its end.
"""
from __future__ import annotations

import socket
import threading
from pathlib import Path

import httpx
import pytest
import yaml

serve = pytest.importorskip("ray.serve", reason="the Ray Serve engine needs the 'ray' extra")
ray = pytest.importorskip("ray")

from test_retriever import write_corpus  # noqa: E402

from envs.retrieval import serve_ray  # noqa: E402
from envs.retrieval.encoders import HashEncoder  # noqa: E402
from envs.retrieval.index import build_index  # noqa: E402
from envs.retrieval.remote import RemoteRetrievalError, RemoteRetriever  # noqa: E402
from envs.retrieval.retriever import Retriever  # noqa: E402
from envs.retrieval.server_models import ServerLimits  # noqa: E402

TOKEN = "ray-s3cret"
QUERIES = ["capital of Japan", "river Spree", "highest mountain", "currency of France", "Danube Vienna"]


@pytest.fixture(scope="module")
def index_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-index")
    return build_index(write_corpus(root / "corpus.jsonl"), HashEncoder(), root / "idx", show_progress=False)


@pytest.fixture(scope="module")
def ray_url(index_folder):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        limits = ServerLimits(max_queries_per_request=4, max_k=6, max_wait_ms=200)
        app = serve_ray.application(str(index_folder), None, "cpu", limits, TOKEN,
                                    serve_ray.ReplicaOptions(replicas=1, num_cpus=0.5))
        yield serve_ray.run(app, "127.0.0.1", port)
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def reference(index_folder):
    return Retriever.from_dir(index_folder, device="cpu")


def test_remote_retriever_gets_the_local_hits_through_ray_serve(ray_url, reference):
    with RemoteRetriever(ray_url, token=TOKEN) as remote:
        for k in (1, 3, 6):
            assert remote.search(QUERIES, k) == reference.search(QUERIES, k)  # 5 queries: split at the cap of 4
        assert remote.corpus.get_many([4, 0]) == reference.corpus.get_many([4, 0])
        health = remote.health()
    assert health["engine"] == "ray" and health["auth"] == "bearer" and health["max_queries_per_request"] == 4
    assert health["served"]["batches"] >= 1 and health["served"]["batched_queries"] >= 3 * len(QUERIES)


def test_search_r1_shape_and_refusals_through_ray_serve(ray_url, reference):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=ray_url, trust_env=False, timeout=60, headers=auth) as http:
        result = http.post("/retrieve", json={"queries": ["capital of Japan", ""], "topk": 2,
                                              "return_scores": True}).json()["result"]
        hit = reference.search(["capital of Japan"], 2)[0][0]
        assert result[0][0] == {"document": {"id": hit.id, "contents": f'"{hit.title}"\n{hit.text}'},
                                "score": hit.score}
        assert result[1] == []
        refused = http.post("/search", json={"queries": ["a"], "k": 7})
        assert refused.status_code == 400 and "max_k=6" in refused.json()["error"]
        long_query = http.post("/search", json={"queries": ["x" * 5000]})
        assert long_query.status_code == 413 and "max_query_chars=4096" in long_query.json()["error"]
    unauthorised = httpx.post(f"{ray_url}/search", json={"queries": ["a"]}, trust_env=False, timeout=60)
    assert unauthorised.status_code == 401 and "bearer token" in unauthorised.json()["error"]
    with pytest.raises(RemoteRetrievalError, match="bearer token"):
        RemoteRetriever(ray_url, retries=0).search(["capital"], 2)


def test_concurrent_requests_share_batches(ray_url, reference):
    """8 threads at once (max_wait_ms=200): each gets its own hits; fewer batches than requests."""
    with RemoteRetriever(ray_url, token=TOKEN, max_concurrency=8) as remote:
        before = remote.health()["served"]
        got: dict[int, list] = {}
        threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, remote.search([QUERIES[i % 5]], 2)))
                   for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        after = remote.health()["served"]
    assert all(got[i] == reference.search([QUERIES[i % 5]], 2) for i in range(8))
    assert after["batched_queries"] - before["batched_queries"] == 8
    assert after["batches"] - before["batches"] < 8


def test_the_serve_config_builds_the_app():
    """configs/serve/retrieval.yaml's args are the ones app_builder takes (no cluster needed to bind)."""
    config = yaml.safe_load((Path(__file__).parents[1] / "configs" / "serve" / "retrieval.yaml").read_text())
    (application,) = config["applications"]
    assert application["import_path"] == "envs.retrieval.serve_ray:app_builder"
    assert isinstance(serve_ray.app_builder(application["args"]), serve.Application)
    with pytest.raises(ValueError, match="unknown args \\['replica'\\]"):
        serve_ray.app_builder({"index": "default", "replica": 2})


def test_serve_logs_no_request_unless_verbose(monkeypatch):
    """Ray Serve logs every request at INFO by default: the server (and its Serve config) turn that off."""
    calls = {}
    monkeypatch.setattr(serve, "start", lambda **kw: calls.setdefault("start", kw))
    monkeypatch.setattr(serve, "run", lambda app, **kw: calls.setdefault("run", kw))
    serve_ray.run(object(), "127.0.0.1", 1)
    quiet = {"log_level": "WARNING", "enable_access_log": False}
    assert calls["start"]["logging_config"] == quiet and calls["run"]["logging_config"] == quiet
    assert serve_ray.logging_config(verbose=True)["enable_access_log"] is True
    from ray.serve.schema import ServeDeploySchema

    config = yaml.safe_load((Path(__file__).parents[1] / "configs" / "serve" / "retrieval.yaml").read_text())
    parsed = ServeDeploySchema.model_validate(config) if hasattr(ServeDeploySchema, "model_validate") \
        else ServeDeploySchema.parse_obj(config)
    assert parsed.logging_config.enable_access_log is False
    assert parsed.applications[0].logging_config.log_level == "WARNING"
