"""Episodes as padded tensors, and the row selections the update cuts from them.

Shapes: ``input_ids``/``attention_mask`` (B, T); every per-token tensor is (B, T−1) and
position ``t`` is about token ``t+1`` (the log-prob at ``t`` predicts token ``t+1``, so
``model_mask[:, t] = loss_mask[t+1]``); ``reward``/``group_id`` (B,).
"""
from __future__ import annotations

from typing import Any

import torch


def episodes_to_batch(episodes: list, pad_id: int, device: Any) -> dict[str, torch.Tensor]:
    """Right-padded tensors. input_ids/attention_mask (B, T); per-token tensors (B, T−1), where
    position t is about token t+1 (the log-prob at t predicts token t+1); reward/group_id (B,)."""
    width = max(len(e.token_ids) for e in episodes)
    B = len(episodes)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    attention = torch.zeros((B, width), dtype=torch.long)
    loss_mask = torch.zeros((B, width), dtype=torch.float32)
    sampler = torch.zeros((B, width), dtype=torch.float32)
    choice = torch.zeros((B, width), dtype=torch.float32)
    gap = torch.zeros((B, width), dtype=torch.float32)
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
    batch = {"input_ids": ids, "attention_mask": attention, "model_mask": loss_mask[:, 1:],
             "sampler_logp": sampler[:, 1:], "choice_mask": choice[:, 1:],
             "choice_reward_gap": gap[:, 1:],
             "reward": torch.tensor([e.reward for e in episodes]),
             "group_id": torch.tensor([e.group_id for e in episodes])}
    return {k: v.to(device) for k, v in batch.items()}


def select(batch: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows of a batch, columns cut to the longest selected episode (less padding to run)."""
    width = int(batch["attention_mask"][rows].sum(-1).max())
    out = {}
    for key, value in batch.items():
        value = value[rows]
        if value.dim() == 2:
            value = value[:, :width] if value.shape[1] == batch["input_ids"].shape[1] else value[:, :width - 1]
        out[key] = value
    return out


def put(full: torch.Tensor, rows: torch.Tensor, part: torch.Tensor) -> None:
    """Write a micro-batch's (b, t) values into the full (B, T−1) tensor at ``rows``."""
    full[rows, :part.shape[1]] = part.to(full.dtype)
