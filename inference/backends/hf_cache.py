"""The KV cache of :class:`inference.backends.hf.HFBackend`'s decode loop.

``transformers``' ``DynamicCache`` appends each step's keys and values with ``torch.cat``, which
copies the whole cache every token (for Gemma 3 270M and 16 rows, about 250 MB per step). Here each
layer keeps buffers with spare room along the sequence and writes new entries in place;
``keys``/``values`` are views ``[b, kv_heads, t, head_dim]`` of them. On top of that:

- rows can be dropped (:meth:`~transformers.Cache.batch_select_indices`) when they finish;
- caches prefilled separately (groups of prompts of similar length, so that little padding is
  computed) are merged into one left-padded batch with :func:`merge_left_padded`.

Every layer is a full-attention layer, also for sliding-window models: the attention mask still
applies the window (it compares cache indices, and left padding shifts query and key alike), at
the price of keeping the whole context in memory.

Needs the cache-layer API of ``transformers`` >= 4.56; :func:`growing_cache_supported` says
whether it is there (the backend falls back to ``DynamicCache`` and one padded prefill).
"""
from __future__ import annotations

import inspect
from functools import partial
from typing import Any

import torch

try:
    from transformers.cache_utils import Cache, DynamicLayer
except ImportError:  # older transformers: no per-layer cache classes
    Cache = DynamicLayer = None  # type: ignore[misc, assignment]


def growing_cache_supported() -> bool:
    """Whether this transformers version has the cache-layer API :class:`GrowingLayer` builds on."""
    return Cache is not None and "layer_class_to_replicate" in inspect.signature(Cache.__init__).parameters


if DynamicLayer is not None:

    class GrowingLayer(DynamicLayer):
        """A full-attention cache layer that grows in place; ``reserve`` is the spare room (tokens)
        added whenever it has to grow."""

        def __init__(self, reserve: int = 64):
            super().__init__()
            self.reserve = reserve
            self._keys: torch.Tensor | None = None  # [b, kv_heads, capacity, head_dim]
            self._values: torch.Tensor | None = None

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            """Append ``[b, kv_heads, t, head_dim]`` states; return all keys and values so far."""
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            used, new = self.get_seq_length(), key_states.shape[-2]
            if self._keys is None or used + new > self._keys.shape[-2]:
                old_keys, old_values = self.keys, self.values
                self.allocate(key_states.shape[0], used + new + self.reserve, key_states, value_states)
                if used:
                    assert old_keys is not None and old_values is not None  # it holds `used` tokens
                    keys, values = self.buffers()
                    keys[:, :, :used], values[:, :, :used] = old_keys, old_values
            keys, values = self.buffers()
            keys[:, :, used:used + new] = key_states
            values[:, :, used:used + new] = value_states
            self.expose(used + new)
            return self.keys, self.values

        def allocate(self, batch: int, capacity: int, like_keys: torch.Tensor, like_values: torch.Tensor) -> None:
            """Fresh zero buffers ``[batch, kv_heads, capacity, head_dim]`` shaped and typed like the examples."""
            if not self.is_initialized:
                self.lazy_initialization(like_keys, like_values)
            self._keys = like_keys.new_zeros((batch, like_keys.shape[1], capacity, like_keys.shape[-1]))
            self._values = like_values.new_zeros((batch, like_values.shape[1], capacity, like_values.shape[-1]))

        def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
            """The key and value buffers (``allocate`` made them), spare room included."""
            assert self._keys is not None and self._values is not None, "allocate() first"
            return self._keys, self._values

        def expose(self, used: int) -> None:
            """Show the first ``used`` positions of the buffers as the layer's keys and values."""
            keys, values = self.buffers()
            self.keys, self.values = keys[:, :, :used], values[:, :, :used]

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            """Keep only the rows ``indices`` (``[b']`` long), with the spare room."""
            if self._keys is None:
                return
            used = self.get_seq_length()
            keys, values = self.buffers()
            self._keys, self._values = keys[indices], values[indices]
            self.expose(used)


def new_growing_cache(reserve: int = 64):
    """An empty cache whose layers (created on first use) are :class:`GrowingLayer`."""
    return Cache(layer_class_to_replicate=partial(GrowingLayer, reserve))  # type: ignore[arg-type]  # a factory


def merge_left_padded(caches: list, capacity: int, reserve: int = 64):
    """One cache holding the rows of ``caches`` (in order), each right-aligned at the longest length.

    The left gaps are zeros; the caller's attention mask must mark them as padding. ``capacity``:
    tokens of room per layer (at least the longest length).
    """
    length = max(cache.get_seq_length() for cache in caches)
    batch = sum(cache.layers[0].keys.shape[0] for cache in caches)
    merged = new_growing_cache(reserve)
    for index in range(len(caches[0].layers)):
        parts = [cache.layers[index] for cache in caches]
        layer = GrowingLayer(reserve)
        layer.allocate(batch, max(capacity, length), parts[0].keys, parts[0].values)
        keys, values = layer.buffers()
        row = 0
        for part in parts:
            rows, used = part.keys.shape[0], part.keys.shape[-2]
            keys[row:row + rows, :, length - used:length] = part.keys
            values[row:row + rows, :, length - used:length] = part.values
            row += rows
        layer.expose(length)
        merged.layers.append(layer)
    return merged


def prefill_groups(lengths: list[int], slack: float = 0.1, min_slack: int = 16) -> list[tuple[int, int]]:
    """Split prompt lengths sorted longest first into ``(start, end)`` runs whose prompts are each
    within ``max(slack * longest, min_slack)`` tokens of the run's longest, so that left padding
    them together wastes little compute."""
    groups, start = [], 0
    for i, length in enumerate(lengths):
        if lengths[start] - length > max(slack * lengths[start], min_slack):
            groups.append((start, i))
            start = i
    groups.append((start, len(lengths)))
    return groups


def keep_rows(cache: Any, keep: list[int], mask: torch.Tensor, next_position: torch.Tensor, tokens: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shrink a decoding batch to the rows ``keep`` (finished rows leave it): the KV cache in place,
    and the attention mask [b, width], next positions [b, 1] and last tokens [b] returned."""
    index = torch.tensor(keep, device=mask.device)
    cache.batch_select_indices(index)
    return mask[index], next_position[index], tokens[index]
