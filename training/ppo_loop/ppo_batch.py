"""Episodes as padded tensors, and the row selections the update cuts from them.

Shapes: ``input_ids``/``attention_mask`` (B, T); every per-token tensor is (B, T−1) and
position ``t`` is about token ``t+1`` (the log-prob at ``t`` predicts token ``t+1``, so
``model_mask[:, t] = loss_mask[t+1]``); ``reward``/``group_id``/``owner`` (B,).

Rows: the episodes first (``owner`` −1), then the verdicts they judged in contexts of their own
(``judge_context: alone``, :class:`training.rollouts.rollout_judge.VerdictRow`; ``owner`` = the episode's
row), each a short row whose one model token is its verdict.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from training.algorithm.answer_credit import answer_term, answer_turn_mask
from training.models.prefix_tree import prefix_trees, row_tokens, tree_length


@dataclass
class VerdictTrainingRow:
    """A verdict judged alone, shaped like an episode for :func:`episodes_to_batch`: per-token lists
    (length n), the one model token last; its episode's reward and group."""

    token_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]
    choice_mask: list[int]
    choice_reward_gap: list[float]
    reward: float
    group_id: int


def verdict_rows_as_episodes(episodes: list) -> tuple[list[VerdictTrainingRow], list[int]]:
    """The episodes' :class:`~training.rollouts.rollout_judge.VerdictRow` s as episode-shaped rows (loss and
    choice mask on the verdict token, its reward gap there; the episode's reward and group), and
    each one's owner (index into ``episodes``)."""
    rows, owners = [], []
    for index, e in enumerate(episodes):
        for v in getattr(e, "verdict_rows", None) or ():
            n = len(v.token_ids)
            rows.append(VerdictTrainingRow(
                token_ids=list(v.token_ids), loss_mask=[0] * (n - 1) + [1],
                sampler_logprobs=[0.0] * (n - 1) + [v.logprob], choice_mask=[0] * (n - 1) + [1],
                choice_reward_gap=[0.0] * (n - 1) + [v.reward_gap], reward=e.reward, group_id=e.group_id))
            owners.append(index)
    return rows, owners


