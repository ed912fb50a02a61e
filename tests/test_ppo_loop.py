"""The SEEDS-R1 PPO loop on a tiny random Llama (2 layers, width 64) and the toy corpus (CPU, seconds)."""
from __future__ import annotations

import math

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.tiny_models import tiny_llama, tiny_tokenizer
from training.config import ConfigError, LoraSettings, PPOConfig, dotted_keys, load_config, save_resolved, with_values
from training.models.checkpoint import export_hf, list_checkpoints, load_latest
from training.models.policy_models import sequence_logprobs, sequence_values, wrap_models
from training.ppo import train
from training.ppo_loop.ppo_batch import micro_batches
from training.runtime.inputs import next_questions


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def tiny_cfg(out, **overrides) -> PPOConfig:
    values = dict(output_dir=str(out), updates=1, critic_warmup_updates=0, questions_per_update=2,
                  samples_per_question=2, micro_batch_size=2, mini_batches=2, max_turn_tokens=8,
                  max_context_tokens=512, env={"max_actions": 3}, eval_questions=0, lr_actor=1e-2, lr_critic=1e-2,
                  lora=LoraSettings(r=4, alpha=8), export=False, sft_warm_start=False, log_samples=0)
    values.update(overrides)
    return with_values(PPOConfig, dotted_keys(values))


def trainable(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


def frozen(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if not p.requires_grad}


def probe(tok):
    ids = tok(["<search> capital France</search>", "What is the capital of Japan?"], padding=True,
              return_tensors="pt")
    return ids["input_ids"], ids["attention_mask"]


def same(a: dict, b: dict, atol: float = 0.0) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=atol, rtol=0) for k in a)


def test_logprobs_and_values_align_with_a_full_forward(tok):
    lm = tiny_llama(tok)
    ids, attention = probe(tok)
    with torch.no_grad():
        full = lm(input_ids=ids, attention_mask=attention).logits[:, :-1].float().log_softmax(-1)
        expected = full.gather(-1, ids[:, 1:, None])[..., 0] * attention[:, 1:]
        logp, entropy = sequence_logprobs(lm, ids, attention, chunk=5, with_entropy=True)
        only = torch.zeros_like(attention[:, 1:])
        only[0, 2] = only[1, 4] = 1
        partial, _ = sequence_logprobs(lm, ids, attention, chunk=5, target_mask=only)
    assert logp.shape == (2, ids.shape[1] - 1)
    assert torch.allclose(logp, expected, atol=1e-5)
    assert torch.allclose(partial, expected * only, atol=1e-5)
    assert (entropy[attention[:, 1:].bool()] > 0).all()
    unused = tiny_cfg("unused")
    models = wrap_models(tiny_llama(tok), tok, unused.model, unused.algorithm, unused.rollout)
    values = sequence_values(models.critic, ids, attention)
    assert values.shape == logp.shape and not values.any()  # the critic starts at V = 0


@pytest.mark.parametrize("lora", [True, False])
def test_one_update_moves_the_actor_not_the_reference(tok, tmp_path, retriever, examples, lora):
    cfg = tiny_cfg(tmp_path, lora=LoraSettings(enabled=lora, r=4, alpha=8), lr_actor=1e-2 if lora else 1e-3)
    models = wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout)
    ids, attention = probe(tok)
    ref_before = models.reference_logprobs(ids, attention)
    with torch.no_grad():
        actor_before = models.actor(ids, attention)[0]
    weights, base = trainable(models.actor), frozen(models.actor)
    result = train(cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)
    assert result["update"] == 1 and result["data_position"] == 2
    assert not same(weights, trainable(models.actor))  # the trained weights moved
    assert same(base, frozen(models.actor))  # LoRA: the base stays frozen
    with torch.no_grad():
        assert not torch.allclose(models.actor(ids, attention)[0], actor_before, atol=1e-6)
    assert torch.allclose(models.reference_logprobs(ids, attention), ref_before, atol=1e-6)
    stats = result["history"][0]
    assert stats["critic_only"] == 0.0 and stats["sampler_logp_gap"] < 1e-4  # sampler == trainer at update 0
    assert load_latest(tmp_path).name == "update_000001"


