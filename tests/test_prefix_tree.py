"""optim.share_prefixes: rows packed as a prefix tree give the row-by-row log-probs, entropies and
gradients (tiny Llama and Gemma 3 with a sliding window, CPU), and a PPO update trained that way
ends at the same weights."""
from __future__ import annotations

import pytest
import torch

from tests.test_frozen_prefix import logprobs_and_grads, lora_actor
from tests.test_ppo_loop import tiny_cfg, trainable
from tests.tiny_models import tiny_llama, tiny_tokenizer
from training import ppo
from training.config import ConfigError, LoraSettings, OptimSettings, with_values
from training.models.frozen_prefix import frozen_depth, prefix_hidden
from training.models.policy_models import wrap_models
from training.models.prefix_tree import attention_masks, pack_rows, shared_packing
from training.ppo import train
from training.ppo_loop.ppo_batch import mini_batch_rows, pack_micro_batches


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def right_padded(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
    return ids, mask


def test_rows_that_begin_alike_are_packed_once_with_their_own_positions():
    a, b, c, d, e, f, g, x, y = range(10, 19)
    ids, mask = right_padded([[a, b, x, y], [a, b, c, d, e], [a, b, f, g], [a, b, c, d, e]])
    packed = pack_rows(ids, mask)
    assert packed.input_ids[0].tolist() == [a, b, c, d, e, f, g, x, y]  # lexicographic: c < f < x
    assert packed.position_ids[0].tolist() == [0, 1, 2, 3, 4, 2, 3, 2, 3]
    assert packed.index[0].tolist() == [0, 1, 7, 8, 0] and packed.index[2].tolist() == [0, 1, 5, 6, 0]
    assert packed.index[1].tolist() == packed.index[3].tolist() == [0, 1, 2, 3, 4]  # a repeated row: no tokens
    assert packed.lengths.tolist() == [4, 5, 4, 5]
    assert torch.equal(packed.input_ids[0][packed.index] * mask, ids * mask)
    path = packed.path[0]
    assert path[6].nonzero().flatten().tolist() == [0, 1, 5, 6]  # g sees a b f g, not c d e
    assert path[8].nonzero().flatten().tolist() == [0, 1, 7, 8]
    assert not path[2, 5] and not path[5, 2]


def test_micro_batches_hold_every_row_once_within_the_packed_budget():
    rows = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 7], [1, 2, 3, 4, 8], [9, 9], [9, 9, 9, 9, 9, 9, 9, 9]]
    ids, mask = right_padded(rows)
    micro = pack_micro_batches(torch.arange(len(rows)), ids, mask, budget=8)
    assert sorted(int(i) for m in micro for i in m) == list(range(len(rows)))
    for m in micro:
        assert pack_rows(ids[m], mask[m], 8).tokens <= 8 or len(m) == 1
    # trees: 1 2 3 4 5 6 8 7 (rows 0, 2, 1: each shares at least half), 9 9 (row 3), 9 × 8 (row 4: shares 2 of 8)
    assert [m.tolist() for m in micro] == [[3], [0, 2, 1], [4]]
    assert pack_rows(ids[micro[1]], mask[micro[1]], 8).input_ids.shape == (1, 8)
    assert [m.tolist() for m in pack_micro_batches(torch.arange(len(rows)), ids, mask, budget=16)] == [[3, 0, 2, 1],
                                                                                                      [4]]


def shared_rows(tok) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows with a common beginning, a repeated row, a short verdict-like row and one of its own."""
    start = tok("Instructions: search, then answer. Question: what is the capital of France?")["input_ids"]
    rows = [start + tok(" <search> capital of France</search>")["input_ids"],
            start + tok(" <search> France capital city</search> Paris")["input_ids"],
            start + tok(" <search> capital of France</search>")["input_ids"],
            start + tok(" yes")["input_ids"],
            tok("An unrelated row of its own")["input_ids"]]
    return right_padded(rows, tok.pad_token_id)


def close(a: torch.Tensor, b: torch.Tensor, tolerance: float = 1e-5) -> bool:
    """Equal up to float noise relative to the tensor's size (gradients here reach ~1e2)."""
    return float((a - b).norm()) <= tolerance * max(float(a.norm()), 1.0)


