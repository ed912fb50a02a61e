"""SEEDS-R1 trajectories for the SFT warm start: teachers, the acceptance filter, the split, and
the exact token layout shared with :mod:`training.rollouts.rollout`.

Trajectory record (``trajectories.jsonl``)::

    {"id", "question", "golden_answers", "example": QAExample.to_dict(), "teacher",
     "segments": [{"role": "prompt" | "model" | "observation", "text"}, ...],
     "text": prompt + model texts + "\\n" + observation + "\\n" ... (the decoded layout, no EOS),
     "ended_with_answer": bool, "summary": the env's episode summary, "accepted", "reason"}

- the *scripted teacher* lives in :mod:`training.teachers.scripted_teacher` (no LLM; queries and answers
  only from what it was shown and opened);
- the *method teacher* (:func:`collect_with_method`): ``seeds-react`` or ``seeds-r1`` behind any
  backend, its env traces rewritten as SEEDS-R1 trajectories;
- :func:`acceptance` (SEEDS-R1 E.2) and :func:`split_train_dev` (seeded, by question id);
- :func:`tokenize_trajectory` / :func:`sft_rows`: ``input_ids`` + loss mask / labels.
"""
from __future__ import annotations

import functools
import logging
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

import methods.base
from envs.config import EnvConfig
from envs.data import example_from_record
from envs.metrics import answer_bearing
from envs.protocol import (
    JUDGE_WORDS,
    LIST_FORM,
    AnswerAction,
    ExpandAction,
    JudgeForm,
    SearchAction,
    judge_alone_prompts,
    judge_chunks,
    parse_action,
    snapshot_candidates,
)
from envs.search_env import SearchEnv
from envs.types import QAExample
from inference.backends import load_backend
from methods.runner import run_questions_sync
from methods.seeds import SeedsR1
from methods.thinking import split_thinking
from training.sft_sections import VERDICT_LABELS

PROTOCOL_METHODS = ("seeds-r1", "seeds-react")  # methods whose env actions are the SEEDS-R1 protocol
ROLES = ("prompt", "model", "observation")
_JUDGED_EXPAND = re.compile(r"(.*?</snapshot>)\n(<expand>[^\n]*?</expand>)(?:\n(.*))?", re.DOTALL)

log = logging.getLogger("training.teachers.trajectories")


def make_record(example: QAExample, teacher: str, prompt: str, turns: list[tuple[str, str]], summary: dict,
            ended_with_answer: bool) -> dict:
    """A trajectory record; ``turns`` are ``(role, text)`` after the prompt."""
    segments = [{"role": "prompt", "text": prompt}] + [{"role": r, "text": t} for r, t in turns]
    record = {
        "id": example.id,
        "question": example.question,
        "golden_answers": list(example.golden_answers),
        "example": example.to_dict(),
        "teacher": teacher,
        "segments": segments,
        "text": trajectory_text(segments),
        "ended_with_answer": ended_with_answer,
        "summary": summary,
    }
    accepted, reason = acceptance(record)
    record.update(accepted=accepted, reason=reason)
    return record


def trajectory_text(segments: Sequence[dict]) -> str:
    """The decoded layout: prompt, model texts, observations wrapped in ``"\\n"`` (no EOS)."""
    return "".join(f"\n{s['text']}\n" if s["role"] == "observation" else s["text"] for s in segments)


def example_of(record: dict) -> QAExample:
    return example_from_record(record["example"], record["id"])


def seeds_r1_prompt_fn(env_config: EnvConfig | None = None) -> Callable[[str], str]:
    """The SEEDS-R1 prompt stating ``env_config``'s limits and expand form: the one the PPO trainer
    and the SFT warm start prompt the policy with in that env."""
    return functools.partial(SeedsR1.prompt, env=env_config or EnvConfig())


def seeds_r1_prompt(question: str, env_config: EnvConfig | None = None) -> str:
    return seeds_r1_prompt_fn(env_config)(question)


# ================================================================================ acceptance

