"""The rollout's hidden states after the actor's frozen bottom layers, kept for the trainer.

With LoRA on the top layers only and ``cache_frozen_layers: true``, every PPO update starts by
running the frozen bottom layers over all of its rows (:func:`training.ppo_loop.ppo_score.frozen_prefix_states`).
The HF rollout has already run those layers over the same tokens, with the same weights (the
merged rollout copy and the actor differ only in the top layers): a forward hook on the last
frozen layer of the rollout model, and the session's word on which positions of which row each
pass ran (:class:`~inference.backends.hf_session.HFSession`'s ``observer``; a prefix the session
ran once for several rows is handed to each by :meth:`FrozenStateRecorder.fork`), keep each row's
states by position (:class:`FrozenStateRecorder`). The rollout hands them to the episode and to each
verdict row (``frozen_states``, (n, H): positions 0 .. n−1), and the trainer runs the bottom
layers only for rows whose recorded states fall short (:func:`covers`).

Equal to the trainer's own pass up to floating-point noise (a left-padded batch with a KV cache
against a right-padded one), as the sampler's log-probs are (``old_logprobs: sampler``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator
from typing import Any

import torch
from torch import nn

from training.models.frozen_prefix import decoder_of


class FrozenStateRecorder:
    """Hidden states after decoder layer ``depth − 1`` of ``model``, per session row and position.

    Use it as the session's observer inside :meth:`capturing`: after each forward pass the session
    says which positions of which rows it ran, in the last columns of that pass."""

    def __init__(self, model: nn.Module, depth: int):
        if depth < 1:
            raise ValueError("record the states after at least one decoder layer (depth >= 1)")
        self.layer: nn.Module = decoder_of(model).layers[depth - 1]
        self.last: torch.Tensor | None = None  # (b, t, H): the hooked layer's latest output
        self.pieces: dict[Hashable, list[tuple[int, torch.Tensor]]] = {}

    @contextlib.contextmanager
    def capturing(self) -> Iterator[FrozenStateRecorder]:
        """The forward hook on the layer for the block (removed after, even on errors)."""
        def keep(module: nn.Module, args: tuple, output: Any) -> None:
            self.last = output[0] if isinstance(output, tuple) else output

        handle = self.layer.register_forward_hook(keep)
        try:
            yield self
        finally:
            handle.remove()
            self.last = None

    def __call__(self, ran: list[tuple[Hashable, int, int]]) -> None:
        """The session's report of the pass just run: row ``i`` ran ``count`` positions from
        ``first`` on, in the last ``count`` columns of the hooked output."""
        if self.last is None:
            return
        hidden, width = self.last, self.last.shape[1]
        for row, (key, first, count) in enumerate(ran):
            if count > 0:
                self.pieces.setdefault(key, []).append((first, hidden[row, width - count:]))

    def take(self, key: Hashable, length: int) -> torch.Tensor:
        """Row ``key``'s states for its first positions, (n, H) with n ≤ ``length``: the longest
        run of positions from 0 that the model ran for it; the row is forgotten."""
        pieces = self.pieces.pop(key, [])
        if not pieces:
            return torch.empty(0)
        first = pieces[0][1]
        states = torch.zeros((length, first.shape[-1]), dtype=first.dtype, device=first.device)
        ran = torch.zeros(length, dtype=torch.bool)
        for start, part in pieces:  # in the order run: a re-run position is written again
            stop = min(start + part.shape[0], length)
            if stop > start:
                states[start:stop] = part[:stop - start]
                ran[start:stop] = True
        n = int(ran.long().cumprod(0).sum())
        return states[:n].clone()

    def fork(self, source: Hashable, targets: list[Hashable]) -> None:
        """Rows ``targets`` now hold row ``source``'s cached tokens (the session ran a shared prefix
        once): each gets what ``source`` recorded, after its own (later pieces win in :meth:`take`)."""
        pieces = self.pieces.get(source, [])
        for key in targets:
            self.pieces.setdefault(key, []).extend(pieces)

    def forget(self, keys: list[Hashable]) -> None:
        """Drop rows whose states are not wanted."""
        for key in keys:
            self.pieces.pop(key, None)


def last_needed_position(model_mask: torch.Tensor) -> torch.Tensor:
    """Per row, the last position whose output the trainer uses (its last model token's
    predecessor), −1 for a row with none. model_mask: (B, T−1), position t about token t+1.
    Returns (B,)."""
    positions = torch.arange(model_mask.shape[1], device=model_mask.device)
    return torch.where(model_mask > 0, positions, torch.full_like(positions, -1)).amax(dim=1)


def covers(states: torch.Tensor | None, last_needed: int) -> bool:
    """Whether recorded ``states`` (n, H) reach every position up to ``last_needed``: the
    positions after it influence no output the trainer uses (causal attention)."""
    return states is not None and states.dim() == 2 and states.shape[0] > last_needed
