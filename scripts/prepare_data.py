"""Prepare a QA set as FlashRAG JSONL (and, optionally, its passage corpus).

Sources:
  default           questions generated from the embedded default corpus (--n, --seed)
  <path>            a local FlashRAG .jsonl or HotpotQA .json file
  <hf name>         a Hugging Face dataset, "name" or "name:config" (--split)

Examples:
  python scripts/prepare_data.py --source default --n 500 --seed 0 --out data/default_500.jsonl
  python scripts/prepare_data.py --source hotpot_dev_distractor_v1.json --out data/hotpot_dev.jsonl \\
      --corpus-out data/hotpot_dev_corpus.jsonl
  python scripts/prepare_data.py --source hotpot_qa:distractor --split validation --limit 1000 \\
      --out data/hotpot_val.jsonl
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

try:
    import envs  # noqa: F401  (installed with `pip install -e .`)
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.data import contexts_corpus, generate_default_questions, load_qa, write_flashrag_jsonl
from envs.retrieval.default_corpus import default_corpus_path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Write a QA set as FlashRAG JSONL (id, question, golden_answers, metadata, "
        "plus positive_ids / supporting_titles / contexts where known).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Examples:", 1)[1].join(["Examples:", ""]),
    )
    parser.add_argument("--source", required=True,
                        help='"default", a local .jsonl/.json file, or a Hugging Face dataset name[:config]')
    parser.add_argument("--n", type=int, default=500, help="number of default questions (default: 500)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the default questions (default: 0)")
    parser.add_argument("--split", default="test", help="hub split to load (default: test)")
    parser.add_argument("--limit", type=int, default=None, help="keep only the first N examples")
    parser.add_argument("--out", required=True, type=Path, help="output FlashRAG JSONL file")
    parser.add_argument("--corpus-out", type=Path, default=None,
                        help="also write a passage corpus JSONL: the union of the examples' context "
                        "paragraphs (e.g. HotpotQA), or a copy of the default corpus for --source default")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.source == "default":
        examples = generate_default_questions(args.n, args.seed)
        if args.limit is not None:
            examples = examples[: args.limit]
    else:
        examples = load_qa(args.source, split=args.split, limit=args.limit)
    write_flashrag_jsonl(examples, args.out)
    print(f"wrote {len(examples)} examples to {args.out}")

    if args.corpus_out is not None:
        args.corpus_out.parent.mkdir(parents=True, exist_ok=True)
        if args.source == "default":
            shutil.copyfile(default_corpus_path(), args.corpus_out)
            print(f"copied the default corpus to {args.corpus_out}")
        elif any(example.contexts for example in examples):
            count = contexts_corpus(examples, args.corpus_out)
            print(f"wrote {count} context passages to {args.corpus_out}")
        else:
            print(f"error: {args.source} has no context paragraphs to build a corpus from", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
