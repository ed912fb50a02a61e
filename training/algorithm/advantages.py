"""Advantage estimators for the SEEDS-R1 trainer: one formula per function, and a registry.

Notation as in :mod:`training.algorithm.ppo_core`: B rows (episodes), T token positions, model_mask (B, T) 1 on
the tokens the policy generated. Every registered estimator has ONE signature,
``fn(batch: AdvantageBatch) -> (advantages (B, T), returns (B, T))``, checked when it registers;
the formula functions below it take plain tensors and are what the tests check by hand.

Registered: ``gae`` (critic), ``grpo`` (group mean, std-normalised; ``std_normalize=False`` is
Dr. GRPO), ``rloo`` (leave-one-out group mean), ``reinforce`` (baseline: the mean score over every process's batch) and
``reinforce_pp`` (REINFORCE++: token-level return-to-go, KL in the reward, whitened over the batch) and
``reinforce_pp_baseline`` (REINFORCE++-baseline: R − group mean, whitened over the batch).
The group baselines (grpo, rloo) give 0 to a question whose samples all got the same reward.
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from training.algorithm.ppo_core import _as, _reduce_sum, masked_whiten

ADVANTAGE_ESTIMATORS: dict[str, Callable[[AdvantageBatch], tuple[torch.Tensor, torch.Tensor]]] = {}
GROUP_ESTIMATORS = ("grpo", "rloo", "reinforce_pp_baseline")  # baselines from a question's own samples
CRITIC_ESTIMATORS = ("gae",)


@dataclasses.dataclass
class AdvantageBatch:
    """What an estimator may read. Tensors: token_rewards, values, model_mask (B, T); scores (B,)
    terminal rewards; group_ids (B,) one id per question (any hashable, or a tensor). An estimator
    names the fields it needs with :meth:`need`; the others may stay None."""

    model_mask: torch.Tensor
    token_rewards: torch.Tensor | None = None  # terminal reward on the last model token, −β·KL per token
    values: torch.Tensor | None = None  # critic values (gae)
    scores: torch.Tensor | None = None  # terminal rewards R
    group_ids: torch.Tensor | Sequence[Hashable] | None = None
    gamma: float = 1.0
    lam: float = 1.0
    std_normalize: bool = True  # grpo: divide by the group's std (False: Dr. GRPO)
    accelerator: Any = None  # statistics over every process where an estimator whitens

    def need(self, *names: str) -> None:
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise TypeError(f"this advantage estimator needs {missing} in its AdvantageBatch")


def register_estimator(name: str):
    """Decorator: add ``fn(batch: AdvantageBatch) -> (advantages, returns)`` to ADVANTAGE_ESTIMATORS.
    A function with another signature, or a name already taken, raises ValueError."""

    def wrap(fn):
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        params = list(inspect.signature(fn).parameters.values())
        if len(params) != 1 or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                      inspect.Parameter.POSITIONAL_OR_KEYWORD):
            raise ValueError(f"advantage estimator {name!r} must take exactly one AdvantageBatch argument")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return wrap


def compute_advantages(name: str, batch: AdvantageBatch | None = None, **fields) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator ``name`` on ``batch`` (or on ``AdvantageBatch(**fields)``)."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; choose from {sorted(ADVANTAGE_ESTIMATORS)}")
    return ADVANTAGE_ESTIMATORS[name](batch if batch is not None else AdvantageBatch(**fields))


# --------------------------------------------------------------------------- GAE


@torch.no_grad()
def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    model_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over model tokens only; observation/prompt/pad tokens are transparent.

    rewards, values, model_mask: (B, T) -> advantages (B, T), returns (B, T); both 0 where mask = 0.
    Backwards over t, with next_v = 0 and last_a = 0 after the last model token:
        δ_t = r_t + γ·next_v − V_t ;  A_t = δ_t + γλ·last_a        (model tokens only)
        next_v ← V_t, last_a ← A_t on model tokens; unchanged across mask-0 tokens,
    so a model token's next state is the next MODEL token, and rewards/values on mask-0 tokens are
    ignored. returns = A + V (un-whitened). Whitening is separate: `masked_whiten(A, mask)`.
    """
    m = model_mask.to(device=values.device).bool()
    B, T = values.shape
    next_v = values.new_zeros(B)
    last_a = values.new_zeros(B)
    advantages = torch.zeros_like(values)
    for t in reversed(range(T)):
        a = rewards[:, t] + gamma * next_v - values[:, t] + gamma * lam * last_a
        next_v = torch.where(m[:, t], values[:, t], next_v)
        last_a = torch.where(m[:, t], a, last_a)
        advantages[:, t] = last_a
    mf = m.to(values.dtype)
    advantages = advantages * mf
    returns = (advantages + values) * mf
    return advantages, returns


