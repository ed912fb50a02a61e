"""Benchmark: SEEDS-ReAct on the embedded default, with and without guided actions.

The same questions (generated from the embedded default corpus, default MiniLM index) run with
free decoding and with ``guided_actions`` (each turn decodes only free text then one
well-formed ``<search>``/``<expand>``/``<answer>`` action, :mod:`methods.guidance`), on one
loaded model, all questions in flight together as ``python -m inference.evaluate`` runs them;
with an ``hf`` model both again with ``prefix_cache`` (:mod:`inference.backends.hf_prefix`).
Prints, per setting, invalid actions, searches, EM, prompt and generated tokens and seconds per
question, then how long a prefill of one question's prompt tokens takes (the share of the time
that prefix reuse across turns could save at most), and last:

``invalid_per_question=<x> eval_s_per_question=<x>`` (guided, with the prefix cache for ``hf``), then
the unguided figures without it.

    python scripts/bench_eval.py [--llm hf:smollm2-135m] [--questions 2] [--max-actions 6]
"""
from __future__ import annotations

import argparse
import time

import torch

import methods
from envs.data import load_questions
from envs.retrieval.defaults import open_run_retriever
from inference.backends import load_backend
from methods.runner import run_questions_sync


def run_setting(llm, retriever, examples, max_actions: int, guided: bool, seed: int) -> dict:
    """One evaluation of SEEDS-ReAct over ``examples``; per-question means."""
    method = methods.get("seeds-react")
    env = method.env_config({"max_actions": max_actions, "max_searches": max(1, max_actions // 3)})
    started = time.perf_counter()
    records = run_questions_sync(method, examples, llm, retriever, env, concurrency=len(examples), seed=seed,
                                 guided_actions=guided)
    elapsed = time.perf_counter() - started
    n = len(records)
    return {
        "invalid_per_question": sum(r["n_invalid"] for r in records) / n,
        "actions_per_question": sum(r["n_actions"] for r in records) / n,
        "searches_per_question": sum(r["n_searches"] for r in records) / n,
        "answered": sum(r["finish_reason"] == "answered" for r in records) / n,
        "em": sum(r["metrics"]["em"] for r in records) / n,
        "prompt_tokens_per_question": sum(r["llm_prompt_tokens"] for r in records) / n,
        "generated_tokens_per_question": sum(r["llm_completion_tokens"] for r in records) / n,
        "eval_s_per_question": elapsed / n,
        "invalid_reasons": sorted({e["invalid_reason"] for r in records for e in r["trace"]
                                   if e.get("type") == "env" and e.get("invalid_reason")})[:4],
    }


def report(llm: str, name: str, figures: dict) -> None:
    print(f"{llm} {name}: " + " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                       for k, v in figures.items()), flush=True)


def prefill_seconds(llm, tokens: int, chunk: int) -> float:
    """Seconds to prefill ``tokens`` prompt tokens in prompts of ``chunk`` tokens (no decoding)."""
    ids = torch.randint(100, 1000, (1, chunk))
    started = time.perf_counter()
    with torch.inference_mode():
        for _ in range(max(1, round(tokens / chunk))):
            llm.model(input_ids=ids, use_cache=False, logits_to_keep=1)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", default="hf:smollm2-135m")
    parser.add_argument("--questions", type=int, default=2)
    parser.add_argument("--max-actions", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    examples = load_questions(None, limit=args.questions, seed=args.seed)
    llm = load_backend(args.llm)
    retriever = open_run_retriever(None, None)
    results = {}
    for name, guided in (("unguided", False), ("guided", True)):
        results[name] = run_setting(llm, retriever, examples, args.max_actions, guided, args.seed)
        report(args.llm, name, results[name])
    if args.llm.startswith("hf:"):
        cached = load_backend(args.llm, prefix_cache=4 * len(examples))
        for name, guided in (("unguided+prefix_cache", False), ("guided+prefix_cache", True)):
            results[name] = run_setting(cached, retriever, examples, args.max_actions, guided, args.seed)
            report(args.llm, name, results[name])
        cached.close()
    prompt_tokens = results["unguided"]["prompt_tokens_per_question"]
    turns = max(1.0, results["unguided"]["actions_per_question"])
    prefill = prefill_seconds(llm, int(prompt_tokens), max(16, int(prompt_tokens / turns)))
    print(f"prefill of one question's {prompt_tokens:.0f} prompt tokens ({turns:.1f} turns): {prefill:.1f} s "
          f"of {results['unguided']['eval_s_per_question']:.1f} s per question (the most prefix reuse could save)")
    llm.close()
    guided, free = results.get("guided+prefix_cache", results["guided"]), results["unguided"]
    print(f"invalid_per_question={guided['invalid_per_question']:.2f} "
          f"eval_s_per_question={guided['eval_s_per_question']:.1f} "
          f"invalid_per_question_unguided={free['invalid_per_question']:.2f} "
          f"eval_s_per_question_unguided={free['eval_s_per_question']:.1f}")


if __name__ == "__main__":
    main()
