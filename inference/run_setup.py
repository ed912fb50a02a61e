"""What an evaluation run is made of, from its command line: the method (with its budget preset
and options), the env (the method's paper limits under ``--env-config`` and ``--env``), the
backend's options (thinking, prefix cache) and whether agent turns are guided.
:mod:`inference.evaluate` runs, resumes and scores the run."""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml

import methods
from envs.config import EnvConfig
from envs.typed_config import ConfigError, merge_values, read_recipe, section_values
from inference.backends.chat import THINKING_MODES, thinking_setting
from methods.base import split_env_limits
from methods.budgets import GREEDY_OPTIONS, budget_options, paper_env_limits

DEFAULT_LLM = "hf:smollm2-135m"  # chat-tuned, ~4x faster than Gemma 3 270M base on CPU
GUIDED_BACKENDS = ("hf", "vllm")  # guided actions by default on these


def _value(text: str) -> Any:
    """``key=value`` option values: YAML scalars (ints, floats, booleans), else the string."""
    return yaml.safe_load(text)


def parse_options(pairs: list[str] | None, flag: str) -> dict[str, Any]:
    options = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} expects key=value, got {pair!r}")
        options[key.replace("-", "_")] = _value(value)
    return options


def build_method(args: argparse.Namespace):
    """The method with its ``--budget`` preset, ``--method-option`` values (which win over the preset)
    and ``--variant``; bad options exit with the reason. Options that are env limits now (``k=3``)
    are read as ``--env`` settings, with a deprecation note."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        options, _ = split_env_limits(args.method, parse_options(args.method_option, "--method-option"))
    for warning in caught:
        print(f"note: {warning.message}", file=sys.stderr)
    if args.variant:
        if options.get("variant", args.variant) != args.variant:
            raise SystemExit(f"--variant {args.variant} contradicts --method-option variant={options['variant']}")
        options["variant"] = args.variant
    if getattr(args, "greedy", False):  # greedy decoding over the preset's; explicit options still win
        options = {**GREEDY_OPTIONS, **options}
    try:
        method = methods.get(args.method, **budget_options(args.budget, args.method, options))
        method.sampling()  # an impossible decoding setting exits here, before any question runs
        return method
    except (KeyError, TypeError, ValueError) as err:
        raise SystemExit(f"--method {args.method}: {err}") from err


def limits_dataset(args: argparse.Namespace) -> str | None:
    """The name a per-dataset paper limit is chosen by: ``--dataset``, else the ``--data`` file or
    hub name (:func:`methods.budgets.dataset_kind`)."""
    return getattr(args, "dataset", None) or args.data


def build_env(args: argparse.Namespace, method) -> EnvConfig:
    """The run's env: the method's paper limits, then under ``--budget paper`` its source's caps for
    the dataset (:func:`methods.budgets.paper_env_limits`, by :func:`limits_dataset`), then
    ``--env-config``, then old limit options (``--method-option k=3``), then ``--env`` (``key=value``
    pairs, ``--env.key value`` written as such by :func:`envs.typed_config.section_pairs`, read by
    :func:`envs.typed_config.section_values`, training's reader of ``--env.key``); the method's
    protocol settings last (:meth:`methods.base.Method.env_config`). A contradiction or a bad key
    exits with the reason."""
    try:
        recipe = merge_values(paper_env_limits(args.budget, args.method, limits_dataset(args)),
                              read_recipe(Path(args.env_config)) if args.env_config else {})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # build_method already warned
            _, old_limits = split_env_limits(args.method, parse_options(args.method_option, "--method-option"))
        overrides = merge_values(merge_values(recipe, old_limits), section_values(args.env, "env"))
        return method.env_config(overrides)
    except (ConfigError, FileNotFoundError, ValueError, TypeError) as err:
        raise SystemExit(f"env: {err}") from err


def resolve_guided_actions(args: argparse.Namespace, method) -> bool:
    """``--guided-actions`` as given, else on for a method with an action format on hf/vllm, unless
    the run is set up for a reasoning model (``--thinking on``, ``--budget thinking``/``paper``):
    the guide leaves room for a short thought only, not for thinking before the tag."""
    if args.guided_actions is not None:
        if args.guided_actions and method.action_regex() is None:
            raise SystemExit(f"--guided-actions: method {args.method} declares no action format to guide")
        return args.guided_actions
    if args.thinking == "on" or args.budget in ("thinking", "paper"):
        return False
    return method.action_regex() is not None and (args.llm or DEFAULT_LLM).partition(":")[0] in GUIDED_BACKENDS


def backend_options(args: argparse.Namespace, llm_options: dict) -> dict:
    """``--llm-option`` values, plus ``--thinking`` (set in one place only), plus for the hf backend
    a prefix cache of one row per question in flight (``prefix_cache``; it changes speed, not
    results, so it is not in ``config.json`` / ``config.yaml``)."""
    options = dict(llm_options)
    if (args.llm or DEFAULT_LLM).partition(":")[0] == "hf":
        options = {"prefix_cache": max(1, args.concurrency), **options}
    if args.thinking == "auto":
        return options
    if "thinking" in options and thinking_setting(options["thinking"]) != THINKING_MODES[args.thinking]:
        raise SystemExit(f"--thinking {args.thinking} contradicts --llm-option thinking={options['thinking']}")
    return {**options, "thinking": args.thinking}
