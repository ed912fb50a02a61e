"""The evaluation config: one typed tree of sections, read the way training reads its own.

    python -m inference.evaluate --method.name seeds-react --data.path data/hotpot.jsonl --data.limit 500 \\
        --model.name hf:/models/qwen --data.index indexes/wiki18-e5 --run.output_dir runs/seeds-react-hotpot

Sections: ``method`` (which method, its options and budget), ``model`` (the backend and how it
decodes), ``data`` (the questions and the retriever, as training's ``data``), ``env`` (EnvConfig
keys over the method's paper limits and ``env_config``) and ``run`` (folder, seed, logging, shards),
loaded by :func:`envs.typed_config.load_config`: defaults < ``--config`` YAML < ``--section.field
value``. The flags of earlier versions (``--method x --out y --env k=v --method-option k=v``) and
the flat keys of earlier YAML recipes are read through one map, :data:`OLD_FLAGS`, with one
``deprecated:`` line. ``--compare RUN ...`` and ``--merge`` are actions, not settings
(:func:`split_actions`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envs.config import EnvConfig
from envs.typed_config import OVERRIDES, ConfigError, deprecated, load_config, move_old_keys, parse_overrides
from inference.backends.chat import THINKING_MODES
from methods.budgets import PRESETS

DEFAULT_LLM = "hf:smollm2-135m"  # chat-tuned, ~4x faster than Gemma 3 270M base on CPU
REPORT_TO = ("none", "wandb")


@dataclass
class MethodSettings:
    name: str | None = None  # a registered method (the list is in --help's description); required to run
    # the method's own options, e.g. --method.options.max_tokens 128 (they win over the budget preset)
    options: dict[str, Any] = field(default_factory=dict)
    # a variant or ablation: seek: parallel_filling, plan, update, no_iter_retrieval, no_initialization; kair:
    # qa_with_docs_only, qa_with_index_only, no_index, no_evolving; maps: no_retrieval_direction, no_parallel,
    # no_disentanglement, single_call (same as --method.options.variant)
    variant: str | None = None
    # generation-budget preset: small (the methods' defaults), paper (the papers' settings), thinking
    # (reasoning models); None: none. method.options win over it
    budget: str | None = None
    greedy: bool = False  # greedy decoding under any budget preset (the default without one)
    max_llm_calls: int | None = None  # per question; None: the method's own cap (64; MAPS: room for its iterations)

    def __post_init__(self) -> None:
        if self.budget is not None and self.budget not in PRESETS:
            raise ConfigError(f"method.budget must be one of {PRESETS} (or null), not {self.budget!r}")


@dataclass
class ModelSettings:
    name: str = DEFAULT_LLM  # backend:model, e.g. hf:smollm2-135m, vllm:/models/x, openai:gpt-4o-mini
    # backend options, e.g. --model.options.max_batch_size 8, --model.options.base_url http://127.0.0.1:8000/v1
    options: dict[str, Any] = field(default_factory=dict)
    thinking: str = "auto"  # the chat template's enable_thinking switch: on, off, or auto (the template's default)
    # constrain each agent turn to free text then one well-formed action of the method's format (grammar-guided
    # decoding); None: on for methods with an action format on the hf and vllm backends
    guided_actions: bool | None = None

    def __post_init__(self) -> None:
        self.thinking = {"True": "on", "False": "off", "true": "on", "false": "off"}.get(self.thinking, self.thinking)
        if self.thinking not in THINKING_MODES:  # YAML reads `thinking: off` as false: read back above
            raise ConfigError(f"model.thinking must be one of {tuple(THINKING_MODES)}, not {self.thinking!r}")


@dataclass
class DataSettings:
    # FlashRAG JSONL / HotpotQA JSON path, or a Hugging Face dataset name; None: questions generated from the
    # embedded default corpus
    path: str | None = None
    # the dataset's name when data.path does not say it (e.g. nq, hotpotqa): method.budget paper picks
    # per-dataset search caps by it; None: the data.path file or hub name
    dataset: str | None = None
    split: str = "test"  # split of a hub dataset
    limit: int | None = None  # the first N questions (default 100); rerun with a larger N to extend a run
    # N questions drawn at random with run.seed (a larger N keeps the smaller sample's questions and adds more)
    sample: int | None = None
    index: str | None = None  # index folder (scripts/build_index.py); None: the embedded default index
    corpus: str | None = None  # corpus file, when it moved since the index was built
    # a retrieval server (python -m envs.retrieval.server, e.g. http://127.0.0.1:8000) or a web retriever
    # (web:searxng:..., web:serper?...) instead of data.index
    retriever: str | None = None


@dataclass
class RunSettings:
    output_dir: str | None = None  # run folder (predictions.jsonl, metrics.json, config.json, config.yaml); required
    seed: int = 0  # the generated questions, data.sample's draw and sampled decoding
    concurrency: int = 32  # questions in flight at once
    overwrite: bool = False  # discard an existing run in output_dir (else a run with the same config resumes)
    report_to: str = "none"  # "wandb": log to Weights & Biases (offline without WANDB_API_KEY)
    wandb_project: str = "seeds-rl"  # the W&B project
    # run shard I of N (0-based) of the questions into output_dir, e.g. 0/4 (under torchrun / accelerate
    # launch: from RANK/WORLD_SIZE)
    shard: str | None = None

    def __post_init__(self) -> None:
        if self.report_to not in REPORT_TO:
            raise ConfigError(f"run.report_to must be one of {REPORT_TO}, not {self.report_to!r}")


@dataclass
class EvalConfig:
    method: MethodSettings = field(default_factory=MethodSettings)  # the method, its options and budget
    model: ModelSettings = field(default_factory=ModelSettings)  # the LLM backend and how it decodes
    data: DataSettings = field(default_factory=DataSettings)  # the questions and the retriever
    env_config: str | None = None  # YAML env recipe (configs/env/) over the method's paper limits
    # env settings over the method's paper limits and env_config (the method sets its protocol over them)
    env: dict[str, Any] = field(default_factory=dict, metadata={OVERRIDES: EnvConfig})
    run: RunSettings = field(default_factory=RunSettings)  # run folder, seed, concurrency, logging, shards

    @classmethod
    def upgrade_keys(cls, values: dict[str, Any]) -> dict[str, Any]:
        """A recipe's (or command line's) flat keys of earlier versions moved into their sections
        (:data:`OLD_FLAGS`), with one deprecation line; ``method``, ``data`` and ``env`` are old
        keys only when they are not mappings (a name, a path, a list of ``key=value``)."""
        out, moved = move_old_keys(values, OLD_FLAGS, SECTIONS, old_value)
        if moved:
            deprecated(f"old evaluation options read as sections ({', '.join(sorted(set(moved)))}); write "
                       "--section.field (inference.eval_config.OLD_FLAGS; docs/evaluation.md, \"Config\")")
        return out


# The options of earlier versions -> today's dotted field. A ``*`` target takes ``key=value`` pairs (a list in a
# recipe, repeated flags on the command line) as that section's keys; ``wandb`` is ``run.report_to: wandb``.
OLD_FLAGS = {
    "method": "method.name", "method_option": "method.options.*", "variant": "method.variant",
    "budget": "method.budget", "greedy": "method.greedy", "max_llm_calls": "method.max_llm_calls",
    "llm": "model.name", "llm_option": "model.options.*", "thinking": "model.thinking",
    "guided_actions": "model.guided_actions",
    "data": "data.path", "dataset": "data.dataset", "split": "data.split", "limit": "data.limit",
    "sample": "data.sample", "index": "data.index", "corpus": "data.corpus", "retriever": "data.retriever",
    "env": "env.*", "out": "run.output_dir", "seed": "run.seed", "concurrency": "run.concurrency",
    "overwrite": "run.overwrite", "wandb": "run.report_to", "wandb_project": "run.wandb_project", "shard": "run.shard",
}
PAIR_FLAGS = {"method_option", "llm_option", "env"}  # flags of key=value pairs (repeatable)
SECTIONS = ("method", "model", "data", "env", "run")  # an old key of the same name is a value, not a mapping


def old_value(key: str, target: str, value: Any) -> tuple[str, Any]:
    """One old option's (target, value): pairs (``["k=3"]``) become that section's keys
    (``("env", "env.*", ["k=3"])`` -> ``("env", {"k": 3})``), ``wandb: true`` becomes ``report_to: wandb``."""
    if target.endswith(".*"):
        pairs = value if isinstance(value, list) else [value]
        return target[:-2], pairs_to_tree(pairs, f"--{key.replace('_', '-')}")
    return target, (("wandb" if value else "none") if key == "wandb" else value)


def pairs_to_tree(pairs: list, flag: str) -> dict[str, Any]:
    """``["k=3", "preview.max_tokens=40"]`` -> ``{"k": 3, "preview": {"max_tokens": 40}}``: each pair read
    as a ``--key=value`` override (:func:`envs.typed_config.parse_overrides`: YAML scalar values, ``-`` in
    keys read as ``_``, later pairs over earlier ones)."""
    bad = [pair for pair in pairs if not str(pair).partition("=")[0] or "=" not in str(pair)]
    if bad:
        raise ConfigError(f"{flag} expects key=value, got {bad[0]!r}")
    return parse_overrides([f"--{pair}" for pair in pairs])[1]


def upgrade_old_argv(argv: list[str]) -> list[str]:
    """``argv`` with the flags of earlier versions written as today's ``--section.field value``, in place
    (later settings still win): ``--out x`` -> ``--run.output_dir x``, ``--env k=3`` -> ``--env.k 3``,
    ``--no-guided-actions`` -> ``--model.guided_actions false``, ``--wandb`` -> ``--run.report_to wandb``."""
    out: list[str] = []
    moved: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        flag, eq, text = arg.partition("=")
        key = flag[2:].replace("-", "_") if flag.startswith("--") and "." not in flag else ""
        negated = key == "no_guided_actions"
        if key not in OLD_FLAGS and not negated:
            out.append(arg)
            continue
        key = "guided_actions" if negated else key
        takes_value = key not in ("greedy", "overwrite", "wandb", "guided_actions")
        if takes_value and not eq:
            if i >= len(argv) or argv[i].startswith("--"):
                raise ConfigError(f"{flag} expects a value")
            text, i = argv[i], i + 1
        value: Any = text if takes_value else ("false" if negated else "true")
        moved.append(flag)
        if key in PAIR_FLAGS:  # --env k=3 -> --env.k=3 (the value read as training reads it)
            pair_key, sep, pair_text = value.partition("=")
            if not sep or not pair_key:
                raise ConfigError(f"{flag} expects key=value, got {value!r}")
            out.append(f"--{OLD_FLAGS[key][:-2]}.{pair_key}={pair_text}")
        else:
            out.append(f"--{OLD_FLAGS[key]}={'wandb' if key == 'wandb' else value}")
    if moved:
        deprecated(f"old evaluation flags read as sections ({', '.join(sorted(set(moved)))}); write --section.field "
                   "(inference.eval_config.OLD_FLAGS; docs/evaluation.md, \"Config\")")
    return out


@dataclass
class Actions:
    compare: list[str] = field(default_factory=list)  # runs to print side by side and pair with the first
    merge: bool = False  # merge the shards of run.output_dir into predictions.jsonl and metrics.json


def split_actions(argv: list[str]) -> tuple[Actions, list[str]]:
    """``--compare RUN [RUN ...]`` and ``--merge`` taken out of ``argv``; the rest is the config's."""
    actions, rest = Actions(), []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--merge":
            actions.merge = True
        elif arg == "--compare":
            while i < len(argv) and not argv[i].startswith("--"):
                actions.compare.append(argv[i])
                i += 1
            if not actions.compare:
                raise ConfigError("--compare expects one or more run folders")
        else:
            rest.append(arg)
    return actions, rest


def load_eval_config(argv: list[str]) -> EvalConfig:
    """The evaluation config of a command line (no actions in it): defaults < ``--config`` < overrides."""
    return load_config(EvalConfig, upgrade_old_argv(argv))


def config_or_exit(argv: list[str]) -> tuple[Actions, EvalConfig]:
    """:func:`split_actions` and :func:`load_eval_config`, a bad option as a clear exit with its reason."""
    try:
        actions, rest = split_actions(argv)
        return actions, load_eval_config(rest)
    except ConfigError as err:
        raise SystemExit(f"python -m inference.evaluate: {err} (--help lists every option)") from err
