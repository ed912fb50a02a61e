"""The one config loader (envs/typed_config.py) behind EnvConfig, PPOConfig and WarmStartConfig."""
from dataclasses import dataclass, field

import pytest

from envs.config import EnvConfig
from envs.typed_config import ConfigError, from_dict, load_config
from training.config import PPOConfig
from training.sft_config import WarmStartConfig


@dataclass
class Inner:
    a: int = 1
    b: float = 2.0


@dataclass
class Outer:
    name: str = "x"
    inner: Inner = field(default_factory=lambda: Inner(a=7))


def test_partial_section_overlays_the_field_default_and_values_are_typed():
    out = from_dict(Outer, {"inner": {"b": 3}})
    assert out.inner == Inner(a=7, b=3.0) and isinstance(out.inner.b, float)
    with pytest.raises(ConfigError, match="inner.c"):
        from_dict(Outer, {"inner": {"c": 1}})
    with pytest.raises(ConfigError, match="integer"):
        from_dict(Outer, {"inner": {"a": "seven"}})


def test_overrides_beat_the_recipe_which_beats_defaults(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: from-recipe\ninner: {a: 3}\n")
    out = load_config(Outer, ["--config", str(recipe), "--inner.b", "5"])
    assert (out.name, out.inner.a, out.inner.b) == ("from-recipe", 3, 5.0)


def test_env_recipes_may_start_from_another(tmp_path):
    (tmp_path / "base.yaml").write_text("admission: prefix\nmax_actions: 7\n")
    (tmp_path / "variant.yaml").write_text("base: base.yaml\nmax_actions: 9\n")
    config = EnvConfig.from_yaml(tmp_path / "variant.yaml")
    assert (config.admission, config.max_actions) == ("prefix", 9)


@pytest.mark.parametrize("cls", [PPOConfig, WarmStartConfig])
def test_a_misspelt_env_override_fails_when_the_config_loads(cls):
    with pytest.raises(ConfigError, match="env.max_actionz"):
        load_config(cls, ["--env.max_actionz", "3"])
    env = load_config(cls, ["--env.max_actions", "3"]).env
    assert (env.max_actions if cls is PPOConfig else env) == (3 if cls is PPOConfig else {"max_actions": 3})


def test_float_fields_take_exponents_without_a_dot(tmp_path):
    """YAML 1.1 reads ``3e-4`` (no dot) as a string: a float field converts it, on the command line
    and in a recipe; text that is not a number is a clear error, not a crash inside the optimizer."""
    cfg = load_config(PPOConfig, ["--optim.lr_actor", "3e-4", "--algorithm.clip_high", "1e-1"])
    assert cfg.optim.lr_actor == pytest.approx(3e-4) and isinstance(cfg.optim.lr_actor, float)
    assert cfg.algorithm.clip_high == 0.1
    recipe = tmp_path / "r.yaml"
    recipe.write_text("optim: {lr_actor: 5e-5}\n")
    assert load_config(PPOConfig, ["--config", str(recipe)]).optim.lr_actor == pytest.approx(5e-5)
    assert load_config(WarmStartConfig, ["--train.learning_rate", "2e-3"]).train.learning_rate == pytest.approx(2e-3)
    with pytest.raises(ConfigError, match="lr_actor expects a number"):
        load_config(PPOConfig, ["--lr_actor", "fast"])
    with pytest.raises(ConfigError, match="expects a number"):
        load_config(PPOConfig, ["--lr_actor", "[1, 2]"])
