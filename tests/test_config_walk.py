"""The walk of the PPO config: a function takes the sections it reads, not the whole
:class:`training.config.PPOConfig` (issue 47); only the orchestrators below hold the whole tree,
and no package but training/ imports it (scripts/ are entry points and may)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (file under training/, function) -> why it holds the whole config
WHOLE_CONFIG = {
    ("ppo.py", "train"): "the loop's top: hands each phase its sections",
    ("ppo_loop/ppo_setup.py", "set_up"): "resolves the tree (resume point, warm start), saves config.yaml, "
                                         "builds the Run of sections",
    ("ppo_loop/ppo_setup.py", "resolve_sft_checkpoint"): "runs the warm start and writes its checkpoint into "
                                                         "the tree (model.sft_checkpoint)",
    ("sft.py", "warm_start_config"): "the bridge to WarmStartConfig: model, data, env, run and warm_start",
    ("sft.py", "warm_start"): "runs that bridge's warm start (and reads warm_start.cache)",
}
PACKAGES_WITHOUT_THE_CONFIG = ("envs", "methods", "inference")


def whole_config_takers(root: Path) -> list[tuple[str, str, str]]:
    """(file relative to ``root``, function, parameter) for every parameter annotated ``PPOConfig``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is not None and arg.annotation is not None and "PPOConfig" in ast.unparse(arg.annotation):
                    found.append((path.relative_to(root).as_posix(), getattr(node, "name", "<lambda>"), arg.arg))
    return found


def config_importers(root: Path) -> list[str]:
    """Modules under ``root`` that import ``training.config`` (or its names, or the module from training)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
                     if isinstance(node, ast.ImportFrom) else [])
            if any(name == "training.config" or name.startswith("training.config.") for name in names):
                found.append(path.relative_to(root.parent).as_posix())
    return found


def test_functions_take_sections_not_the_whole_config():
    takers = whole_config_takers(REPO / "training")
    unlisted = [f"training/{file}: {name}({param}: PPOConfig)" for file, name, param in takers
                if (file, name) not in WHOLE_CONFIG]
    assert not unlisted, ("pass the sections a function reads (cfg.model, cfg.rollout, ...), not the whole "
                          f"PPOConfig: {unlisted}")
    stale = sorted(set(WHOLE_CONFIG) - {(file, name) for file, name, _ in takers})
    assert not stale, f"allow-listed but no longer taking PPOConfig (drop them from WHOLE_CONFIG): {stale}"


def test_no_package_outside_training_imports_the_ppo_config():
    importers = [module for package in PACKAGES_WITHOUT_THE_CONFIG for module in config_importers(REPO / package)]
    assert not importers, f"the PPO config is training's; these import it: {importers}"


def test_the_walk_sees_a_whole_config_parameter_and_an_import(tmp_path):
    (tmp_path / "helper.py").write_text(
        "from training.config import PPOConfig\n\n"
        "def build(lm, cfg: PPOConfig, *, other: 'PPOConfig | None' = None) -> None:\n    pass\n")
    (tmp_path / "plain.py").write_text("from training.config_sections import RolloutSettings\n\n"
                                       "def build(rollout: RolloutSettings) -> None:\n    pass\n")
    assert whole_config_takers(tmp_path) == [("helper.py", "build", "cfg"), ("helper.py", "build", "other")]
    assert config_importers(tmp_path) == [f"{tmp_path.name}/helper.py"]
