"""Prepare HotpotQA (distractor setting) for configs/ppo/hotpotqa.yaml: split, corpus and index.

Writes into --out-dir (default data/hotpotqa, where the recipe looks):
  train.jsonl      training questions (FlashRAG JSONL, supporting titles = positives)
  held_out.jsonl   held-out questions: id's sha256 % 8 == 0 (envs/hotpotqa.py), or all of --eval-source
  corpus.jsonl     every question's own paragraphs, one passage each, deduplicated on (title, text)
  split.json       the rule and the counts
  index/           the FAISS index of corpus.jsonl (--encoder, default minilm; --no-index skips it)

Examples:
  python scripts/prepare_hotpotqa.py --source ../shared/data/hotpotqa_dev_distractor_500.jsonl
  python scripts/prepare_hotpotqa.py --source hotpot_train_v1.1.json --eval-source hotpot_dev_distractor_v1.json \\
      --out-dir data/hotpotqa_full --device cuda
  python scripts/prepare_hotpotqa.py --source hotpot_qa:distractor --split train --eval-source \\
      hotpot_qa:distractor --eval-split validation
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from envs.data import DataFormatError  # noqa: E402
from envs.hotpotqa import CORPUS_FILE, HELD_OUT_MODULUS, prepare_hotpotqa  # noqa: E402

DEFAULT_OUT = "data/hotpotqa"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--source", required=True,
                        help="HotpotQA questions: a .jsonl (FlashRAG: contexts, supporting_titles) or original "
                             ".json file, or a hub name such as hotpot_qa:distractor")
    parser.add_argument("--split", default="train", help="hub split of --source (default: train)")
    parser.add_argument("--eval-source", default=None,
                        help="hold out this file's questions (all of them) instead of splitting --source by id")
    parser.add_argument("--eval-split", default="validation", help="hub split of --eval-source (default: validation)")
    parser.add_argument("--modulus", type=int, default=HELD_OUT_MODULUS,
                        help=f"held out when sha256(id) %% modulus == 0 (default {HELD_OUT_MODULUS}, the recipe's)")
    parser.add_argument("--out-dir", type=Path, default=Path(DEFAULT_OUT),
                        help=f"output folder (default {DEFAULT_OUT}, where configs/ppo/hotpotqa.yaml reads)")
    parser.add_argument("--encoder", default="minilm", help="index encoder (default minilm, the recipe's retriever)")
    parser.add_argument("--device", default=None, help="encoder device: cpu, cuda, ... (default: auto)")
    parser.add_argument("--no-index", action="store_true", help="write the files only, build no index")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def build_corpus_index(corpus_path: Path, index_dir: Path, encoder_name: str, device: str | None,
                       quiet: bool) -> int:
    """A Flat FAISS index of ``corpus_path`` in ``index_dir`` (as scripts/build_index.py builds it);
    returns its row count. A finished index of the same corpus and encoder is reused."""
    from envs.retrieval.corpus import load_corpus
    from envs.retrieval.encoders import load_encoder
    from envs.retrieval.index import build_index

    corpus = load_corpus(corpus_path)
    encoder = load_encoder(encoder_name, device=device, show_progress=not quiet)
    build_index(corpus, encoder, index_dir, index_type="Flat", show_progress=not quiet)
    return len(corpus)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    try:
        summary = prepare_hotpotqa(args.source, args.out_dir, eval_source=args.eval_source, split=args.split,
                                   eval_split=args.eval_split, modulus=args.modulus)
    except (DataFormatError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{summary['questions']} questions from {args.source} ({summary['rule']}): {summary['train']} training "
          f"-> {args.out_dir}/train.jsonl, {summary['held_out']} held out -> {args.out_dir}/held_out.jsonl"
          + (f"; {summary['repeats_dropped_from_train']} training question(s) left out as repeats of held-out ones"
             if summary["repeats_dropped_from_train"] else ""))
    print(f"{summary['passages']} passages ({summary['paragraphs']} paragraphs, deduplicated on title and text) "
          f"-> {args.out_dir}/{CORPUS_FILE}")
    if not args.no_index:
        rows = build_corpus_index(args.out_dir / CORPUS_FILE, args.out_dir / "index", args.encoder, args.device,
                                  args.quiet)
        print(f"index {args.out_dir}/index ({args.encoder}, Flat, {rows} rows)")
    print(f"train={summary['train']} held_out={summary['held_out']} passages={summary['passages']} "
          f"prepare_s={time.perf_counter() - started:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
