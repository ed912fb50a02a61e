"""Pieces of scripts/learning_check.py on the toy corpus and a tiny random Llama (CPU, fast)."""
from __future__ import annotations

import importlib.util
import math
import random
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_llama, tiny_tokenizer

from envs.config import EnvConfig

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "learning_check.py"


@pytest.fixture(scope="module")
def lc():
    spec = importlib.util.spec_from_file_location("learning_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture
def tokenizer():
    tok = tiny_tokenizer()
    tok.add_tokens(["yes", "no"])
    return tok


@pytest.fixture
def setup(lc, tokenizer, retriever):
    cfg = lc.CheckConfig(trainable_layers=1, bottom_dtype="float32", lora_r=4, lora_alpha=8, lr=1e-2, lr_warmup=1,
                         batch_questions=2, samples_per_question=4, ppo_epochs=2, critic_warmup=0, warm_steps=2,
                         warm_batch_questions=2)
    policy = lc.JudgePolicy(tiny_llama(tokenizer, seed=1), tokenizer, cfg)
    episodes = lc.Episodes(retriever, EnvConfig(shuffle_candidates=True), tokenizer)
    return cfg, policy, episodes


def test_first_read_title(lc):
    obs = "<information>\n[3] Paris\nParis is the capital.\n\n[1] France\nFrance is a country.\n</information>"
    assert lc.first_read_title(obs) == "Paris"
    assert lc.first_read_title("<information>\nNo passages expanded.\n</information>") == lc.NO_ANSWER


def test_auc(lc):
    assert lc.auc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert lc.auc([0.1, 0.2, 0.9], [True, False, False]) == 0.0
    assert lc.auc([0.5, 0.5], [True, False]) == 0.5
    assert math.isnan(lc.auc([0.5], [True]))


def test_scripted_episodes_in_the_env(lc, setup, examples):
    _, _, episodes = setup
    batch = episodes.run(examples, [5, 6, 7, 8], lc.scripted_decide("oracle", random.Random(0)))
    for previews, labels, decisions, summary, reward in zip(batch.previews, batch.labels, batch.decisions,
                                                             batch.summaries, batch.rewards):
        assert len(previews) == len(labels) == len(decisions) == 5
        assert decisions == labels  # the oracle opens exactly the positives
        assert summary["negatives_opened"] == 0
        assert reward == pytest.approx(summary["reward"]["total"])
    # q0 (positives Paris and France): the reader answers with the first passage it read.
    first = next(p for p, d in zip(batch.previews[0], batch.decisions[0]) if d)
    assert batch.summaries[0]["answer"] == first.split(":")[0]
    none = episodes.run(examples, [5, 6, 7, 8], lc.scripted_decide("none", random.Random(0)))
    assert all(s["answer"] == lc.NO_ANSWER and s["docs_read"] == 0 for s in none.summaries)
    assert lc.batch_metrics([batch])["precision"] == 1.0 and lc.batch_metrics([none])["precision"] == 0.0


def test_samples_share_one_forward_pass_whatever_the_order(lc, setup, examples):
    """Every sample of a question gets the judgement of the candidate it shows, in its own order."""
    cfg, policy, episodes = setup
    ppo = lc.PPO(policy, cfg)

    def forward(exs, previews):  # yes for the Paris passage only, whatever the prompt order
        rows = [[20.0, -20.0] if p.startswith("Paris") else [-20.0, 20.0] for prev in previews for p in prev]
        return torch.tensor(rows), torch.zeros((len(rows), policy.top.hidden_size))

    policy.forward = forward
    store = {}
    repeated = [examples[0]] * 6 + [examples[2]] * 6
    batch = episodes.run(repeated, list(range(12)), ppo._decide(store))
    assert len(store["u_examples"]) == 2  # one forward pass per question
    orders = {tuple(p) for p in batch.previews[:6]}
    assert len(orders) > 1  # the samples saw different candidate orders
    for previews, decisions in zip(batch.previews, batch.decisions):
        assert decisions == [p.startswith("Paris") for p in previews]
    assert all(s["answer"] == "Paris" for s in batch.summaries[:6])


def test_warm_start_and_ppo_update_train_the_lora_and_the_critic(lc, setup, examples):
    cfg, policy, episodes = setup
    warm = lc.warm_start(policy, episodes, examples, cfg)
    assert warm["loss_last"] < warm["loss_first"]
    policy.freeze_reference()
    lora = {n: p.detach().clone() for n, p in policy.lm.named_parameters() if p.requires_grad}
    assert lora and all(".layers.1." in n for n in lora)  # LoRA on the top layer only
    critic = [p.detach().clone() for p in policy.value.parameters()]
    ppo = lc.PPO(policy, cfg)
    repeated = [ex for ex in examples[:2] for _ in range(cfg.samples_per_question)]
    stats = ppo.update(0, episodes, repeated, list(range(len(repeated))))
    for key in ("approx_kl", "clip_frac", "value_loss", "entropy", "train_reward", "train_precision"):
        assert math.isfinite(stats[key]), key
    moved = [n for n, p in policy.lm.named_parameters() if p.requires_grad and not torch.equal(p, lora[n])]
    assert moved
    assert any(not torch.equal(a, b) for a, b in zip(critic, policy.value.parameters()))
    metrics = lc.evaluate(policy, episodes, examples, [1, 2, 3, 4], batch=2)
    assert metrics["episodes"] == 4 and 0.0 <= metrics["p_yes_mean"] <= 1.0