@pytest.mark.parametrize("family, top_layers", [("llama", None), ("llama", 1), ("gemma3", 1)])
def test_a_packed_micro_batch_gives_the_rows_log_probs_and_gradients(tok, family, top_layers):
    """Same log-probs, entropies and LoRA gradients as the rows run one by one, from the tokens and
    from the cached frozen prefix (Gemma 3: sliding window 3, so the window mask matters)."""
    actor = lora_actor(tok, family, top_layers)
    ids, mask = shared_rows(tok)
    packed = pack_rows(ids, mask)
    assert packed.input_ids.shape[0] == 2  # the unrelated row alone
    assert int((packed.path.diagonal(dim1=1, dim2=2)).sum()) < int(mask.sum()) - 20  # the shared beginnings run once
    plain = logprobs_and_grads(actor, ids, mask)
    tree = logprobs_and_grads(actor, ids, mask, packing=packed)
    target = mask[:, 1:].bool()
    assert torch.allclose(plain[0][target], tree[0][target], atol=1e-5)
    assert torch.allclose(plain[1][target], tree[1][target], atol=1e-5)
    assert plain[2].keys() == tree[2].keys() and plain[2]
    assert all(close(plain[2][k], tree[2][k]) for k in plain[2])
    depth = frozen_depth(actor.lm)
    if depth:
        prefix = prefix_hidden(actor.lm, ids, mask, depth)
        cached = logprobs_and_grads(actor, ids, mask, prefix=prefix, prefix_depth=depth, packing=packed)
        assert torch.allclose(plain[0][target], cached[0][target], atol=1e-5)
        assert all(close(plain[2][k], cached[2][k]) for k in plain[2])


def test_without_the_tree_mask_the_log_probs_differ(tok):
    """The test above can fail: with every packed token seeing all earlier ones (a plain causal
    mask over the packed sequence) the branches read each other and the log-probs move."""
    actor = lora_actor(tok, "llama", None)
    ids, mask = shared_rows(tok)
    packed = pack_rows(ids, mask)
    packed.path = torch.ones_like(packed.path).tril()
    plain = logprobs_and_grads(actor, ids, mask)[0]
    wrong = logprobs_and_grads(actor, ids, mask, packing=packed)[0]
    assert not torch.allclose(plain[mask[:, 1:].bool()], wrong[mask[:, 1:].bool()], atol=1e-3)


def test_masks_follow_the_attention_implementation(tok):
    lm = tiny_llama(tok)
    packed = pack_rows(*right_padded([[1, 2, 3], [1, 2, 4]]))
    lm.config._attn_implementation = "eager"
    additive = attention_masks(packed, lm.config, torch.float32)
    assert additive.shape == (1, 1, 4, 4) and additive[0, 0, 3, 2] == torch.finfo(torch.float32).min
    assert additive[0, 0, 3, 1] == 0
    lm.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="sdpa or eager"):
        attention_masks(packed, lm.config, torch.float32)


def test_group_mini_batches_keep_each_group_whole():
    group = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1, 1, 2, 3, 3])
    parts = mini_batch_rows(group, 2, torch.Generator().manual_seed(0), by_group=True)
    assert sorted(int(i) for p in parts for i in p) == list(range(len(group)))
    seen = [set(group[p].tolist()) for p in parts]
    assert not seen[0] & seen[1] and all(len(s) == 2 for s in seen)
    rows = mini_batch_rows(group, 3, torch.Generator().manual_seed(0), by_group=False)
    assert sorted(int(i) for p in rows for i in p) == list(range(len(group)))


def test_share_prefixes_needs_micro_batches_by_tokens():
    with pytest.raises(ConfigError, match="micro_batch_tokens"):
        OptimSettings(share_prefixes=True)


@pytest.mark.parametrize("top_layers", [None, 1])
def test_a_ppo_update_with_shared_prefixes_trains_the_same_weights(tok, tmp_path, retriever, examples, top_layers,
                                                                    monkeypatch):
    """Two updates of two epochs of two mini-batches, the actor's passes packed or row by row (the
    same mini-batches: by group in both; from the cached frozen prefix with ``top_layers`` 1): the
    same gradients, so the same trained LoRA weights."""
    packings = []
    monkeypatch.setattr(ppo, "shared_packing", lambda *a: packings.append(shared_packing(*a)) or packings[-1])
    weights = {}
    for share in (False, True):
        cfg = tiny_cfg(tmp_path / f"share-{share}", lora=LoraSettings(r=4, alpha=8, top_layers=top_layers),
                       updates=2, ppo_epochs=2, advantage="grpo", seed=3, micro_batch_tokens=4096,
                       cache_frozen_layers=top_layers is not None)
        cfg = with_values(cfg, {"optim.share_prefixes": share, "optim.mini_batch_by_group": True})
        models = wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout)
        train(cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)
        weights[share] = trainable(models.actor)
    assert packings and all(p is not None and p.input_ids.shape[0] < p.pack.shape[0] for p in packings)  # shared
    plain, packed = weights[False], weights[True]
    assert plain.keys() == packed.keys() and plain
    moved = [k for k in plain if "lora_B" in k and float(plain[k].abs().sum()) > 0]
    assert moved, "the update did not move the adapters"
    assert all(torch.allclose(plain[k], packed[k], atol=2e-4) for k in plain)  # Adam moves near-0 gradients by noise