@register_estimator("gae")
def gae_estimator(batch: AdvantageBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's estimator: `gae_advantages`, then advantages whitened over the model tokens of all
    processes. returns = un-whitened A + V (the critic's target)."""
    batch.need("token_rewards", "values")
    assert batch.token_rewards is not None and batch.values is not None  # need() raised otherwise
    advantages, returns = gae_advantages(batch.token_rewards, batch.values, batch.model_mask, batch.gamma, batch.lam)
    return masked_whiten(advantages, batch.model_mask, accelerator=batch.accelerator), returns


# --------------------------------------------------------------------------- group baselines


def _group_index(group_ids: torch.Tensor | Sequence[Hashable], device) -> torch.Tensor:
    """(B,) ids of any hashable kind (ints, UUID strings) -> (B,) long in 0..G−1."""
    if isinstance(group_ids, torch.Tensor):
        return torch.unique(group_ids, return_inverse=True)[1].to(device)
    seen: dict[Hashable, int] = {}
    return torch.tensor([seen.setdefault(g, len(seen)) for g in group_ids], dtype=torch.long, device=device)


def _group_moments(scores: torch.Tensor, group_ids) -> tuple[torch.Tensor, ...]:
    """(B,) scores -> per row: its group's size n_g, mean and unbiased std (float64)."""
    g = _group_index(group_ids, scores.device)
    G = int(g.max()) + 1 if g.numel() else 0
    s = scores.to(torch.float64)
    count = torch.zeros(G, dtype=s.dtype, device=s.device).index_add_(0, g, torch.ones_like(s))
    mean = torch.zeros_like(count).index_add_(0, g, s) / count
    sq = torch.zeros_like(count).index_add_(0, g, (s - mean[g]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return count[g], mean[g], std[g]


def _per_token(a: torch.Tensor, count: torch.Tensor, scores: torch.Tensor,
               model_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) group advantages (0 for a group of one) and R broadcast over model tokens -> (B, T) each."""
    a = torch.where(count > 1, a, torch.zeros_like(a)).to(scores.dtype)
    m = _as(model_mask, scores)
    return a[:, None] * m, scores[:, None] * m


@torch.no_grad()
def grpo_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor | Sequence[Hashable],
    model_mask: torch.Tensor,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """a_i = (R_i − mean_g)/(std_g + eps), broadcast over model tokens.

    scores: (B,) terminal rewards R; group_ids: (B,) one id per prompt (n samples share it; any
    order); model_mask: (B, T) -> advantages (B, T), returns (B, T) = R broadcast over model tokens.
    std_g is unbiased. A group of one sample has no comparison and gets advantage 0.
    norm_by_std=False gives Dr.GRPO's a_i = R_i − mean_g.
    """
    count, mean, std = _group_moments(scores, group_ids)
    dev = scores.to(torch.float64) - mean
    return _per_token(dev / (std + eps) if norm_by_std else dev, count, scores, model_mask)


@register_estimator("grpo")
def grpo_estimator(batch: AdvantageBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """`grpo_advantages` (``batch.std_normalize`` False: Dr. GRPO)."""
    batch.need("scores", "group_ids")
    assert batch.scores is not None and batch.group_ids is not None  # need() raised otherwise
    return grpo_advantages(batch.scores, batch.group_ids, batch.model_mask, norm_by_std=batch.std_normalize)


@torch.no_grad()
def rloo_advantages(
    scores: torch.Tensor, group_ids: torch.Tensor | Sequence[Hashable], model_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: a_i = R_i − mean_{j≠i, j∈g} R_j = n_g/(n_g − 1)·(R_i − mean_g), broadcast over model tokens.

    scores: (B,), group_ids: (B,), model_mask: (B, T) -> advantages (B, T), returns (B, T) = R on
    model tokens. A group of one sample gets 0.
    """
    count, mean, _ = _group_moments(scores, group_ids)
    return _per_token(count / (count - 1).clamp(min=1) * (scores.to(torch.float64) - mean), count, scores, model_mask)


@register_estimator("rloo")
def rloo_estimator(batch: AdvantageBatch) -> tuple[torch.Tensor, torch.Tensor]:
    batch.need("scores", "group_ids")
    assert batch.scores is not None and batch.group_ids is not None  # need() raised otherwise
    return rloo_advantages(batch.scores, batch.group_ids, batch.model_mask)


# --------------------------------------------------------------------------- REINFORCE


@torch.no_grad()
def reinforce_advantages(
    scores: torch.Tensor,
    model_mask: torch.Tensor,
    baseline: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A_t = R − b on model tokens; b = batch mean of R, or the given baseline.

    scores: (B,) terminal rewards R (the undiscounted return at every model token);
    model_mask: (B, T); baseline: None, (B,) per-episode or (B, T) per-token (e.g. critic values).
    Returns advantages (B, T), returns (B, T) = R broadcast over model tokens.
    """
    m = _as(model_mask, scores)
    returns = scores[:, None] * m
    if baseline is None:
        b = scores.mean().expand_as(scores)[:, None]
    else:
        b = baseline[:, None] if baseline.dim() == 1 else baseline
    return (returns - b) * m, returns


def global_mean(scores: torch.Tensor, accelerator=None) -> torch.Tensor:
    """Mean of ``scores`` (B,) over the rows of ALL processes (each may hold a different B) -> scalar.
    One process: ``scores.mean()``. The local sum and count are reduced as scalars."""
    sums = torch.stack([scores.detach().to(torch.float64).sum(),
                        torch.tensor(float(scores.numel()), dtype=torch.float64, device=scores.device)])
    total, count = _reduce_sum(sums, accelerator).unbind()
    return (total / count.clamp(min=1.0)).to(scores.dtype)


@register_estimator("reinforce")
def reinforce_estimator(batch: AdvantageBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """`reinforce_advantages` with b the mean score over every process's episodes (as GAE and
    REINFORCE++ whiten over all processes)."""
    batch.need("scores")
    assert batch.scores is not None  # need() raised otherwise
    scores = batch.scores if batch.scores.is_floating_point() else batch.scores.float()
    baseline = global_mean(scores, batch.accelerator).expand_as(scores)
    return reinforce_advantages(scores, batch.model_mask, baseline=baseline)


@torch.no_grad()
def returns_to_go(rewards: torch.Tensor, model_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """G_t = Σ_{s ≥ t, s a model token} γ^(k(s) − k(t))·r_s, k counting model tokens only.

    rewards, model_mask: (B, T) -> (B, T), 0 where mask = 0 (rewards there are ignored).
    """
    m = model_mask.to(device=rewards.device).bool()
    running = rewards.new_zeros(rewards.shape[0])
    out = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(m[:, t], rewards[:, t] + gamma * running, running)
        out[:, t] = running
    return out * m.to(rewards.dtype)


@register_estimator("reinforce_pp")
def reinforce_pp_estimator(batch: AdvantageBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): A_t = whiten_batch(G_t), G_t the token-level return-to-go of the
    token rewards (terminal reward − β·KL per token); the mean and std are over the model tokens of
    every process. returns = G (un-whitened)."""
    batch.need("token_rewards")
    assert batch.token_rewards is not None  # need() raised otherwise
    returns = returns_to_go(batch.token_rewards, batch.model_mask, batch.gamma)
    return masked_whiten(returns, batch.model_mask, accelerator=batch.accelerator), returns


@torch.no_grad()
def reinforce_pp_baseline_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor | Sequence[Hashable],
    model_mask: torch.Tensor,
    accelerator=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline (Hu et al. 2025; verl's compute_reinforce_plus_plus_baseline_outcome_advantage):
    a_i = R_i − mean_g on every model token of episode i, then A = whiten(a) over the model tokens of
    every process (mean and unbiased std of the (B, T) token values, so long episodes weigh more).

    scores: (B,) terminal rewards R; group_ids: (B,) one id per prompt; model_mask: (B, T) ->
    advantages (B, T), returns (B, T) = R broadcast over model tokens. A group of one sample has
    a_i = 0 before whitening (as grpo and rloo); after it, a group whose samples all scored the same
    gets −μ/σ (the batch's token mean of a, not 0).
    """
    count, mean, _ = _group_moments(scores, group_ids)
    deviations, returns = _per_token(scores.to(torch.float64) - mean, count, scores, model_mask)
    return masked_whiten(deviations, model_mask, accelerator=accelerator), returns


@register_estimator("reinforce_pp_baseline")
def reinforce_pp_baseline_estimator(batch: AdvantageBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """`reinforce_pp_baseline_advantages`, whitened over every process's model tokens."""
    batch.need("scores", "group_ids")
    assert batch.scores is not None and batch.group_ids is not None  # need() raised otherwise
    scores = batch.scores if batch.scores.is_floating_point() else batch.scores.float()
    return reinforce_pp_baseline_advantages(scores, batch.group_ids, batch.model_mask, batch.accelerator)


# --------------------------------------------------------------------------- per-verdict credit


@torch.no_grad()
def two_choice_advantages(
    choice_logp: torch.Tensor, reward_gap: torch.Tensor, choice_mask: torch.Tensor, accelerator=None
) -> torch.Tensor:
    """Exact advantage of a two-way choice whose own reward is known for both options:
    A = r(a) − Σ_b π(b)·r(b) = (1 − π(a))·(r(a) − r(other)), scaled to unit RMS over the choices.

    choice_logp: (B, T) log π(a) of the chosen option (renormalised over the two), reward_gap:
    (B, T) r(a) − r(other), choice_mask: (B, T) 1 at choices -> (B, T), 0 off the choices.
    """
    m = choice_mask.to(choice_logp.dtype)
    a = (1.0 - choice_logp.exp()) * reward_gap * m
    n, square_sum = _reduce_sum(torch.stack([m.sum().double(), (a.double() ** 2).sum()]), accelerator).unbind()
    rms = torch.sqrt(square_sum / n.clamp(min=1.0)).to(a.dtype)
    return torch.where(rms > 0, a / rms.clamp(min=1e-12), torch.zeros_like(a))


@torch.no_grad()
def centred_reward_gaps(choice_logp: torch.Tensor, reward_gap: torch.Tensor, opened: torch.Tensor,
                        choice_mask: torch.Tensor, accelerator=None) -> tuple[torch.Tensor, float]:
    """The verdicts' reward gaps less the batch's price of opening b, so that their own credit moves
    which candidates are opened and not how many: with g_i = r_i(open) − r_i(skip) = s_i·gap_i
    (s_i = +1 where the verdict opened, −1 where it skipped) and w_i = π_i·(1 − π_i), the slope of
    π(open) in its logit (the same for either choice), b = Σ_i w_i·g_i / Σ_i w_i and the new gap is
    gap_i − s_i·b. The expected push of the two-way advantage on each open logit is w_i·g_i, so after
    the shift the pushes sum to zero over the batch (all processes).

    choice_logp: (B, T) log π(a) of the chosen option (renormalised over the two), reward_gap: (B, T)
    r(a) − r(other), opened: (B, T) 1 where the chosen option opens, choice_mask: (B, T) 1 at choices
    -> ((B, T) gaps, 0 off the choices; b).
    """
    m = choice_mask.to(reward_gap.dtype)
    p = choice_logp.exp()
    w = p * (1.0 - p) * m
    s = (2.0 * opened.to(reward_gap.dtype) - 1.0) * m
    total_w, total_wg = _reduce_sum(torch.stack([w.sum().double(), (w * s * reward_gap).sum().double()]),
                                    accelerator).unbind()
    price = float(total_wg / total_w) if float(total_w) > 0 else 0.0
    return priced_gaps(reward_gap, opened, choice_mask, price), price


def priced_gaps(reward_gap: torch.Tensor, opened: torch.Tensor, choice_mask: torch.Tensor,
                price: float) -> torch.Tensor:
    """The verdicts' reward gaps with opening made ``price`` dearer: r(open) − r(skip) falls by price for
    every verdict, so the gap of the option taken becomes gap − s·price (s = +1 where it opened, −1
    where it skipped).

    reward_gap: (B, T) r(taken) − r(other), opened: (B, T) 1 where the taken option opens,
    choice_mask: (B, T) 1 at choices -> (B, T), 0 off the choices.
    """
    m = choice_mask.to(reward_gap.dtype)
    s = (2.0 * opened.to(reward_gap.dtype) - 1.0) * m
    return (reward_gap - s * price) * m
