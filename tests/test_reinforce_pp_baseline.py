"""REINFORCE++-baseline (training.algorithm.advantages): R − group mean on every model token, whitened over the
model tokens of all processes, against numbers derived by hand; and its place among the outcome estimators."""
from __future__ import annotations

import pytest
import torch

from training.algorithm import advantages as A
from training.config import OUTCOME_ESTIMATORS, ConfigError, PPOConfig, with_values

# group a = (1, 0): deviations ±0.5; group b = (2, 0): ±1. Rows have 2, 1, 1 and 2 model tokens.
SCORES = torch.tensor([1.0, 0.0, 2.0, 0.0])
GROUPS = ["a", "a", "b", "b"]
MASK = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def test_group_deviation_whitened_over_the_model_tokens():
    adv, ret = A.compute_advantages("reinforce_pp_baseline", scores=SCORES, group_ids=GROUPS, model_mask=MASK)
    # token values (0.5, 0.5 | −0.5 | 1 | −1, −1): mean −1/12, unbiased variance 3.708333/5 = 0.7416667, so
    # (0.5 + 1/12)/0.8612007 = 0.6773489, (−0.5 + 1/12)/… = −0.4838206, 1.2579336, −1.0644054
    close(adv, [[0.6773489, 0.6773489, 0.0], [0.0, -0.4838206, 0.0], [1.2579336, 0.0, 0.0],
                [0.0, -1.0644054, -1.0644054]])
    close(ret, SCORES[:, None] * MASK)
    # the formula function is what the estimator runs
    close(A.reinforce_pp_baseline_advantages(SCORES, GROUPS, MASK)[0], adv)


class TwoEqualProcesses:
    """accelerator.reduce as if a second process held the same batch: every sum doubles."""

    def reduce(self, tensor, reduction="sum"):
        assert reduction == "sum"
        return tensor * 2


def test_whitening_takes_every_process_s_tokens():
    adv, _ = A.compute_advantages("reinforce_pp_baseline", scores=SCORES, group_ids=GROUPS, model_mask=MASK,
                                  accelerator=TwoEqualProcesses())
    # 12 tokens: the same mean, variance 2·3.708333/11 = 0.6742424
    close(adv[:, :2], [[0.7104095, 0.7104095], [0.0, -0.5074353], [1.3193319, 0.0], [0.0, -1.1163578]])


def test_equal_groups_and_single_samples_get_the_shifted_zero():
    scores = torch.tensor([2.0, 0.0, 0.5, 0.5, 3.0])  # a = (2, 0), b = (0.5, 0.5), c = (3) alone
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    adv, _ = A.compute_advantages("reinforce_pp_baseline", scores=scores, group_ids=[0, 0, 1, 1, 2], model_mask=mask)
    # before whitening (1, 1 | −1 | 0 | 0 | 0): mean 1/6, unbiased variance 2.833333/5 = 0.5666667
    close(adv, [[1.1070186, 1.1070186], [-1.5498260, 0.0], [-0.2214037, 0.0], [0.0, -0.2214037], [-0.2214037, 0.0]])


def test_registered_as_a_group_and_outcome_estimator():
    assert "reinforce_pp_baseline" in A.ADVANTAGE_ESTIMATORS
    assert "reinforce_pp_baseline" in A.GROUP_ESTIMATORS and "reinforce_pp_baseline" in OUTCOME_ESTIMATORS
    with_values(PPOConfig,
                {"algorithm.advantage": "reinforce_pp_baseline",
                 "algorithm.answer_credit": "answer"})  # an outcome estimator: allowed
    with pytest.raises(ConfigError, match="outcome estimator"):
        with_values(PPOConfig, {"algorithm.advantage": "reinforce_pp", "algorithm.answer_credit": "answer"})
    with pytest.raises(TypeError, match="group_ids"):
        A.compute_advantages("reinforce_pp_baseline", scores=SCORES, model_mask=MASK)
