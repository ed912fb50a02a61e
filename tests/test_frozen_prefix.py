"""cache_frozen_layers: the actor's frozen bottom run once per update gives the same log-probs,
gradients and trained weights as the full forward (tiny Llama and Gemma 3, CPU)."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tests.test_ppo_loop import probe, tiny_cfg, trainable
from tests.tiny_models import tiny_gemma3, tiny_llama, tiny_tokenizer
from training.config import LoraSettings, with_values
from training.models.frozen_prefix import frozen_depth, prefix_hidden
from training.models.policy_models import wrap_models
from training.ppo import train
from training.ppo_loop import ppo_score


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def lora_models(tok, family: str, top_layers: int | None):
    lm = tiny_llama(tok) if family == "llama" else tiny_gemma3(tok, window=3)
    cfg = tiny_cfg("unused", lora=LoraSettings(r=4, alpha=8, top_layers=top_layers), critic_warmup_updates=0)
    models = wrap_models(lm, tok, cfg.model, cfg.algorithm, cfg.rollout)
    for name, p in models.actor.named_parameters():  # LoRA's B starts at 0: move it, so the adapters matter
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.2)
    return models


def lora_actor(tok, family: str, top_layers: int | None):
    return lora_models(tok, family, top_layers).actor


def logprobs_and_grads(actor, ids, attention, **prefix):
    actor.zero_grad()
    logp, entropy = actor(ids, attention, with_entropy=True, **prefix)
    (logp.sum() + entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in actor.named_parameters() if p.requires_grad}
    return logp.detach(), entropy.detach(), grads


@pytest.mark.parametrize("family, top_layers, depth", [("llama", 1, 1), ("gemma3", 1, 2), ("gemma3", 2, 1)])
def test_starting_from_the_cached_prefix_is_the_full_forward(tok, family, top_layers, depth):
    """Same log-probs, entropies and LoRA gradients; for Gemma 3 the layers that run keep their own
    attention type (depth 1 leaves a sliding-window layer, window 3, on top of the cache)."""
    actor = lora_actor(tok, family, top_layers)
    assert frozen_depth(actor.lm) == depth
    ids, attention = probe(tok)
    full = logprobs_and_grads(actor, ids, attention)
    prefix = prefix_hidden(actor.lm, ids, attention, depth)
    assert prefix.shape == (*ids.shape, actor.lm.config.hidden_size) and not prefix.requires_grad
    cached = logprobs_and_grads(actor, ids, attention, prefix=prefix, prefix_depth=depth)
    assert torch.allclose(full[0], cached[0], atol=1e-5) and torch.allclose(full[1], cached[1], atol=1e-5)
    assert full[2].keys() == cached[2].keys() and full[2]
    assert all(torch.allclose(full[2][k], cached[2][k], atol=1e-5) for k in full[2])
    assert float(sum(g.abs().sum() for g in cached[2].values())) > 0
    assert torch.allclose(actor(ids, attention)[0], full[0], atol=1e-6)  # the frozen layers run again after


def test_frozen_depth_needs_frozen_embeddings_and_bottom_layers(tok):
    assert frozen_depth(lora_actor(tok, "llama", None).lm) == 0  # LoRA on every layer: nothing to cache
    plain = tiny_llama(tok)  # full fine-tune: the embeddings train
    assert frozen_depth(plain) == 0
    for p in plain.parameters():
        p.requires_grad_(False)
    assert frozen_depth(plain) == 0  # nothing trains at all


def test_prefix_hidden_refuses_depth_zero(tok):
    with pytest.raises(ValueError, match="depth"):
        prefix_hidden(tiny_llama(tok), *probe(tok), 0)


def test_the_reference_from_the_cached_prefix_is_its_full_forward(tok):
    """The LoRA reference (adapter off) started from the actor's cache: the same log-probs as its
    full forward, and not the actor's (the adapters matter)."""
    models = lora_models(tok, "gemma3", 1)
    actor = models.actor
    ids, attention = probe(tok)
    prefix = prefix_hidden(actor.lm, ids, attention, 2)
    full = models.reference_logprobs(ids, attention)
    cached = models.reference_logprobs(ids, attention, prefix=prefix, prefix_depth=2)
    assert torch.allclose(full, cached, atol=1e-5)
    assert not torch.allclose(full, actor(ids, attention)[0].detach(), atol=1e-3)


