"""PPO math for SEEDS-R1: small pure torch functions, one formula each.

Notation used in every docstring:
    B  rows (episodes) in a batch,  T  token positions per row,  V  vocabulary size.
    model_mask / mask (B, T): 1 on tokens the policy generated (trained), 0 on prompt, observation
        and padding tokens. Masks may be bool, int or float; they are cast to the data's dtype.
    logp, old_logp, ref_logp (B, T): log-probabilities of the sampled token under the current,
        behaviour (old) and reference policies.

The policy loss is per token (`policy_loss_terms`, reduced by `aggregate_loss`); the value loss
returns a SUM over masked tokens, which the trainer divides by `global_token_count`. KL estimators live in
:mod:`training.algorithm.kl_estimators`, advantage estimators in
:mod:`training.algorithm.advantages`. Nothing here keeps state.
"""
from __future__ import annotations

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


# --------------------------------------------------------------------------- losses


def policy_loss_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate per token (unmasked; aggregate it with `aggregate_loss`).

    logp, old_logp, advantages, mask: (B, T) -> loss (B, T), stats.
        ρ = exp(logp − old_logp)   (log-ratio clamped to ±20)
        L = max(−A·ρ, −A·clip(ρ, 1 − clip_low, 1 + clip_high))
        dual clip c > 1 (Ye et al. 2020), A < 0 only:  L = min(L, −c·A)  — bounds the loss when ρ ≫ 1.
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
    return loss, stats


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


LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")


def aggregate_loss(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    global_tokens: torch.Tensor,
    global_sequences: torch.Tensor,
    norm_tokens: float = 1.0,
) -> torch.Tensor:
    """This micro-batch's share of the aggregated loss: summed over the micro-batches of a mini-batch
    and averaged over processes (DDP, after multiplying by the process count) it is

        token_mean:               Σ_i Σ_t m·L / N_tok                  (every token weighs the same)
        seq_mean_token_mean:      Σ_i (Σ_t m·L / n_i) / N_seq          (every sequence weighs the same)
        seq_mean_token_sum:       Σ_i Σ_t m·L / N_seq
        seq_mean_token_sum_norm:  Σ_i Σ_t m·L / (N_seq · norm_tokens)  (Dr. GRPO: a constant normaliser)

    loss, mask: (B, T); n_i the model tokens of row i; global_tokens N_tok and global_sequences N_seq
    (rows with a model token) are counts over the whole mini-batch of EVERY process (scalars).
    """
    m = _as(mask, loss)
    per_row = (loss * m).sum(dim=1)  # (B,)
    sequences = global_sequences.clamp(min=1.0)
    if mode == "token_mean":
        return per_row.sum() / global_tokens.clamp(min=1.0)
    if mode == "seq_mean_token_mean":
        return (per_row / m.sum(dim=1).clamp(min=1.0)).sum() / sequences
    if mode == "seq_mean_token_sum":
        return per_row.sum() / sequences
    if mode == "seq_mean_token_sum_norm":
        return per_row.sum() / (sequences * norm_tokens)
    raise ValueError(f"unknown loss aggregation {mode!r}; choose from {LOSS_AGGREGATIONS}")


def global_sequence_count(mask: torch.Tensor, accelerator=None) -> torch.Tensor:
    """Rows with at least one model token, summed over all processes. mask: (B, T) -> scalar.

    The local count is reduced as one scalar: processes hold different numbers of rows (verdict rows,
    dynamic sampling), and a collective over a per-row vector would pair unequal tensors."""
    return _reduce_sum((mask.sum(dim=1) > 0).to(torch.float32).sum(), accelerator)


@torch.no_grad()
def importance_weights(
    old_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    level: str = "token",
    mode: str = "truncate",
    cap: float = 2.0,
    low: float = 0.5,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Off-policy correction of the sampler against the trainer's old policy.

    old_logp, sampler_logp, mask: (B, T) -> weights (B, T) (0 off the mask), stats.
        token:     w_t = exp(old_logp_t − sampler_logp_t)
        sequence:  w_i = exp(Σ_t m·(old_logp − sampler_logp)) for every token of row i
        truncate (TIS):  w ← min(w, cap)
        mask:            w ← 1 if low ≤ w ≤ cap else 0   (drops the token / the whole sequence)
    stats: weight_mean, clipped_frac (share of tokens whose w was capped or dropped), raw_max.
    """
    m = _as(mask, old_logp)
    log_w = (old_logp - sampler_logp) * m
    if level == "sequence":
        log_w = log_w.sum(dim=1, keepdim=True).expand_as(log_w)
    elif level != "token":
        raise ValueError(f"importance sampling level must be 'token' or 'sequence', not {level!r}")
    raw = torch.exp(log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    if mode == "truncate":
        weights, changed = raw.clamp(max=cap), raw > cap
    elif mode == "mask":
        keep = (raw >= low) & (raw <= cap)
        weights, changed = keep.to(raw.dtype), ~keep
    else:
        raise ValueError(f"importance sampling mode must be 'truncate' or 'mask', not {mode!r}")
    weights = weights * m
    stats = {"weight_mean": masked_mean(weights, m), "clipped_frac": masked_mean(changed.to(raw.dtype), m),
             "raw_max": torch.where(m.bool(), raw, torch.zeros_like(raw)).max()}
    return weights, stats


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 − Var[R − V] / Var[R] over model tokens (1: perfect critic, 0: no better than the mean).

    values, returns, mask: (B, T) -> scalar; NaN when Var[R] = 0.
    """
    var_r = masked_var(returns, mask)
    ev = 1.0 - masked_var(returns - values, mask) / var_r
    return torch.where(var_r > 0, ev, torch.full_like(ev, float("nan")))
