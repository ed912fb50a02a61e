"""Where the answer term goes: what a policy's answers are made of, and what reading rules could get.

Three measurements on one set of questions in one env (the PPO recipe's held-out questions in its
env, by :mod:`scripts.run_reader_study`):

- :func:`~training.evaluation.answer_sources.answer_sources`: each episode's answer classified
  against what the episode showed and opened (:mod:`training.evaluation.answer_sources`, which
  every greedy evaluation reports too). It tells whether a policy answers from what it read, so
  that what its verdicts open can reach the answer term of the reward.
- :func:`forced_answers`: the policy's greedy answer turn after the scripted teacher's own search,
  verdicts and readings (teacher forcing up to the answer): whether it answers with the title the
  teacher opened first, whatever its own verdicts would have opened. It measures reading alone.
- :func:`teacher_table`: the scripted teacher (:mod:`training.teachers.scripted_teacher`, no model)
  with each expansion rule and each reader rule: EM, EM per question kind and reward. It bounds
  what a policy that reads by that rule gets from its openings.

Episodes are the env's summaries (``Episode.info`` of a rollout, ``summary`` of a trajectory
record): ``answer``, ``metrics.em`` and ``searches`` (``titles`` in the order shown, ``expanded``
1-based numbers in the order opened).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from envs.config import EnvConfig
from envs.metrics import exact_match, normalize_answer
from envs.protocol import AnswerAction, JudgeForm, parse_action
from training.evaluation.answer_sources import answer_sources
from training.teachers.scripted_teacher import READER_RULES, ScriptedTeacherConfig, collect_scripted
from training.teachers.trajectories import tokenize_trajectory

# name -> ScriptedTeacherConfig fields (random mode: each candidate on a coin)
TEACHER_EXPANSIONS: dict[str, dict[str, Any]] = {
    "positives (gold-guided)": {"expand": "positives"},
    "open_rate 0.5": {"expand": "random", "open_rate": 0.5},
    "every candidate": {"expand": "random", "open_rate": 1.0},
    "none": {"expand": "random", "open_rate": 0.0},
}


def teacher_row(examples: Sequence, retriever: Any, env_config: EnvConfig, settings: ScriptedTeacherConfig,
                seed: int, tokenizer: Any = None) -> dict[str, float]:
    """EM, EM per question kind (``metadata["type"]``) and mean reward of the scripted teacher."""
    records = collect_scripted(examples, retriever, env_config, settings, seed=seed, tokenizer=tokenizer)
    em = np.array([r["summary"]["metrics"]["em"] for r in records], dtype=np.float64)
    reward = np.array([r["summary"]["reward"]["total"] for r in records], dtype=np.float64)
    kinds = np.array([str(ex.metadata.get("type", "all")) for ex in examples])
    row = {"em": float(em.mean()), "reward": float(reward.mean())}
    row.update({f"em_{kind}": float(em[kinds == kind].mean()) for kind in sorted(set(kinds))})
    return row


def teacher_table(examples: Sequence, retriever: Any, env_config: EnvConfig, seed: int, tokenizer: Any = None,
                  readers: Sequence[str] = tuple(READER_RULES)) -> dict[str, dict[str, dict[str, float]]]:
    """{expansion: {reader: teacher_row}} over :data:`TEACHER_EXPANSIONS` (one search, no think)."""
    table = {}
    for name, fields in TEACHER_EXPANSIONS.items():
        table[name] = {reader: teacher_row(examples, retriever, env_config, ScriptedTeacherConfig(
            second_search=False, think=False, reader=reader, **fields), seed, tokenizer) for reader in readers}
    return table


def answer_context(record: dict, tokenizer: Any, form: JudgeForm) -> list[int]:
    """The token ids a policy's answer turn starts from in ``record`` (a trajectory that ended
    with an answer): its layout (:func:`training.teachers.trajectories.tokenize_trajectory`) up to that turn."""
    segments = list(record["segments"])
    if not segments or segments[-1]["role"] != "model" or not isinstance(parse_action(segments[-1]["text"]),
                                                                         AnswerAction):
        raise ValueError(f"trajectory {record.get('id')!r} does not end with an answer")
    before = {**record, "segments": segments[:-1], "ended_with_answer": False}
    return tokenize_trajectory(before, tokenizer, form, train_verdicts=False)["input_ids"]


@torch.no_grad()
def greedy_turns(model: Any, tokenizer: Any, contexts: Sequence[list[int]], max_new_tokens: int,
                 batch_size: int = 16) -> list[str]:
    """Greedy continuations (left-padded batches; special tokens dropped) of token-id ``contexts``."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    texts: list[str] = []
    for start in range(0, len(contexts), batch_size):
        batch = contexts[start:start + batch_size]
        width = max(len(c) for c in batch)
        ids = torch.tensor([[pad] * (width - len(c)) + list(c) for c in batch], device=device)
        attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in batch], device=device)
        out = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id)
        texts += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return texts


def forced_answers(model: Any, tokenizer: Any, records: Sequence[dict], form: JudgeForm,
                   max_new_tokens: int = 48) -> dict[str, Any]:
    """The policy's greedy answers after each teacher trajectory's own turns (those that ended with
    an answer): counts of :data:`ANSWER_SOURCES` (the teacher's openings), ``em``, and
    ``teacher_answer``: how many say what the teacher's reader said there."""
    records = [r for r in records if r.get("ended_with_answer") and r["summary"].get("answer") is not None]
    contexts = [answer_context(r, tokenizer, form) for r in records]
    turns = greedy_turns(model, tokenizer, contexts, max_new_tokens)
    summaries, same = [], 0
    for record, turn in zip(records, turns):
        action = parse_action(turn)
        said = action.answer if isinstance(action, AnswerAction) else None
        golds = record["golden_answers"]
        summaries.append({**record["summary"], "answer": said,
                          "metrics": {"em": exact_match(said, golds) if said is not None else 0.0}})
        same += said is not None and normalize_answer(said) == normalize_answer(str(record["summary"]["answer"]))
    return {**answer_sources(summaries), "teacher_answer": same}
