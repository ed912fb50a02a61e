"""The judgement form of the expand action in rollouts (``EnvConfig.expand_form = "judge"``).

After a snapshot the episode's token stream is the interleaved rendering of
:func:`envs.protocol.judge_chunks`: candidate 1 and its question (prompt tokens, loss mask 0),
the policy's ONE verdict token (generated with ``max_tokens=1``: a model token with its log-prob;
with ``RolloutConfig.constrain_verdicts`` it is drawn among the yes/no tokens only, its log-prob
renormalised over them, and the episode's ``choice_mask`` marks it so the trainer scores it the same way),
candidate 2 and its question, its verdict, ..., then the closing text. The verdict words become
the env's expand action (:func:`envs.protocol.judgement_action`); a word other than yes/no is an
invalid action the env refuses and scores. Each verdict sits right after the preview it is about,
so the decision is made where the model has just read the candidate.

All live episodes of a batch judge their i-th candidate in one generation call (the rollout's
:class:`~training.rollouts.rollout_generation.TurnGenerator`: with the HF session only the new chunk is
prefilled; vLLM's prefix cache does the same). :func:`methods.seeds.judge_snapshot` renders the
same tokens in evaluation, and :func:`training.teachers.trajectories.tokenize_trajectory` in SFT.

With ``EnvConfig.judge_context = "alone"`` each candidate is judged in a short context of its own
(:func:`envs.protocol.judge_alone_prompts`: the candidate, then the question), all candidates of
all live episodes in ONE generation call (each a session row of its own, released after); each
becomes a :class:`VerdictRow` of the episode (its context and verdict token, a row of its own in
the trainer's batch; with a recorder, its frozen-layer states too). The episode's
stream shows the snapshot as an observation and then the expand those verdicts make, as text the
model did not write (loss mask 0). :func:`methods.seeds.judge_alone_snapshot` does the same in
evaluation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from envs.protocol import (
    JUDGE_WORDS,
    VERDICT_CUTS,
    cut_verdicts,
    judge_alone_prompts,
    judge_chunks,
    judgement_action,
    snapshot_candidates,
    yes_prob,
)
from envs.rewards import RewardConfig, verdict_reward_gap
from methods.llm import GenerationRequest
from training.rollouts.rollout_generation import end_episode, request_seed


@dataclass
class VerdictRow:
    """One verdict judged in a context of its own (``judge_context: alone``): ``token_ids`` is the
    context and then the verdict token (the only model token), ``logprob`` its sampler log-prob
    (over the yes/no choices when constrained), ``reward_gap`` its candidate's
    :func:`envs.rewards.verdict_reward_gap` (the trainer's ``verdict_credit``)."""

    token_ids: list[int]
    logprob: float
    reward_gap: float = 0.0
    positive: bool | None = None  # its candidate's label, once the env accepted the judgement (None: not counted)
    frozen_states: Any = None  # (n, H) tensor: the rollout's states after the frozen layers (rollout_states.py)


def judging_rows(observations: list[str], rows: list[int]) -> dict[int, str]:
    """The rows whose observation is a snapshot with candidates to judge -> that observation."""
    return {k: observations[k] for k in rows if snapshot_candidates(observations[k])}


def verdict_request(batch: Any, slot: Any, step: int) -> GenerationRequest:
    """One verdict token after the slot's context (sampled like a turn, its own seed)."""
    config = batch.config
    seed = request_seed(config.seed, slot.index, 1000 * (slot.turn + 1) + step)
    return GenerationRequest(list(slot.ids), stop=(), max_tokens=1, temperature=config.temperature,
                             top_p=config.top_p, top_k=config.top_k, seed=seed,
                             allowed_token_ids=batch.verdict_ids)


def judge_snapshots(batch: Any, slots: list, pending: dict[int, str]) -> dict[int, str]:
    """The verdicts of the snapshots of ``pending`` rows (row -> snapshot observation) in the env's
    judge form (:class:`envs.protocol.JudgeForm`); returns row -> the expand action for the env
    (rows that ran out of context are ended)."""
    if batch.venv.config.judge_form.alone:
        return judge_alone(batch, slots, pending)
    if batch.config.verdict_cut != "level":
        raise ValueError(f"verdict_cut {batch.config.verdict_cut!r} cuts verdicts judged alone "
                         "(env judge_context: alone); in the stream each verdict is drawn before the next is shown")
    return judge_in_stream(batch, slots, {k: judge_chunks(obs) for k, obs in pending.items()})


def judge_in_stream(batch: Any, slots: list, pending: dict[int, tuple[list[str], str]]) -> dict[int, str]:
    """Lay out the interleaved snapshots of ``pending`` rows (row -> chunks, closing) with their
    sampled verdicts; returns row -> the expand action for the env."""
    words: dict[int, list[str]] = {k: [] for k in pending}
    longest = max(len(chunks) for chunks, _ in pending.values())
    for step in range(longest):
        rows = [k for k, (chunks, _) in pending.items() if step < len(chunks) and not slots[k].done]
        rows = [k for k in rows if batch.append_prompt_text(slots[k], k, [pending[k][0][step]], room=2)]
        if not rows:
            continue
        results = batch.generator.generate([verdict_request(batch, slots[k], step) for k in rows], rows)
        for k, result in zip(rows, results):
            completion, slot = result.completions[0], slots[k]
            if completion.finish_reason == "error":
                end_episode(batch.venv, slot, k, reason="error")
                slot.info["error"] = completion.error
                continue
            slot.append(completion.token_ids, 1, [float(x) for x in completion.logprobs],
                        choice=bool(batch.verdict_ids))
            words[k].append(batch.tokenizer.decode(completion.token_ids))
            slot.pending_verdicts.append((len(slot.ids) - 1, words[k][-1].strip().lower() == JUDGE_WORDS[0].strip()))
    actions = {}
    for k, (_, closing) in pending.items():
        if slots[k].done or not batch.append_prompt_text(slots[k], k, [closing]):
            continue
        actions[k] = judgement_action(words[k])
    return actions


def judge_alone(batch: Any, slots: list, pending: dict[int, str]) -> dict[int, str]:
    """Each candidate of each ``pending`` snapshot (already in the episode's stream) judged in its
    own context, all in one generation call; the expand each row's verdicts make is appended to its
    stream as text the model did not write. Returns row -> that expand action."""
    config, tokenizer = batch.config, batch.tokenizer
    requests, owners, keys = [], [], []
    prompts: list[list[int]] = []  # requests[j]'s token ids
    for k, observation in pending.items():
        slot = slots[k]
        for i, text in enumerate(judge_alone_prompts(slot.example.question, observation)):
            ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
            seed = request_seed(config.seed, slot.index, 1000 * (slot.turn + 1) + i)
            requests.append(GenerationRequest(ids, stop=(), max_tokens=1, temperature=config.temperature,
                                              top_p=config.top_p, top_k=config.top_k, seed=seed,
                                              allowed_token_ids=batch.verdict_ids))
            owners.append(k)
            prompts.append(ids)
            keys.append(("verdict", k, slot.turn, i))  # a session row of its own, released below
    results = batch.generator.generate(requests, keys) if requests else []
    words: dict[int, list[str]] = {k: [] for k in pending}
    for k, key, ids, result in zip(owners, keys, prompts, results):
        completion, slot = result.completions[0], slots[k]
        if slot.done:
            continue
        if completion.finish_reason == "error" or len(completion.token_ids) != 1:
            end_episode(batch.venv, slot, k, reason="error")
            slot.info["error"] = completion.error or "the verdict was not one token"
            continue
        slot.verdict_rows.append(VerdictRow(ids + list(completion.token_ids), float(completion.logprobs[0]),
                                            frozen_states=batch.generator.frozen_states(key, len(ids) + 1)))
        words[k].append(tokenizer.decode(completion.token_ids))
        opened = words[k][-1].strip().lower() == JUDGE_WORDS[0].strip()
        slot.pending_verdicts.append((len(slot.verdict_rows) - 1, opened))
    batch.generator.release(keys)
    if config.verdict_cut != "level":
        for k in words:
            if not slots[k].done:
                words[k] = recut_verdicts(slots[k], batch.verdict_ids, config.verdict_cut)
    actions = {}
    for k, chosen in words.items():
        action = judgement_action(chosen)
        if not slots[k].done and batch.append_prompt_text(slots[k], k, [action]):
            actions[k] = action
    return actions


def check_verdict_cut(cut: str, temperature: float, constrained: bool) -> None:
    """A rollout's ``verdict_cut`` (:data:`envs.protocol.VERDICT_CUTS`): a cut other than the level re-decides
    greedy verdicts constrained to yes/no; raises ValueError otherwise."""
    if cut not in VERDICT_CUTS:
        raise ValueError(f"verdict_cut must be one of {', '.join(VERDICT_CUTS)}, not {cut!r}")
    if cut != "level" and (temperature > 0 or not constrained):
        raise ValueError(f"verdict_cut {cut!r} cuts greedy, constrained verdicts: it needs temperature 0 and "
                         "constrain_verdicts (sampled verdicts are drawn, not cut)")


def recut_verdicts(slot: Any, choice_ids: tuple[int, ...], cut: str) -> list[str]:
    """Greedy verdicts of the slot's latest snapshot (its ``pending_verdicts``, rows judged alone) re-decided
    by :func:`envs.protocol.cut_verdicts` from their π(yes) over the two choices (``choice_ids``: yes, no);
    each row's verdict token and log-prob become the chosen choice's. Returns the words, in order."""
    yes_id, no_id = choice_ids
    rows = [slot.verdict_rows[where] for where, _ in slot.pending_verdicts]
    yes_probs = [yes_prob(r.logprob, r.token_ids[-1] == yes_id) for r in rows]
    opened = cut_verdicts(yes_probs, [is_open for _, is_open in slot.pending_verdicts], cut)
    for row, p, is_open in zip(rows, yes_probs, opened):
        row.token_ids[-1] = yes_id if is_open else no_id
        row.logprob = math.log(max(p if is_open else 1.0 - p, 1e-30))
    slot.pending_verdicts = [(where, is_open) for (where, _), is_open in zip(slot.pending_verdicts, opened)]
    return [JUDGE_WORDS[0] if is_open else JUDGE_WORDS[1] for is_open in opened]


def record_judgement(slot: Any, info: dict) -> None:
    """After the env's step on a judgement: keep its verdicts (token position, opened) with the
    search they judged when the env accepted the expand; a refused one opened nothing."""
    verdicts, slot.pending_verdicts = slot.pending_verdicts, []
    if info.get("action") == "expand" and verdicts:
        slot.judgements.append((int(info["n_searches"]) - 1, verdicts))


def judged_gaps(slot: Any, config: RewardConfig) -> list[tuple[int, float, bool]]:
    """(where, gap, positive) for each accepted verdict: :func:`envs.rewards.verdict_reward_gap` of
    its candidate (labels from the episode's search records, answer correctness from its end) and
    that label; where is the verdict's token position in the stream, or its index in
    ``slot.verdict_rows`` (alone)."""
    searches = slot.info.get("searches", [])
    if not slot.judgements or not searches:
        return []
    correct = slot.info.get("metrics", {}).get("em", 0.0) == 1.0  # as Episode.reward_breakdown decides
    out = []
    for search_index, verdicts in slot.judgements:
        positive = searches[search_index]["positive"]
        for i, (where, opened) in enumerate(verdicts[:len(positive)]):
            out.append((where, verdict_reward_gap(opened, positive[i], correct, config), bool(positive[i])))
    return out


def verdict_reward_gaps(slot: Any, num_tokens: int, config: RewardConfig) -> list[float]:
    """Per token of the episode: at each accepted in-stream verdict its candidate's reward gap
    (:func:`judged_gaps`), 0 elsewhere; alone, each :class:`VerdictRow` gets its gap instead.
    Empty when no verdict of the stream counts (``Episode.choice_reward_gap``)."""
    gaps = judged_gaps(slot, config)
    if slot.verdict_rows:
        for where, gap, positive in gaps:
            slot.verdict_rows[where].reward_gap, slot.verdict_rows[where].positive = gap, positive
        return []
    if not gaps:
        return []
    out = [0.0] * num_tokens
    for where, gap, _ in gaps:
        out[where] = gap
    return out
