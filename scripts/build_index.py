"""Build a dense FAISS index for a corpus.

    python scripts/build_index.py --corpus default --encoder minilm --index-type Flat --out DIR
    python scripts/build_index.py --corpus wiki18_100w.jsonl --encoder e5 --index-type ivfpq \
        --out indexes/wiki18_e5_ivfpq --batch-size 1024 --device cuda

Interrupted builds resume from the last completed batch when run again with the same
arguments (``--no-resume`` starts over). ``--index-type`` takes any FAISS factory string or
flat / hnsw / ivfpq. See envs/index.py for the directory layout.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from envs.corpus import load_corpus  # noqa: E402
from envs.encoders import DTYPES, load_encoder  # noqa: E402
from envs.index import META_FILE, build_index  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="corpus file, or 'default' for the embedded Wikipedia summaries")
    parser.add_argument("--corpus-format", default="auto", help="auto | flashrag | jsonl | tsv")
    parser.add_argument("--encoder", default="minilm",
                        help="minilm | e5[:model] | bge[:model] | qwen3[:model] | hash[:dim] | sentence-transformers folder")
    parser.add_argument("--index-type", default="Flat", help="FAISS factory string, or flat | hnsw | ivfpq")
    parser.add_argument("--out", required=True, help="index directory (created if missing)")
    parser.add_argument("--batch-size", type=int, default=256, help="passages per encode call and checkpoint")
    parser.add_argument("--encoder-batch-size", type=int, default=None, help="texts per forward pass")
    parser.add_argument("--max-length", type=int, default=None, help="encoder token limit")
    parser.add_argument("--device", default=None, help="encoder device: cpu, cuda, cuda:1 ... (default: auto)")
    parser.add_argument("--dtype", default="auto", choices=DTYPES, help="encoder precision (auto: fp16 on CUDA, fp32 on CPU)")
    parser.add_argument("--train-size", type=int, default=100_000, help="rows sampled to train IVF/PQ types")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow model code from the model repo")
    parser.add_argument("--no-resume", action="store_true", help="ignore any partial build in --out")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.corpus == "default":
        from envs.default_corpus import default_corpus_path

        corpus_path = default_corpus_path()
    else:
        corpus_path = Path(args.corpus)
    corpus = load_corpus(corpus_path, fmt=args.corpus_format)
    encoder = load_encoder(
        args.encoder, device=args.device, batch_size=args.encoder_batch_size, max_length=args.max_length,
        show_progress=not args.quiet, dtype=args.dtype, trust_remote_code=args.trust_remote_code,
    )
    print(f"corpus {corpus.path}: {len(corpus)} passages; encoder {encoder.name} ({encoder.dim} dims, {encoder.settings})")
    started = time.perf_counter()
    out = build_index(
        corpus, encoder, args.out, index_type=args.index_type, batch_size=args.batch_size,
        resume=not args.no_resume, train_size=args.train_size, show_progress=not args.quiet,
    )
    meta = json.loads((out / META_FILE).read_text())
    print(f"index {out} ({meta['factory']}, {meta['ntotal']} rows) ready after {time.perf_counter() - started:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
