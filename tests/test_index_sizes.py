"""Index sizes, estimates and build plans: parsing budgets, bytes per vector at Wikipedia scale,
named types resolved for a corpus, estimates checked against built indexes, and the budget
formula of a build plan (the builds themselves: test_index_build.py)."""
from __future__ import annotations

import faiss
import numpy as np
import pytest
from test_index_build import one_faiss_thread  # noqa: F401  (autouse: one FAISS thread here too)

from envs.retrieval.index import MemoryBudgetError, resolve_index_type
from envs.retrieval.index_build import train_and_fill
from envs.retrieval.index_memory import (
    ADD_COPIES,
    ENCODE_BYTES_PER_PASSAGE,
    HEADROOM_MIN,
    INDEX_NAMES,
    LIST_OVERHEAD,
    TRAIN_COPIES,
    estimate_index_size,
    format_bytes,
    parse_bytes,
    plan_build,
)


def test_parse_bytes_units():
    assert parse_bytes("8GB") == 8 * 10**9 and parse_bytes("8GiB") == parse_bytes("8g") == 8 << 30
    assert parse_bytes("512MB") == 512 * 10**6 and parse_bytes("512 MiB") == 512 << 20
    assert parse_bytes(1234) == parse_bytes("1234") == 1234 and parse_bytes(None) is None
    for bad in ("lots", "-1GB", "0", "8XB"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_bytes_per_vector_estimates_at_wikipedia_scale():
    n, d = 21_015_324, 768
    per_vector = {name: estimate_index_size(resolve_index_type(name, n, d), d).per_vector for name in INDEX_NAMES}
    assert per_vector["flat"] == 4 * d and per_vector["fp16"] == 2 * d and per_vector["sq8"] == d
    assert (per_vector["ivfflat"] == 4 * d + 8 and per_vector["ivf-sqfp16"] == 2 * d + 8
            and per_vector["ivf-sq8"] == d + 8)
    assert per_vector["ivfpq"] == per_vector["opq-ivfpq"] == 64 + 8
    assert 4 * d + 8 * 32 < per_vector["hnsw"] < 4 * d + 8 * 32 + 32  # vectors + ~2M int32 links
    flat = estimate_index_size("Flat", d).total(n)
    assert format_bytes(flat) == "64.6 GB"
    opq = estimate_index_size(resolve_index_type("opq-ivfpq", n, d), d)
    assert opq.opq and opq.fixed > 4 * d * d  # the rotation is counted once


def test_names_resolve_to_factory_strings_sized_for_the_corpus():
    n, d = 21_015_324, 768
    expected = {"flat": "Flat", "hnsw": "HNSW32", "fp16": "SQfp16", "sq8": "SQ8", "ivfflat": "IVF18337,Flat",
                "ivf-sqfp16": "IVF18337,SQfp16", "ivf-sq8": "IVF18337,SQ8", "ivfpq": "IVF18337,PQ64",
                "opq-ivfpq": "OPQ64,IVF18337,PQ64"}
    assert {name: resolve_index_type(name, n, d) for name in INDEX_NAMES} == expected
    for spelling, name in [("IVF-PQ", "ivfpq"), ("opq_ivfpq", "opq-ivfpq"), ("ivf_flat", "ivfflat"),
                           ("sqfp16", "fp16"), ("IVF-SQfp16", "ivf-sqfp16")]:
        assert resolve_index_type(spelling, n, d) == expected[name]
    assert resolve_index_type("OPQ64,IVF65536,PQ64", n, d) == "OPQ64,IVF65536,PQ64"  # factory strings pass through
    assert resolve_index_type("opq-ivfpq", 300, 512) == "OPQ64,IVF7,PQ64x2"


@pytest.mark.parametrize("name", sorted(INDEX_NAMES))
def test_estimate_matches_the_built_index(name):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((2000, 16)).astype(np.float32)
    faiss.normalize_L2(vectors)
    factory = resolve_index_type(name, len(vectors), 16)
    index, _ = train_and_fill(vectors, factory, add_chunk=700)
    stored = len(faiss.serialize_index(index))
    estimate = estimate_index_size(factory, 16).total(len(vectors))
    ivf = faiss.try_extract_index_ivf(index)
    in_memory_only = 0 if ivf is None else ivf.nlist * LIST_OVERHEAD  # list bookkeeping is not written
    assert abs(estimate - in_memory_only - stored) <= 0.05 * stored


def test_plan_follows_the_budget_formula():
    n, d = 10_000_000, 768
    factory = resolve_index_type("ivfpq", n, d)
    size = estimate_index_size(factory, d)
    budget = 4 * 10**9
    plan = plan_build(factory, n, d, budget, train_size=10**7, batch_size=1024, baseline_rss=10**9)
    working = budget - 10**9 - budget // 16
    assert plan.working_bytes == working and plan.headroom_bytes == budget // 16
    assert plan.train_rows == (working - size.fixed) // (TRAIN_COPIES * 4 * d)
    assert plan.add_chunk == 65_536  # plenty of room: the requested chunk
    assert plan.fill_bytes == size.total(n) + 4 * n  # codes + ids + int32 list of every row
    assert plan.encode_batch == 1024
    tight = plan_build(factory, n, d, (size.while_filling(n) + 10**9 + 10**7) * 16 // 15, baseline_rss=10**9)
    assert tight.add_chunk == (tight.working_bytes - tight.fill_bytes) // (ADD_COPIES * 4 * d) < 65_536
    small = plan_build("Flat", 1000, 64, HEADROOM_MIN + 400_000, batch_size=256, baseline_rss=0)
    assert small.encode_batch == 400_000 // (ENCODE_BYTES_PER_PASSAGE + 8 * 64) < 256
    unbounded = plan_build(factory, n, d, None, train_size=123_456, baseline_rss=0)
    assert unbounded.train_rows == 123_456 and unbounded.add_chunk == 65_536 and unbounded.budget_bytes is None


def test_wikipedia_flat_in_8gb_is_refused_with_the_estimate_and_alternatives():
    n, d = 21_015_324, 768
    with pytest.raises(MemoryBudgetError) as err:
        plan_build("Flat", n, d, "8GB", baseline_rss=2 * 10**9)
    message = str(err.value)
    assert "64.6 GB" in message and "3,072 bytes/vector" in message
    assert "--index-type opq-ivfpq (OPQ64,IVF18337,PQ64" in message and "--rerank" in message
    plan_build(resolve_index_type("opq-ivfpq", n, d), n, d, "8GB", baseline_rss=2 * 10**9)  # fits
