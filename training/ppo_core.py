"""PPO math for SEEDS-R1: small pure torch functions, one formula each.

Notation used in every docstring:
    B  rows (episodes) in a batch,  T  token positions per row,  V  vocabulary size.
    model_mask / mask (B, T): 1 on tokens the policy generated (trained), 0 on prompt, observation
        and padding tokens. Masks may be bool, int or float; they are cast to the data's dtype.
    logp, old_logp, ref_logp (B, T): log-probabilities of the sampled token under the current,
        behaviour (old) and reference policies.

Losses return SUMS over masked tokens; the trainer divides by `global_token_count` (see its
docstring for why). Nothing here keeps state except the `ADVANTAGE_ESTIMATORS` registry.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

WHITEN_EPS = 1e-8
LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: keeps ratios finite without touching realistic values


# --------------------------------------------------------------------------- masked statistics


def _as(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return mask.to(dtype=x.dtype, device=x.device)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x·mask.

    x, mask: (B, T) (any equal shapes). dim=None -> scalar; dim=d -> x.shape without d.
    """
    m = _as(mask, x)
    return (x * m).sum() if dim is None else (x * m).sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x·mask / Σ mask; 0 where the mask is empty.

    x, mask: (B, T). dim=None -> scalar; dim=d -> x.shape without d.
    """
    count = masked_sum(torch.ones_like(x), mask, dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of x over entries with mask == 1: Σ m·(x − μ)² / (N − 1) (or / N if not unbiased).

    x, mask: (B, T) -> scalar. N = Σ mask; returns 0 when N ≤ 1 (unbiased) or N = 0.
    """
    mean = masked_mean(x, mask)
    sq = masked_sum((x - mean) ** 2, mask)
    n = masked_sum(torch.ones_like(x), mask)
    denom = n - 1.0 if unbiased else n
    return torch.where(denom > 0, sq / denom.clamp(min=1.0), torch.zeros_like(sq))


def _reduce_sum(t: torch.Tensor, accelerator=None) -> torch.Tensor:
    """Sum of ``t`` over all processes (accelerate, else torch.distributed, else local)."""
    if accelerator is not None:
        return accelerator.reduce(t, reduction="sum")
    if dist.is_available() and dist.is_initialized():
        total = t.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total
    return t