def episodes_to_batch(episodes: list, pad_id: int, device: Any) -> dict[str, torch.Tensor]:
    """Right-padded tensors. input_ids/attention_mask (B, T); per-token tensors (B, T−1), where
    position t is about token t+1 (the log-prob at t predicts token t+1); reward/group_id/owner (B,):
    the episodes' rows, then their verdict rows (:func:`verdict_rows_as_episodes`). ``answer_mask``
    (B, T−1) marks the answering turn's model tokens and ``answer_reward`` (B,) is the reward's answer
    term (:mod:`training.algorithm.answer_credit`), both 0 on verdict rows."""
    verdicts, owners = verdict_rows_as_episodes(episodes)
    owner = [-1] * len(episodes) + owners
    episodes = list(episodes) + verdicts
    width = max(len(e.token_ids) for e in episodes)
    B = len(episodes)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    attention = torch.zeros((B, width), dtype=torch.long)
    loss_mask = torch.zeros((B, width), dtype=torch.float32)
    sampler = torch.zeros((B, width), dtype=torch.float32)
    choice = torch.zeros((B, width), dtype=torch.float32)
    gap = torch.zeros((B, width), dtype=torch.float32)
    answer = torch.zeros((B, width), dtype=torch.float32)
    for i, e in enumerate(episodes):
        n = len(e.token_ids)
        ids[i, :n] = torch.tensor(e.token_ids)
        attention[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(e.loss_mask, dtype=torch.float32)
        sampler[i, :n] = torch.tensor(e.sampler_logprobs, dtype=torch.float32)
        if e.choice_mask:
            choice[i, :n] = torch.tensor(e.choice_mask, dtype=torch.float32)
        if e.choice_reward_gap:
            gap[i, :n] = torch.tensor(e.choice_reward_gap, dtype=torch.float32)
        answer[i, :n] = torch.tensor(answer_turn_mask(e), dtype=torch.float32)
    batch = {"input_ids": ids, "attention_mask": attention, "model_mask": loss_mask[:, 1:],
             "sampler_logp": sampler[:, 1:], "choice_mask": choice[:, 1:],
             "choice_reward_gap": gap[:, 1:], "answer_mask": answer[:, 1:],
             "reward": torch.tensor([e.reward for e in episodes]),
             "answer_reward": torch.tensor([answer_term(e) for e in episodes], dtype=torch.float32),
             "group_id": torch.tensor([e.group_id for e in episodes]), "owner": torch.tensor(owner)}
    return {k: v.to(device) for k, v in batch.items()}


def micro_batches(rows: torch.Tensor, lengths: torch.Tensor, size: int, tokens: int = 0) -> list[torch.Tensor]:
    """A mini-batch's ``rows`` (sorted by length) cut into micro-batches: ``size`` rows each, or with
    ``tokens > 0`` as many rows as fit ``tokens`` padded positions (their count × the longest one's
    length; a row longer than that alone). rows: (n,) indices; lengths: (n,) their lengths."""
    if tokens <= 0:
        return list(rows.split(size))
    cuts, count, longest = [], 0, 0
    for i, length in enumerate(lengths.tolist()):
        if count and (count + 1) * max(longest, length) > tokens:
            cuts.append(i)
            count, longest = 0, 0
        count, longest = count + 1, max(longest, length)
    bounds = [0, *cuts, len(rows)]
    return [rows[a:b] for a, b in zip(bounds, bounds[1:])]


def pack_micro_batches(rows: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       budget: int) -> list[torch.Tensor]:
    """A mini-batch's ``rows`` (indices into the batch's ``input_ids``/``attention_mask``, (B, T)),
    grouped into prefix trees (:func:`training.models.prefix_tree.prefix_trees`), cut as
    :func:`micro_batches` cuts rows by tokens, whole trees in order of packed length (``budget``:
    their count × the longest one's packed length; a longer tree alone)."""
    tokens = row_tokens(input_ids[rows], attention_mask[rows])
    trees = sorted(prefix_trees(tokens, budget), key=lambda tree: tree_length(tokens, tree))
    lengths = torch.tensor([tree_length(tokens, tree) for tree in trees], dtype=torch.long)
    parts = micro_batches(torch.arange(len(trees)), lengths, 1, budget)
    return [rows[torch.tensor([i for t in part.tolist() for i, _ in trees[t]], dtype=torch.long, device=rows.device)]
            for part in parts]


def mini_batch_rows(group_id: torch.Tensor, mini_batches: int, generator: torch.Generator,
                    by_group: bool) -> list[torch.Tensor]:
    """One PPO epoch's mini-batches: the batch's rows (indices) shuffled and cut into ``mini_batches``
    parts, by row (each row anywhere), or ``by_group``: whole groups (``group_id`` (B,): each question's
    samples and the verdict rows they judged) shuffled and cut, a group's rows together."""
    device = group_id.device
    if not by_group:
        return list(torch.randperm(group_id.shape[0], generator=generator).to(device).tensor_split(mini_batches))
    groups = group_id.unique()
    chosen = groups[torch.randperm(groups.shape[0], generator=generator).to(device)]
    out = []
    for part in chosen.tensor_split(mini_batches):
        out.append(torch.nonzero(torch.isin(group_id, part), as_tuple=True)[0])
    return out


def select(batch: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows of a batch, columns cut to the longest selected episode (less padding to run)."""
    width = int(batch["attention_mask"][rows].sum(-1).max())
    out = {}
    for key, value in batch.items():
        value = value[rows]
        if value.dim() >= 2:  # (B, T), (B, T−1) or per-token states (B, T, H)
            value = value[:, :width] if value.shape[1] == batch["input_ids"].shape[1] else value[:, :width - 1]
        out[key] = value
    return out


def owners_advantages(advantages: torch.Tensor, mask: torch.Tensor, owner: torch.Tensor,
                       weight: float = 1.0) -> torch.Tensor:
    """Each verdict row's advantage: ``weight`` × its episode's mean advantage over that episode's
    model tokens (an outcome estimator's one value per episode), on the verdict row's model token.

    advantages, mask: (B, T−1) with the E episode rows first; owner: (B,), −1 on episode rows.
    Returns (B, T−1): the episode rows' advantages unchanged, the verdict rows' filled in (0 where
    ``weight`` is 0: the verdicts then learn from their own candidate's term only, ``verdict_credit``)."""
    rows = owner >= 0
    if not bool(rows.any()):
        return advantages
    E = int((~rows).sum())
    per_episode = (advantages[:E] * mask[:E]).sum(-1) / mask[:E].sum(-1).clamp(min=1.0)  # (E,)
    out = advantages.clone()
    out[rows] = weight * per_episode[owner[rows]].unsqueeze(-1) * mask[rows]
    return out


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """(E, T) -> (rows, T): zero rows appended (the verdict rows after the episodes')."""
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])


def put(full: torch.Tensor, rows: torch.Tensor, part: torch.Tensor) -> None:
    """Write a micro-batch's (b, t) values into the full (B, T−1) tensor at ``rows``."""
    full[rows, :part.shape[1]] = part.to(full.dtype)
