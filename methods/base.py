"""The method interface and registry.

A method is plain sequential code for ONE question: an ``async def run(ctx)`` that calls the
LLM (``await ctx.generate(...)``) and the environment (``await ctx.search(q)``,
``await ctx.expand(ids)``, ``await ctx.answer(text)``). The runner (:mod:`methods.runner`)
runs many questions at once, so their LLM calls and retrievals are batched across questions.

Each method also says which environment it needs (:meth:`Method.env_config`): admission mode,
candidates per search and limits. Every method answers through the env, so all of them are
scored by the same metrics and counted by the same evidence accounting.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from envs.config import EnvConfig
from methods.guidance import action_regex

if TYPE_CHECKING:
    from methods.context import QuestionContext

REGISTRY: dict[str, type[Method]] = {}


def register(name: str):
    """Class decorator: make a method available as ``methods.get(name)``."""

    def decorate(cls: type[Method]) -> type[Method]:
        if name in REGISTRY:
            raise ValueError(f"method {name!r} registered twice")
        cls.name = name
        REGISTRY[name] = cls
        return cls

    return decorate


class Method(ABC):
    """Base class; subclasses are dataclasses whose fields are the method's options."""

    name: ClassVar[str] = "method"
    action_tags: ClassVar[tuple[str, ...]] = ()  # the tags its turns end in (guided decoding), if it has them

    def env_config(self, base: EnvConfig) -> EnvConfig:
        """The env this method runs in, derived from the run's base config (default: unchanged)."""
        return base

    @abstractmethod
    async def run(self, ctx: QuestionContext) -> None:
        """Answer ``ctx.question`` by calling ``ctx.generate`` and the env actions."""

    def action_regex(self) -> str | None:
        """The regular expression of one agent turn in this method's action format
        (:func:`methods.guidance.action_regex` of :attr:`action_tags`); None: no action format."""
        return action_regex(self.action_tags) if self.action_tags else None

    def options(self) -> dict[str, Any]:
        """The method's settings, as saved with a run's resolved configuration."""
        return dataclasses.asdict(self) if dataclasses.is_dataclass(self) else {}


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
        if unknown:
            raise TypeError(f"method {name!r} has no option(s) {sorted(unknown)}; it takes {sorted(known)}")
    return cls(**options)


def available() -> list[str]:
    return sorted(REGISTRY)
