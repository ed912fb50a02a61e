"""The env over the real stack: a corpus file, a FAISS index, the retriever, the demo CLI."""
import json
from pathlib import Path

import pytest
from conftest import PASSAGES

from envs.config import EnvConfig
from envs.retrieval.corpus import load_corpus
from envs.retrieval.encoders import load_encoder
from envs.retrieval.index import build_index
from envs.retrieval.retriever import Retriever
from envs.types import QAExample
from envs.vector_env import SearchVectorEnv
from methods.scripted import run_scripted_episodes


@pytest.fixture
def index_dir(tmp_path):
    corpus_path = tmp_path / "corpus.jsonl"
    corpus_path.write_text("".join(json.dumps({"id": i, "title": t, "text": x}) + "\n" for i, t, x in PASSAGES))
    out = tmp_path / "index"
    build_index(load_corpus(corpus_path), load_encoder("hash"), out, show_progress=False)
    return out


def test_scripted_episodes_over_a_real_index(index_dir):
    retriever = Retriever.from_dir(index_dir)
    examples = [
        QAExample("a", "Vienna capital of Austria", ("Vienna",), positive_ids=("p11",)),
        QAExample("b", "Mount Fuji highest mountain in Japan", ("Mount Fuji",)),
        QAExample("c", "Spree river eastern Germany", ("Spree",), positive_titles=("Spree",)),
    ]
    venv = SearchVectorEnv(retriever, num_envs=2, config=EnvConfig())
    summaries = run_scripted_episodes(venv, examples, n_expand=2)
    assert [s["example_id"] for s in summaries] == ["a", "b", "c"]
    assert [s["metrics"]["em"] for s in summaries] == [1.0, 1.0, 1.0]
    assert all(s["positives_opened"] >= 1 and s["docs_read"] == 2 for s in summaries)
    # 2 batches x (search step), each search step one retrieval call for the whole batch
    assert retriever.stats.calls == 2 and retriever.stats.encode_calls == 2
    assert summaries[0]["transcript"][0]["observation"].startswith("<snapshot>\n[1] Vienna")


def test_demo_cli_writes_episodes_and_metrics(index_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "scripts"))
    import demo_episodes

    data = tmp_path / "qa.jsonl"
    data.write_text(
        json.dumps({"id": "x", "question": "capital of Japan Tokyo", "golden_answers": ["Tokyo"]}) + "\n"
        + json.dumps({"id": "y", "question": "Danube river Vienna Budapest", "golden_answers": ["Danube"]}) + "\n"
    )
    out = tmp_path / "run"
    code = demo_episodes.main(["--data", str(data), "--index", str(index_dir), "--out", str(out),
                               "--admission", "prefix", "--top-k", "2", "--show", "1"])
    assert code == 0
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert [json.loads(line)["example_id"] for line in lines] == ["x", "y"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["episodes"] == 2 and metrics["docs_read_per_question"] == 2.0 and metrics["em"] == 1.0
    printed = capsys.readouterr().out
    assert "policy> <search>capital of Japan Tokyo</search>" in printed and "admission=prefix" in printed
