"""Search momentum (MAPS §2, A.1): does accumulated query drift predict the next sub-query's drift?

One trajectory per question, as embeddings ``E`` of shape ``(T+1, D)``:

- ``e_0``: the question; ``e_t`` (t = 1..T): the t-th retrieval round's sub-query. A round with
  several sub-queries (MAPS's parallel sub-queries) is the L2-normalised mean of their embeddings
  (:func:`round_embedding`), so every round is one step.
- displacement ``d_t = e_t - e_{t-1}``;
- momentum ``m_0 = 0``, ``m_t = beta_t * m_{t-1} + (1 - beta_t) * d_t``, ``beta_t`` in [0, 1);
- stepwise directional alignment ``S_t = cos(m_{t-1}, e_t - e_0)`` for t >= 2.

The cosines depend on the betas only through the ratios of the weights the momentum puts on
d_1, d_2, ...; ``beta_1`` only scales ``m_1 = (1 - beta_1) d_1`` and trades off exactly against
``beta_2``, so it is not identifiable. We fix ``beta_1 = 0`` (``m_1 = d_1``) and fit
``beta_2, beta_3, beta_4``: the free parameters of S_2..S_5 (S_2 depends on no beta at all).

Fitting (A.1): trajectories with fewer than three rounds are dropped; the questions are split by
a seeded permutation of their sorted ids into a fitting and a disjoint held-out part; the betas
maximise the objective (the equal-weight mean over t = 2..5 of the mean S_t over the trajectories
that reach step t) by L-BFGS-B (bounds [0, 0.999], at most 500 iterations, a few starting
points, best kept); S_t is then reported on the held-out part.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

FIT_STEPS = (2, 3, 4, 5)  # the alignment steps in the objective: S_2..S_5
MIN_ROUNDS = 3  # shorter trajectories are dropped (A.1)
BETA_BOUNDS = (0.0, 0.999)
BETA_1 = 0.0  # fixed: see the module docstring
MAX_ITER = 500
STARTS = (0.2, 0.5, 0.8)  # L-BFGS-B starting values (the same for every free beta)
Betas = Sequence[float] | np.ndarray  # betas as a list or as the optimiser's array


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity; 0 where either vector is zero.

    a, b: ``(..., D)`` -> ``(...)``.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    dots = np.sum(a * b, axis=-1)
    return np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 0.0)


def round_embedding(vectors: np.ndarray) -> np.ndarray:
    """One step's embedding from its sub-queries' embeddings: the L2-normalised mean.

    vectors: ``(k, D)``, k >= 1 -> ``(D,)`` (all zeros if the mean is zero).
    """
    mean = np.asarray(vectors, dtype=np.float64).mean(axis=0)
    norm = np.linalg.norm(mean)
    return mean / norm if norm > 0 else mean


def displacements(trajectory: np.ndarray) -> np.ndarray:
    """``d_t = e_t - e_{t-1}``. trajectory ``(T+1, D)`` -> ``(T, D)``, row t-1 holds d_t."""
    trajectory = np.asarray(trajectory, dtype=np.float64)
    return trajectory[1:] - trajectory[:-1]


def momentum(disp: np.ndarray, betas: Betas) -> np.ndarray:
    """``m_t = beta_t m_{t-1} + (1 - beta_t) d_t`` from ``m_0 = 0``.

    disp: ``(T, D)`` (row t-1 = d_t), or batched ``(N, T, D)``; betas: ``(>= T,)``, betas[t-1] = beta_t.
    Returns the same shape as ``disp``; row t-1 holds m_t.
    """
    disp = np.asarray(disp, dtype=np.float64)
    out = np.zeros_like(disp)
    previous = np.zeros_like(disp[..., 0, :])
    for t in range(disp.shape[-2]):
        beta = float(betas[t])
        previous = beta * previous + (1.0 - beta) * disp[..., t, :]
        out[..., t, :] = previous
    return out


def alignment_scores(trajectory: np.ndarray, betas: Sequence[float]) -> np.ndarray:
    """``S_t = cos(m_{t-1}, e_t - e_0)`` for t = 2..T.

    trajectory: ``(T+1, D)`` (row 0 = e_0); betas: ``(>= T-1,)``, betas[t-1] = beta_t.
    Returns ``(T-1,)``; element j holds S_{j+2}.
    """
    trajectory = np.asarray(trajectory, dtype=np.float64)
    m = momentum(displacements(trajectory)[:-1], betas)  # m_1..m_{T-1}
    return cosine(m, trajectory[2:] - trajectory[0])


def pad_trajectories(trajectories: Sequence[np.ndarray],
                     max_step: int = FIT_STEPS[-1]) -> tuple[np.ndarray, np.ndarray]:
    """Stack trajectories, cut to ``e_0..e_{max_step}`` and zero-padded, for batched scoring.

    trajectories: each ``(T_i+1, D)`` -> (``E (N, max_step+1, D)``, ``rounds (N,)`` = min(T_i, max_step)).
    """
    dim = np.asarray(trajectories[0]).shape[-1]
    E = np.zeros((len(trajectories), max_step + 1, dim))
    rounds = np.zeros(len(trajectories), dtype=int)
    for i, trajectory in enumerate(trajectories):
        trajectory = np.asarray(trajectory, dtype=np.float64)[: max_step + 1]
        E[i, : len(trajectory)] = trajectory
        rounds[i] = len(trajectory) - 1
    return E, rounds


def batch_alignment(E: np.ndarray, rounds: np.ndarray, betas: Betas) -> np.ndarray:
    """S_t of every padded trajectory; NaN past a trajectory's last round.

    E: ``(N, P, D)``, rounds: ``(N,)``, betas: ``(>= P-2,)`` -> ``(N, P-2)``; column j holds S_{j+2}.
    """
    m = momentum(E[:, 1:-1] - E[:, :-2], betas)  # m_1..m_{P-2}
    scores = cosine(m, E[:, 2:] - E[:, :1])
    reached = np.arange(2, E.shape[1])[None, :] <= rounds[:, None]
    return np.where(reached, scores, np.nan)


def stepwise_alignment(E: np.ndarray, rounds: np.ndarray, betas: Betas) -> tuple[np.ndarray, np.ndarray]:
    """Mean S_t over the trajectories reaching step t, and their number.

    -> (``means (P-2,)``, NaN where no trajectory reaches t; ``counts (P-2,)``); index j is step j+2.
    """
    scores = batch_alignment(E, rounds, betas)
    counts = np.sum(~np.isnan(scores), axis=0)
    sums = np.nansum(scores, axis=0)
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan), counts


def alignment_objective(E: np.ndarray, rounds: np.ndarray, betas: Betas) -> float:
    """Equal-weight mean over the steps reached by some trajectory of the per-step mean S_t."""
    means, counts = stepwise_alignment(E, rounds, betas)
    return float(np.mean(means[counts > 0])) if np.any(counts > 0) else math.nan


def full_betas(free: Betas) -> np.ndarray:
    """``(beta_1, beta_2, ...)`` with beta_1 fixed: free ``(k,)`` -> ``(k+1,)``."""
    return np.concatenate([[BETA_1], np.asarray(free, dtype=np.float64)])


def fit_betas(E: np.ndarray, rounds: np.ndarray) -> tuple[np.ndarray, float]:
    """beta_2..beta_{P-2} maximising :func:`alignment_objective` on (E, rounds) by L-BFGS-B.

    E: ``(N, P, D)``; returns (``free betas (P-3,)``, the objective there). The best of the
    :data:`STARTS` runs is kept, so the result is deterministic.
    """
    from scipy.optimize import minimize

    n_free = E.shape[1] - 3

    def loss(free: np.ndarray) -> float:
        return -alignment_objective(E, rounds, full_betas(free))

    best = None
    for start in STARTS:
        result = minimize(loss, x0=np.full(n_free, start), method="L-BFGS-B",
                          bounds=[BETA_BOUNDS] * n_free, options={"maxiter": MAX_ITER})
        if best is None or result.fun < best.fun:
            best = result
    assert best is not None  # STARTS is not empty
    return np.clip(best.x, *BETA_BOUNDS), float(-best.fun)


def split_ids(ids: Sequence[str], fit_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Disjoint (fit, held-out) question ids: a seeded permutation of the sorted ids.

    round(fit_fraction * n) go to fitting, at least one on each side when n >= 2.
    """
    ordered = sorted(ids)
    order = np.random.default_rng(seed).permutation(len(ordered))
    n_fit = round(fit_fraction * len(ordered))
    if len(ordered) >= 2:
        n_fit = min(max(n_fit, 1), len(ordered) - 1)
    fit = [ordered[i] for i in order[:n_fit]]
    held = [ordered[i] for i in order[n_fit:]]
    return fit, held


