"""Benchmark: multi-turn rollouts against plain batched generation, in generated tokens per second.

The same questions (generated from the embedded default corpus) are first rolled out with
:func:`training.rollouts.rollout.collect_rollouts` in the SEEDS-R1 environment, all in one batch, sampling
at temperature 1 (each episode's KV cache kept across turns; ``--reprefill`` also times the path
that prefills the whole context every turn). Then the same model generates the same number of
tokens for the same prompts with ONE plain batched ``model.generate`` call (sampling at
temperature 1, no stop strings, ``min_new_tokens = max_new_tokens``, so every row generates
exactly its share). Rollout time is everything ``collect_rollouts`` does: generation, observation
prefill, env steps, retrieval, tokenisation.

The retriever is a word-overlap toy over the default corpus (offline, no encoder, about a
millisecond per query); ``--retriever default`` uses the default MiniLM index instead (built on
first use). Prints both rates and, last, ``rollout_efficiency=<rollout tokens/s / plain tokens/s>``
(target >= 0.7). ``--engine-baseline`` also times one ``backend.generate`` call over the same
prompts: the stricter comparison, since the HF backend's own decode loop outruns ``model.generate``.

    python scripts/bench_rollout.py [--model smollm2-135m] [--questions 8] [--max-turn-tokens 64] \\
        [--max-actions 4] [--reprefill] [--engine-baseline]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import time
from collections import Counter

import torch

from envs.default_questions import generate_default_questions
from envs.retrieval.default_corpus import default_corpus_path
from envs.types import Hit, Passage
from envs.vector_env import SearchVectorEnv
from inference.backends.hf import HFBackend
from methods.llm import GenerationRequest
from methods.seeds import SeedsR1
from training.rollouts.rollout import RolloutConfig, collect_rollouts

WORD = re.compile(r"\w+")


class WordOverlapRetriever:
    """Ranks passages by the number of distinct query words they contain (ties by row); an
    inverted index over the corpus makes a query cost its words' posting lists only."""

    def __init__(self, passages: list[Passage]):
        self.corpus = passages
        self.postings: dict[str, list[int]] = {}
        for passage in passages:
            for word in set(WORD.findall(f"{passage.title} {passage.text}".lower())):
                self.postings.setdefault(word, []).append(passage.row)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        results = []
        for query in queries:
            counts = Counter(row for word in set(WORD.findall(query.lower())) for row in self.postings.get(word, ()))
            best = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:k]
            results.append([Hit.from_passage(self.corpus[row], float(score), rank)
                             for rank, (row, score) in enumerate(best, 1)])
        return results


def toy_retriever() -> WordOverlapRetriever:
    with open(default_corpus_path(), encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    return WordOverlapRetriever([Passage(row, r["id"], r["title"], r["text"]) for row, r in enumerate(records)])


def time_rollouts(backend: HFBackend, retriever, questions, method: SeedsR1, args, reuse: bool) -> tuple[list, float]:
    env = method.env_config({"max_actions": args.max_actions})
    venv = SearchVectorEnv(retriever, num_envs=len(questions), config=env,
                           tokenizer=backend.tokenizer)
    config = RolloutConfig(max_turn_tokens=args.max_turn_tokens, max_context_tokens=args.max_context_tokens,
                           temperature=1.0, seed=args.seed, reuse_kv_cache=reuse)
    start = time.perf_counter()
    episodes = collect_rollouts(backend, venv, questions, config, lambda q: method.prompt(q, env))
    return episodes, time.perf_counter() - start


def time_plain_generate(backend: HFBackend, prompts: list[str], new_tokens: int, seed: int) -> float:
    """One ``model.generate`` call: ``len(prompts)`` left-padded rows, exactly ``new_tokens`` each."""
    tokenizer = backend.tokenizer
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True).to(backend.device)
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.inference_mode():
        out = backend.model.generate(**batch, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                     max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                     pad_token_id=backend.pad_id)
    seconds = time.perf_counter() - start
    assert out.shape[1] - batch["input_ids"].shape[1] == new_tokens
    return seconds


