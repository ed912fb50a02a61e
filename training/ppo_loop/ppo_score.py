"""Scoring one PPO update's episodes (step 2-4 of :mod:`training.ppo`): the padded batch, the no-grad
passes (old log-probs, reference log-probs, values; from the frozen-layer cache where LoRA trains the
top layers only, its states taken from the rollout where it recorded them), token rewards,
advantages and returns, and the importance weights with ``tis``.

Every per-token tensor is (B, T−1) and position ``t`` is about token ``t+1``.
"""
from __future__ import annotations

import math

import torch

from training.algorithm.advantages import (
    AdvantageBatch,
    centred_reward_gaps,
    compute_advantages,
    priced_gaps,
    two_choice_advantages,
)
from training.algorithm.answer_credit import with_answer_credit
from training.algorithm.dapo import overlong_penalty
from training.algorithm.kl_control import current_kl_coef
from training.algorithm.kl_estimators import (
    kl_penalty,
    kl_token_scope,
    level_free_reference,
    open_logits,
    verdict_level_shift,
)
from training.algorithm.ppo_core import _reduce_sum, importance_weights, token_level_rewards
from training.models.frozen_prefix import decoder_of, prefix_hidden
from training.models.policy_models import sequence_values
from training.ppo_loop.ppo_batch import episodes_to_batch, owners_advantages, pad_rows, put, select
from training.ppo_loop.ppo_setup import Run
from training.rollouts.rollout_states import covers, last_needed_position


def set_train_mode(training: bool, *models) -> None:
    """``model.train(training)`` on every model given that is not None."""
    for model in models:
        if model is not None:
            model.train(training)


def recorded_states(episodes: list) -> list:
    """Each batch row's states recorded by the rollout (:mod:`training.rollouts.rollout_states`), or None:
    the episodes', then their verdict rows' (the row order of :func:`episodes_to_batch`)."""
    return ([getattr(e, "frozen_states", None) for e in episodes]
            + [v.frozen_states for e in episodes for v in getattr(e, "verdict_rows", None) or ()])


def frozen_prefix_states(run: Run, batch: dict[str, torch.Tensor], recorded: list | None = None
                         ) -> tuple[torch.Tensor, float]:
    """(B, T, H): every row's hidden states after the actor's frozen bottom layers, and the share
    of rows that took them from the rollout (``recorded``, when they reach every position the
    trainer reads); the other rows run those layers here, in micro-batches of similar lengths
    (:func:`training.models.frozen_prefix.prefix_hidden`)."""
    B, T = batch["input_ids"].shape
    recorded = recorded or [None] * B
    last = last_needed_position(batch["model_mask"]).tolist()
    reused = [i for i in range(B) if covers(recorded[i], last[i])]
    embeddings = decoder_of(run.policy.lm).get_input_embeddings().weight
    states = embeddings.new_zeros((B, T, embeddings.shape[-1]))
    for i in reused:
        n = min(recorded[i].shape[0], T)
        states[i, :n] = recorded[i][:n].to(device=states.device, dtype=states.dtype)
    computed = torch.tensor(sorted(set(range(B)) - set(reused)), dtype=torch.long, device=states.device)
    lengths = batch["attention_mask"].sum(-1)[computed]
    for rows in computed[lengths.argsort(stable=True)].split(run.optim.micro_batch_size) if len(computed) else ():
        mb = select(batch, rows)
        hidden = prefix_hidden(run.policy.lm, mb["input_ids"], mb["attention_mask"], run.frozen_depth)
        states[rows, :hidden.shape[1]] = hidden.to(states.dtype)
    return states, len(reused) / max(B, 1)


def prefix_of(run: Run, mb: dict[str, torch.Tensor]) -> dict:
    """The actor's keyword arguments that start it from the cached frozen states, if any."""
    return {"prefix": mb["prefix"], "prefix_depth": run.frozen_depth} if "prefix" in mb else {}