def global_masked_moments(x: torch.Tensor, mask: torch.Tensor, accelerator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased variance of x over mask == 1 entries of ALL processes.

    x, mask: (B, T) -> (μ, σ²) scalars, from the reduced Σm, Σm·x and Σm·x². One process: the
    same values as :func:`masked_mean` / :func:`masked_var`.
    """
    m = _as(mask, x).detach()
    xd = x.detach().to(torch.float64)
    sums = torch.stack([m.sum().double(), (m * xd).sum(), (m * xd * xd).sum()])
    n, s1, s2 = _reduce_sum(sums, accelerator).unbind()
    mean = s1 / n.clamp(min=1.0)
    var = torch.where(n > 1, (s2 - n * mean * mean) / (n - 1.0).clamp(min=1.0), torch.zeros_like(n))
    return mean.to(x.dtype), var.clamp(min=0.0).to(x.dtype)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, accelerator=None) -> torch.Tensor:
    """(x − μ)/sqrt(σ² + 1e-8) with μ, σ² (unbiased) over mask == 1 only; masked-out entries -> 0.

    x, mask: (B, T) -> (B, T). shift_mean=False adds μ back (scale only, keep the mean).
    With several processes (an ``accelerator`` or a torch.distributed group), μ and σ² are taken
    over the model tokens of ALL processes, so every rank whitens with the same statistics.
    """
    if accelerator is not None or (dist.is_available() and dist.is_initialized()):
        mean, var = global_masked_moments(x, mask, accelerator)
    else:
        mean, var = masked_mean(x, mask), masked_var(x, mask)
    white = (x - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        white = white + mean
    return white * _as(mask, x)


# --------------------------------------------------------------------------- rewards and KL


def last_token_index(model_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last model token of each row; −1 for rows without one.

    model_mask: (B, T) -> (B,) long.
    """
    m = model_mask.bool()
    T = m.shape[1]
    from_end = torch.flip(m, dims=[1]).int().argmax(dim=1)  # first True counted from the end
    return torch.where(m.any(dim=1), T - 1 - from_end, torch.full_like(from_end, -1))


def token_level_rewards(
    terminal_reward: torch.Tensor,
    model_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """r_t = R·[t = last model token] − kl_coef·kl_t·m_t (KL-in-reward mode when kl is given).

    terminal_reward: (B,) episode reward R; model_mask: (B, T); kl: (B, T) per-token KL estimate
    (usually `kl_k1(old_logp, ref_logp)`) or None. Returns (B, T), zero on non-model tokens.
    Rows without a model token get no reward (nothing could be credited).
    """
    if not terminal_reward.is_floating_point():
        terminal_reward = terminal_reward.float()
    m = _as(model_mask, terminal_reward)
    rewards = torch.zeros_like(m)
    last = last_token_index(model_mask)
    rows = torch.nonzero(last >= 0, as_tuple=True)[0]
    rewards[rows, last[rows]] = terminal_reward[rows].to(rewards.dtype)
    if kl is not None and kl_coef != 0.0:
        rewards = rewards - kl_coef * kl.to(rewards.dtype) * m
    return rewards


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = logp − ref_logp (unbiased estimate of KL(π‖π_ref), high variance, can be < 0).

    logp, ref_logp: (B, T) -> (B, T).
    """
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = ½·(logp − ref_logp)² (biased, low variance, ≥ 0; its gradient is the KL gradient).

    logp, ref_logp: (B, T) -> (B, T).
    """
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, clamp: float | None = 10.0) -> torch.Tensor:
    """k3 = exp(x) − x − 1 with x = ref_logp − logp (unbiased, low variance, ≥ 0).

    logp, ref_logp: (B, T) -> (B, T). x is clamped to ±20 and the result to ≤ clamp (None: no cap)
    so one extreme token cannot produce inf.
    """
    x = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    k3 = torch.exp(x) - x - 1.0
    return k3 if clamp is None else k3.clamp(max=clamp)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1, "kl": kl_k1,
    "k2": kl_k2, "mse": kl_k2,
    "k3": kl_k3, "low_var_kl": kl_k3,
}


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token KL estimate of the chosen kind: "k1"/"kl", "k2"/"mse", "k3"/"low_var_kl".

    logp, ref_logp: (B, T) -> (B, T) (unmasked; mask it where it is used).
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; choose from {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[kind](logp, ref_logp)


# --------------------------------------------------------------------------- advantage estimators

ADVANTAGE_ESTIMATORS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}


def register_estimator(name: str):
    """Decorator: add fn(**batch) -> (advantages (B, T), returns (B, T)) to ADVANTAGE_ESTIMATORS."""

    def wrap(fn):
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return wrap