def acceptance(record: dict) -> tuple[bool, str]:
    """SEEDS-R1 E.2: protocol followed AND (EM == 1 OR a gold answer was observed).

    Reasons: ``"correct"`` / ``"gold_observed"`` (accepted); ``"invalid_action"``,
    ``"search_without_expand"``, ``"no_answer"``, ``"wrong_answer"`` (rejected).
    """
    summary = record.get("summary") or {}
    segments = record["segments"]
    actions = [parse_action(s["text"]) for s in segments if s["role"] == "model"]
    if summary.get("n_invalid", 0) > 0 or any(not isinstance(a, (SearchAction, ExpandAction, AnswerAction))
                                              for a in actions):
        return False, "invalid_action"
    for i, action in enumerate(actions):
        if isinstance(action, SearchAction) and not (i + 1 < len(actions) and isinstance(actions[i + 1], ExpandAction)):
            return False, "search_without_expand"
    if not actions or not isinstance(actions[-1], AnswerAction) or summary.get("answer") is None \
            or not record.get("ended_with_answer", True):
        return False, "no_answer"
    if float((summary.get("metrics") or {}).get("em", 0.0)) == 1.0:
        return True, "correct"
    golds = record["golden_answers"]
    if any(answer_bearing(s["text"], golds) for s in segments if s["role"] == "observation"):
        return True, "gold_observed"
    return False, "wrong_answer"