def test_sampler_old_logprobs_match_recomputed_ones(tok, tmp_path, retriever, examples):
    """``old_logprobs: sampler`` skips the recomputation: with the HF engine on the trainer's own
    fp32 weights it trains to the same weights, and the sampler/trainer gap is still measured."""
    results, calls = {}, {}
    for mode in ("recompute", "sampler"):
        torch.manual_seed(0)
        cfg = tiny_cfg(tmp_path / mode, old_logprobs=mode, mini_batches=1, micro_batch_size=4)
        models = wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout)
        forward = models.actor.forward
        calls[mode] = 0

        def counting(*args, _forward=forward, _mode=mode, **kwargs):
            calls[_mode] += 1
            return _forward(*args, **kwargs)

        models.actor.forward = counting
        result = train(cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)
        results[mode] = (trainable(models.actor), result["history"][0])
    assert calls["sampler"] == calls["recompute"] - 1  # one no-grad pass fewer (a single micro-batch)
    (w_re, h_re), (w_sa, h_sa) = results["recompute"], results["sampler"]
    assert all(torch.allclose(w_re[n], w_sa[n], atol=1e-5) for n in w_re)
    assert 0.0 <= h_sa["sampler_logp_gap"] < 1e-4 and abs(h_sa["reward_mean"] - h_re["reward_mean"]) < 1e-9
    with pytest.raises(ValueError):
        tiny_cfg(tmp_path, old_logprobs="vllm")


def test_critic_warmup_leaves_the_actor_unchanged(tok, tmp_path, retriever, examples):
    cfg = tiny_cfg(tmp_path, critic_warmup_updates=1)
    models = wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout)
    actor, critic = trainable(models.actor), trainable(models.critic)
    result = train(cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)
    assert result["history"][0]["critic_only"] == 1.0
    assert same(actor, trainable(models.actor))
    assert not same(critic, trainable(models.critic))


def test_config_yaml_cli_overrides_and_unknown_keys(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model": "smollm2-135m", "updates": 7, "lr_actor": 2e-6,
                                      "lora": {"r": 32, "alpha": 64}, "env": {"top_k": 3}}))
    cfg = load_config(PPOConfig, ["--config", str(recipe), "--lora.r", "8", "--updates=3", "--resume",
                                  "--env.max_actions", "4", "--dual_clip", "3", "--sft_checkpoint", "null",
                                  "--kl-mode", "loss", "--kl_estimator", "k3"])
    assert cfg.model.name == "smollm2-135m" and cfg.optim.updates == 3 and cfg.optim.lr_actor == 2e-6
    assert cfg.run.resume is True
    assert cfg.model.lora.r == 8 and cfg.model.lora.alpha == 64
    assert (cfg.env.candidates_per_search, cfg.env.max_actions) == (3, 4)
    assert cfg.algorithm.dual_clip == 3.0 and isinstance(cfg.algorithm.dual_clip, float)
    assert cfg.algorithm.kl_mode == "loss"
    # the same config, nested: the old flat names above are read through OLD_FLAT_KEYS
    recipe.write_text(yaml.safe_dump({"model": {"name": "smollm2-135m", "lora": {"r": 32, "alpha": 64}},
                                      "optim": {"updates": 7, "lr_actor": 2e-6}, "env": {"candidates_per_search": 3}}))
    nested = load_config(PPOConfig, ["--config", str(recipe), "--model.lora.r", "8", "--optim.updates=3",
                                     "--run.resume", "--env.max_actions", "4", "--algorithm.dual_clip", "3",
                                     "--model.sft_checkpoint", "null", "--algorithm.kl-mode", "loss",
                                     "--algorithm.kl_estimator", "k3"])
    assert nested == cfg
    with pytest.raises(ConfigError, match="lora.rank"):
        load_config(PPOConfig, ["--lora.rank", "8"])
    with pytest.raises(ConfigError, match="learning_rate"):
        load_config(PPOConfig, ["--learning_rate", "1e-5"])
    recipe.write_text(yaml.safe_dump({"updatez": 3}))
    with pytest.raises(ConfigError, match="updatez"):
        load_config(PPOConfig, ["--config", str(recipe)])
    with pytest.raises(ConfigError):
        load_config(PPOConfig, ["--advantage", "ppo2"])
    path = save_resolved(cfg, tmp_path / "run")
    assert load_config(PPOConfig, ["--config", str(path)]) == cfg


