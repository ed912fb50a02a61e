"""Tiny PPO runs for the multi-process tests: a saved tiny Llama, the toy corpus indexed with the
hash encoder, four questions, and a recipe for ``training.ppo`` over them (CPU, seconds)."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import yaml

from envs.retrieval.corpus import load_corpus
from envs.retrieval.encoders import load_encoder
from envs.retrieval.index import build_index
from tests.conftest import PASSAGES
from tests.tiny_models import tiny_llama, tiny_tokenizer

QUESTIONS = [("a", "What is the capital of France?", "Paris"), ("b", "Which river flows through Vienna?", "Danube"),
             ("c", "What is the capital of Japan?", "Tokyo"), ("d", "Which river flows through Berlin?", "Spree")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_tiny_run(folder: Path, **overrides) -> Path:
    """Model, index and questions under ``folder``; returns ``folder/tiny.yaml``, a recipe with
    two updates of two questions (one episode each), one episode per micro-batch, output in
    ``folder/run``. ``overrides``: other recipe values."""
    tokenizer = tiny_tokenizer()
    model_dir = folder / "model"
    tiny_llama(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "title": t, "text": x}) + "\n" for i, t, x in PASSAGES))
    build_index(load_corpus(corpus), load_encoder("hash"), folder / "index", show_progress=False)
    data = folder / "qa.jsonl"
    data.write_text("".join(json.dumps({"id": i, "question": q, "golden_answers": [a]}) + "\n"
                            for i, q, a in QUESTIONS))
    recipe = {
        "model": str(model_dir), "sft_warm_start": False,
        "lora": {"enabled": True, "r": 4, "alpha": 8, "critic": True},
        "data": str(data), "eval_data": str(data), "eval_questions": 0, "index": str(folder / "index"),
        "env_config": None, "env": {"max_actions": 3, "max_searches": 1}, "train_questions": 4,
        "questions_per_update": 2, "samples_per_question": 1, "num_envs": 1, "rollout_batch_size": 1,
        "max_turn_tokens": 8, "max_context_tokens": 1024, "updates": 2, "critic_warmup_updates": 0,
        "micro_batch_size": 1, "output_dir": str(folder / "run"), "export": False, "save_every": 1,
    }
    recipe.update(overrides)
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path