def split_train_dev(records: Sequence[dict], dev_fraction: float = 0.1, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Seeded split by question id: every record of a question lands on the same side.

    ``dev`` gets ``round(dev_fraction * questions)`` questions (at least one when
    ``dev_fraction > 0`` and there are two or more questions).
    """
    ids = sorted({r["id"] for r in records})
    random.Random(seed).shuffle(ids)
    n_dev = round(dev_fraction * len(ids))
    if dev_fraction > 0 and n_dev == 0 and len(ids) >= 2:
        n_dev = 1
    dev_ids = set(ids[:n_dev])
    return [r for r in records if r["id"] not in dev_ids], [r for r in records if r["id"] in dev_ids]


# ================================================================================ replay

def play_actions(example: QAExample, model_texts: Sequence[str], retriever: Any, env_config: EnvConfig | None = None,
                 teacher: str = "replay", seed: int = 0, tokenizer: Any | None = None) -> dict:
    """The trajectory record of fixed model turns played in a fresh :class:`SearchEnv` (stops when
    the env ends the episode; turns left over are ignored). For hand-written demonstrations and tests.
    ``tokenizer``: the policy's, so observation caps count its tokens (None: words)."""
    env_config = env_config or EnvConfig()
    env = SearchEnv(retriever, None, env_config, tokenizer=tokenizer)
    env.reset(seed=seed, options={"example": example})
    turns: list[tuple[str, str]] = []
    summary, answered = None, False
    for text in model_texts:
        observation, _, terminated, truncated, info = env.step(text)
        turns.append(("model", text))
        if terminated or truncated:
            summary, answered = info["episode"], bool(terminated)
            break
        turns.append(("observation", observation))
    if summary is None:
        summary = env.summary()
    return make_record(example, teacher, seeds_r1_prompt(example.question, env_config), turns, summary, answered)


# ================================================================================ method teacher

def method_teacher(name: str, options: dict | None = None):
    """The registered method ``name`` with ``options``; it runs in the SEEDS-R1 env it teaches
    (:func:`collect_with_method` fits the method to that env: the env's limits, the method's protocol)."""
    if name not in PROTOCOL_METHODS:
        raise ValueError(f"method {name!r} cannot teach SEEDS-R1: its env actions are not the SEEDS-R1 protocol "
                         f"(search -> snapshot -> expand -> answer); use one of {PROTOCOL_METHODS}")
    method_options, limits = methods.base.split_env_limits(name, options or {})
    if limits:
        raise ValueError(f"teacher.method_options {sorted(limits)} are env limits: the teacher runs in the SEEDS-R1 "
                         "env being taught (set them in the env section)")
    return methods.base.get(name, **method_options)


def record_from_method(result: dict, example: QAExample, teacher: str, env_config: EnvConfig | None = None) -> dict:
    """A runner prediction record (with its trace) as a SEEDS-R1 trajectory.

    Each env step becomes one model segment and (unless it ended the episode) one observation.
    The model segment is the LLM turn that produced the action (its reasoning included) when
    the step followed one; a step the method made itself (a forced ``<expand>none</expand>``,
    a cleaned forced answer) appears as the action text. The prompt is the SEEDS-R1 prompt of
    ``env_config`` (the env the teacher ran in).
    """
    turns: list[tuple[str, str]] = []
    last_output: str | None = None
    finished_with_answer = False
    for event in result.get("trace", []):
        if event.get("type") == "llm":
            last_output = event.get("output") if event.get("tag") == "turn" else None
        elif event.get("type") == "env":
            text = event["action"]
            if last_output is not None and split_thinking(last_output).visible == text:
                text = last_output  # the whole turn (a leading <think> block included): the action is what it said
            last_output = None
            turns.append(("model", text))
            if event.get("kind") == "answer":
                finished_with_answer = True
                break
            turns.append(("observation", event["observation"]))
    summary = {
        "example_id": result["id"], "question": result["question"], "golden_answers": result["golden_answers"],
        "answer": result.get("prediction"), "metrics": result.get("metrics", {}),
        "n_searches": result.get("n_searches", 0), "n_invalid": result.get("n_invalid", 0),
        "docs_read": result.get("docs_read", 0), "positives_opened": result.get("positives_opened", 0),
        "negatives_opened": result.get("negatives_opened", 0), "positives_shown": result.get("positives_shown", 0),
        "searches": result.get("searches", []), "finish_reason": result.get("finish_reason"),
    }
    if turns and turns[-1][0] == "observation":  # the env ended the episode without an answer
        turns.pop()
    return make_record(example, teacher, seeds_r1_prompt(example.question, env_config), turns, summary,
                   finished_with_answer)


def collect_with_method(examples: Sequence[QAExample], retriever: Any, method: str, llm: Any,
                        env_config: EnvConfig | None = None, method_options: dict | None = None,
                        concurrency: int = 32, seed: int = 0, tokenizer: Any | None = None) -> list[dict]:
    """Run ``method`` (an instance is built from its name) with backend ``llm`` (an ``LLMBackend`` or a
    spec) over ``examples`` through :mod:`methods.runner`, and convert every record.

    ``tokenizer``: the POLICY's tokenizer; the env counts observation caps in its tokens (not the
    teacher's), so the observations are the ones the policy will see.
    """
    teacher = method_teacher(method, method_options)
    if isinstance(llm, str):
        llm = load_backend(llm)
    base = env_config or EnvConfig()
    results = run_questions_sync(teacher, examples, llm, retriever, base, concurrency=concurrency, seed=seed,
                                 env_tokenizer=tokenizer)
    ran_in = teacher.fit_env(base)
    return [record_from_method(r, ex, f"method:{method}", ran_in) for r, ex in zip(results, examples)]


# ================================================================================ token layout

def tokenize_trajectory(record: dict, tokenizer: Any, form: JudgeForm = LIST_FORM,
                        train_verdicts: bool = True) -> dict[str, list[int]]:
    """``input_ids`` and ``loss_mask`` exactly as :func:`training.rollouts.rollout.collect_rollouts` lays
    out the same episode (the EOS after an accepted final answer is a trained token), in the env's
    judge ``form`` (:class:`envs.protocol.JudgeForm`). In the stream form a snapshot followed by its
    judgement expand is rendered interleaved (:func:`envs.protocol.judge_chunks`): each candidate,
    then its one-token verdict (trained). Judged alone, the verdicts are made outside the stream:
    the snapshot is an observation and the judgement expand after it is text the model did not
    write (mask 0), so the teacher's choices are shown, never imitated."""
    ids: list[int] = []
    mask: list[int] = []
    segments = record["segments"]
    skip = False
    for k, segment in enumerate(segments):
        role, text = segment["role"], segment["text"]
        if skip:
            skip = False
            continue
        if role == "prompt":
            piece, bits = list(tokenizer(text, add_special_tokens=True)["input_ids"]), None
            bit = 0
        elif role == "model":
            piece, bit, bits = list(tokenizer(text, add_special_tokens=False)["input_ids"]), 1, None
            if form.alone and k and _judged_verdicts(segments[k - 1]["text"], segment):
                bit = 0  # the expand the verdicts judged alone make: shown to the model, not written by it
        elif role == "observation":
            verdicts = _judged_verdicts(text, segments[k + 1] if k + 1 < len(segments) else None) \
                if form.in_stream else None
            if verdicts:
                piece, bits = _interleaved(text, verdicts, tokenizer, train_verdicts)
                skip = True  # the expand's text is the verdicts, already laid out
            else:
                piece, bit, bits = list(tokenizer("\n" + text + "\n", add_special_tokens=False)["input_ids"]), 0, None
        else:
            raise ValueError(f"unknown segment role {role!r}")
        ids += piece
        mask += bits if bits is not None else [bit] * len(piece)
    model_segments = [s for s in segments if s["role"] == "model"]
    if record.get("ended_with_answer", True) and model_segments and model_segments[-1]["text"].rstrip().endswith(
            "</answer>"):
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no EOS token")
        ids.append(tokenizer.eos_token_id)
        mask.append(1)
    return {"input_ids": ids, "loss_mask": mask}


def _judged_verdicts(observation: str, following: dict | None) -> list[str] | None:
    """The verdict words of a snapshot whose next segment is a complete judgement expand, else None."""
    n = len(snapshot_candidates(observation))
    if not n or following is None or following["role"] != "model":
        return None
    action = parse_action(following["text"])
    if not isinstance(action, ExpandAction) or action.judged != tuple(range(1, n + 1)):
        return None
    return [JUDGE_WORDS[0] if i in action.ids else JUDGE_WORDS[1] for i in range(1, n + 1)]


def _interleaved(observation: str, verdicts: list[str], tokenizer: Any,
                 train_verdicts: bool = True) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of a snapshot rendered with its verdicts (verdict tokens trained
    unless ``train_verdicts`` is False: then the teacher's choices are shown, not imitated)."""
    chunks, closing = judge_chunks(observation)
    ids: list[int] = []
    mask: list[int] = []
    for chunk, verdict in zip(chunks, verdicts):
        chunk_ids = list(tokenizer(chunk, add_special_tokens=False)["input_ids"])
        verdict_ids = list(tokenizer(verdict, add_special_tokens=False)["input_ids"])
        ids += chunk_ids + verdict_ids
        mask += [0] * len(chunk_ids) + [int(train_verdicts)] * len(verdict_ids)
    closing_ids = list(tokenizer(closing, add_special_tokens=False)["input_ids"])
    return ids + closing_ids, mask + [0] * len(closing_ids)


def trajectory_from_episode(episode: Any, tokenizer: Any, example: QAExample, teacher: str = "policy") -> dict:
    """A rollout :class:`training.rollouts.rollout.Episode` as a trajectory record (segments decoded from its
    mask runs), e.g. to keep a policy's own accepted episodes for further SFT."""
    eos = tokenizer.eos_token_id
    ids, mask = list(episode.token_ids), list(episode.loss_mask)
    ended = bool(ids) and ids[-1] == eos and mask[-1] == 1 and episode.finish_reason == "answer"
    if ended:
        ids, mask = ids[:-1], mask[:-1]
    segments = [{"role": "prompt", "text": tokenizer.decode(ids[:episode.prompt_length], skip_special_tokens=True)}]
    start = episode.prompt_length
    for t in range(start + 1, len(ids) + 1):
        if t == len(ids) or mask[t] != mask[start]:
            text = tokenizer.decode(ids[start:t], skip_special_tokens=False)
            if mask[start]:
                segments.append({"role": "model", "text": text})
            else:
                segments.append({"role": "observation", "text": text[1:-1] if text.startswith("\n") and
                                 text.endswith("\n") else text})
            start = t
    if getattr(episode, "verdict_rows", None):  # judge_context "alone": the judgement expand is in an observation run
        segments = [part for segment in segments for part in _judged_expand_as_action(segment)]
    record = {"id": example.id, "question": example.question, "golden_answers": list(example.golden_answers),
              "example": example.to_dict(), "teacher": teacher, "segments": segments,
              "text": trajectory_text(segments), "ended_with_answer": ended, "summary": dict(episode.info)}
    record["accepted"], record["reason"] = acceptance(record)
    return record


def _judged_expand_as_action(segment: dict) -> list[dict]:
    """An observation run of an episode judged alone, ``<snapshot>…</snapshot>`` + ``\n<expand>…</expand>``
    + ``\n…`` (the expand its verdicts made, mask 0 like the observations around it), as the record
    of a teacher writes it: snapshot, the expand as a model action, what followed. Other segments as
    they are. :func:`tokenize_trajectory` in the alone form lays them out as before."""
    match = _JUDGED_EXPAND.fullmatch(segment["text"]) if segment["role"] == "observation" else None
    if match is None:
        return [segment]
    snapshot, action, rest = match.groups()
    parts = [{"role": "observation", "text": snapshot}, {"role": "model", "text": action}]
    return parts + ([{"role": "observation", "text": rest}] if rest else [])


def sft_rows(records: Sequence[dict], tokenizer: Any, max_length: int | None = None,
             form: JudgeForm = LIST_FORM, train_verdicts: bool = True, verdict_labels: str = "teacher") -> list[dict]:
    """Trainer rows ``{"input_ids", "labels"}`` (labels -100 where the mask is 0); longer ones dropped.
    Judged alone with ``train_verdicts``, each record's verdict rows (:func:`alone_verdict_rows`,
    labelled as ``verdict_labels`` says) follow it."""
    rows = []
    for record in records:
        layout = tokenize_trajectory(record, tokenizer, form, train_verdicts)
        if max_length is not None and len(layout["input_ids"]) > max_length:
            log.warning("dropping trajectory %s: %d tokens > max_length %d", record["id"], len(layout["input_ids"]),
                        max_length)
            continue
        labels = [t if m else -100 for t, m in zip(layout["input_ids"], layout["loss_mask"])]
        rows.append({"input_ids": layout["input_ids"], "labels": labels})
        if form.alone and train_verdicts:
            rows += alone_verdict_rows(record, tokenizer, verdict_labels)
    return rows


def alone_verdict_rows(record: dict, tokenizer: Any, labels: str = "teacher") -> list[dict]:
    """One row per verdict of a record judged alone: the candidate's own context
    (:func:`envs.protocol.judge_alone_prompts`, tokenized as :func:`training.rollouts.rollout_judge.judge_alone`
    does) and then the teacher's verdict token, the only label; with ``labels="both"`` two rows per
    candidate instead, its context with each verdict word of :data:`envs.protocol.JUDGE_WORDS`
    (whatever the teacher chose). Snapshots without a complete judgement expand after them give none."""
    if labels not in VERDICT_LABELS:
        raise ValueError(f"labels must be one of {VERDICT_LABELS}, not {labels!r}")
    rows = []
    segments = record["segments"]
    for k, segment in enumerate(segments[:-1]):
        verdicts = _judged_verdicts(segment["text"], segments[k + 1]) if segment["role"] == "observation" else None
        for context, verdict in zip(judge_alone_prompts(record["question"], segment["text"]) if verdicts else (),
                                    verdicts or ()):
            context_ids = list(tokenizer(context, add_special_tokens=True)["input_ids"])
            for word in (verdict,) if labels == "teacher" else JUDGE_WORDS:
                verdict_ids = list(tokenizer(word, add_special_tokens=False)["input_ids"])
                rows.append({"input_ids": context_ids + verdict_ids,
                             "labels": [-100] * len(context_ids) + verdict_ids})
    return rows


# ================================================================================ dev evaluation