def test_resume_continues_exactly(tok, tmp_path, retriever, examples):
    def run(out, updates, resume=False):
        cfg = tiny_cfg(out, updates=updates, resume=resume, critic_warmup_updates=1, save_every=1,
                       keep_checkpoints=2)
        models = wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout)
        return train(cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)

    first = run(tmp_path / "a", 2)  # "killed" after 2 updates
    assert first["update"] == 2 and first["data_position"] == 4
    resumed = run(tmp_path / "a", 3, resume=True)
    straight = run(tmp_path / "b", 3)
    assert resumed["update"] == straight["update"] == 3
    assert resumed["data_position"] == straight["data_position"] == 6
    assert [h["update"] for h in resumed["history"]] == [3]
    assert same(trainable(resumed["models"].actor), trainable(straight["models"].actor), atol=1e-6)
    assert same(trainable(resumed["models"].critic), trainable(straight["models"].critic), atol=1e-6)
    assert resumed["history"][0]["reward_mean"] == straight["history"][-1]["reward_mean"]
    assert [p.name for p in list_checkpoints(tmp_path / "a")] == ["update_000002", "update_000003"]
    # The question stream is a pure function of the position.
    assert next_questions(examples, 4, 2, 0) == next_questions(examples, 0, 6, 0)[4:]


def test_a_resumed_run_compares_against_the_policy_it_started_from(tok, tmp_path, retriever, examples, monkeypatch):
    """The "before" of a resumed run is the policy PPO started from, not the checkpoint it resumes."""
    import training.ppo_loop.ppo_setup as ppo_setup

    evaluated = []
    original = ppo_setup.evaluate
    monkeypatch.setattr(ppo_setup, "evaluate", lambda run: (evaluated.append(trainable(run.policy)), original(run))[1])

    def run(updates, resume=False):
        cfg = tiny_cfg(tmp_path / "a", updates=updates, resume=resume, advantage="grpo", save_every=1,
                       cache_warm_start=False)
        models = wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout)
        initial = trainable(models.actor)
        result = train(cfg, retriever=retriever, examples=examples, eval_examples=examples[:2], models=models)
        return initial, result

    initial, first = run(1)  # "killed" after 1 update (its checkpoint saved)
    assert not same(trainable(first["models"].actor), initial)  # the update moved the policy
    evaluated.clear()
    initial, resumed = run(2, resume=True)
    assert same(evaluated[0], initial)  # the before-evaluation saw the policy as built ...
    assert resumed["eval_start"] == first["eval_start"]  # ... the same evaluation the first run made


def test_group_baselines_run_without_a_critic(tok, tmp_path, retriever, examples):
    """grpo builds no critic (no second decoder, no value pass), checkpoints without critic.pt,
    resumes exactly, and refuses to resume a critic-free checkpoint with GAE."""
    def run(out, updates, resume=False, advantage="grpo"):
        cfg = tiny_cfg(out, updates=updates, resume=resume, advantage=advantage, save_every=1, keep_checkpoints=2,
                       temperature=1.0, max_turn_tokens=6)
        models = wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout)
        return train(cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)

    first = run(tmp_path / "a", 1)
    assert first["models"].critic is None
    history = first["history"][0]
    assert math.isnan(history["value_loss"]) and math.isnan(history["explained_variance"])
    assert math.isfinite(history["policy_loss"]) and history["critic_only"] == 0.0
    folder = load_latest(tmp_path / "a")
    assert (folder / "actor.pt").is_file() and not (folder / "critic.pt").exists()
    resumed, straight = run(tmp_path / "a", 2, resume=True), run(tmp_path / "b", 2)
    assert same(trainable(resumed["models"].actor), trainable(straight["models"].actor), atol=1e-6)
    with pytest.raises(ValueError, match="critic"):
        run(tmp_path / "a", 3, resume=True, advantage="gae")


