"""``kl_tokens: verdicts``: the KL term to the reference on the constrained verdict tokens only."""
from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from test_rollout import script_lm, tokenizer  # noqa: F401 (fixtures)

from tests.test_ppo_loop import tiny_cfg
from training.config import ConfigError, PPOConfig, with_values
from training.models.policy_models import wrap_models
from training.ppo import actor_objective, train


def objective(kl_coef: float, kl_tokens: str, answer_mask: list[float] | None = None) -> float:
    """One row, three model tokens: text, verdict, text (the last the answer where ``answer_mask`` says
    so); the policy has moved away from the reference at every token, and not from the sampler (ratio 1,
    zero advantage: the surrogate is 0)."""
    cfg = with_values(PPOConfig,
                      {"algorithm.kl_coef": kl_coef, "algorithm.kl_mode": "loss", "algorithm.kl_estimator": "k3",
                       "algorithm.kl_tokens": kl_tokens})
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.6]]))
    mb = {"model_mask": torch.ones(1, 3), "old_logp": logp.clone(), "advantages": torch.zeros(1, 3),
          "ref_logp": torch.log(torch.tensor([[0.1, 0.5, 0.9]])), "choice_mask": torch.tensor([[0.0, 1.0, 0.0]])}
    if answer_mask is not None:
        mb["answer_mask"] = torch.tensor([answer_mask])
    loss, *_ = actor_objective(cfg.algorithm, logp, torch.zeros(1, 3), mb, torch.tensor(3.0), torch.tensor(1.0),
                               max_context_tokens=cfg.rollout.max_context_tokens)
    return float(loss)


def k3(p: float, ref: float) -> float:
    ratio = ref / p
    return ratio - 1 - torch.log(torch.tensor(ratio)).item()


def test_verdict_kl_counts_the_verdict_token_only():
    assert objective(0.0, "all") == pytest.approx(0.0, abs=1e-7)
    assert objective(1.0, "all") == pytest.approx((k3(0.5, 0.1) + k3(0.2, 0.5) + k3(0.6, 0.9)) / 3, rel=1e-5)
    assert objective(1.0, "verdicts") == pytest.approx(k3(0.2, 0.5) / 3, rel=1e-5)
    assert objective(2.0, "verdicts") == pytest.approx(2 * objective(1.0, "verdicts"), rel=1e-6)


def test_verdict_and_answer_kl_counts_the_verdict_and_the_answer_tokens():
    answer_last = [0.0, 0.0, 1.0]
    assert objective(1.0, "verdicts_answer", answer_last) == pytest.approx((k3(0.2, 0.5) + k3(0.6, 0.9)) / 3, rel=1e-5)
    assert objective(1.0, "verdicts", answer_last) == pytest.approx(k3(0.2, 0.5) / 3, rel=1e-5)  # answers ignored
    assert objective(1.0, "verdicts_answer") == pytest.approx(objective(1.0, "verdicts"), rel=1e-6)  # no answer turn


def test_kl_tokens_is_checked():
    with pytest.raises(ConfigError, match="kl_tokens"):
        with_values(PPOConfig, {"algorithm.kl_tokens": "text"})


def run_with_reference_log(kl_tokens, tmp_path, retriever, examples, script_lm, tokenizer):  # noqa: F811
    """A tiny judged-alone run with the KL on ``kl_tokens``: (the verdict count of each row the reference
    pass scored, one tensor per micro-batch; the run's result)."""
    env = {"max_actions": 3, "max_searches": 1, "expand_form": "judge", "judge_context": "alone"}
    cfg = tiny_cfg(tmp_path, advantage="grpo", temperature=1.0, env=env, kl_coef=0.5, kl_mode="loss",
                   kl_estimator="k3", kl_tokens=kl_tokens)
    torch.manual_seed(0)
    models = wrap_models(copy.deepcopy(script_lm), tokenizer, cfg.model, cfg.algorithm, cfg.rollout)
    scored = []

    def reference_logprobs(input_ids, attention_mask, target_mask=None, choice_mask=None, choice_ids=None, **prefix):
        scored.append(choice_mask.sum(dim=1))
        return reference(input_ids, attention_mask, target_mask, choice_mask, choice_ids, **prefix)

    reference, models = models.reference_logprobs, dataclasses.replace(models, reference_logprobs=reference_logprobs)
    return scored, train(cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)


def test_a_verdict_kl_run_asks_the_reference_for_verdict_rows_only(tmp_path, retriever, examples, script_lm,
                                                                    # noqa: F811
                                                                   tokenizer):  # noqa: F811
    """Judged alone, the episodes' rows carry no verdict token: the reference pass skips them, and
    the logged KL is the verdicts' (finite, from the rows the reference scored)."""
    scored, result = run_with_reference_log("verdicts", tmp_path, retriever, examples, script_lm, tokenizer)
    micro_batch_size = tiny_cfg(tmp_path).optim.micro_batch_size
    assert scored and all(bool((rows >= 1).any()) for rows in scored)
    assert sum(int((rows == 0).sum()) for rows in scored) < micro_batch_size  # no all-episode micro-batch
    assert math.isfinite(result["history"][0]["kl"])


def test_a_verdict_and_answer_kl_run_asks_the_reference_for_the_answering_episodes_too(
        tmp_path, retriever, examples, script_lm, tokenizer):  # noqa: F811
    """With the answer turn in the KL's scope, the reference pass scores the episode rows that answered
    (they carry no verdict token) as well as the verdict rows, and the logged KL is finite."""
    scored, result = run_with_reference_log("verdicts_answer", tmp_path, retriever, examples, script_lm, tokenizer)
    assert sum(int((rows == 0).sum()) for rows in scored) > 0  # episode rows (no verdict) were scored
    assert math.isfinite(result["history"][0]["kl"])
