"""Benchmark: a rollout's first turn with and without shared prefixes in the HF session.

The main job's first turn: ``--questions`` questions generated from the embedded default corpus,
each prompted ``--samples`` times with the SEEDS-R1 prompt of the main job's env (the same
instructions before every question), one token sampled per row (so the time is the prefill).
:class:`~inference.backends.hf_session.HFSession` runs them twice, in fresh sessions: with
``share_prefixes`` (the instructions once, each question's prompt once) and without (every row
its whole prompt). Best of ``--repeats`` each, the two alternating; the sampled tokens must agree.
Prints the prompt tokens each way ran and, last, ``shared_prefix_speedup=<time without / time with>``.

    python scripts/bench_shared_prefix.py [--model smollm2-135m] [--questions 8] [--samples 3] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from envs.default_questions import generate_default_questions
from inference.backends.hf import HFBackend
from methods.llm import GenerationRequest
from training.config import PPOConfig, load_config
from training.ppo import resolve_argv
from training.teachers.trajectories import seeds_r1_prompt_fn


def first_turn(backend: HFBackend, prompts: list[list[int]], samples: int, share: bool) -> tuple[float, list, int]:
    """One session call over every sample of every prompt -> (seconds, sampled tokens, prompt
    tokens the model ran, shared prefixes included)."""
    session = backend.session()
    session.share_prefixes = share
    requests = [GenerationRequest(ids, max_tokens=1, temperature=1.0, seed=7 * q + s)
                for q, ids in enumerate(prompts) for s in range(samples)]
    keys = list(range(len(requests)))
    start = time.perf_counter()
    results = session.generate(requests, keys)
    seconds = time.perf_counter() - start
    return seconds, [r.completions[0].token_ids for r in results], session.prefill_tokens_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a spec for inference.models.load_causal_lm")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min), "
          f"cpus={os.cpu_count()} torch_threads={torch.get_num_threads()}")
    rows = args.questions * args.samples
    backend = HFBackend(args.model, device=args.device, max_batch_size=rows)
    prompt_fn = seeds_r1_prompt_fn(load_config(PPOConfig, resolve_argv([])).env)
    questions = generate_default_questions(args.questions, seed=0)
    prompts = [list(backend.tokenizer(prompt_fn(q.question), add_special_tokens=True)["input_ids"])
               for q in questions]
    first_turn(backend, prompts[:1], 1, share=False)  # warm-up
    best = {True: float("inf"), False: float("inf")}
    tokens, ran = {}, {}
    for _ in range(args.repeats):
        for share in (True, False):
            seconds, tokens[share], ran[share] = first_turn(backend, prompts, args.samples, share)
            best[share] = min(best[share], seconds)
    if tokens[True] != tokens[False]:
        raise SystemExit("the sampled tokens differ with and without shared prefixes")
    total = sum(len(p) for p in prompts) * args.samples
    print(f"model={args.model} dtype={backend.model.dtype} rows={rows} ({args.questions} questions x "
          f"{args.samples} samples) prompt tokens={total}")
    for share, label in ((False, "each row its whole prompt"), (True, "shared prefixes")):
        print(f"{label}: ran {ran[share]} prompt tokens in {best[share]:.2f} s (best of {args.repeats})")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"shared_prefix_speedup={best[False] / best[True]:.2f}")


if __name__ == "__main__":
    main()
