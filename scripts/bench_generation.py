"""Benchmark: HF backend generation, one request at a time versus one batch.

The same requests (prompts of about 300 tokens: search-agent instructions, passages of the
embedded default corpus cut to fit, and a question; the answer turn is prefilled with
``<search>`` or ``<answer>`` so many completions close the tag) are generated greedily, first
one request per ``generate`` call, then all in one call. Prints generated tokens/s for both, how many completions
agree token for token, and last:

- ``batched_speedup=<x>``: batched tokens/s over one-at-a-time tokens/s (target >= 3);
- ``tokens_after_stop=<n>``: tokens generated after the first occurrence of a stop string,
  counted independently of the backend by decoding each completion's token prefixes (must be 0).

    python scripts/bench_generation.py [--model gemma3-270m] [--requests 16] [--max-tokens 64]
"""
from __future__ import annotations

import argparse
import itertools
import json
import time

from envs.retrieval.default_corpus import default_corpus_path
from inference.backends.hf import HFBackend
from methods.llm import GenerationRequest, GenerationResult

STOPS = ("</search>", "</answer>")
INSTRUCTIONS = (
    "You answer questions with a search engine over Wikipedia. To search, write <search>query</search>. "
    "When you know the answer, write <answer>short answer</answer>. Here are passages found so far."
)


def read_passages(limit: int, stride: int = 97) -> list[dict]:
    """Every ``stride``-th passage of the default corpus, ``limit`` of them."""
    with open(default_corpus_path(), encoding="utf-8") as handle:
        return [json.loads(line) for line in itertools.islice(handle, 0, stride * limit, stride)]


def build_requests(tokenizer, count: int, max_tokens: int, prompt_tokens: int = 300) -> list[GenerationRequest]:
    """``count`` prompts of ``prompt_tokens`` tokens, give or take a few: the passages are cut to fit."""
    passages = read_passages(4 * count)
    requests = []
    for i in range(count):
        own = passages[4 * i: 4 * i + 4]
        question = f"Question: What is {own[0]['title']} best known for?"
        ending = "\n\n".join([question, "Assistant: " + ("<search>" if i % 2 == 0 else "<answer>")])
        context = "\n\n".join(f"[{k + 1}] {p['title']}: {p['text']}" for k, p in enumerate(own))
        budget = prompt_tokens - len(tokenizer(f"{INSTRUCTIONS}\n\n\n\n{ending}")["input_ids"])
        context_ids = tokenizer(context, add_special_tokens=False)["input_ids"][:budget]
        text = "\n\n".join([INSTRUCTIONS, tokenizer.decode(context_ids).rstrip(), ending])
        requests.append(GenerationRequest(text, stop=STOPS, max_tokens=max_tokens))
    return requests


def tokens_after_stop(tokenizer, results: list[GenerationResult]) -> int:
    """Tokens after the shortest token prefix whose decoded text contains a stop string."""
    total = 0
    for completion in (c for result in results for c in result.completions):
        ids = completion.token_ids
        for k in range(1, len(ids) + 1):
            if any(stop in tokenizer.decode(ids[:k], skip_special_tokens=True) for stop in STOPS):
                total += len(ids) - k
                break
    return total


def timed(fn) -> tuple[list[GenerationResult], float]:
    start = time.perf_counter()
    results = fn()
    return results, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()

    start = time.perf_counter()
    backend = HFBackend(args.model, device=args.device, dtype=args.dtype, max_batch_size=args.requests)
    print(f"model={args.model} loaded in {time.perf_counter() - start:.1f}s device={backend.device} "
          f"dtype={backend.model.dtype}")
    requests = build_requests(backend.tokenizer, args.requests, args.max_tokens)
    backend.generate([GenerationRequest("Warm-up.", max_tokens=4)])

    single, single_s = timed(lambda: [backend.generate([r])[0] for r in requests])
    batched, batched_s = timed(lambda: backend.generate(requests))

    single_tokens = sum(r.completion_tokens for r in single)
    batched_tokens = sum(r.completion_tokens for r in batched)
    prompt_lengths = [r.prompt_tokens for r in batched]
    same = sum(a.completions[0].token_ids == b.completions[0].token_ids for a, b in zip(single, batched))
    reasons = [r.completions[0].finish_reason for r in batched]
    print(f"requests={len(requests)} prompt_tokens min/mean/max={min(prompt_lengths)}/"
          f"{sum(prompt_lengths) / len(prompt_lengths):.0f}/{max(prompt_lengths)} max_tokens={args.max_tokens}")
    print(f"finish_reasons={ {k: reasons.count(k) for k in sorted(set(reasons))} } "
          f"identical_single_vs_batched={same}/{len(requests)}")
    print(f"example completion: {batched[0].text!r}")
    print(f"one_at_a_time: tokens={single_tokens} seconds={single_s:.2f} tokens/s={single_tokens / single_s:.1f}")
    print(f"batched:       tokens={batched_tokens} seconds={batched_s:.2f} tokens/s={batched_tokens / batched_s:.1f}")
    speedup = (batched_tokens / batched_s) / (single_tokens / single_s)
    print(f"batched_speedup={speedup:.2f}")
    print(f"tokens_after_stop={tokens_after_stop(backend.tokenizer, single + batched)}")


if __name__ == "__main__":
    main()