def spying(reference, cache: bool, log: list):
    """``reference`` that logs (cache on, given the depth-1 prefix) per call."""
    def spy(*args, prefix=None, prefix_depth=0, **kwargs):
        log.append((cache, prefix is not None and prefix_depth == 1))
        return reference(*args, prefix=prefix, prefix_depth=prefix_depth, **kwargs)
    return spy


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_ppo_with_the_cache_trains_the_same_weights(tok, tmp_path, retriever, examples, kl_coef):
    """Two updates, two PPO epochs: the same trained LoRA weights with and without the cache; with
    a KL term in the loss the reference starts from the cache too. The cache's states computed by the
    trainer: the same weights; taken from the rollout (``reuse_rollout_states``, every row): the
    same up to the float noise of the rollout's batch layout."""
    cfg = tiny_cfg(tmp_path / "plain", lora=LoraSettings(r=4, alpha=8, top_layers=1), updates=2, ppo_epochs=2,
                   advantage="grpo", seed=3, kl_coef=kl_coef, kl_mode="loss", kl_estimator="k3")
    weights, cached_references, reused = {}, [], {}
    for cache, reuse in ((False, False), (True, False), (True, True)):
        run_cfg = with_values(cfg,
                              {"model.cache_frozen_layers": cache, "rollout.reuse_rollout_states": reuse,
                               "run.output_dir": str(tmp_path / f"{cache}-{reuse}")})
        models = wrap_models(tiny_llama(tok), tok, run_cfg.model, run_cfg.algorithm, run_cfg.rollout)
        models = dataclasses.replace(models, reference_logprobs=spying(models.reference_logprobs, cache,
                                                                       cached_references))
        history = train(run_cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)["history"]
        weights[cache, reuse] = trainable(models.actor)
        reused[cache, reuse] = [stats["reused_states"] for stats in history]
    assert weights[False, False].keys() == weights[True, False].keys() == weights[True, True].keys()
    if kl_coef:  # every reference call started from the cache exactly when it was on
        assert set(cached_references) == {(False, False), (True, True)}
    moved = [k for k in weights[True, False] if "lora_B" in k and float(weights[True, False][k].abs().sum()) > 0]
    assert moved, "the update did not move the adapters"
    plain = weights[False, False]
    assert all(torch.allclose(plain[k], weights[True, False][k], atol=1e-5) for k in plain)
    assert all(torch.allclose(plain[k], weights[True, True][k], atol=1e-3) for k in plain)
    assert reused[True, True] == [1.0, 1.0] and reused[True, False] == [0.0, 0.0]
    assert all(math.isnan(x) for x in reused[False, False])


def test_a_critic_only_update_runs_no_frozen_pass(tok, tmp_path, retriever, examples, monkeypatch):
    """critic_warmup_updates 1 with the sampler's log-probs: the first update trains only the critic
    and computes no frozen-layer states; the second (actor) does."""
    calls = []
    real = ppo_score.frozen_prefix_states
    monkeypatch.setattr(ppo_score, "frozen_prefix_states", lambda run, *args: calls.append(1) or real(run, *args))
    cfg = tiny_cfg(tmp_path, lora=LoraSettings(r=4, alpha=8, top_layers=1), updates=2, advantage="gae",
                   critic_warmup_updates=1, cache_frozen_layers=True, old_logprobs="sampler", seed=3)
    models = wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout)
    assert models.critic is not None
    train(cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)
    assert len(calls) == 1


def test_sft_with_the_cache_trains_the_same_adapter(tok, tmp_path):
    """The warm start's epochs over the same rows: the frozen layers run once per row, and the
    trained LoRA weights are those of the uncached run."""
    from training.sft_config import SFTModelSettings, SFTRunSettings, SFTTrainSettings, WarmStartConfig
    from training.warm_start.sft_trainer import build_trainer

    generator = torch.Generator().manual_seed(0)
    rows = []
    for length in (9, 14, 11, 17, 12, 8):
        ids = torch.randint(5, len(tok), (length,), generator=generator).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * (length // 2) + ids[length // 2:]})
    weights, caches = {}, {}
    for cache in (False, True):
        config = WarmStartConfig(
            model=SFTModelSettings(device="cpu", cache_frozen_layers=cache,
                                   lora=LoraSettings(r=4, alpha=8, dropout=0.0, top_layers=1)),
            train=SFTTrainSettings(epochs=3, learning_rate=5e-3, batch_size=2, warmup_ratio=0.0, progress=False),
            run=SFTRunSettings(output_dir=str(tmp_path / str(cache))))
        trainer = build_trainer(rows, config, tiny_llama(tok), tok)
        trainer.train()
        weights[cache] = trainable(trainer.model)
        caches[cache] = trainer.prefix_cache
    assert caches[False] is None and caches[True].depth == 1
    assert len(caches[True].states) == len(rows) and caches[True].hits == 2 * len(rows)  # epochs 2 and 3 reuse
    moved = [k for k in weights[True] if "lora_B" in k and float(weights[True][k].abs().sum()) > 0]
    assert moved and weights[False].keys() == weights[True].keys()
    assert all(torch.allclose(weights[False][k], weights[True][k], atol=1e-5) for k in weights[True])


def test_the_benchmark_runs_on_a_tiny_model(tok, tmp_path, capsys):
    """scripts/bench_frozen_prefix.py end to end on a saved tiny Llama: its last line is the figure."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import bench_frozen_prefix

    tiny_llama(tok).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    assert bench_frozen_prefix.main(["--model", str(tmp_path / "tiny"), "--dtype", "float32", "--top-layers", "1",
                                     "--rows", "4", "--tokens", "16", "--micro-batch", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any("1 frozen below" in line for line in lines)
    name, value = lines[-1].split("=")
    assert name == "frozen_prefix_speedup" and float(value) > 0
