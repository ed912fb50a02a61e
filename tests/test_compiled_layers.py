"""compile_trained_layers: the trained decoder layers under torch.compile give the actor the same
log-probs and LoRA gradients as eager mode, from the cached frozen prefix; only those layers are
compiled (tiny Llama, CPU; skipped where inductor has no C++ compiler)."""
from __future__ import annotations

import shutil

import pytest
import torch

from tests.test_frozen_prefix import logprobs_and_grads, lora_actor
from tests.test_ppo_loop import probe
from tests.tiny_models import tiny_tokenizer
from training.config import ConfigError, PPOConfig, with_values
from training.models.compiled_layers import RECOMPILE_LIMIT, compile_trained_layers, trained_layer_indices
from training.models.frozen_prefix import decoder_of, frozen_depth, prefix_hidden

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                    reason="torch.compile (inductor) needs a C++ compiler on a CPU")


@needs_compiler
def test_compiled_top_layers_match_eager_log_probs_and_gradients():
    tok = tiny_tokenizer()
    actor = lora_actor(tok, "llama", top_layers=1)
    depth = frozen_depth(actor.lm)
    ids, attention = probe(tok)
    prefix = prefix_hidden(actor.lm, ids, attention, depth)
    eager = logprobs_and_grads(actor, ids, attention, prefix=prefix, prefix_depth=depth)
    layers = decoder_of(actor.lm).layers
    assert compile_trained_layers(actor.lm) == trained_layer_indices(actor.lm) == [len(layers) - 1]
    assert [getattr(layer, "_seeds_compiled", False) for layer in layers] == [False] * depth + [True]
    torch._dynamo.reset()
    compiled = logprobs_and_grads(actor, ids, attention, prefix=prefix, prefix_depth=depth)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # the layer ran compiled
    assert torch._dynamo.config.recompile_limit >= RECOMPILE_LIMIT  # its variants do not fall back to eager
    assert torch.allclose(eager[0], compiled[0], atol=1e-4) and torch.allclose(eager[1], compiled[1], atol=1e-4)
    assert eager[2].keys() == compiled[2].keys() and eager[2]
    assert all(torch.allclose(eager[2][k], compiled[2][k], atol=1e-4) for k in eager[2])
    assert compile_trained_layers(actor.lm) == [len(layers) - 1]  # a second call compiles nothing more


def test_compiled_layers_refuse_an_unmerged_hf_rollout():
    with pytest.raises(ConfigError, match="rollout_merge_lora"):
        with_values(PPOConfig, {"model.compile_trained_layers": True, "rollout.rollout_merge_lora": False})
    with_values(PPOConfig, {"model.compile_trained_layers": True})  # merged rollout copy: allowed