def episode_kl_sums(kl: torch.Tensor, mask: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
    """Σ_t m·KL_t over each episode's own row and over the verdict rows it owns (judged alone).

    kl, mask: (B, T) with the E episode rows first; owner: (B,), −1 on episode rows, else the index
    of the owning episode -> (E,)."""
    per_row = (kl * mask).sum(dim=1)  # (B,)
    E = int((owner < 0).sum())
    sums = per_row[:E].clone()
    verdicts = owner >= 0
    return sums.index_add_(0, owner[verdicts], per_row[verdicts]) if bool(verdicts.any()) else sums


def episode_rewards(reward: torch.Tensor, kl: torch.Tensor | None, mask: torch.Tensor, owner: torch.Tensor,
                    kl_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The reward every estimator reads, with the KL penalty in it when ``kl`` is given (kl_mode: reward).

    reward: (E,) episode rewards; kl: (B, T) per-token KL (0 off its scope) or None; mask: (B, T);
    owner: (B,) -> token rewards (E, T): R on the last model token − β·KL on the episode's own model
    tokens, with its verdict rows' KL (judged alone, rows the estimators never read) charged on that
    last token; scores (E,): R − β·Σ KL over the episode and its verdict rows, the score the outcome
    estimators (grpo, rloo, reinforce, reinforce_pp_baseline) read, as verl's do with KL in the reward.
    Both carry the same total penalty, so every estimator sees the KL it is configured with."""
    E = reward.shape[0]
    if kl is None or kl_coef == 0.0:
        return token_level_rewards(reward, mask[:E]), reward
    total = episode_kl_sums(kl, mask, owner)  # (E,)
    own = (kl[:E] * mask[:E]).sum(dim=1)
    terminal = reward - kl_coef * (total - own)  # the verdict rows' share, at the episode's end
    return token_level_rewards(terminal, mask[:E], kl[:E], kl_coef), reward - kl_coef * total


def verdict_open_logit(old_logp: torch.Tensor, opened: torch.Tensor, choices: torch.Tensor, accelerator) -> float:
    """The sampled verdicts' mean open logit log π(open) − log π(skip) under the old policy: the batch's
    shared yes level (NaN without verdicts). old_logp, opened, choices: (B, T)."""
    m = choices.to(old_logp.dtype)
    count, total = _reduce_sum(torch.stack([m.sum().double(), (open_logits(old_logp, opened) * m).sum().double()]),
                               accelerator).unbind()
    return float(total / count) if float(count) > 0 else math.nan


def verdict_advantages(algo, old_logp: torch.Tensor, reward_gap: torch.Tensor, opened: torch.Tensor | None,
                       choices: torch.Tensor, level_shift: float, accelerator) -> tuple[torch.Tensor, float]:
    """Each verdict's own candidate term, verdict_credit × the exact two-way advantage of its reward gap,
    after the batch's price of opening (verdict_credit_centred) and the level hold's price
    (verdict_level_gain × δ, δ the shared yes level's shift from the warm start) are taken out.

    old_logp, reward_gap, opened, choices: (B, T) -> ((B, T) advantages, 0 off the verdicts; the batch's
    total price of opening, NaN where neither applies).
    """
    gaps, price = reward_gap, math.nan
    if algo.verdict_credit_centred:
        assert opened is not None  # the open logits need the two-way verdicts (PPOConfig checks it)
        gaps, price = centred_reward_gaps(old_logp, gaps, opened, choices, accelerator)
    if algo.verdict_level_gain > 0:  # a level above the warm start's makes opening dearer, below it cheaper
        assert opened is not None  # as above
        hold = algo.verdict_level_gain * level_shift
        gaps = priced_gaps(gaps, opened, choices, hold)
        price = hold + (0.0 if math.isnan(price) else price)
    return algo.verdict_credit * two_choice_advantages(old_logp, gaps, choices, accelerator), price


def score(run: Run, episodes: list, train_actor: bool = True) -> tuple[dict[str, torch.Tensor], dict]:
    """The update's batch (:mod:`training.ppo_loop.ppo_batch`) with, per model token (B, T−1): old and
    reference log-probs and values (no gradients), token rewards, advantages and returns, and with
    ``tis`` the importance weights. Returns (batch, extras for the log). ``train_actor`` False (a
    critic-only update): no frozen-layer states unless the old log-probs are recomputed."""
    accelerator, algo = run.accelerator, run.algorithm
    batch = episodes_to_batch(episodes, run.pad_id, accelerator.device)
    mask = batch["model_mask"]
    overlong = torch.zeros_like(batch["reward"])
    if algo.overlong_buffer > 0:  # DAPO: a soft penalty on episodes near or past overlong_max_tokens
        overlong = overlong_penalty(mask.sum(dim=1), algo.overlong_max_tokens, algo.overlong_buffer)
        batch["reward"] = batch["reward"] + overlong.to(batch["reward"].dtype)
    recompute = algo.old_logprobs == "recompute"
    with_reference = algo.kl_coef > 0  # kl_coef 0: no reference pass (one forward fewer; KL is then not logged)
    old_logp = torch.zeros_like(mask) if recompute else batch["sampler_logp"] * mask
    ref_logp, values = torch.zeros_like(mask), torch.zeros_like(mask)
    set_train_mode(False, run.actor, run.critic)
    reused_states = math.nan
    if run.frozen_depth and (train_actor or recompute):  # the frozen bottom layers, once for the whole update
        batch["prefix"], reused_states = frozen_prefix_states(run, batch, recorded_states(episodes))
    with torch.no_grad():
        for rows in torch.arange(mask.shape[0], device=accelerator.device).split(run.optim.micro_batch_size):
            mb = select(batch, rows)
            verdicts = {"choice_mask": mb["choice_mask"], "choice_ids": run.choice_ids}
            if recompute:
                put(old_logp, rows, run.actor(mb["input_ids"], mb["attention_mask"], target_mask=mb["model_mask"],
                                              **verdicts, **prefix_of(run, mb))[0])
            if with_reference and bool(kl_token_scope(algo.kl_tokens, mb).any()):  # rows outside it: no pass
                put(ref_logp, rows, run.models.reference_logprobs(mb["input_ids"], mb["attention_mask"],
                                                                  mb["model_mask"], **verdicts, **prefix_of(run, mb)))
            if run.critic is not None:
                put(values, rows, sequence_values(run.critic, mb["input_ids"], mb["attention_mask"]))
    set_train_mode(True, run.actor, run.critic)
    values = values * mask
    verdicts_taken = batch["choice_mask"] * mask
    # the open token is the first choice (envs.protocol.judge_token_ids); None: no two-way verdicts to read
    opened = batch["input_ids"][:, 1:] == run.choice_ids[0] if run.choice_ids is not None else None
    level_shift, open_logit = math.nan, math.nan
    if opened is not None:
        open_logit = verdict_open_logit(old_logp, opened, verdicts_taken, accelerator)
        if with_reference:  # how far the shared yes level sits from the warm start's (logged every update)
            level_shift = verdict_level_shift(old_logp, ref_logp, opened, verdicts_taken, accelerator)
    if with_reference and algo.kl_verdict_level == "free":  # the KL holds the verdicts' spread, not their level
        assert opened is not None  # kl_verdict_level free needs constrained verdicts (PPOConfig checks it)
        ref_logp, level_shift = level_free_reference(old_logp, ref_logp, opened, verdicts_taken, accelerator)
    kl_scope = kl_token_scope(algo.kl_tokens, batch)  # where the KL term applies
    kl_old = kl_penalty(old_logp, ref_logp,
                        algo.kl_estimator) * kl_scope if with_reference else torch.zeros_like(mask)
    E = len(episodes)  # the episode rows; verdict rows judged alone follow (their episode's advantage × weight)
    token_rewards, scores = episode_rewards(batch["reward"][:E], kl_old if algo.kl_mode == "reward" else None,
                                            mask, batch["owner"], current_kl_coef(run))
    advantages, returns = compute_advantages(algo.advantage, AdvantageBatch(
        model_mask=mask[:E], token_rewards=token_rewards, values=values[:E], scores=scores,
        group_ids=batch["group_id"][:E], gamma=algo.gamma, lam=algo.lam, std_normalize=algo.grpo_std_normalize,
        accelerator=accelerator))
    advantages = owners_advantages(pad_rows(advantages, mask.shape[0]), mask, batch["owner"],
                                   algo.verdict_episode_credit)
    if algo.answer_credit == "answer":  # the answer turn: the answer term's own advantage
        advantages = with_answer_credit(algo, advantages, batch, mask, E)
    returns = pad_rows(returns, mask.shape[0])
    verdict_price = math.nan
    if algo.verdict_credit > 0:  # each verdict's own candidate term, on top of the episode's advantage
        verdict_terms, verdict_price = verdict_advantages(algo, old_logp, batch["choice_reward_gap"], opened,
                                                          verdicts_taken, level_shift, accelerator)
        advantages = advantages + verdict_terms
    batch.update(old_logp=old_logp, ref_logp=ref_logp, old_values=values, advantages=advantages, returns=returns)
    if opened is not None:  # the objective's level hold reads which verdicts opened
        batch["verdict_opened"] = opened.to(mask.dtype)
    tis_stats: dict[str, torch.Tensor] = {}
    if algo.tis != "none":  # the sampler's tokens reweighted toward the trainer's old policy
        batch["is_weight"], tis_stats = importance_weights(old_logp, batch["sampler_logp"], mask, algo.tis,
                                                           algo.tis_mode, algo.tis_cap, algo.tis_low)
    extras = {"kl_old": kl_old, "kl_scope": kl_scope, "overlong": overlong[:E], "tis": tis_stats,
              "reused_states": reused_states, "verdict_price": verdict_price, "verdict_level_shift": level_shift,
              "verdict_open_logit": open_logit}
    return batch, extras
