"""What an evaluation run is made of, from its config (:class:`inference.eval_config.EvalConfig`):
the method (with its budget preset and options), the env (the method's paper limits under
``env_config`` and ``env``), the backend's options (thinking, prefix cache) and whether agent
turns are guided. :mod:`inference.evaluate` runs, resumes and scores the run."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import methods
from envs.config import EnvConfig
from envs.typed_config import ConfigError, merge_values, read_recipe
from inference.backends.chat import THINKING_MODES, thinking_setting
from inference.eval_config import DataSettings, EvalConfig, MethodSettings, ModelSettings
from methods.base import split_env_limits
from methods.budgets import GREEDY_OPTIONS, budget_options, paper_env_limits

GUIDED_BACKENDS = ("hf", "vllm")  # guided actions by default on these


def method_name(settings: MethodSettings) -> str:
    """``method.name``, which every run needs."""
    if not settings.name:
        raise SystemExit("method.name is required (--method.name NAME; --help lists the methods)")
    return settings.name


def build_method(settings: MethodSettings):
    """The method with its ``budget`` preset, its ``options`` (which win over the preset) and its
    ``variant``; bad options exit with the reason. Options that are env limits now (``k=3``) are
    read as ``env`` settings, with a deprecation note."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        options, _ = split_env_limits(method_name(settings), dict(settings.options))
    for warning in caught:
        print(f"note: {warning.message}", file=sys.stderr)
    if settings.variant:
        if options.get("variant", settings.variant) != settings.variant:
            raise SystemExit(f"method.variant {settings.variant} contradicts method.options.variant "
                             f"{options['variant']}")
        options["variant"] = settings.variant
    if settings.greedy:  # greedy decoding over the preset's; explicit options still win
        options = {**GREEDY_OPTIONS, **options}
    try:
        name = method_name(settings)
        method = methods.get(name, **budget_options(settings.budget, name, options))
        method.sampling()  # an impossible decoding setting exits here, before any question runs
        return method
    except (KeyError, TypeError, ValueError) as err:
        raise SystemExit(f"method {settings.name}: {err}") from err


def limits_dataset(data: DataSettings) -> str | None:
    """The name a per-dataset paper limit is chosen by: ``data.dataset``, else the ``data.path`` file
    or hub name (:func:`methods.budgets.dataset_kind`)."""
    return data.dataset or data.path


def build_env(cfg: EvalConfig, method) -> EnvConfig:
    """The run's env: the method's paper limits, then under ``method.budget paper`` its source's caps
    for the dataset (:func:`methods.budgets.paper_env_limits`, by :func:`limits_dataset`), then
    ``env_config``, then old limit options (``method.options.k 3``), then ``env``; the method's
    protocol settings last (:meth:`methods.base.Method.env_config`). A contradiction or a bad key
    exits with the reason."""
    try:
        name = method_name(cfg.method)
        recipe = merge_values(paper_env_limits(cfg.method.budget, name, limits_dataset(cfg.data)),
                              read_recipe(Path(cfg.env_config)) if cfg.env_config else {})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # build_method already warned
            _, old_limits = split_env_limits(name, dict(cfg.method.options))
        overrides = merge_values(merge_values(recipe, old_limits), cfg.env)
        return method.env_config(overrides)
    except (ConfigError, FileNotFoundError, ValueError, TypeError) as err:
        raise SystemExit(f"env: {err}") from err


def resolve_guided_actions(model: ModelSettings, budget: str | None, method) -> bool:
    """``model.guided_actions`` as given, else on for a method with an action format on hf/vllm,
    unless the run is set up for a reasoning model (``model.thinking on``, ``method.budget``
    thinking or paper): the guide leaves room for a short thought only, not for thinking before the tag."""
    if model.guided_actions is not None:
        if model.guided_actions and method.action_regex() is None:
            raise SystemExit(f"model.guided_actions: method {method.name} declares no action format to guide")
        return model.guided_actions
    if model.thinking == "on" or budget in ("thinking", "paper"):
        return False
    return method.action_regex() is not None and model.name.partition(":")[0] in GUIDED_BACKENDS


def backend_options(model: ModelSettings, concurrency: int) -> dict:
    """``model.options``, plus ``model.thinking`` (set in one place only), plus for the hf backend a
    prefix cache of one row per question in flight (``prefix_cache``; it changes speed, not
    results, so it is not in ``config.json`` / ``config.yaml``)."""
    options = dict(model.options)
    if model.name.partition(":")[0] == "hf":
        options = {"prefix_cache": max(1, concurrency), **options}
    if model.thinking == "auto":
        return options
    if "thinking" in options and thinking_setting(options["thinking"]) != THINKING_MODES[model.thinking]:
        raise SystemExit(f"model.thinking {model.thinking} contradicts model.options.thinking {options['thinking']}")
    return {**options, "thinking": model.thinking}
