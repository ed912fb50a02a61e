"""The actor's frozen bottom, run once per update instead of once per PPO epoch.

With LoRA on the top layers only (``lora.top_layers``), the embeddings and the decoder layers
below the first adapted one have no trainable parameter: their output for a sequence is the same
in every PPO epoch and mini-batch of an update. ``cache_frozen_layers: true`` runs them once per
update (:func:`prefix_hidden`, no gradients) and every later pass of the actor starts from those
hidden states (:func:`top_hidden`: the frozen layers are skipped, the trainable ones run as
usual). Exact: the same layers on the same inputs, only not recomputed.

Model-agnostic over ``*ForCausalLM`` decoders with a ``layers`` list (Llama, Qwen2, Gemma 3 with
its per-layer attention types, ...): the bottom pass stops at a forward hook after the last
frozen layer; the top pass feeds the cached states in as ``inputs_embeds`` and turns the frozen
layers into identities for its duration, so the decoder's own code builds the masks and
positions for the layers that run.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


class _StopAfterPrefix(Exception):
    """Raised by the bottom pass's hook once the last frozen layer has run."""


def unwrap_peft(model: nn.Module) -> Any:
    """The transformers model under a peft wrapper (LoRA layers stay injected in it); ``Any``, as
    its attributes (``config``, ``get_decoder``, ...) are the model class's own."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def decoder_of(lm: nn.Module) -> Any:
    """The base decoder (embeddings, ``layers``, final norm) of a causal LM (plain or peft); ``Any``
    as :func:`unwrap_peft`'s model."""
    base = unwrap_peft(lm)
    decoder = getattr(base, "base_model", base)
    return decoder if decoder is not base else base.get_decoder()


def frozen_depth(lm: nn.Module) -> int:
    """How many bottom decoder layers (from layer 0 up) have no trainable parameter, when the
    input embeddings have none either; 0 when that is not so or the decoder has no ``layers``
    list, or when no layer is trainable at all (nothing to run on top of a cache)."""
    decoder = decoder_of(lm)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not callable(getattr(decoder, "get_input_embeddings", None)):
        return 0
    if any(p.requires_grad for p in decoder.get_input_embeddings().parameters()):
        return 0
    for index, layer in enumerate(layers):
        if any(p.requires_grad for p in layer.parameters()):
            return index
    return 0


def prefix_hidden(lm: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, depth: int) -> torch.Tensor:
    """Hidden states after the first ``depth`` decoder layers.

    input_ids, attention_mask: (B, T), right-padded. Returns (B, T, H) in the model's dtype,
    detached (the layers below ``depth`` are frozen)."""
    if depth < 1:
        raise ValueError("prefix_hidden needs depth >= 1")
    decoder = decoder_of(lm)
    captured: dict[str, torch.Tensor] = {}

    def grab(module: nn.Module, args: tuple, output) -> None:
        captured["hidden"] = output[0] if isinstance(output, tuple) else output
        decoder._layers_return_tuple = isinstance(output, tuple)  # for skipping_prefix's stand-ins
        raise _StopAfterPrefix

    handle = decoder.layers[depth - 1].register_forward_hook(grab)
    try:
        with torch.no_grad():
            decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    except _StopAfterPrefix:
        pass
    finally:
        handle.remove()
    return captured["hidden"].detach()


def _pass_through(returns_tuple: bool):
    """A frozen layer's stand-in: its input is its output (as a 1-tuple for transformers < 4.54)."""
    def forward(hidden_states: torch.Tensor, *args, **kwargs):
        return (hidden_states,) if returns_tuple else hidden_states
    return forward


@contextlib.contextmanager
def skipping_prefix(lm: nn.Module, depth: int) -> Iterator[nn.Module]:
    """The decoder, with its first ``depth`` layers passing their input through, for the block."""
    decoder = decoder_of(lm)
    if getattr(decoder, "_layers_return_tuple", None) is None:  # no pass yet (states from elsewhere): learn
        one = torch.ones((1, 1), dtype=torch.long, device=decoder.get_input_embeddings().weight.device)
        prefix_hidden(lm, one, one, 1)  # the layers' output kind from a one-token pass through layer 0
    returns_tuple = decoder._layers_return_tuple
    skipped = list(decoder.layers[:depth])
    for layer in skipped:
        layer.forward = _pass_through(returns_tuple)
    try:
        yield decoder
    finally:
        for layer in skipped:
            del layer.forward  # the class's forward again


def top_hidden(lm: nn.Module, prefix: torch.Tensor, attention_mask: Any, depth: int,
               position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The decoder's last hidden states (after the final norm) from the cached ``prefix``.

    prefix: (B, T, H) from :func:`prefix_hidden` with the same ``depth``; attention_mask: (B, T),
    or a prepared 4-D mask with its ``position_ids`` (B, T) (:mod:`training.models.prefix_tree`).
    Returns (B, T, H), with gradients through the trainable layers."""
    with skipping_prefix(lm, depth) as decoder:
        return decoder(inputs_embeds=prefix, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=False).last_hidden_state


class PrefixCache:
    """The frozen prefix of each distinct training sequence, kept across epochs (SFT: the same rows
    every epoch). Keyed by the sequence's tokens; rows must be right-padded (others run uncached).
    Memory: one (length, H) tensor per distinct sequence."""

    def __init__(self, depth: int):
        self.depth = depth
        self.states: dict[bytes, torch.Tensor] = {}
        self.hits = 0

    def prefix(self, lm: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T, H): the prefix states of the batch, computed only for sequences not seen before."""
        lengths = attention_mask.sum(-1)
        right_padded = bool((attention_mask.bool() == (torch.arange(input_ids.shape[1], device=lengths.device)
                                                       < lengths[:, None])).all())
        if not right_padded:
            return prefix_hidden(lm, input_ids, attention_mask, self.depth)
        keys = [input_ids[i, :int(n)].cpu().numpy().tobytes() for i, n in enumerate(lengths)]
        missing = [i for i, key in enumerate(keys) if key not in self.states]
        self.hits += len(keys) - len(missing)
        if missing:
            rows = torch.tensor(missing, device=input_ids.device)
            hidden = prefix_hidden(lm, input_ids[rows], attention_mask[rows], self.depth)
            for j, i in enumerate(missing):
                self.states[keys[i]] = hidden[j, :int(lengths[i])]
        first = self.states[keys[0]]
        out = first.new_zeros((*input_ids.shape, first.shape[-1]))
        for i, key in enumerate(keys):
            out[i, :int(lengths[i])] = self.states[key]
        return out
