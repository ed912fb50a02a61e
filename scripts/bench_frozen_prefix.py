"""Benchmark: PPO epochs over one update's rows with and without the frozen-prefix cache.

The main job's actor (SmolLM2-135M-Instruct by default, LoRA r 16 on the top 4 layers, the
recipe's dtype rule ``native``) runs ``--epochs`` passes of forward + backward (the trainer's
``sequence_logprobs``) over ``--rows`` rows of ``--tokens`` random tokens, in micro-batches of
``--micro-batch``, with the log-probs of the last ``--target-share`` of each row's positions (the
model's tokens: ~15% of an episode row of the main job, one token of a verdict row; the lm_head
runs only there):

- plain: every epoch runs all decoder layers;
- cached (``cache_frozen_layers: true``): one no-grad pass of the frozen bottom layers
  (:func:`training.models.frozen_prefix.prefix_hidden`), then every epoch runs only the top layers.

Both give the same gradients (tests/test_frozen_prefix.py); this times them. Prints both times
and, last, ``frozen_prefix_speedup=<plain seconds / cached seconds>``.

    python scripts/bench_frozen_prefix.py [--model smollm2-135m] [--rows 16] [--tokens 512] [--epochs 2]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from training.config import LoraSettings, PPOConfig, with_values
from training.models.frozen_prefix import frozen_depth, prefix_hidden
from training.models.policy_models import build_models


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="native")
    parser.add_argument("--top-layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--target-share", type=float, default=0.15)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def epochs_plain(actor, batches, epochs: int) -> float:
    start = time.perf_counter()
    for _ in range(epochs):
        for ids, attention, target in batches:
            actor(ids, attention, target_mask=target)[0].sum().backward()
    return time.perf_counter() - start


def epochs_cached(actor, batches, epochs: int, depth: int) -> float:
    start = time.perf_counter()
    prefixes = [prefix_hidden(actor.lm, ids, attention, depth) for ids, attention, _ in batches]
    for _ in range(epochs):
        for (ids, attention, target), prefix in zip(batches, prefixes):
            actor(ids, attention, target_mask=target, prefix=prefix, prefix_depth=depth)[0].sum().backward()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = with_values(PPOConfig, {"model.name": args.model, "model.dtype": args.dtype,
                                  "optim.critic_warmup_updates": 0, "algorithm.advantage": "grpo",
                                  "model.lora": LoraSettings(r=16, alpha=32, dropout=0.0, top_layers=args.top_layers)})
    actor = build_models(cfg.model, cfg.algorithm, cfg.rollout, device="cpu").actor.train()
    depth = frozen_depth(actor.lm)
    generator = torch.Generator().manual_seed(args.seed)
    vocab = actor.lm.config.vocab_size
    batches = []
    for _ in range(0, args.rows, args.micro_batch):
        ids = torch.randint(0, vocab, (args.micro_batch, args.tokens), generator=generator)
        target = torch.zeros((args.micro_batch, args.tokens - 1), dtype=torch.long)
        target[:, int((args.tokens - 1) * (1 - args.target_share)):] = 1
        batches.append((ids, torch.ones_like(ids), target))
    print(f"{args.model} ({next(actor.parameters()).dtype}), LoRA on the top {args.top_layers} layers: "
          f"{depth} frozen below; {args.rows} rows x {args.tokens} tokens, {args.epochs} epochs", flush=True)
    epochs_plain(actor, batches[:1], 1)  # warm-up
    plain = epochs_plain(actor, batches, args.epochs)
    cached = epochs_cached(actor, batches, args.epochs, depth)
    print(f"plain {plain:.1f} s, cached {cached:.1f} s", flush=True)
    print(f"frozen_prefix_speedup={plain / cached:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
