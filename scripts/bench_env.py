"""Benchmark: how much of a batched env step is the env itself, not encoding or FAISS.

64 episodes on the embedded default are stepped together by the scripted policy (search the
question, expand the top 2, answer). Prints steps/s and the split of step time into query
encoding, FAISS search and everything else; the last line is
``env_overhead_fraction=<x>`` = time outside encode+FAISS / total step time (target <= 0.10).

    python scripts/bench_env.py [--episodes 64] [--repeats 3]
"""
from __future__ import annotations

import argparse
import time

from envs.config import EnvConfig
from envs.default_questions import generate_default_questions
from envs.retrieval.defaults import default_retriever
from envs.vector_env import SearchVectorEnv
from methods.scripted import SearchExpandAnswerPolicy


def run_batch(venv: SearchVectorEnv, examples, seed: int) -> tuple[float, int]:
    """Step one batch of scripted episodes to the end; returns (seconds inside venv.step, env steps)."""
    observations, _ = venv.reset(seed=seed, examples=examples)
    policies = [SearchExpandAnswerPolicy(ex.question, n_expand=2) for ex in examples]
    done = [False] * len(examples)
    seconds, steps = 0.0, 0
    while not all(done):
        actions = [None if done[i] else policies[i].act(observations[i]) for i in range(len(examples))]
        start = time.perf_counter()
        observations, _, terminated, truncated, _ = venv.step(actions)
        seconds += time.perf_counter() - start
        steps += sum(a is not None for a in actions)
        done = [d or t or u for d, t, u in zip(done, terminated, truncated)]
    return seconds, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="batches of fresh questions to time")
    args = parser.parse_args()

    retriever = default_retriever()
    questions = generate_default_questions(args.episodes * (args.repeats + 1), seed=1234)
    venv = SearchVectorEnv(retriever, num_envs=args.episodes, config=EnvConfig())
    run_batch(venv, questions[: args.episodes], seed=0)  # warm-up: model kernels, page cache

    retriever.clear_cache()
    retriever.stats.reset()
    total, steps = 0.0, 0
    for r in range(1, args.repeats + 1):
        seconds, n = run_batch(venv, questions[r * args.episodes : (r + 1) * args.episodes], seed=r)
        total += seconds
        steps += n
    encode, faiss_time = retriever.stats.encode_seconds, retriever.stats.index_seconds
    other = total - encode - faiss_time
    print(f"episodes={args.episodes} x {args.repeats} batches, env steps={steps}, "
          f"retrieval calls={retriever.stats.calls}")
    print(f"steps/s={steps / total:.1f}")
    print(f"encode_s={encode:.3f} faiss_s={faiss_time:.3f} other_s={other:.3f} total_s={total:.3f}")
    print(f"env_overhead_fraction={other / total:.4f}")


if __name__ == "__main__":
    main()
