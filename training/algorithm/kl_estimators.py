"""KL estimators between the policy and the reference, per token: one formula each.

Notation as in :mod:`training.algorithm.ppo_core`: logp, ref_logp (B, T) log-probabilities of the sampled
token under the current (or old) policy and the reference. Which one a run uses is
``PPOConfig.kl_estimator``; docs/rl_algorithms.md ("KL estimators") says which gradient each
follows as a loss.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from training.algorithm.ppo_core import LOG_RATIO_CLAMP, global_masked_moments


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


def kl_two_way_exact(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Exact KL(π‖π_ref) of a two-way choice from the log-prob of the option taken:
    p log(p/q) + (1 − p) log((1 − p)/(1 − q)), p = exp(logp), q = exp(ref_logp), renormalised over
    the two options (a constrained verdict's log-prob). The same value whichever option was sampled:
    no sampling variance, and as a loss its gradient is the true gradient of KL(π‖π_ref).

    logp, ref_logp: (B, T) -> (B, T) ≥ 0. Log-probs are capped just below 0 so that
    log(1 − p) stays finite; off the choices (logp = ref_logp = 0) the result is 0.
    """
    cap = -1e-7
    lp, lq = logp.clamp(-LOG_RATIO_CLAMP, cap), ref_logp.clamp(-LOG_RATIO_CLAMP, cap)
    l1p, l1q = torch.log(-torch.expm1(lp)), torch.log(-torch.expm1(lq))  # log(1 − p), log(1 − q)
    return lp.exp() * (lp - lq) + torch.exp(l1p) * (l1p - l1q)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1, "kl": kl_k1,
    "k2": kl_k2, "mse": kl_k2,
    "k3": kl_k3, "low_var_kl": kl_k3,
    "exact": kl_two_way_exact,
}


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token KL estimate of the chosen kind: "k1"/"kl", "k2"/"mse", "k3"/"low_var_kl", "exact".

    logp, ref_logp: (B, T) -> (B, T) (unmasked; mask it where it is used).
    As values (KL in the reward) k1 and k3 are unbiased estimates of KL(π‖π_ref) on tokens drawn
    from π. As a loss on tokens drawn from π_old = π their gradients differ: k1's expected gradient
    is 0; k2's is ∇KL(π‖π_ref); k3's is ∇KL(π_ref‖π) = −Σ π_ref ∇log π (the reverse direction);
    "exact" (two-way choices only) is KL(π‖π_ref) itself.
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; choose from {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[kind](logp, ref_logp)


def kl_token_scope(kl_tokens: str, mb: dict[str, torch.Tensor]) -> torch.Tensor:
    """Where the KL term to the reference applies (``algorithm.kl_tokens``): "all", every model token;
    "verdicts", the constrained verdict tokens; "verdicts_answer", those and the answering turn's tokens.

    mb: a batch with ``model_mask`` and ``choice_mask`` (B, T), and ``answer_mask`` (B, T) for
    "verdicts_answer" (absent: no answer turn) -> (B, T) in {0, 1}.
    """
    mask = mb["model_mask"]
    if kl_tokens == "all":
        return mask
    scope = mb["choice_mask"]
    if kl_tokens == "verdicts_answer" and "answer_mask" in mb:
        scope = torch.maximum(scope, mb["answer_mask"].to(scope.dtype))
    return scope * mask


def open_logits(choice_logp: torch.Tensor, opened: torch.Tensor) -> torch.Tensor:
    """The open-vs-skip logit z = log π(open) − log π(skip) of each two-way verdict, from the log-prob
    of the option taken (renormalised over the two): z = ±(logp − log(1 − p)), + where it opened.

    choice_logp: (B, T), opened: (B, T) 1 where the chosen option opens -> (B, T) (meaningless off
    the choices; mask it where it is used).
    """
    lp = choice_logp.clamp(-LOG_RATIO_CLAMP, -1e-7)
    logit = lp - torch.log(-torch.expm1(lp))
    return torch.where(opened.bool(), logit, -logit)


@torch.no_grad()
def verdict_level_shift(old_logp: torch.Tensor, ref_logp: torch.Tensor, opened: torch.Tensor,
                        choice_mask: torch.Tensor, accelerator=None) -> float:
    """How far the verdicts' shared yes level has moved from the reference: δ = mean_i (z_old,i − z_ref,i)
    over the batch's verdicts (all processes), z the open logit (:func:`open_logits`); 0 without verdicts.

    old_logp, ref_logp: (B, T) log-probs of the option taken; opened: (B, T) 1 where it opens;
    choice_mask: (B, T) 1 at verdicts -> δ in logits.
    """
    z_old, z_ref = open_logits(old_logp, opened), open_logits(ref_logp, opened)
    return float(global_masked_moments(z_old - z_ref, choice_mask.to(old_logp.dtype), accelerator)[0])


@torch.no_grad()
def level_free_reference(old_logp: torch.Tensor, ref_logp: torch.Tensor, opened: torch.Tensor,
                         choice_mask: torch.Tensor, accelerator=None) -> tuple[torch.Tensor, float]:
    """The reference's verdict log-probs with its open logits shifted by the batch's mean shift of the
    policy from it, δ = mean_i (z_old,i − z_ref,i) (all processes): a KL to this reference anchors how
    the verdicts differ from one another, not the yes level they share, which the reward then sets.

    old_logp, ref_logp: (B, T) log-probs of the option taken; opened: (B, T) 1 where it opens;
    choice_mask: (B, T) 1 at verdicts -> ((B, T) reference log-probs, changed at the verdicts only; δ).
    """
    m = choice_mask.to(old_logp.dtype)
    shift = verdict_level_shift(old_logp, ref_logp, opened, choice_mask, accelerator)
    z_shifted = open_logits(ref_logp, opened) + shift
    chosen = torch.where(opened.bool(), z_shifted, -z_shifted)  # the taken option's logit against the other
    shifted_logp = -torch.nn.functional.softplus(-chosen)  # log σ(chosen)
    return torch.where(m.bool(), shifted_logp, ref_logp), shift


def level_hold_terms(logp: torch.Tensor, ref_logp: torch.Tensor, opened: torch.Tensor,
                     choice_mask: torch.Tensor, target: float | None = None) -> torch.Tensor:
    """Per-verdict terms whose sum has the gradient of ½·n·d² over the n verdicts given (a micro-batch's),
    z from :func:`open_logits`: d = mean_i (z_i − z_ref,i), the verdicts' shared shift of open logit from
    the reference, or with ``target`` d = mean_i z_i − target, the shared level's distance from a fixed
    open logit (0: the greedy cut at π(open) = ½). Each term is d·(z_i − z_ref,i) with d held constant
    (z_ref is a constant, so the gradient is d·∇z_i): summed, they pull every verdict's open logit by the
    same d, so the shared level returns to the reference's (or the target) and the spread is left alone.

    logp: (B, T) current log-probs of the option taken (with gradient), ref_logp: (B, T), opened:
    (B, T) 1 where the taken option opens, choice_mask: (B, T) 1 at verdicts -> (B, T), 0 off them.
    """
    at = choice_mask.bool()
    safe = torch.full_like(logp, -0.5)  # off the verdicts a fixed value: their log-probs (padding too) stay out
    z = open_logits(torch.where(at, logp, safe), opened)
    z_ref = open_logits(torch.where(at, ref_logp, safe), opened)
    gap = torch.where(at, z - z_ref, torch.zeros_like(z))
    n = at.sum().clamp(min=1)
    if target is None:
        d = (gap.sum() / n).detach()
    else:
        d = (torch.where(at, z, torch.zeros_like(z)).sum() / n - target).detach()
    return d * gap

