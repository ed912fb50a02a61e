"""Build a dense FAISS index for a corpus.

    python scripts/build_index.py --corpus default --encoder minilm --index-type Flat --out DIR
    python scripts/build_index.py --corpus wiki18_100w.jsonl --encoder e5 --index-type opq-ivfpq \\
        --rerank 100 --memory-budget 8GB --devices all --batch-size 1024 --out indexes/wiki18_e5_opq

Interrupted builds resume from the last completed batch when run again with the same
arguments (``--no-resume`` starts over); with ``--devices`` each device's shard resumes on its
own. ``--index-type`` takes any FAISS factory string or a name sized for the corpus: flat, hnsw,
fp16 (SQfp16), sq8, ivfflat, ivf-sqfp16, ivf-sq8, ivfpq, opq-ivfpq. ``--memory-budget`` caps the
build's peak RAM: the training sample, add chunk and encode batch are derived from it, and a
type whose index cannot fit is refused before anything is encoded, with the estimate and the
types that would fit (21M x 768 E5 vectors: Flat 64.6 GB, SQ8 16.1 GB, IVF-PQ64 1.6 GB).
``--rerank K`` stores the default number of candidates that searches re-rank exactly from the
on-disk embeddings. ``--dtype auto`` (the default) encodes in float16 on CUDA, bfloat16 on a CPU
with native bfloat16 (avx512_bf16 / AMX) and float32 elsewhere; the precision is part of the
index's identity (a float32 build is never reused as a bfloat16 one) and queries are encoded in
it too. The last line printed is ``build_s=<seconds>`` (wall time from the start: imports,
corpus and model loading included). See envs/retrieval/index.py (directory layout) and
envs/retrieval/index_memory.py (formulas).
"""
from __future__ import annotations

import time

_LAUNCHED = time.perf_counter()  # build_s counts from here: imports, corpus and model loading included

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from envs.retrieval.corpus import CorpusFormatError, load_corpus  # noqa: E402
from envs.retrieval.encoders import DTYPES, load_encoder, resolve_dtype  # noqa: E402
from envs.retrieval.index import META_FILE, MemoryBudgetError, build_index  # noqa: E402
from envs.retrieval.index_memory import format_bytes, parse_bytes  # noqa: E402
from envs.retrieval.index_types import INDEX_NAMES  # noqa: E402


def parse_devices(text: str | None) -> list[str] | None:
    """``"cuda:0,cuda:1"`` -> that list; ``"all"`` -> every visible CUDA device; None -> None."""
    if text is None:
        return None
    if text.strip().lower() == "all":
        import torch

        count = torch.cuda.device_count()
        if count == 0:
            raise SystemExit("--devices all: torch sees no CUDA device")
        return [f"cuda:{i}" for i in range(count)]
    devices = [d.strip() for d in text.split(",") if d.strip()]
    if not devices:
        raise SystemExit(f"--devices {text!r}: no device named")
    return devices


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="index type names:\n"
                                     + "\n".join(f"  {k:11s} {v}" for k, v in INDEX_NAMES.items()))
    parser.add_argument("--corpus", required=True,
                        help="corpus file, or 'default' for the embedded Wikipedia summaries")
    parser.add_argument("--corpus-format", default="auto", help="auto | flashrag | jsonl | tsv")
    parser.add_argument("--encoder", default="minilm",
                        help="minilm | e5[:model] | bge[:model] | qwen3[:model] | hash[:dim] | "
                             "sentence-transformers folder")
    parser.add_argument("--index-type", default="Flat",
                        help="FAISS factory string (e.g. 'OPQ64,IVF65536,PQ64'), or a name listed below")
    parser.add_argument("--out", required=True, help="index directory (created if missing)")
    parser.add_argument("--memory-budget", default=None,
                        help="peak RAM for the build, e.g. 8GB, 512MiB, 8g (GB = 10^9, GiB and g = 2^30); "
                             "sizes the training sample, add chunk and encode batch, and refuses an index "
                             "that cannot fit")
    parser.add_argument("--rerank", type=int, default=None,
                        help="default K' for searches: fetch K' candidates and re-rank them exactly from "
                             "embeddings.npy (0: off)")
    parser.add_argument("--nprobe", type=int, default=None,
                        help="default IVF lists visited per search (stored in meta.json; else 32)")
    parser.add_argument("--batch-size", type=int, default=1024,
                        help="passages per encode call and checkpoint (upper bound under a budget); each call "
                             "is sorted by length into forward passes, so larger calls pad less")
    parser.add_argument("--encoder-batch-size", type=int, default=None, help="texts per forward pass")
    parser.add_argument("--max-length", type=int, default=None, help="encoder token limit")
    parser.add_argument("--device", default=None, help="encoder device: cpu, cuda, cuda:1 ... (default: auto)")
    parser.add_argument("--devices", default=None,
                        help="encode with one process per device over contiguous shards: 'cuda:0,cuda:1', 'all' "
                             "(every visible GPU) or 'cpu,cpu'; default: every GPU when several exist and the corpus "
                             "has >= 100,000 passages")
    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="encoder precision (auto: fp16 on CUDA, bf16 on a CPU with native bf16, else fp32)")
    parser.add_argument("--train-size", type=int, default=100_000,
                        help="rows sampled to train IVF/PQ/SQ types (upper bound under a budget)")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow model code from the model repo")
    parser.add_argument("--no-resume", action="store_true", help="ignore any partial build in --out")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        budget = parse_bytes(args.memory_budget)
    except ValueError as err:
        print(f"--memory-budget: {err}", file=sys.stderr)
        return 2
    devices = parse_devices(args.devices)
    if args.corpus == "default":
        from envs.retrieval.default_corpus import default_corpus_path

        corpus_path = default_corpus_path()
    else:
        corpus_path = Path(args.corpus)
    try:
        corpus = load_corpus(corpus_path, fmt=args.corpus_format)
    except (CorpusFormatError, FileNotFoundError) as err:  # the message names the file and line: no traceback
        print(f"corpus: {err}", file=sys.stderr)
        return 2
    device = args.device if args.device is not None or not devices else devices[0]
    dtype = args.dtype if not devices else resolve_dtype(args.dtype, devices[0])  # every shard the same precision
    encoder = load_encoder(
        args.encoder, device=device, batch_size=args.encoder_batch_size, max_length=args.max_length,
        show_progress=not args.quiet, dtype=dtype, trust_remote_code=args.trust_remote_code,
    )
    print(f"corpus {corpus.path}: {len(corpus)} passages; "
          f"encoder {encoder.name} ({encoder.dim} dims, {encoder.settings})")
    started = time.perf_counter()
    try:
        out = build_index(
            corpus, encoder, args.out, index_type=args.index_type, batch_size=args.batch_size,
            resume=not args.no_resume, train_size=args.train_size, show_progress=not args.quiet,
            memory_budget=args.memory_budget, devices=devices, rerank=args.rerank, nprobe=args.nprobe,
            encoder_options={"trust_remote_code": True} if args.trust_remote_code else None,
        )
    except MemoryBudgetError as err:
        print(f"refused: {err}", file=sys.stderr)
        return 2
    meta = json.loads((out / META_FILE).read_text())
    peak = meta.get("peak_rss_bytes")
    print(f"index {out} ({meta['factory']}, {meta['ntotal']} rows) ready after {time.perf_counter() - started:.1f}s"
          + (f"; peak RSS {format_bytes(peak)}" if peak else "")
          + (f" of a {format_bytes(budget)} budget" if budget and peak else ""))
    print(f"build_s={time.perf_counter() - _LAUNCHED:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
