"""The method interface and registry.

A method is plain sequential code for ONE question: an ``async def run(ctx)`` that calls the
LLM (``await ctx.generate(...)``) and the environment (``await ctx.search(q)``,
``await ctx.expand(ids)``, ``await ctx.answer(text)``). The runner (:mod:`methods.runner`)
runs many questions at once, so their LLM calls and retrievals are batched across questions.

The env's limits (candidates per search, passages opened, searches, actions, observation cap) live
in the :class:`~envs.config.EnvConfig` and nowhere else: a method reads them from ``ctx.env.config``.
Each method declares two things about its env: ``paper_env``, the limits its paper ran with (the
defaults a run's env recipe or ``--env.key value`` overrides), and :meth:`Method.fixed_env`, what
its protocol cannot run without (admission mode; for methods that count their own iterations, the
searches those allow). Every method answers through the env, so all of them are scored by the same
metrics and counted by the same evidence accounting.
"""
from __future__ import annotations

import dataclasses
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from envs.config import EnvConfig
from envs.typed_config import merge_values
from methods.guidance import action_regex

if TYPE_CHECKING:
    from methods.context import QuestionContext

REGISTRY: dict[str, type[Method]] = {}
DEFAULT_LLM_CALLS = 64  # LLM calls per question unless a method needs more (Method.llm_call_cap)
# Method options of earlier releases that are env limits now: old option -> EnvConfig field.
ENV_LIMIT_OPTIONS = {"k": "candidates_per_search", "max_expand": "max_expand", "max_searches": "max_searches",
                     "max_actions": "max_actions", "expand_form": "expand_form", "judge_question": "judge_question"}


def register(name: str):
    """Class decorator: make a method available as ``methods.get(name)``."""

    def decorate(cls: type[Method]) -> type[Method]:
        if name in REGISTRY:
            raise ValueError(f"method {name!r} registered twice")
        cls.name = name
        REGISTRY[name] = cls
        return cls

    return decorate


# The decoding options every method has (keyword-only fields of :class:`Method`), kept out of
# ``options()`` and recorded as the run's ``sampling`` instead (runs from before them still resume).
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "sampling_seed")


