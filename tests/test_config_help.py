"""Every config field documented once, beside it in its dataclass, and shown by ``--help``; one
override syntax (``--env.max_actions 6``) in training and evaluation; evaluation's ``config.yaml``."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import pytest
import yaml

import inference.evaluate as ev
from envs.config import EnvConfig
from envs.typed_config import (
    OVERRIDES,
    config_help,
    field_docs,
)
from training.config import PPOConfig
from training.sft_config import WarmStartConfig


def config_classes(cls: type, seen: dict | None = None) -> dict[str, type]:
    """``cls`` and every config below it: nested sections and the configs dict fields override."""
    seen = {} if seen is None else seen
    seen.setdefault(cls.__name__, cls)
    for spec in dataclasses.fields(cls):
        target = spec.metadata.get(OVERRIDES)
        if isinstance(target, str):
            import importlib
            module, _, name = target.partition(":")
            target = getattr(importlib.import_module(module), name)
        default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
        for sub in (target, type(default) if dataclasses.is_dataclass(default) else None):
            if sub is not None and sub.__name__ not in seen:
                config_classes(sub, seen)
    return seen


ALL = {**config_classes(PPOConfig), **config_classes(WarmStartConfig), **config_classes(EnvConfig)}


def test_the_walk_reaches_every_nested_config():
    assert {"PPOConfig", "LoraSettings", "VLLMSettings", "WarmStartConfig", "EnvConfig", "PreviewConfig",
            "RewardConfig"} <= set(ALL)


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_field_has_a_doc(name):
    cls = ALL[name]
    docs = field_docs(cls)
    missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name, "").strip()]
    assert missing == [], f"{name}: fields without a `# ...` comment beside or above them: {missing}"


@dataclass
class Documented:
    beside: int = 1  # the comment beside the field
    # ---- a heading, not a doc
    # the comment lines
    # directly above it
    above: str = "x"
    both: float = 2.0  # beside wins
    section: dict = field(  # on the first line of a long field
        default_factory=dict, metadata={OVERRIDES: EnvConfig})

    undocumented: bool = False


def test_field_docs_read_beside_then_above_and_skip_headings():
    assert field_docs(Documented) == {"beside": "the comment beside the field",
                                      "above": "the comment lines directly above it", "both": "beside wins",
                                      "section": "on the first line of a long field"}


def test_config_help_lists_type_default_doc_and_override_sections():
    text = config_help(Documented)
    assert "--beside  int = 1\n      the comment beside the field" in text
    assert "--undocumented  bool = False\n      (undocumented)" in text
    assert "--section.max_actions  int = 10" in text and "--section.reward.negative_opened_penalty" in text


def run_help(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code in (0, None)
    return capsys.readouterr().out


def doc_of(cls: type, name: str) -> str:
    return " ".join(field_docs(cls)[name].split())[:40]


def test_ppo_help_documents_every_field(capsys):
    from training.ppo import main
    text = run_help(main, ["--help"], capsys)
    flat = " ".join(text.split())
    for spec in dataclasses.fields(PPOConfig):
        assert f"--{spec.name} " in text or f"--{spec.name}.*" in text, spec.name
        assert doc_of(PPOConfig, spec.name) in flat, spec.name
    assert "--model.lora.r  int = 16" in text and doc_of(ALL["LoraSettings"], "r") in flat
    assert "--env.reward.negative_opened_penalty  float = 0.05" in text
    assert doc_of(ALL["RewardConfig"], "negative_opened_penalty") in flat
    assert "--warm_start.train.epochs  int = 2" in text and doc_of(ALL["SFTTrainSettings"], "epochs") in flat
    assert "--warm_start.teacher.open_rate  float | None = None" in text
    assert "--rollout.vllm.gpu_memory_utilization" in text and "--warm_start.lora.enabled  bool = True" in text
    for name in ("merge_lora", "device", "gradient_checkpointing"):  # documented where the SFT sections define them
        assert f"--warm_start.{name} " in text and doc_of(ALL["WarmStartSettings"], name) in flat
    for section in ("model", "data", "env", "rollout", "optim", "algorithm", "warm_start", "evaluation", "run"):
        assert f"--{section}.*  section:" in text, section


def test_sft_help_documents_every_field(capsys):
    from training.sft import resolve_config
    text = run_help(resolve_config, ["--help"], capsys)
    flat = " ".join(text.split())
    for spec in dataclasses.fields(WarmStartConfig):
        assert f"--{spec.name} " in text or f"--{spec.name}.*" in text, spec.name
        assert doc_of(WarmStartConfig, spec.name) in flat, spec.name
        section = type(getattr(WarmStartConfig(), spec.name))
        for inner in dataclasses.fields(section) if dataclasses.is_dataclass(section) else ():
            assert f"--{spec.name}.{inner.name} " in text or f"--{spec.name}.{inner.name}.*" in text, inner.name
            assert doc_of(section, inner.name) in flat, f"{spec.name}.{inner.name}"
    assert "--train.epochs  int = 3" in text and "--model.lora.r  int = 16" in text
    assert "--teacher.llm  str | None = None" in text and "--dev.enabled  bool = True" in text
    assert "--env.reward.negative_opened_penalty  float = 0.05" in text


def test_evaluate_help_documents_every_field(capsys):
    text = run_help(ev.main, ["--help"], capsys)
    flat = " ".join(text.split())
    for spec in dataclasses.fields(EnvConfig):
        assert f"--env.{spec.name} " in text or f"--env.{spec.name}.*" in text, spec.name
    assert "--env.max_actions  int = 10" in text and doc_of(EnvConfig, "max_actions") in flat
    assert "--env.reward.negative_opened_penalty  float = 0.05" in text
    assert doc_of(ALL["RewardConfig"], "negative_opened_penalty") in flat
    from inference.eval_config import EvalConfig
    for section in ("method", "model", "data", "run"):  # every field of every section, with its doc
        settings = type(getattr(EvalConfig(), section))
        for spec in dataclasses.fields(settings):
            assert f"--{section}.{spec.name}  " in text and doc_of(settings, spec.name) in flat, (section, spec.name)
    assert "--env_config  str | None = None" in text and "--compare RUN" in text and "--merge" in text


def env_of(tmp_path, *extra) -> EnvConfig:
    args = ev.resolve_args(["--method.name", "seeds-react", "--run.output_dir", str(tmp_path), *extra])
    return ev.build_env(args, ev.build_method(args.method))


def test_evaluate_env_dotted_form_gives_the_same_env_as_key_value(tmp_path):
    base = env_of(tmp_path)
    assert base.max_actions != 6
    dotted = env_of(tmp_path, "--env.max_actions", "6")
    assert dotted == env_of(tmp_path, "--env", "max_actions=6") == env_of(tmp_path, "--env.max_actions=6")
    assert dotted == dataclasses.replace(base, max_actions=6)
    bonus = env_of(tmp_path, "--env.reward.positive_opened_bonus", "0.2", "--env", "max_searches=3")
    assert bonus == env_of(tmp_path, "--env", "reward.positive_opened_bonus=0.2", "--env", "max_searches=3")
    assert (bonus.reward.positive_opened_bonus, bonus.max_searches) == (0.2, 3)
    # one list in command-line order: the later setting of a key wins, whichever form
    assert env_of(tmp_path, "--env", "max_actions=6", "--env.max_actions", "7").max_actions == 7
    assert env_of(tmp_path, "--env.max_actions", "7", "--env", "max_actions=6").max_actions == 6
    with pytest.raises(SystemExit, match="max_actionz"):
        env_of(tmp_path, "--env.max_actionz", "6")


def test_evaluate_writes_config_yaml_beside_config_json(tmp_path):
    config = {"method": "m", "env": {"max_actions": 6, "reward": {"format_penalty": 0.1}}, "sampling": ("a", 1)}
    ev.prepare_run_dir(tmp_path, config, overwrite=False)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == saved
    ev.prepare_run_dir(tmp_path, config, overwrite=True)
    assert (tmp_path / "config.yaml").is_file()


def test_an_old_run_folder_with_config_json_alone_still_resumes(tmp_path):
    config = {"method": "m", "env": {"max_actions": 6}, "seed": 0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert ev.prepare_run_dir(tmp_path, config, overwrite=False) == []
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == config
    (tmp_path / "config.yaml").unlink()
    with pytest.raises(SystemExit, match="different configuration"):
        ev.prepare_run_dir(tmp_path, {**config, "seed": 1}, overwrite=False)