def compute_advantages(name: str, **batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator `name`, passing the entries of `batch` its signature names.

    The trainer can hand every estimator the same batch dict (token_rewards, values, scores,
    group_ids, model_mask, gamma, ...); keys an estimator does not take are left out. A missing
    required key raises TypeError.
    """
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; choose from {sorted(ADVANTAGE_ESTIMATORS)}")
    fn = ADVANTAGE_ESTIMATORS[name]
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(**batch)
    return fn(**{k: v for k, v in batch.items() if k in params})


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
def gae_estimator(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    model_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    accelerator=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's estimator: `gae_advantages`, then advantages whitened over the model tokens of all processes.

    token_rewards, values, model_mask: (B, T) -> advantages (B, T), returns (B, T).
    returns = un-whitened A + V (the critic's target).
    """
    advantages, returns = gae_advantages(token_rewards, values, model_mask, gamma, lam)
    if whiten:
        advantages = masked_whiten(advantages, model_mask, accelerator=accelerator)
    return advantages, returns


def _group_index(group_ids: torch.Tensor | Sequence[Hashable], device) -> torch.Tensor:
    """(B,) ids of any hashable kind (ints, UUID strings) -> (B,) long in 0..G−1."""
    if isinstance(group_ids, torch.Tensor):
        return torch.unique(group_ids, return_inverse=True)[1].to(device)
    seen: dict[Hashable, int] = {}
    return torch.tensor([seen.setdefault(g, len(seen)) for g in group_ids], dtype=torch.long, device=device)


@register_estimator("grpo")
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
    g = _group_index(group_ids, scores.device)
    G = int(g.max()) + 1 if g.numel() else 0
    s = scores.to(torch.float64)  # group sums in double: exact for the small groups we use
    count = torch.zeros(G, dtype=s.dtype, device=s.device).index_add_(0, g, torch.ones_like(s))
    mean = torch.zeros_like(count).index_add_(0, g, s) / count
    dev = s - mean[g]
    sq = torch.zeros_like(count).index_add_(0, g, dev**2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    a = dev / (std[g] + eps) if norm_by_std else dev
    a = torch.where(count[g] > 1, a, torch.zeros_like(a)).to(scores.dtype)
    m = _as(model_mask, scores)
    return a[:, None] * m, scores[:, None] * m


@register_estimator("reinforce")
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


# --------------------------------------------------------------------------- losses


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate, summed over masked tokens.

    logp, old_logp, advantages, mask: (B, T) -> loss_sum (scalar), stats.
        ρ = exp(logp − old_logp)   (log-ratio clamped to ±20)
        L = max(−A·ρ, −A·clip(ρ, 1 − clip_low, 1 + clip_high))
        dual clip c > 1 (Ye et al. 2020), A < 0 only:  L = min(L, −c·A)  — bounds the loss when ρ ≫ 1.
    Divide loss_sum by `global_token_count(mask)` (not by this micro-batch's count).
    stats (detached, means over this mask): clip_frac (clipped branch strictly larger), dual_clip_frac,
    approx_kl = mean((ρ − 1) − log ρ) (k3 of KL(old‖new)), ratio_max.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    dual_active = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip is not None:
        bound = -dual_clip * advantages
        dual_active = (advantages < 0) & (loss > bound)
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    with torch.no_grad():
        stats = {
            "clip_frac": masked_mean((loss_clipped > loss_unclipped).to(loss.dtype), mask),
            "dual_clip_frac": masked_mean(dual_active.to(loss.dtype), mask),
            "approx_kl": masked_mean(ratio - 1.0 - log_ratio, mask),
            "ratio_max": torch.where(mask.bool(), ratio, torch.zeros_like(ratio)).max(),
        }
    return masked_sum(loss, mask), stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss, summed over masked tokens.

    values, old_values, returns, mask: (B, T) -> loss_sum (scalar), stats.
        V_clip = old_V + clamp(V − old_V, −clip, clip)
        L = ½·max((V − R)², (V_clip − R)²)          (clip=None: ½·(V − R)²)
    stats (detached): clip_frac = share of tokens where the clipped term is strictly larger.
    """
    unclipped = (values - returns) ** 2
    if clip is None:
        loss, clipped_wins = 0.5 * unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (v_clip - returns) ** 2
        loss, clipped_wins = 0.5 * torch.maximum(unclipped, clipped), clipped > unclipped
    with torch.no_grad():
        stats = {"clip_frac": masked_mean(clipped_wins.to(loss.dtype), mask)}
    return masked_sum(loss, mask), stats


# --------------------------------------------------------------------------- logits -> per-token quantities


def _chunked_over_tokens(fn, logits: torch.Tensor, *others: torch.Tensor, chunk: int | None) -> torch.Tensor:
    """Apply fn(logits_rows (N, V), *others_rows (N, ...)) -> (N,) over the B·T positions in chunks.

    logits: (B, T, V), others: (B, T, ...) -> (B, T) float32. Each chunk is upcast to float32 on its
    own; when gradients are needed, chunks are checkpointed so backward keeps only the inputs and
    recomputes one chunk's (chunk, V) intermediates at a time.
    """
    B, T, V = logits.shape
    flat = logits.reshape(B * T, V)
    flat_others = [o.reshape(B * T, *o.shape[2:]) for o in others]
    if chunk is None or chunk >= B * T:
        return fn(flat, *flat_others).reshape(B, T)
    grad = torch.is_grad_enabled() and logits.requires_grad
    outs = []
    for s in range(0, B * T, chunk):
        parts = [flat[s : s + chunk]] + [o[s : s + chunk] for o in flat_others]
        outs.append(checkpoint(fn, *parts, use_reentrant=False) if grad else fn(*parts))
    return torch.cat(outs).reshape(B, T)


def _logprob_rows(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    z = logits.float()
    return z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


def _entropy_rows(logits: torch.Tensor) -> torch.Tensor:
    z = logits.float()
    return torch.logsumexp(z, dim=-1) - (F.softmax(z, dim=-1) * z).sum(dim=-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk: int | None = 1024) -> torch.Tensor:
    """log softmax(logits)[label] = z_label − logsumexp(z), without materialising (B, T, V) log-probs.

    logits: (B, T, V) (any float dtype), labels: (B, T) long -> (B, T) float32. Positions are
    aligned as given: shift before calling (logits[:, :-1] scores labels = ids[:, 1:]).
    chunk: positions (of the B·T) per chunk; peak extra memory ≈ chunk·V·4 bytes (1024 × 262k ≈ 1 GiB).
    None: one pass.
    """
    return _chunked_over_tokens(_logprob_rows, logits, labels, chunk=chunk)


def entropy_from_logits(logits: torch.Tensor, chunk: int | None = 1024) -> torch.Tensor:
    """H_t = logsumexp(z_t) − Σ_v softmax(z_t)_v·z_t,v, chunked like `logprobs_from_logits`.

    logits: (B, T, V) -> (B, T) float32.
    """
    return _chunked_over_tokens(_entropy_rows, logits, chunk=chunk)


def choice_logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, choice_ids: torch.Tensor) -> torch.Tensor:
    """log π(label | label ∈ C) = z_label − logsumexp(z_C): the log-prob of a token drawn among
    the choices C only (a constrained verdict; what the sampler returns for it).

    logits: (N, V), labels: (N,) long, choice_ids: (C,) long -> (N,) float32.
    """
    z = logits.float()
    return z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z[:, choice_ids], dim=-1)


def choice_entropy_from_logits(logits: torch.Tensor, choice_ids: torch.Tensor) -> torch.Tensor:
    """Entropy of the distribution renormalised over the choices C: H = −Σ_{c∈C} p_c log p_c.

    logits: (N, V), choice_ids: (C,) long -> (N,) float32.
    """
    return _entropy_rows(logits[:, choice_ids])


def entropy_sum(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ H_t over model tokens (divide by `global_token_count`, like the policy loss).

    entropy, mask: (B, T) -> scalar.
    """
    return masked_sum(entropy, mask)


# --------------------------------------------------------------------------- aggregation and diagnostics


def global_token_count(mask: torch.Tensor, accelerator=None) -> torch.Tensor:
    """Number of model tokens in the whole mini-batch summed over ALL processes: the token-mean denominator.

    mask: (B, T) for this process's full mini-batch (every micro-batch it will accumulate) -> scalar
    float tensor, ≥ 1. Summed with `accelerator.reduce(..., "sum")` when an accelerate Accelerator
    is given, else with torch.distributed all_reduce when a process group is initialised, else local.

    Why: the PPO objective is the mean over every model token of the mini-batch. Averaging per
    micro-batch (or per process) means instead weights each token by 1/(its micro-batch's token
    count), so tokens in micro-batches of short episodes count more than tokens of long ones, and
    the gradient depends on how episodes were split into micro-batches and processes. Summing
    per-token losses and dividing by this one global count gives the true token mean.
    Note: DDP/accelerate AVERAGE gradients over the W processes, so use
    loss = loss_sum · W / global_token_count to get the token mean's gradient.
    """
    return _reduce_sum(mask.detach().to(torch.float32).sum(), accelerator).clamp(min=1.0)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 − Var[R − V] / Var[R] over model tokens (1: perfect critic, 0: no better than the mean).

    values, returns, mask: (B, T) -> scalar; NaN when Var[R] = 0.
    """
    var_r = masked_var(returns, mask)
    ev = 1.0 - masked_var(returns - values, mask) / var_r
    return torch.where(var_r > 0, ev, torch.full_like(ev, float("nan")))
