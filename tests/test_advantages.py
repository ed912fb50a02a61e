"""The estimators added to training.algorithm.advantages (rloo, Dr. GRPO, reinforce_pp), loss aggregation and
off-policy correction in training.algorithm.ppo_core, against numbers derived by hand; and one trainer update
with each of them."""
from __future__ import annotations

import json
import math

import pytest
import torch

from tests.tiny_models import tiny_llama, tiny_tokenizer
from training.algorithm import advantages as A
from training.algorithm import ppo_core as pc
from training.config import ConfigError, LoraSettings, PPOConfig, dotted_keys, with_values
from training.models.policy_models import wrap_models


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


SCORES = torch.tensor([1.0, 2.0, 0.0, 0.0, 1.0])
GROUPS = ["a", "b", "a", "b", "a"]  # a = (1, 0, 1), b = (2, 0)


def test_rloo_leaves_each_sample_out_of_its_own_baseline():
    mask = torch.ones(5, 2)
    adv, ret = A.compute_advantages("rloo", scores=SCORES, group_ids=GROUPS, model_mask=mask)
    # a: 1 − mean(0, 1) = 0.5, 0 − mean(1, 1) = −1, 1 − 0.5 = 0.5;  b: 2 − 0 = 2, 0 − 2 = −2
    close(adv, torch.tensor([0.5, 2.0, -1.0, -2.0, 0.5])[:, None] * mask)
    close(ret, SCORES[:, None] * mask)
    single, _ = A.rloo_advantages(torch.tensor([3.0]), [0], torch.ones(1, 1))
    close(single, [[0.0]])  # nothing to compare with


def test_dr_grpo_is_grpo_without_the_std():
    mask = torch.ones(5, 1)
    adv, _ = A.compute_advantages("grpo", scores=SCORES, group_ids=GROUPS, model_mask=mask, std_normalize=False)
    close(adv, [[1 / 3], [1.0], [-2 / 3], [-1.0], [1 / 3]])  # R − mean_g: a mean 2/3, b mean 1


@pytest.mark.parametrize("name,options", [("grpo", {}), ("grpo", {"std_normalize": False}), ("rloo", {})])
def test_group_baselines_give_nothing_to_a_question_with_equal_rewards(name, options):
    scores = torch.tensor([0.7, 0.7, 0.7, -0.2, 0.5])
    adv, _ = A.compute_advantages(name, scores=scores, group_ids=[0, 0, 0, 1, 1], model_mask=torch.ones(5, 3),
                                  **options)
    close(adv[:3], torch.zeros(3, 3))
    assert bool((adv[3:] != 0).all())


def test_reinforce_pp_whitens_the_token_level_return_to_go():
    rewards = t([0.0, 0.5, 1.0, 2.0])  # the 1.0 sits on an observation token: ignored
    mask = t([1, 1, 0, 1])
    close(A.returns_to_go(rewards, mask, gamma=1.0), [[2.5, 2.5, 0.0, 2.0]])
    adv, ret = A.compute_advantages("reinforce_pp", token_rewards=rewards, model_mask=mask, gamma=0.5)
    # G = (0.5·1.5, 0.5 + 0.5·2, ·, 2) = (0.75, 1.5, ·, 2): mean 1.4166667, unbiased std 0.6291529
    close(ret, [[0.75, 1.5, 0.0, 2.0]])
    close(adv, [[-1.059626, 0.132453, 0.0, 0.927173]])


LOSS = t([1.0, 2.0, 3.0], [4.0, 9.0, 9.0])
MASK = t([1, 1, 1], [1, 0, 0])  # 4 tokens in 2 sequences


@pytest.mark.parametrize("mode,expected", [
    ("token_mean", (6 + 4) / 4),
    ("seq_mean_token_mean", (6 / 3 + 4 / 1) / 2),
    ("seq_mean_token_sum", (6 + 4) / 2),
    ("seq_mean_token_sum_norm", (6 + 4) / (2 * 10)),
])
def test_loss_aggregations_and_their_micro_batch_shares(mode, expected):
    tokens, sequences = pc.global_token_count(MASK), pc.global_sequence_count(MASK)
    assert float(tokens) == 4 and float(sequences) == 2
    whole = pc.aggregate_loss(LOSS, MASK, mode, tokens, sequences, norm_tokens=10.0)
    close(whole, expected)
    # micro-batches with the mini-batch's global counts add up to the whole
    parts = sum(pc.aggregate_loss(LOSS[i:i + 1], MASK[i:i + 1], mode, tokens, sequences, 10.0) for i in range(2))
    close(parts, expected)
    with pytest.raises(ValueError):
        pc.aggregate_loss(LOSS, MASK, "mean", tokens, sequences)


