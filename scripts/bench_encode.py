"""Benchmark: the default encoding precision against float32 on the embedded default corpus.

"Default" is what ``dtype="auto"`` picks here (:func:`envs.retrieval.encoders.resolve_dtype`:
bfloat16 on a CPU with native bfloat16, float32 on other CPUs, float16 on CUDA). Two figures:

- ``encode_speedup`` = (seconds to embed the sample in float32) / (seconds in the default
  precision). The sample is ``--passages`` evenly spaced passages of the default corpus, passed in
  calls of ``DEFAULT_ENCODE_ROWS`` passages as the default index build does, each precision timed
  once after a warm-up call.
- ``top5_agreement_fp32`` = mean over the questions q of |T5_default(q) ∩ T5_fp32(q)| / 5, where
  T5_x(q) is the set of the 5 passages (corpus rows) that an exact (Flat) search returns for q
  when both the whole corpus and q are embedded in precision x. 1.0: the same five passages for
  every question (their order may differ). The questions are the first ``--questions`` default
  questions of seed 0 (:func:`envs.default_questions.generate_default_questions`). Also printed:
  top-1 agreement and the fraction of questions whose ordered top-5 lists are identical.

The two full-corpus indexes are the cached default indexes (``default_index_dir``; built here
when missing: about 4 min for float32 and 1.7 min for bfloat16 on 2 cores).

    python scripts/bench_encode.py [--passages 2048] [--questions 500] [--device cpu]

Last line: ``encode_speedup=<x> top5_agreement_fp32=<x>``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from envs.default_questions import generate_default_questions  # noqa: E402
from envs.retrieval.corpus import load_corpus  # noqa: E402
from envs.retrieval.default_corpus import default_corpus_path  # noqa: E402
from envs.retrieval.defaults import DEFAULT_ENCODE_ROWS, default_index_dir  # noqa: E402
from envs.retrieval.encoders import Encoder, load_encoder  # noqa: E402
from envs.retrieval.index import DenseIndex, build_index  # noqa: E402

TOP_K = 5


def encode_seconds(encoder: Encoder, passages: list) -> float:
    """Wall seconds to embed ``passages`` in calls of ``DEFAULT_ENCODE_ROWS`` (after a warm-up call)."""
    encoder.encode_passages(passages[:32], show_progress=False)
    started = time.perf_counter()
    for first in range(0, len(passages), DEFAULT_ENCODE_ROWS):
        encoder.encode_passages(passages[first:first + DEFAULT_ENCODE_ROWS], show_progress=False)
    return time.perf_counter() - started


def top_rows(encoder: Encoder, corpus, questions: list[str], device: str) -> np.ndarray:
    """``(len(questions), TOP_K)`` corpus rows of the exact top-k for each question, in rank order,
    from the default index embedded with ``encoder`` (built into the cache if missing)."""
    index_dir = default_index_dir(corpus, "Flat", encoder.name, encoder.settings.get("dtype"))
    started = time.perf_counter()
    build_index(corpus, encoder, index_dir, index_type="Flat", batch_size=DEFAULT_ENCODE_ROWS)
    print(f"{encoder.settings.get('dtype')} index {index_dir} ready after {time.perf_counter() - started:.1f}s")
    index = DenseIndex.load(index_dir, corpus=corpus, device=device)
    _, rows = index.search(encoder.encode_queries(questions), TOP_K)
    return np.asarray(rows)


def topk_agreement(rows_a: np.ndarray, rows_b: np.ndarray) -> float:
    """Mean over queries of |set(rows_a[q]) ∩ set(rows_b[q])| / k; both ``(queries, k)``."""
    k = rows_a.shape[1]
    return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(rows_a, rows_b)]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, default=2048, help="passages in the timed sample")
    parser.add_argument("--questions", type=int, default=500, help="default questions for the agreement")
    parser.add_argument("--device", default="cpu", help="encoder and index device")
    args = parser.parse_args(argv)

    corpus = load_corpus(default_corpus_path())
    encoders = {name: load_encoder("minilm", device=args.device, dtype=dtype, show_progress=False)
                for name, dtype in (("fp32", "float32"), ("default", "auto"))}
    default_dtype = encoders["default"].settings["dtype"]
    rows = np.unique(np.linspace(0, len(corpus) - 1, min(args.passages, len(corpus))).astype(int))
    sample = corpus.get_many(rows.tolist())
    seconds = {name: encode_seconds(encoder, sample) for name, encoder in encoders.items()}
    for name, encoder in encoders.items():
        print(f"{name} ({encoder.settings['dtype']}): {len(sample) / seconds[name]:.1f} passages/s "
              f"over {len(sample)} passages ({seconds[name]:.1f}s)")

    questions = [q.question for q in generate_default_questions(args.questions, seed=0)]
    top = {name: top_rows(encoder, corpus, questions, args.device) for name, encoder in encoders.items()}
    top1 = float(np.mean(top["default"][:, 0] == top["fp32"][:, 0]))
    same_order = float(np.mean(np.all(top["default"] == top["fp32"], axis=1)))
    print(f"{len(questions)} questions, default = {default_dtype}: top-1 agreement {top1:.4f}, "
          f"identical ordered top-5 {same_order:.4f}")
    print(f"encode_speedup={seconds['fp32'] / seconds['default']:.2f} "
          f"top5_agreement_fp32={topk_agreement(top['default'], top['fp32']):.4f}")


if __name__ == "__main__":
    main()
