"""What a training run reads besides its model and its env (``PPOConfig.env``, resolved when the config
loads): the training and held-out questions, the retriever, and the stream of questions over updates."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from envs.data import load_qa
from envs.default_questions import generate_default_questions
from envs.retrieval.defaults import open_run_retriever
from training.config import DataSettings, EvalSettings

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_train_and_held_out(data: DataSettings, evaluation: EvalSettings) -> tuple[list, list]:
    """(training, held-out evaluation) questions; held-out ones never repeat a training question."""
    if data.train_data:
        everything = load_qa(data.train_data)
        if evaluation.eval_data:
            train, held_out = everything, load_qa(evaluation.eval_data, limit=evaluation.eval_questions or None)
        else:  # hold out the LAST eval_questions of the file
            cut = len(everything) - evaluation.eval_questions
            train, held_out = everything[:cut], everything[cut:]
        if data.train_questions:
            train = train[:data.train_questions]
    else:
        train = generate_default_questions(data.train_questions, seed=data.question_seed)
        seen = {q.question for q in train}
        extra = (generate_default_questions(evaluation.eval_questions * 2 + 20, seed=evaluation.eval_seed)
                 if evaluation.eval_questions else [])
        held_out = [q for q in extra if q.question not in seen][:evaluation.eval_questions]
    if not train:
        raise ValueError("no training questions")
    return train, held_out[:evaluation.eval_questions]


def load_retriever(data: DataSettings):
    """The retrieval server ``data.retriever`` when set, else ``data.index`` over ``data.corpus`` (any
    object with those three fields: the PPO config's data section, a WarmStartConfig)."""
    return open_run_retriever(data.retriever, data.index, data.corpus)


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
