"""The actor's trained decoder layers under ``torch.compile`` (``compile_trained_layers``).

With LoRA on the top layers (``lora.top_layers``) and the frozen bottom cached
(:mod:`training.models.frozen_prefix`), every PPO pass of the actor runs only those top layers
and the lm_head. On a CPU a third of that time is element-wise work between the matrix products
(bf16 <-> fp32 casts around the LoRA adapters and RMSNorm, rotary and gating multiplies:
experiments/update_speed.md); inductor fuses it. Each trained layer is compiled as a module
(``layer.compile``, dynamic shapes: PyTorch's regional compilation), so the layers, being of one
class, share their compiled code (their weights are the graph's inputs) and micro-batches of other
sizes reuse it. The layer still has several variants: its input with or without gradients (the
lowest trained layer reads detached frozen states), grad mode on or off (the reference pass), a
mask or none, boolean or additive (prefix trees); together they passed dynamo's default limit of 8
recompilations, after which new ones ran eagerly (bench-update-4), so the limit is raised to
:data:`RECOMPILE_LIMIT`. The first pass compiles (minutes on a CPU); the layers compute
the same function (float noise aside), so checkpoints, LoRA merging and export are unchanged.
"""
from __future__ import annotations

import torch._dynamo
from torch import nn

from training.models.frozen_prefix import decoder_of

RECOMPILE_LIMIT = 64  # graphs per compiled layer code: the variants above, with room for new shapes


def trained_layer_indices(lm: nn.Module) -> list[int]:
    """Indices of the decoder layers with a trainable parameter (LoRA's layers); [] when the
    decoder has no ``layers`` list."""
    layers = getattr(decoder_of(lm), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        return []
    return [i for i, layer in enumerate(layers) if any(p.requires_grad for p in layer.parameters())]


def compile_trained_layers(lm: nn.Module) -> list[int]:
    """Compile every trained decoder layer of ``lm`` in place (``nn.Module.compile``, dynamic
    shapes); returns the compiled layers' indices. Compiling twice is a no-op."""
    indices = trained_layer_indices(lm)
    layers = decoder_of(lm).layers if indices else []
    if indices:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    for index in indices:
        layer = layers[index]
        if not getattr(layer, "_seeds_compiled", False):
            layer.compile(dynamic=True)
            layer._seeds_compiled = True
    return indices
