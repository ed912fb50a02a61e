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
:class:`~training.rollout_generation.TurnGenerator`: with the HF session only the new chunk is
prefilled; vLLM's prefix cache does the same). :func:`methods.seeds.judge_snapshot` renders the
same tokens in evaluation, and :func:`training.trajectories.tokenize_trajectory` in SFT.
"""
from __future__ import annotations

from typing import Any

from envs.protocol import JUDGE_WORDS, judge_chunks, judgement_action
from envs.rewards import RewardConfig, verdict_reward_gap
from methods.llm import GenerationRequest
from training.rollout_generation import end_episode, request_seed


def judging_rows(observations: list[str], rows: list[int]) -> dict[int, tuple[list[str], str]]:
    """The rows whose observation is a snapshot with candidates to judge -> (chunks, closing)."""
    out = {}
    for k in rows:
        chunks, closing = judge_chunks(observations[k])
        if chunks:
            out[k] = (chunks, closing)
    return out


def verdict_request(batch: Any, slot: Any, step: int) -> GenerationRequest:
    """One verdict token after the slot's context (sampled like a turn, its own seed)."""
    config = batch.config
    seed = request_seed(config.seed, slot.index, 1000 * (slot.turn + 1) + step)
    return GenerationRequest(list(slot.ids), stop=(), max_tokens=1, temperature=config.temperature,
                             top_p=config.top_p, top_k=config.top_k, seed=seed,
                             allowed_token_ids=batch.verdict_ids)


def judge_snapshots(batch: Any, slots: list, pending: dict[int, tuple[list[str], str]]) -> dict[int, str]:
    """Lay out the interleaved snapshots of ``pending`` rows with their sampled verdicts;
    returns row -> the expand action for the env (rows that ran out of context are ended)."""
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


def record_judgement(slot: Any, info: dict) -> None:
    """After the env's step on a judgement: keep its verdicts (token position, opened) with the
    search they judged when the env accepted the expand; a refused one opened nothing."""
    verdicts, slot.pending_verdicts = slot.pending_verdicts, []
    if info.get("action") == "expand" and verdicts:
        slot.judgements.append((int(info["n_searches"]) - 1, verdicts))


def verdict_reward_gaps(slot: Any, num_tokens: int, config: RewardConfig) -> list[float]:
    """Per token of the episode: at each accepted verdict, :func:`envs.rewards.verdict_reward_gap`
    of its candidate (labels from the episode's search records, answer correctness from its end);
    0 elsewhere. Empty when the episode judged nothing (``Episode.choice_reward_gap``)."""
    searches = slot.info.get("searches", [])
    if not slot.judgements or not searches:
        return []
    correct = slot.info.get("metrics", {}).get("em", 0.0) == 1.0  # as Episode.reward_breakdown decides
    gaps = [0.0] * num_tokens
    for search_index, verdicts in slot.judgements:
        positive = searches[search_index]["positive"]
        for i, (position, opened) in enumerate(verdicts[:len(positive)]):
            gaps[position] = verdict_reward_gap(opened, positive[i], correct, config)
    return gaps