def _by_step(values: np.ndarray, steps: Sequence[int]) -> dict[str, float | None]:
    return {str(t): (None if math.isnan(v) else float(v)) for t, v in zip(steps, values)}


def momentum_analysis(trajectories: Mapping[str, np.ndarray], fit_fraction: float = 0.5, seed: int = 0,
                      min_per_split: int = 2) -> dict:
    """Fit beta_2..beta_4 on one split, report held-out S_2..S_5 (see the module docstring).

    trajectories: question id -> ``(T+1, D)``. Returns a JSON-ready dict; ``status`` is ``"ok"`` or
    ``"too_few_trajectories"`` (fewer than ``min_per_split`` usable trajectories on either side).
    A beta whose step no fitting trajectory reaches is reported as None, and the held-out S_t that
    would need it too.
    """
    usable = {k: v for k, v in trajectories.items() if len(v) - 1 >= MIN_ROUNDS}
    out: dict = {"n_trajectories": len(trajectories), "n_dropped_short": len(trajectories) - len(usable),
                 "min_rounds": MIN_ROUNDS, "beta_1": BETA_1, "fit_fraction": fit_fraction, "seed": seed}
    fit_ids, held_ids = split_ids(list(usable), fit_fraction, seed)
    out.update(n_fit=len(fit_ids), n_heldout=len(held_ids))
    if len(fit_ids) < min_per_split or len(held_ids) < min_per_split:
        out["status"] = "too_few_trajectories"
        out["message"] = (f"{len(usable)} trajectories with >= {MIN_ROUNDS} rounds; need >= {min_per_split} "
                          f"for fitting and >= {min_per_split} held out")
        return out
    steps = list(FIT_STEPS)
    E_fit, r_fit = pad_trajectories([usable[i] for i in fit_ids])
    E_held, r_held = pad_trajectories([usable[i] for i in held_ids])
    free, objective = fit_betas(E_fit, r_fit)
    _, fit_counts = stepwise_alignment(E_fit, r_fit, full_betas(free))
    # beta_t shapes m_t, first used by S_{t+1}: identifiable only if some fitting trajectory reaches t+1
    identified = {t: bool(fit_counts[t - 1] > 0) for t in range(2, steps[-1])}
    held_means, held_counts = stepwise_alignment(E_held, r_held, full_betas(free))
    usable_step = [t == 2 or identified[t - 1] for t in steps]
    held_means = np.where(usable_step, held_means, np.nan)
    reported = held_means[~np.isnan(held_means)]
    out.update(
        status="ok",
        betas={str(t): (float(free[t - 2]) if identified[t] else None) for t in identified},
        fit_objective=objective,
        fit_counts={str(t): int(c) for t, c in zip(steps, fit_counts)},
        heldout_alignment=_by_step(held_means, steps),
        heldout_counts={str(t): int(c) for t, c in zip(steps, held_counts)},
        heldout_mean=float(np.mean(reported)) if len(reported) else None,
    )
    return out
