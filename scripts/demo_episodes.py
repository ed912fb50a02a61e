"""Episode demo on the embedded default (the main job until the trainer lands).

Builds (first run only) the default Wikipedia-summaries corpus and its MiniLM index, generates
questions, runs the scripted search -> expand -> answer policy through the batched env, prints
a few whole episodes and the aggregate metrics, and writes every episode summary as JSONL.

    python scripts/demo_episodes.py [--n 32] [--admission preview|prefix] [--out runs/demo]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from envs.atomic import write_json_atomic, write_jsonl_atomic
from envs.config import EnvConfig
from envs.data import load_qa
from envs.default_questions import generate_default_questions
from envs.report import summarize_episodes
from envs.retrieval.defaults import default_retriever
from envs.retrieval.retriever import Retriever
from envs.vector_env import SearchVectorEnv
from methods.scripted import run_scripted_episodes


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=32, help="number of questions (default 32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", help="FlashRAG JSONL questions (default: generated from the default corpus)")
    parser.add_argument("--index", help="index directory from scripts/build_index.py (default: the embedded default)")
    parser.add_argument("--env-config",
                        help="YAML env recipe, e.g. configs/env/seeds_r1.yaml (flags below override it)")
    parser.add_argument("--admission", choices=["preview", "prefix"])
    parser.add_argument("--top-k", type=int, help="candidates per search (default 5)")
    parser.add_argument("--n-expand", type=int, default=2, help="candidates the scripted policy expands")
    parser.add_argument("--distractor-rate", type=float, help="chance each candidate is a random passage")
    parser.add_argument("--batch", type=int, default=16, help="episodes stepped together")
    parser.add_argument("--show", type=int, default=2, help="episodes printed in full")
    parser.add_argument("--out", default="runs/demo", help="folder for episodes.jsonl and metrics.json")
    return parser.parse_args(argv)


def print_episode(summary: dict) -> None:
    print("=" * 80)
    print(f"Q: {summary['question']}   gold: {summary['golden_answers']}")
    for turn in summary["transcript"]:
        print(f"  policy> {turn['action']}")
        for line in turn["observation"].splitlines():
            print(f"    {line[:160]}")
    print(f"  -> EM={summary['metrics']['em']:.0f} reward={summary['reward']['total']:+.2f} "
          f"read={summary['docs_read']} positives opened={summary['positives_opened']}/{summary['positives_shown']}")


def main(argv=None) -> int:
    args = parse_args(argv)
    retriever = Retriever.from_dir(args.index) if args.index else default_retriever()
    examples = load_qa(args.data, limit=args.n) if args.data else generate_default_questions(args.n, seed=args.seed)
    config = EnvConfig.from_yaml(args.env_config) if args.env_config else EnvConfig()
    overrides = {"admission": args.admission, "candidates_per_search": args.top_k,
                 "distractor_rate": args.distractor_rate}
    config = dataclasses.replace(config, **{k: v for k, v in overrides.items() if v is not None})
    venv = SearchVectorEnv(retriever, num_envs=min(args.batch, len(examples)), config=config)
    summaries = run_scripted_episodes(venv, examples, n_expand=args.n_expand, seed=args.seed)
    for summary in summaries[: args.show]:
        print_episode(summary)
    metrics = summarize_episodes(summaries)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(summaries, out / "episodes.jsonl")
    write_json_atomic(metrics, out / "metrics.json")
    print("=" * 80)
    print(f"{len(summaries)} episodes, admission={config.admission}, written to {out}/")
    for key, value in metrics.items():
        print(f"  {key:>20}: {value:.3f}" if isinstance(value, float) else f"  {key:>20}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
