"""Stage 1 of the SFT warm start: collect the configured teacher's trajectories, judge them with
the E.2 filter, and (``target_accepted``) stop once enough are accepted.

Every env built here counts observation caps in the POLICY's tokens (the tokenizer passed in),
so the observations the policy is trained on are the ones its own rollouts will get.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envs.retrieval.defaults import open_run_retriever
from envs.types import QAExample
from inference.backends import load_backend
from training.sft_config import WarmStartConfig
from training.teachers.scripted_teacher import collect_scripted
from training.teachers.trajectories import collect_with_method

log = logging.getLogger("training.sft")


def load_retriever(config: WarmStartConfig) -> Any:
    """The retrieval server ``config.data.retriever`` when set, else ``config.data.index`` over its ``corpus``."""
    return open_run_retriever(config.data.retriever, config.data.index, config.data.corpus)


def load_teacher_llm(config: WarmStartConfig) -> Any:
    assert config.teacher.llm is not None  # WarmStartConfig requires it where the method teacher collects
    return load_backend(config.teacher.llm, **config.teacher.llm_options)


def collect(config: WarmStartConfig, examples: Sequence[QAExample], retriever: Any, tokenizer: Any = None,
            llm: Any = None, seed_offset: int = 0) -> list[dict]:
    """Trajectories of the configured teacher (unfiltered; ``accepted`` / ``reason`` set).

    ``tokenizer``: the policy's (observation caps in its tokens). ``seed_offset``: where
    ``examples`` start in the whole question list (keeps the env seeds of a chunked collection
    equal to those of one pass).
    """
    teacher, seed = config.teacher, config.run.seed
    if teacher.kind == "scripted":
        return collect_scripted(examples, retriever, config.env_config(), config.scripted_teacher(),
                                num_envs=teacher.num_envs, seed=seed, tokenizer=tokenizer, offset=seed_offset,
                                samples=teacher.samples)
    llm = llm if llm is not None else load_teacher_llm(config)
    return collect_with_method(examples, retriever, teacher.method, llm, config.env_config(),
                               teacher.method_options, concurrency=teacher.concurrency,
                               seed=seed, tokenizer=tokenizer)


def collect_until_accepted(config: WarmStartConfig, examples: Sequence[QAExample], retriever: Any,
                           tokenizer: Any = None, llm: Any = None) -> tuple[list[dict], dict]:
    """Collect question by question (in chunks of one env batch) until ``config.teacher.target_accepted``
    trajectories are accepted, or over all ``examples`` when it is None.

    Returns ``(records, progress)``: the records up to and including the target-th accepted one
    (any collected after it in the last chunk are dropped), and ``{"questions_available",
    "questions_used", "target_accepted", "target_reached", "dropped_after_target"}``.
    """
    teacher = config.teacher
    target = teacher.target_accepted
    if teacher.kind == "method" and llm is None:
        llm = load_teacher_llm(config)
    chunk = len(examples) if target is None else max(1, teacher.num_envs if teacher.kind == "scripted"
                                                    else teacher.concurrency)
    records: list[dict] = []
    used, dropped = 0, 0
    while used < len(examples) and (target is None or _accepted_count(records) < target):
        batch = list(examples[used:used + chunk])
        records += collect(config, batch, retriever, tokenizer=tokenizer, llm=llm, seed_offset=used)
        used += len(batch)
        if target is not None:
            log.info("collected %d questions: %d of %d accepted", used, _accepted_count(records), target)
    if target is not None and _accepted_count(records) >= target:
        cut = _position_of_accepted(records, target) + 1
        records, dropped = records[:cut], len(records) - cut
    reached = target is None or _accepted_count(records) >= target
    if not reached:
        print(f"[sft] target_accepted={target} not reached: the teacher's trajectories of all {len(examples)} "
              f"questions gave only {_accepted_count(records)} accepted; training goes on with those (give more "
              f"questions: data.path / data.num_questions)", flush=True)
    progress = {"questions_available": len(examples), "questions_used": used, "target_accepted": target,
                "target_reached": reached, "dropped_after_target": dropped}
    return records, progress


def _accepted_count(records: Sequence[dict]) -> int:
    return sum(1 for r in records if r["accepted"])


def _position_of_accepted(records: Sequence[dict], nth: int) -> int:
    """Index of the ``nth`` (1-based) accepted record."""
    seen = 0
    for position, record in enumerate(records):
        seen += bool(record["accepted"])
        if seen == nth:
            return position
    raise ValueError(f"fewer than {nth} accepted records")


def acceptance_stats(records: Sequence[dict]) -> dict:
    """``{"trajectories", "accepted", "acceptance_rate", "reasons": {reason: count}}``."""
    reasons: dict[str, int] = {}
    for r in records:
        reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    n, accepted = len(records), _accepted_count(records)
    return {"trajectories": n, "accepted": accepted, "acceptance_rate": accepted / n if n else 0.0,
            "reasons": reasons}


def acceptance_line(stats: dict) -> str:
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(stats["reasons"].items()))
    return (f"[sft] E.2 acceptance: {stats['accepted']} of {stats['trajectories']} trajectories accepted "
            f"(rate {stats['acceptance_rate']:.3f}; {reasons})")


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