def time_engine_generate(backend: HFBackend, prompts: list[str], new_tokens: int, seed: int) -> float:
    """Tokens/s of ONE ``backend.generate`` call over the prompts (no stop strings; a row may end
    early at EOS, so tokens are counted)."""
    ids = [backend.tokenizer(p, add_special_tokens=True)["input_ids"] for p in prompts]
    requests = [GenerationRequest(row, max_tokens=new_tokens, temperature=1.0, seed=seed + i)
                for i, row in enumerate(ids)]
    start = time.perf_counter()
    results = backend.generate(requests)
    return sum(r.completion_tokens for r in results) / (time.perf_counter() - start)


def describe(episodes: list, seconds: float, label: str) -> float:
    """Print a rollout's shape and rate; returns its model tokens per second."""
    model_tokens = sum(e.num_model_tokens for e in episodes)
    prompt_tokens = sum(e.prompt_length for e in episodes)
    observation_tokens = sum(len(e.token_ids) for e in episodes) - model_tokens - prompt_tokens
    reasons = Counter(e.finish_reason for e in episodes)
    turns = sum(e.num_turns for e in episodes) / len(episodes)
    print(f"{label}: episodes={len(episodes)} turns/episode={turns:.2f} finish={dict(reasons)} "
          f"prompt_tokens={prompt_tokens} observation_tokens={observation_tokens} model_tokens={model_tokens}")
    print(f"{label}: seconds={seconds:.2f} tokens/s={model_tokens / seconds:.1f}")
    return model_tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a spec for inference.models.load_causal_lm")
    parser.add_argument("--questions", type=int, default=8, help="episodes, all in one batch")
    parser.add_argument("--max-turn-tokens", type=int, default=64)
    parser.add_argument("--max-context-tokens", type=int, default=2048)
    parser.add_argument("--max-actions", type=int, default=4)
    parser.add_argument("--retriever", choices=("toy", "default"), default="toy")
    parser.add_argument("--reprefill", action="store_true", help="also time rollouts without the kept KV cache")
    parser.add_argument("--engine-baseline", action="store_true",
                        help="also time one backend.generate call over the same prompts (the HF engine without turns)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min), "
          f"cpus={os.cpu_count()} torch_threads={torch.get_num_threads()}")
    start = time.perf_counter()
    backend = HFBackend(args.model, device=args.device, max_batch_size=args.questions)
    if args.retriever == "default":
        from envs.retrieval.defaults import default_retriever

        retriever = default_retriever()
    else:
        retriever = toy_retriever()
    questions = generate_default_questions(args.questions, seed=args.seed)
    method = SeedsR1(max_tokens=args.max_turn_tokens)
    env = method.env_config({"max_actions": args.max_actions})
    print(f"model={args.model} device={backend.device} dtype={backend.model.dtype} retriever={args.retriever} "
          f"setup={time.perf_counter() - start:.1f}s")
    backend.generate([GenerationRequest("Warm-up.", max_tokens=4)])
    time_plain_generate(backend, ["Warm-up."], 4, args.seed)

    episodes, seconds = time_rollouts(backend, retriever, questions, method, args, reuse=True)
    rollout_rate = describe(episodes, seconds, "rollout (KV cache kept)")
    if args.reprefill:
        again, again_seconds = time_rollouts(backend, retriever, questions, method, args, reuse=False)
        describe(again, again_seconds, "rollout (re-prefill every turn)")
    per_row = math.ceil(sum(e.num_model_tokens for e in episodes) / len(questions))
    prompts = [method.prompt(q.question, env) for q in questions]
    plain_seconds = time_plain_generate(backend, prompts, per_row, args.seed)
    plain_rate = per_row * len(questions) / plain_seconds
    print(f"plain model.generate: rows={len(questions)} new_tokens/row={per_row} seconds={plain_seconds:.2f} "
          f"tokens/s={plain_rate:.1f}")
    if args.engine_baseline:
        engine_rate = time_engine_generate(backend, prompts, per_row, args.seed)
        print(f"one backend.generate call (same prompts, no stop strings): tokens/s={engine_rate:.1f} "
              f"rollout/engine={rollout_rate / engine_rate:.2f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"rollout_efficiency={rollout_rate / plain_rate:.2f}")


if __name__ == "__main__":
    main()