def test_importance_weights_truncate_or_mask_tokens_and_sequences():
    sampler = torch.zeros(1, 4)
    old = torch.log(t([3.0, 0.5, 1.5, 7.0]))
    mask = t([1, 1, 1, 0])  # the 7 is no model token
    weights, stats = pc.importance_weights(old, sampler, mask, "token", "truncate", cap=2.0)
    close(weights, [[2.0, 0.5, 1.5, 0.0]])
    close(stats["clipped_frac"], 1 / 3)
    weights, stats = pc.importance_weights(old, sampler, mask, "token", "mask", cap=2.0, low=0.6)
    close(weights, [[0.0, 0.0, 1.0, 0.0]])  # 3 > cap and 0.5 < low are dropped
    close(stats["clipped_frac"], 2 / 3)
    weights, _ = pc.importance_weights(old, sampler, mask, "sequence", "truncate", cap=2.0)
    close(weights, [[2.0, 2.0, 2.0, 0.0]])  # 3·0.5·1.5 = 2.25, capped at 2 for the whole row
    weights, _ = pc.importance_weights(old, sampler, mask, "sequence", "mask", cap=3.0, low=0.5)
    close(weights, [[1.0, 1.0, 1.0, 0.0]])


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="recompute"):
        with_values(PPOConfig, {"algorithm.tis": "token", "algorithm.old_logprobs": "sampler"})
    with pytest.raises(ConfigError):
        with_values(PPOConfig, {"algorithm.loss_agg": "mean"})
    with pytest.raises(ConfigError):
        with_values(PPOConfig, {"algorithm.advantage": "ppo"})
    with pytest.raises(ConfigError):
        with_values(PPOConfig, {"algorithm.tis": "token", "algorithm.tis_cap": 0.5})


@pytest.mark.parametrize("overrides", [
    {"advantage": "rloo"},
    {"advantage": "reinforce_pp", "kl_coef": 0.01},
    {"advantage": "grpo", "grpo_std_normalize": False, "loss_agg": "seq_mean_token_sum_norm"},
    {"advantage": "grpo", "loss_agg": "seq_mean_token_mean", "tis": "token"},
    {"advantage": "rloo", "tis": "sequence", "tis_mode": "mask"},
])
def test_one_update_with_each_setting(tmp_path, retriever, examples, overrides):
    from training.ppo import train

    tok = tiny_tokenizer()
    cfg = with_values(PPOConfig,
                      dotted_keys(dict(output_dir=str(tmp_path), updates=1, questions_per_update=2,
                                       samples_per_question=2,
                    micro_batch_size=2, mini_batches=2, max_turn_tokens=8, max_context_tokens=512,
                    env={"max_actions": 3}, eval_questions=0, lr_actor=1e-2, lora=LoraSettings(r=4, alpha=8),
                    export=False, sft_warm_start=False, log_samples=0, temperature=1.0,
                    old_logprobs="recompute", **overrides)))
    torch.manual_seed(0)
    models = wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout)
    before = {n: p.detach().clone() for n, p in models.actor.named_parameters() if p.requires_grad}
    stats = train(cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)["history"][0]
    assert models.critic is None and math.isfinite(stats["policy_loss"])
    moved = any(not torch.equal(before[n], p) for n, p in models.actor.named_parameters() if p.requires_grad)
    assert moved and stats["grad_norm_actor"] > 0  # the rewards differ within a group here (seeded)
    if cfg.algorithm.tis != "none":
        assert 0.0 <= stats["tis_clipped_frac"] <= 1.0 and stats["tis_weight_mean"] > 0


def episodes(rewards_by_group: list[list[float]]) -> list:
    from training.rollouts.rollout import Episode

    return [Episode(token_ids=[1, 2], loss_mask=[0, 1], sampler_logprobs=[0.0, -1.0], turn_ids=[-1, 0],
                    prompt_length=1, example_id=f"q{g}", group_id=g, reward=r)
            for g, rewards in enumerate(rewards_by_group) for r in rewards]


def test_dynamic_sampling_drops_equal_reward_groups_and_refills():
    from training.algorithm.dapo import dynamic_sample

    first = episodes([[1.0, 1.0], [0.0, 1.0], [0.5, 0.5]])  # only group 1 is informative
    drawn = []

    def draw(round_):
        drawn.append(round_)
        return episodes([[0.2, 0.2], [0.0, 0.3], [1.0, 0.0]])

    kept, stats = dynamic_sample(first, draw, want=3, max_rounds=2)
    assert drawn == [1]  # one round filled the batch
    assert [(e.example_id, e.group_id, e.reward) for e in kept] == [
        ("q1", 0, 0.0), ("q1", 0, 1.0), ("q1", 1, 0.0), ("q1", 1, 0.3), ("q2", 2, 1.0), ("q2", 2, 0.0)]
    assert stats == {"groups_dropped": 2.0, "extra_rounds": 1.0, "groups_kept": 3.0}
    # the cap on rounds: nothing informative anywhere -> the first batch as it was
    flat = episodes([[1.0, 1.0]])
    kept, stats = dynamic_sample(flat, lambda r: episodes([[0.0, 0.0]]), want=1, max_rounds=2)
    assert kept == flat and stats["extra_rounds"] == 2.0 and stats["groups_kept"] == 0.0


