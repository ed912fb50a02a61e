"""What a training run reads besides its model: the env config, the training and held-out
questions, the retriever, and the stream of questions over updates."""
from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path

import torch

from envs.config import EnvConfig
from envs.data import load_qa
from envs.default_questions import generate_default_questions
from envs.retrieval.defaults import open_run_retriever
from training.config import PPOConfig

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_env_config(cfg: PPOConfig) -> EnvConfig:
    """EnvConfig from ``cfg.env_config`` (a YAML recipe) with ``cfg.env`` overrides."""
    base = EnvConfig()
    if cfg.env_config:
        path = Path(cfg.env_config)
        base = EnvConfig.from_yaml(path if path.is_file() else REPO_ROOT / path)
    values = dataclasses.asdict(base)
    for key, value in cfg.env.items():
        values[key] = ({**values[key], **value} if isinstance(value, dict) and isinstance(values.get(key), dict)
                       else value)
    return EnvConfig.from_dict(values)


def load_train_and_held_out(cfg: PPOConfig) -> tuple[list, list]:
    """(training, held-out evaluation) questions; held-out ones never repeat a training question."""
    if cfg.data:
        everything = load_qa(cfg.data)
        if cfg.eval_data:
            train, held_out = everything, load_qa(cfg.eval_data, limit=cfg.eval_questions or None)
        else:  # hold out the LAST eval_questions of the file
            cut = len(everything) - cfg.eval_questions
            train, held_out = everything[:cut], everything[cut:]
        if cfg.train_questions:
            train = train[:cfg.train_questions]
    else:
        train = generate_default_questions(cfg.train_questions, seed=cfg.question_seed)
        seen = {q.question for q in train}
        extra = (generate_default_questions(cfg.eval_questions * 2 + 20, seed=cfg.eval_seed)
                 if cfg.eval_questions else [])
        held_out = [q for q in extra if q.question not in seen][:cfg.eval_questions]
    if not train:
        raise ValueError("no training questions")
    return train, held_out[:cfg.eval_questions]


def load_retriever(cfg: PPOConfig):
    """The retrieval server ``cfg.retriever`` when set, else ``cfg.index`` over ``cfg.corpus``."""
    return open_run_retriever(cfg.retriever, cfg.index, cfg.corpus)


@lru_cache(maxsize=4)
def _epoch_order(n: int, seed: int) -> tuple[int, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randperm(n, generator=generator).tolist())


def next_questions(examples: list, position: int, count: int, seed: int) -> list:
    """Questions ``position .. position+count−1`` of the endless stream of shuffled passes over
    ``examples`` (pass ``e`` shuffled with seed ``seed + e``): a pure function of the position,
    so a resumed run continues with exactly the questions it would have seen."""
    n = len(examples)
    return [examples[_epoch_order(n, seed + p // n)[p % n]] for p in range(position, position + count)]