@dataclasses.dataclass
class Method(ABC):
    """Base class; subclasses are dataclasses whose fields are the method's options.

    Every method also has the decoding options of its LLM calls (keyword-only): ``temperature``
    (0: greedy, the default; ``top_p``/``top_k`` then do nothing), ``top_p`` (1: off), ``top_k``
    (0: off) and ``sampling_seed`` (None: each call's seed comes from the run's ``--run.seed``, the
    question id and the call's number; an int replaces ``--run.seed`` there). ``--method.budget paper`` /
    ``thinking`` set them per method (:mod:`methods.budgets`)."""

    name: ClassVar[str] = "method"
    # The env limits of the method's paper (EnvConfig fields): defaults that a run's env overrides.
    paper_env: ClassVar[Mapping[str, Any]] = {}
    # A leading <think> block is taken out of every completion before the method parses it
    # (methods.thinking); trained token-in/token-out protocols turn this off to match training.
    handles_thinking: ClassVar[bool] = True
    action_tags: ClassVar[tuple[str, ...]] = ()  # the tags its turns end in (guided decoding), if it has them
    temperature: float = dataclasses.field(default=0.0, kw_only=True)
    top_p: float = dataclasses.field(default=1.0, kw_only=True)
    top_k: int = dataclasses.field(default=0, kw_only=True)
    sampling_seed: int | None = dataclasses.field(default=None, kw_only=True)

    def fixed_env(self) -> dict[str, Any]:
        """EnvConfig fields the method's protocol fixes (admission mode, limits its own options imply)."""
        return {}

    def env_config(self, overrides: Mapping[str, Any] | None = None) -> EnvConfig:
        """The env of a run: EnvConfig defaults, then ``paper_env``, then the run's ``overrides``
        (an env recipe's keys, ``--env`` options; nested ``preview``/``reward`` sections merge key by
        key), then :meth:`fixed_env`. An override that contradicts the fixed settings is an error."""
        overrides = dict(overrides or {})
        fixed = self.fixed_env()
        clashes = {key: overrides[key] for key, value in fixed.items() if key in overrides and overrides[key] != value}
        if clashes:
            raise ValueError(f"method {self.name!r} runs with {', '.join(f'{k}={fixed[k]!r}' for k in clashes)}; "
                             f"the env sets {', '.join(f'{k}={v!r}' for k, v in clashes.items())}")
        return EnvConfig.from_dict({**merge_values(dict(self.paper_env), overrides), **fixed})

    def fit_env(self, env: EnvConfig) -> EnvConfig:
        """A whole env chosen by the caller (its limits are kept) with the method's fixed settings."""
        return dataclasses.replace(env, **self.fixed_env())

    @abstractmethod
    async def run(self, ctx: QuestionContext) -> None:
        """Answer ``ctx.question`` by calling ``ctx.generate`` and the env actions."""

    def action_regex(self) -> str | None:
        """The regular expression of one agent turn in this method's action format
        (:func:`methods.guidance.action_regex` of :attr:`action_tags`); None: no action format."""
        if not self.action_tags:
            return None
        bounds = {key: getattr(self, key) for key in ("answer_chars", "query_chars") if hasattr(self, key)}
        return action_regex(self.action_tags, **bounds)

    def llm_call_cap(self) -> int:
        """LLM calls one question may make when the run sets no ``--method.max_llm_calls``
        (:data:`DEFAULT_LLM_CALLS`; a method whose protocol needs more says so)."""
        return DEFAULT_LLM_CALLS

    def options(self) -> dict[str, Any]:
        """The method's settings, as saved with a run's resolved configuration (its decoding
        options apart: :meth:`sampling`)."""
        if not dataclasses.is_dataclass(self):
            return {}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in SAMPLING_FIELDS}

    def sampling(self) -> Sampling:
        """The decoding of every LLM call the method makes (ValueError for an impossible setting)."""
        return Sampling(float(self.temperature), float(self.top_p), int(self.top_k), self.sampling_seed)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Decoding settings of a method's LLM calls; ``temperature == 0`` is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None  # None: the run's --run.seed

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, not {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], not {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: off), not {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def record(self, run_seed: int) -> dict[str, Any]:
        """What ``config.json`` and ``metrics.json`` say about the decoding."""
        return {"mode": "greedy" if self.greedy else "sample", "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "seed": run_seed if self.seed is None else self.seed}


# Observation tokens per candidate in the papers' settings: SEEDS-R1 caps an observation at 1,200
# tokens for K=5 passages (appendix E); the prompted K=10 methods get the same room per passage.
OBS_TOKENS_PER_CANDIDATE = 240


def paper_limits(k: int, max_searches: int | None = None, max_actions: int | None = None,
                 max_expand: int | None = None) -> dict[str, Any]:
    """A ``paper_env``: K candidates per search, an observation cap that fits all K passages, and the
    given limits (None: the EnvConfig default)."""
    limits = {"candidates_per_search": k, "max_obs_tokens": OBS_TOKENS_PER_CANDIDATE * k,
              "max_searches": max_searches, "max_actions": max_actions, "max_expand": max_expand}
    return {key: value for key, value in limits.items() if value is not None}


def require_choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    """ValueError naming the allowed values when ``value`` is not one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{option} must be one of {choices}, not {value!r}")


def get(name: str, **options: Any) -> Method:
    """Build the registered method ``name`` with ``options`` (its dataclass fields)."""
    if name not in REGISTRY:
        raise KeyError(f"unknown method {name!r}; available: {', '.join(sorted(REGISTRY))}")
    cls = REGISTRY[name]
    if dataclasses.is_dataclass(cls):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(options) - known
        limits = sorted(unknown & ENV_LIMIT_OPTIONS.keys())
        if limits:
            raise TypeError(f"{limits} are env limits, not options of method {name!r}: set them in the env "
                            f"({', '.join(ENV_LIMIT_OPTIONS[o] for o in limits)}; e.g. --env.candidates_per_search 3)")
        if unknown:
            raise TypeError(f"method {name!r} has no option(s) {sorted(unknown)}; it takes {sorted(known)}")
    return cls(**options)


def split_env_limits(name: str, options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(method options, env overrides): options of earlier releases that are env limits now
    (``k=3`` -> ``candidates_per_search=3``) move to the env, with a DeprecationWarning."""
    cls = REGISTRY.get(name)
    own = {f.name for f in dataclasses.fields(cls)} if cls is not None and dataclasses.is_dataclass(cls) else set()
    method_options, env = {}, {}
    for key, value in options.items():
        if key in ENV_LIMIT_OPTIONS and key not in own:
            warnings.warn(f"method option {key}={value!r} is the env's {ENV_LIMIT_OPTIONS[key]} now "
                          f"(--env {ENV_LIMIT_OPTIONS[key]}={value}); the old option goes in the next release",
                          DeprecationWarning, stacklevel=2)
            env[ENV_LIMIT_OPTIONS[key]] = value
        else:
            method_options[key] = value
    return method_options, env


def available() -> list[str]:
    return sorted(REGISTRY)
