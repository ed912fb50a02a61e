"""The KL coefficient's controllers (training.algorithm.kl_control): the adaptive one's updates by hand, its
settings, and in the trainer: the β each update uses, logs, saves and resumes with."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from tests.test_ppo_loop import tiny_cfg
from tests.tiny_models import tiny_llama, tiny_tokenizer
from training import ppo
from training.algorithm.kl_control import AdaptiveKLController, FixedKLController, build_kl_controller, current_kl_coef
from training.config import AlgorithmSettings, ConfigError, PPOConfig, dotted_keys, with_values
from training.models.checkpoint import load_latest
from training.models.policy_models import wrap_models
from training.ppo_loop import ppo_score


def test_adaptive_controller_by_hand():
    c = AdaptiveKLController(0.1, target=0.05, horizon=100)
    c.update(0.055, 10)  # e = 0.055/0.05 − 1 = 0.1: β·(1 + 0.1·10/100) = 0.1·1.01
    assert c.value == pytest.approx(0.101, abs=1e-12)
    c.update(0.2, 10)  # e = 3, clipped to 0.2: ·1.02
    assert c.value == pytest.approx(0.10302, abs=1e-12)
    c.update(0.02, 50)  # e = −0.6, clipped to −0.2: ·(1 − 0.2·0.5) = ·0.9
    assert c.value == pytest.approx(0.092718, abs=1e-12)
    c.update(0.045, 100)  # e = −0.1 inside the clip: ·0.9
    assert c.value == pytest.approx(0.0834462, abs=1e-12)
    c.update(0.05, 1000)  # on target: unchanged
    c.update(math.nan, 10)  # nothing measured: unchanged
    assert c.value == pytest.approx(0.0834462, abs=1e-12)
    c.resume(None)
    assert c.value == pytest.approx(0.0834462, abs=1e-12)
    c.resume(0.3)
    assert c.value == 0.3


def test_fixed_controller_and_the_choice():
    fixed = FixedKLController(0.02)
    fixed.update(10.0, 1000)
    fixed.resume(0.5)  # a resumed run takes its configured kl_coef
    assert fixed.value == 0.02
    assert isinstance(build_kl_controller(AlgorithmSettings(kl_coef=0.02)), FixedKLController)
    adaptive = build_kl_controller(AlgorithmSettings(kl_coef=0.02, kl_target=0.1, kl_horizon=50))
    assert (type(adaptive), adaptive.value, adaptive.target, adaptive.horizon) == (AdaptiveKLController, 0.02, 0.1, 50)
    no_controller = SimpleNamespace(algorithm=AlgorithmSettings(kl_coef=0.7))
    assert current_kl_coef(no_controller) == 0.7  # no controller: the config's
    assert current_kl_coef(SimpleNamespace(algorithm=AlgorithmSettings(kl_coef=0.7),
                                           kl_controller=fixed)) == 0.02


@pytest.mark.parametrize("overrides,match", [
    ({"kl_target": 0.0}, "kl_target"), ({"kl_target": -0.1}, "kl_target"), ({"kl_horizon": 0}, "kl_horizon"),
    ({"kl_target": 0.1, "kl_coef": 0.0}, "kl_target"),
])
def test_settings_are_checked(overrides, match):
    with pytest.raises(ConfigError, match=match):
        with_values(PPOConfig, dotted_keys(overrides))


def test_the_trainer_adapts_logs_saves_and_resumes_beta(tmp_path, retriever, examples, monkeypatch):
    """kl_target with KL in the loss: update 1 starts at the reference (KL 0, the error clipped to −0.2),
    so update 2 runs with β = 0.05·(1 − 0.2·4/4) = 0.04; every reader of β (the rewards, the loss) gets
    the controller's value; the checkpoint holds the β after update 2 and a resumed run starts from it."""
    tok = tiny_tokenizer()
    seen = {"loss": [], "rewards": []}

    def objective(*args, **kwargs):
        seen["loss"].append(args[6])
        return actor_objective(*args, **kwargs)

    def reward_beta(run):
        seen["rewards"].append(current_kl_coef(run))
        return seen["rewards"][-1]

    actor_objective = ppo.actor_objective
    monkeypatch.setattr(ppo, "actor_objective", objective)
    monkeypatch.setattr(ppo_score, "current_kl_coef", reward_beta)

    def run(updates, resume=False):
        cfg = tiny_cfg(tmp_path, updates=updates, resume=resume, save_every=1, advantage="grpo", temperature=1.0,
                       kl_coef=0.05, kl_target=0.01, kl_horizon=4, kl_mode="loss", kl_estimator="k3")
        return train(cfg, models=wrap_models(tiny_llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout))

    def train(cfg, models):
        return ppo.train(cfg, retriever=retriever, examples=examples, eval_examples=[], models=models)

    history = run(2)["history"]
    assert [h["kl_coef"] for h in history] == pytest.approx([0.05, 0.04], abs=1e-12)
    assert history[0]["kl_estimate"] == pytest.approx(0.0, abs=1e-6)
    assert [round(b, 12) for b in seen["rewards"]] == [0.05, 0.04]  # one scoring per update
    assert seen["loss"][0] == 0.05 and {round(b, 12) for b in seen["loss"]} == {0.05, 0.04}
    error = min(max(history[1]["kl_estimate"] / 0.01 - 1.0, -0.2), 0.2)
    saved = json.loads((load_latest(tmp_path) / "state.json").read_text())["kl_coef"]
    assert saved == pytest.approx(0.04 * (1.0 + error * 4 / 4), abs=1e-12)
    resumed = run(3, resume=True)["history"]
    assert [h["update"] for h in resumed] == [3] and resumed[0]["kl_coef"] == pytest.approx(saved, abs=1e-12)
