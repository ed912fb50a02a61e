"""DAPO's pieces (Yu et al. 2025): dynamic sampling and overlong reward shaping.

Dynamic sampling: a question whose samples all got the same reward gives
every group baseline (grpo, Dr. GRPO, rloo) a zero advantage, so it only dilutes the batch. Such
groups are dropped and the batch is refilled with the groups of more questions, up to a cap of
extra rollout rounds (``PPOConfig.dynamic_sampling``, ``dynamic_sampling_max_rounds``).

The reward compared is the one the advantage is formed from: the env reward plus the overlong
penalty. The KL term (``kl_mode: reward``) is left out, as verl's DAPO filters on a task metric:
it differs between any two samples, so with it no group would ever tie. A group whose rewards tie
is kept when ``verdict_credit`` > 0 and one of its verdicts has a reward gap of its own: that
verdict's two-way term still has a gradient (the tied episodes' own advantages are 0).

The extra questions come from a stream of their own that depends only on the update and the round
(not on how many earlier rounds were needed), so a resumed run draws the same ones and the main
question stream (``data_position``) is unchanged.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

EXTRA_STREAM_SEED = 7919  # added to the run's seed for the refill questions' own shuffled stream


def shaped_reward(episode, overlong_max_tokens: int, overlong_buffer: int) -> float:
    """The episode's reward as the advantage reads it (before the KL term): the env reward plus
    :func:`overlong_penalty` of its model tokens (what ``training.ppo_loop.ppo_score.score`` adds)."""
    if overlong_buffer <= 0:
        return float(episode.reward)
    tokens = torch.tensor([float(sum(episode.loss_mask[1:]))])
    return float(episode.reward) + float(overlong_penalty(tokens, overlong_max_tokens, overlong_buffer)[0])


def has_verdict_signal(episode) -> bool:
    """Whether any verdict of the episode has a non-zero reward gap of its own (``verdict_credit``'s
    two-way term), in the stream (``choice_reward_gap``) or judged alone (``verdict_rows``)."""
    gaps = list(getattr(episode, "choice_reward_gap", None) or ())
    gaps += [row.reward_gap for row in getattr(episode, "verdict_rows", None) or ()]
    return any(gap != 0.0 for gap in gaps)


def informative_groups(episodes: Sequence, reward_of: Callable = lambda e: e.reward,
                       own_signal: Callable = lambda e: False) -> list[list]:
    """The episodes grouped by ``group_id`` (in first-seen order), keeping the groups whose rewards
    (``reward_of``) are not all equal, or in which some episode has a signal of its own
    (``own_signal``: verdicts credited by their own term still learn when the rewards tie)."""
    groups: dict[int, list] = {}
    for episode in episodes:
        groups.setdefault(episode.group_id, []).append(episode)
    return [g for g in groups.values() if len({reward_of(e) for e in g}) > 1 or any(own_signal(e) for e in g)]


def dynamic_sample(first: list, draw: Callable[[int], list], want: int, max_rounds: int,
                   reward_of: Callable = lambda e: e.reward,
                   own_signal: Callable = lambda e: False) -> tuple[list, dict]:
    """Keep the informative groups of ``first`` (:func:`informative_groups` with ``reward_of`` and
    ``own_signal``); while fewer than ``want`` groups are kept and fewer
    than ``max_rounds`` extra rounds ran, add the informative groups of ``draw(round)`` (round 1, 2,
    ...). At most ``want`` groups are returned, renumbered 0..n−1; when none is informative the
    first batch is returned as it is (its advantages are zero: the update learns nothing, as without
    this option). Returns (episodes, stats) with stats ``groups_dropped`` (of the first batch),
    ``extra_rounds``, ``groups_kept``."""
    kept = informative_groups(first, reward_of, own_signal)
    dropped = len({e.group_id for e in first}) - len(kept)
    rounds = 0
    while len(kept) < want and rounds < max_rounds:
        rounds += 1
        kept += informative_groups(draw(rounds), reward_of, own_signal)
    kept = kept[:want]
    stats = {"groups_dropped": float(dropped), "extra_rounds": float(rounds), "groups_kept": float(len(kept))}
    if not kept:
        return first, stats
    episodes = [dataclasses.replace(e, group_id=g) for g, group in enumerate(kept) for e in group]
    return episodes, stats


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the episode reward:
        0                              if n ≤ max_tokens − buffer
        (max_tokens − buffer − n)/buffer  if max_tokens − buffer < n ≤ max_tokens   (0 down to −1)
        −1                             if n > max_tokens
    lengths: (B,) model tokens per episode -> (B,) float32.
    """
    n = lengths.to(torch.float32)
    return ((max_tokens - buffer - n) / buffer).clamp(min=-1.0, max=0.0)
