"""The actor's trained decoder layers under ``torch.compile`` (``compile_trained_layers``).

With LoRA on the top layers (``lora.top_layers``) and the frozen bottom cached
(:mod:`training.models.frozen_prefix`), every PPO pass of the actor runs only those top layers
and the lm_head. On a CPU a third of that time is element-wise work between the matrix products
(bf16 <-> fp32 casts around the LoRA adapters and RMSNorm, rotary and gating multiplies:
experiments/update_speed.md); inductor fuses it. Each trained layer's ``forward`` is replaced by
its compiled version in place, with dynamic shapes, so micro-batches of other sizes reuse the
graph. The first pass compiles (minutes on a CPU); the layers compute the same function (float
noise aside), so checkpoints, LoRA merging and export are unchanged.
"""
from __future__ import annotations

import torch
from torch import nn

from training.models.frozen_prefix import decoder_of


def trained_layer_indices(lm: nn.Module) -> list[int]:
    """Indices of the decoder layers with a trainable parameter (LoRA's layers); [] when the
    decoder has no ``layers`` list."""
    layers = getattr(decoder_of(lm), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        return []
    return [i for i, layer in enumerate(layers) if any(p.requires_grad for p in layer.parameters())]


def compile_trained_layers(lm: nn.Module) -> list[int]:
    """Replace the ``forward`` of every trained decoder layer of ``lm`` by ``torch.compile`` of it
    (dynamic shapes); returns the compiled layers' indices. Compiling twice is a no-op."""
    indices = trained_layer_indices(lm)
    layers = decoder_of(lm).layers if indices else []
    for index in indices:
        layer = layers[index]
        if not getattr(layer, "_seeds_compiled", False):
            layer.forward = torch.compile(layer.forward, dynamic=True)
            layer._seeds_compiled = True
    return indices