@pytest.mark.parametrize("lora", [True, False])
def test_exported_folder_loads_with_auto_model(tok, tmp_path, lora):
    cfg = tiny_cfg(tmp_path, lora=LoraSettings(enabled=lora, r=4, alpha=8))
    models = wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout)
    with torch.no_grad():
        for name, p in models.actor.named_parameters():
            if p.requires_grad and "lora_B" in name or not lora and "q_proj" in name:
                p.add_(0.05)
    ids, attention = probe(tok)
    with torch.no_grad():
        expected = models.actor(ids, attention)[0]
    folder = export_hf(models.actor, tok, tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert AutoTokenizer.from_pretrained(folder).eos_token == "</s>"
    with torch.no_grad():
        got = sequence_logprobs(loaded, ids, attention)[0]
    assert torch.allclose(got, expected, atol=1e-4)
    if lora:  # merging worked on a copy: the actor still has its adapter
        assert models.actor.is_lora and any("lora_" in n for n, _ in models.actor.named_parameters())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_no_config_means_the_embedded_default_recipe():
    from training.ppo import DEFAULT_RECIPE, resolve_argv

    assert resolve_argv([]) == ["--config", str(DEFAULT_RECIPE)]
    assert resolve_argv(["--updates", "1"]) == ["--config", str(DEFAULT_RECIPE), "--updates", "1"]
    assert resolve_argv(["--config", "x.yaml", "--updates", "1"]) == ["--config", "x.yaml", "--updates", "1"]
    assert resolve_argv(["--config=x.yaml"]) == ["--config=x.yaml"]
    assert resolve_argv(["--updates", "2", "--config", "none"]) == ["--updates", "2"]
    assert resolve_argv(["--config=null", "--seed", "3"]) == ["--seed", "3"]
    default = load_config(PPOConfig, resolve_argv([]))
    assert default.model.name == "smollm2-135m" and default.model.lora.enabled and default.model.sft_checkpoint is None
    assert default.warm_start.enabled and default.evaluation.eval_questions >= 64
    assert default.rollout.rollout_engine == "hf"
    assert default.env.expand_form == "judge" and default.env.shuffle_candidates is True


def test_sft_warm_start_hook(tmp_path, monkeypatch):
    from training.ppo_loop.ppo_setup import resolve_sft_checkpoint
    from training.sft import warm_start_config

    calls = []
    monkeypatch.setattr("training.sft.warm_start",
                        lambda view, retriever=None, examples=None: calls.append((view, retriever, examples))
                        or str(tmp_path / "sft"))
    cfg = tiny_cfg(tmp_path, sft_warm_start=True, lora=LoraSettings(enabled=False, r=4))
    resolved = resolve_sft_checkpoint(cfg, retriever="R", examples=["train questions"])
    assert resolved.model.sft_checkpoint == str(tmp_path / "sft")
    view, retriever, examples = calls[0]
    assert retriever == "R" and view is cfg and examples == ["train questions"]  # never the held-out ones
    warm = warm_start_config(cfg)  # a full-fine-tune PPO run gets a full-fine-tune warm start
    assert warm.model.lora.enabled is False and warm.run.output_dir == str(tmp_path / "sft")
    assert warm.teacher == cfg.warm_start.teacher and warm.teacher.expand == "random"  # the section itself
    changed = warm_start_config(with_values(cfg, {"warm_start": {"train": {"epochs": 5}, "lora": {"enabled": True}}}))
    assert (changed.train.epochs, changed.model.lora.enabled, changed.train.learning_rate) == (5, True, 2e-4)
    given = with_values(cfg, {"model.sft_checkpoint": "somewhere"})
    assert resolve_sft_checkpoint(given) is given and len(calls) == 1  # a given checkpoint wins
    assert resolve_sft_checkpoint(with_values(cfg, {"warm_start.enabled": False})).model.sft_checkpoint is None


def test_sample_table_goes_to_the_wandb_tracker(monkeypatch):
    import sys
    from types import SimpleNamespace

    from training.evaluation.ppo_report import log_sample_table

    logged = []

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    tracker = SimpleNamespace(log=lambda values, step: logged.append((values, step)))
    accelerator = SimpleNamespace(
        get_tracker=lambda name, unwrap: tracker if (name, unwrap) == ("wandb", True) else None)
    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(Table=Table))
    sample = {"update": 3, "question": "q1", "reward": 0.5, "finish": "answer", "text": "<answer>x</answer>"}
    log_sample_table(accelerator, [sample], step=3)
    (values, step), = logged
    assert step == 3 and values["samples"].columns == ["update", "question", "reward", "finish", "text"]
    assert values["samples"].data == [[3, "q1", 0.5, "answer", "<answer>x</answer>"]]


