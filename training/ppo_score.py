"""Scoring one PPO update's episodes (step 2-4 of :mod:`training.ppo`): the padded batch, the no-grad
passes (old log-probs, reference log-probs, values; from the frozen-layer cache where LoRA trains the
top layers only), token rewards, advantages and returns, and the importance weights with ``tis``.

Every per-token tensor is (B, T−1) and position ``t`` is about token ``t+1``.
"""
from __future__ import annotations

import torch

from training.advantages import AdvantageBatch, compute_advantages, two_choice_advantages
from training.answer_credit import with_answer_credit
from training.dapo import overlong_penalty
from training.frozen_prefix import prefix_hidden
from training.models import sequence_values
from training.ppo_batch import episodes_to_batch, owners_advantages, pad_rows, put, select
from training.ppo_core import importance_weights, kl_penalty, token_level_rewards
from training.ppo_setup import Run


def set_train_mode(training: bool, *models) -> None:
    """``model.train(training)`` on every model given that is not None."""
    for model in models:
        if model is not None:
            model.train(training)


def frozen_prefix_states(run: Run, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, T, H): every row's hidden states after the actor's frozen bottom layers, computed in
    micro-batches of similar lengths (:func:`training.frozen_prefix.prefix_hidden`)."""
    lengths = batch["attention_mask"].sum(-1)
    states = None
    for rows in lengths.argsort(stable=True).split(run.cfg.micro_batch_size):
        mb = select(batch, rows)
        hidden = prefix_hidden(run.policy.lm, mb["input_ids"], mb["attention_mask"], run.frozen_depth)
        if states is None:
            states = hidden.new_zeros((*batch["input_ids"].shape, hidden.shape[-1]))
        states[rows, :hidden.shape[1]] = hidden
    return states


def prefix_of(run: Run, mb: dict[str, torch.Tensor]) -> dict:
    """The actor's keyword arguments that start it from the cached frozen states, if any."""
    return {"prefix": mb["prefix"], "prefix_depth": run.frozen_depth} if "prefix" in mb else {}


def score(run: Run, episodes: list, train_actor: bool = True) -> tuple[dict[str, torch.Tensor], dict]:
    """The update's batch (:mod:`training.ppo_batch`) with, per model token (B, T−1): old and
    reference log-probs and values (no gradients), token rewards, advantages and returns, and with
    ``tis`` the importance weights. Returns (batch, extras for the log). ``train_actor`` False (a
    critic-only update): no frozen-layer states unless the old log-probs are recomputed."""
    cfg, accelerator = run.cfg, run.accelerator
    batch = episodes_to_batch(episodes, run.pad_id, accelerator.device)
    mask = batch["model_mask"]
    overlong = torch.zeros_like(batch["reward"])
    if cfg.overlong_buffer > 0:  # DAPO: a soft penalty on episodes near or past overlong_max_tokens
        overlong = overlong_penalty(mask.sum(dim=1), cfg.overlong_max_tokens, cfg.overlong_buffer)
        batch["reward"] = batch["reward"] + overlong.to(batch["reward"].dtype)
    recompute = cfg.old_logprobs == "recompute"
    with_reference = cfg.kl_coef > 0  # kl_coef 0: no reference pass (one forward fewer; KL is then not logged)
    old_logp = torch.zeros_like(mask) if recompute else batch["sampler_logp"] * mask
    ref_logp, values = torch.zeros_like(mask), torch.zeros_like(mask)
    set_train_mode(False, run.actor, run.critic)
    if run.frozen_depth and (train_actor or recompute):  # the frozen bottom layers, once for the whole update
        batch["prefix"] = frozen_prefix_states(run, batch)
    with torch.no_grad():
        for rows in torch.arange(mask.shape[0], device=accelerator.device).split(cfg.micro_batch_size):
            mb = select(batch, rows)
            choices = {"choice_mask": mb["choice_mask"], "choice_ids": run.choice_ids}
            if recompute:
                put(old_logp, rows, run.actor(mb["input_ids"], mb["attention_mask"], target_mask=mb["model_mask"],
                                              **choices, **prefix_of(run, mb))[0])
            if with_reference and (cfg.kl_tokens == "all" or bool(mb["choice_mask"].any())):
                put(ref_logp, rows, run.models.reference_logprobs(mb["input_ids"], mb["attention_mask"],
                                                                  mb["model_mask"], **choices, **prefix_of(run, mb)))
            if run.critic is not None:
                put(values, rows, sequence_values(run.critic, mb["input_ids"], mb["attention_mask"]))
    set_train_mode(True, run.actor, run.critic)
    values = values * mask
    kl_scope = batch["choice_mask"] * mask if cfg.kl_tokens == "verdicts" else mask  # where the KL term applies
    kl_old = kl_penalty(old_logp, ref_logp, cfg.kl_estimator) * kl_scope if with_reference else torch.zeros_like(mask)
    token_rewards = token_level_rewards(batch["reward"], mask, kl_old if cfg.kl_mode == "reward" else None,
                                        cfg.kl_coef)
    E = len(episodes)  # the episode rows; verdict rows judged alone follow (their episode's advantage × weight)
    advantages, returns = compute_advantages(cfg.advantage, AdvantageBatch(
        model_mask=mask[:E], token_rewards=token_rewards[:E], values=values[:E], scores=batch["reward"][:E],
        group_ids=batch["group_id"][:E], gamma=cfg.gamma, lam=cfg.lam, std_normalize=cfg.grpo_std_normalize,
        accelerator=accelerator))
    advantages = owners_advantages(pad_rows(advantages, mask.shape[0]), mask, batch["owner"],
                                   cfg.verdict_episode_credit)
    if cfg.answer_credit == "answer":  # the answer turn: the answer term's own advantage
        advantages = with_answer_credit(cfg, advantages, batch, mask, E)
    returns = pad_rows(returns, mask.shape[0])
    if cfg.verdict_credit > 0:  # each verdict's own candidate term, on top of the episode's advantage
        advantages = advantages + cfg.verdict_credit * two_choice_advantages(
            old_logp, batch["choice_reward_gap"], batch["choice_mask"] * mask, accelerator)
    batch.update(old_logp=old_logp, ref_logp=ref_logp, old_values=values, advantages=advantages, returns=returns)
    tis_stats = {}
    if cfg.tis != "none":  # the sampler's tokens reweighted toward the trainer's old policy
        batch["is_weight"], tis_stats = importance_weights(old_logp, batch["sampler_logp"], mask, cfg.tis,
                                                           cfg.tis_mode, cfg.tis_cap, cfg.tis_low)
    extras = {"kl_old": kl_old, "kl_scope": kl_scope, "overlong": overlong[:E], "tis": tis_stats}
    return batch, extras
