"""The KL coefficient β of the penalty to the reference policy, fixed or adaptive.

``PPOConfig.kl_target`` null: β = ``kl_coef`` for the whole run (:class:`FixedKLController`).
``kl_target: K``: Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences"), as
verl's and TRL's ``AdaptiveKLController`` (:class:`AdaptiveKLController`): β starts at ``kl_coef``
and after each update moves by

    e = clip(KL / K − 1, −0.2, 0.2),   β ← β·(1 + e·n / kl_horizon)

with KL the update's measured KL to the reference (``kl_estimate``) and n its episodes. The trainer
keeps the controller on its :class:`training.ppo_loop.ppo_setup.Run`, reads β through :func:`current_kl_coef`
wherever the penalty is applied (token rewards, or the loss), logs it as ``kl_coef`` and saves it in
its checkpoints, so ``--resume`` goes on with the adapted value.
"""
from __future__ import annotations

import math
from typing import Any

ERROR_CLIP = 0.2  # the proportional error's bound (Ziegler et al.)


class FixedKLController:
    """β = ``kl_coef`` throughout: :meth:`update` and :meth:`resume` change nothing (a resumed run
    takes its configured ``kl_coef``)."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def resume(self, saved: float | None) -> None:
        pass


class AdaptiveKLController:
    """β moved toward a target KL, proportionally to the relative error, clipped to ±0.2.

    update(current_kl, n_steps): e = clip(current_kl/target − 1, −0.2, 0.2); β ← β·(1 + e·n_steps/horizon).
    A KL that is not a finite number (nothing measured) leaves β unchanged.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        if not target > 0 or not horizon > 0:
            raise ValueError(f"the adaptive KL controller needs target > 0 and horizon > 0, not {target}, {horizon}")
        self.value, self.target, self.horizon = float(init_kl_coef), float(target), int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        if not math.isfinite(current_kl):
            return
        proportional_error = min(max(current_kl / self.target - 1.0, -ERROR_CLIP), ERROR_CLIP)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def resume(self, saved: float | None) -> None:
        """Continue from a checkpoint's β (``state.json``'s ``kl_coef``; None: an older checkpoint, keep β)."""
        if saved is not None:
            self.value = float(saved)


def build_kl_controller(algorithm: Any) -> FixedKLController | AdaptiveKLController:
    """The controller the ``algorithm`` section (:class:`training.config.AlgorithmSettings`) asks for:
    adaptive with ``kl_target``."""
    if algorithm.kl_target is None:
        return FixedKLController(algorithm.kl_coef)
    return AdaptiveKLController(algorithm.kl_coef, algorithm.kl_target, algorithm.kl_horizon)


def current_kl_coef(run: Any) -> float:
    """β for this update: the run's controller's value, or ``run.algorithm.kl_coef`` where it has none."""
    controller = getattr(run, "kl_controller", None)
    return run.algorithm.kl_coef if controller is None else controller.value