def test_dynamic_sampling_in_the_trainer(tmp_path, retriever, examples):
    from training.ppo import train

    tok = tiny_tokenizer()
    cfg = with_values(PPOConfig,
                      {"run.output_dir": str(tmp_path), "optim.updates": 1, "rollout.questions_per_update": 2,
                       "rollout.samples_per_question": 2, "optim.micro_batch_size": 2, "optim.mini_batches": 2,
                       "rollout.max_turn_tokens": 8, "rollout.max_context_tokens": 512, "env": {"max_actions": 3},
                       "evaluation.eval_questions": 0, "optim.lr_actor": 1e-2,
                       "model.lora": LoraSettings(r=4, alpha=8), "run.export": False, "warm_start.enabled": False,
                       "run.log_samples": 0, "rollout.temperature": 1.0, "algorithm.advantage": "rloo",
                       "algorithm.dynamic_sampling": True, "algorithm.dynamic_sampling_max_rounds": 1})
    torch.manual_seed(0)
    stats = train(cfg, retriever=retriever, examples=examples, eval_examples=[],
                  models=wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout))["history"][0]
    assert stats["dynamic_extra_rounds"] in (0.0, 1.0) and 0 <= stats["dynamic_groups_kept"] <= 2
    assert math.isfinite(stats["policy_loss"])
    with pytest.raises(ConfigError, match="dynamic_sampling"):
        with_values(PPOConfig, {"algorithm.dynamic_sampling": True, "rollout.samples_per_question": 1})


def test_overlong_penalty_is_zero_then_linear_then_minus_one():
    from training.algorithm.dapo import overlong_penalty

    # max 100, buffer 20: free up to 80 tokens, then −1/20 per token, −1 past 100
    close(overlong_penalty(torch.tensor([10, 80, 81, 90, 100, 101, 500]), 100, 20),
          [0.0, 0.0, -0.05, -0.5, -1.0, -1.0, -1.0])
    with pytest.raises(ConfigError, match="overlong_buffer"):
        with_values(PPOConfig, {"algorithm.overlong_buffer": 200, "algorithm.overlong_max_tokens": 100})


def test_overlong_shaping_in_the_trainer(tmp_path, retriever, examples):
    """A budget every episode exceeds: each reward the estimator sees is 1 lower, so every group's
    rewards move together and grpo's advantages, hence the update, are the same as without it."""
    from training.ppo import train

    def update(**overrides):
        tok = tiny_tokenizer()
        cfg = with_values(PPOConfig,
                          dotted_keys(dict(output_dir=str(tmp_path / str(len(overrides))), updates=1,
                                           questions_per_update=2,
                        samples_per_question=2, micro_batch_size=2, mini_batches=1, max_turn_tokens=8,
                        max_context_tokens=512, env={"max_actions": 3}, eval_questions=0, lr_actor=1e-2,
                        lora=LoraSettings(r=4, alpha=8), export=False, sft_warm_start=False, log_samples=0,
                        temperature=1.0, advantage="grpo", **overrides)))
        torch.manual_seed(0)
        return train(cfg, retriever=retriever, examples=examples, eval_examples=[],
                     models=wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout))["history"][0]

    plain, shaped = update(), update(overlong_buffer=1, overlong_max_tokens=2)
    assert shaped["overlong_penalty_mean"] == -1.0 and math.isnan(plain["overlong_penalty_mean"])
    assert shaped["policy_loss"] == pytest.approx(plain["policy_loss"], abs=1e-6)
    assert shaped["reward_mean"] == plain["reward_mean"]  # the env's reward is logged unshaped


def _aggregate_on_rank(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        rows = slice(0, 1) if rank == 0 else slice(1, 2)  # each rank holds one sequence of the mini-batch
        tokens, sequences = pc.global_token_count(MASK[rows]), pc.global_sequence_count(MASK[rows])
        shares = {mode: float(pc.aggregate_loss(LOSS[rows], MASK[rows], mode, tokens, sequences, 10.0))
                  for mode in pc.LOSS_AGGREGATIONS}
        with open(f"{out_dir}/rank{rank}.json", "w") as handle:
            json.dump({"shares": shares, "tokens": float(tokens), "sequences": float(sequences)}, handle)
    finally:
        dist.destroy_process_group()


def test_loss_aggregations_add_up_across_two_processes(tmp_path):
    """Two gloo ranks, one sequence each: the counts are global, and the ranks' shares (what DDP
    averages after the trainer multiplies by the world size) add up to the one-process loss."""
    import torch.multiprocessing as mp

    mp.spawn(_aggregate_on_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["tokens"] == 4.0 and r["sequences"] == 2.0 for r in ranks)
    tokens, sequences = pc.global_token_count(MASK), pc.global_sequence_count(MASK)
    for mode in pc.LOSS_AGGREGATIONS:
        whole = float(pc.aggregate_loss(LOSS, MASK, mode, tokens, sequences, 10.0))
        assert sum(r["shares"][mode] for r in ranks) == pytest.approx(whole)