def test_lora_on_the_top_layers_only(tok):
    """``lora.top_layers``: adapters on the last N decoder layers of the actor and the critic."""
    cfg = tiny_cfg("unused", lora=LoraSettings(r=4, alpha=8, top_layers=1))
    models = wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout)
    for module in (models.actor, models.critic):
        names = [n for n, p in module.named_parameters() if p.requires_grad and "lora_" in n]
        assert names and all(".layers.1." in n for n in names)
    with pytest.raises(ValueError, match="top_layers"):
        too_high = tiny_cfg("unused", lora=LoraSettings(r=4, top_layers=3))
        wrap_models(tiny_llama(tok), tok, too_high.model, too_high.algorithm, too_high.rollout)


def test_a_batch_without_model_tokens_still_backpropagates(tok):
    """No target position (every episode ended before the model wrote a token): the zero log-probs
    stay tied to the graph, so backward runs (DDP's all-reduce too) and leaves zero gradients."""
    cfg = tiny_cfg("unused", advantage="grpo")
    models = wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout)
    ids, attention = probe(tok)
    logp, _ = models.actor(ids, attention, target_mask=torch.zeros_like(attention[:, 1:]))
    assert logp.requires_grad and float(logp.abs().sum()) == 0.0
    logp.sum().backward()
    grads = [p.grad for p in models.actor.parameters() if p.requires_grad]
    assert grads and all(g is not None and float(g.abs().sum()) == 0.0 for g in grads)


def test_micro_batches_by_rows_or_by_padded_tokens():
    rows, lengths = torch.arange(7), torch.tensor([3, 3, 4, 5, 9, 20, 30])
    assert [r.tolist() for r in micro_batches(rows, lengths, 3)] == [[0, 1, 2], [3, 4, 5], [6]]
    # up to 16 padded positions each: 3 rows of <= 4 (a 4th, of 5, would pad them to 20), then 5 and 9 apart
    # (2 x 9 > 16), longer rows alone
    assert [r.tolist() for r in micro_batches(rows, lengths, 3, tokens=16)] == [[0, 1, 2], [3], [4], [5], [6]]
    assert [r.tolist() for r in micro_batches(rows, lengths, 3, tokens=1000)] == [list(range(7))]


def test_token_budget_micro_batches_train_the_same_weights(tok, tmp_path, retriever, examples):
    trained = []
    for name, extra in (("rows", {"micro_batch_size": 1}), ("tokens", {"micro_batch_tokens": 100_000})):
        cfg = tiny_cfg(tmp_path / name, mini_batches=1, **extra)
        torch.manual_seed(0)
        models = wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout)
        train(cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)
        trained.append(trainable(models.actor))
    assert trained[0].keys() == trained[1].keys()
    for key in trained[0]:  # one pass over every row against one row at a time: the same gradient
        torch.testing.assert_close(trained[0][key], trained[1][key], atol=1e-5, rtol=1e-4)
    with pytest.raises(ConfigError, match="micro_batch_tokens"):
        tiny_cfg(tmp_path, micro_batch_tokens=-1)
