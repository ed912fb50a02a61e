"""Named generation-budget presets: per method, the ``max_tokens`` of each kind of LLM call.

The budgets stay the methods' own options (``max_tokens``, ``reader_max_tokens``,
``step_tokens``, ...); a preset only picks values for them, and an explicit option wins
(:func:`budget_options`). Three presets:

- ``small``: the methods' defaults, sized for small local instruct models (the embedded Gemma 3
  270M, SmolLM2): short per-call caps that stop a rambling small model early.
- ``paper``: the settings the papers (or their public code) state, where they state one; where
  they are silent the ``thinking`` value, since SEEDS, SEEK and MAPS ran reasoning models
  (QwQ-32B, Qwen3-32B). Sources per value: README, "Budgets and thinking models".
- ``thinking``: room for a reasoning model to think before it writes its tags: a few thousand
  tokens for short decisions (select, judge, answer), 8,192 for agent turns, readers and steps.
  Sized against a 32k context (QwQ-32B, Qwen3-32B: 32,768 native).

The trained protocols (``search-r1``, ``seeds-r1``) keep their per-turn budget in every preset
but ``paper``: a checkpoint is evaluated as it was trained.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import methods  # noqa: F401  (registers every method, whose defaults make the small preset)
from methods.base import REGISTRY

# Every token-budget option, per method (what a preset may set).
BUDGET_FIELDS: dict[str, tuple[str, ...]] = {
    "vanilla-llm": ("answer_tokens",),
    "vanilla-rag": ("answer_tokens",),
    "react": ("max_tokens", "forced_answer_tokens"),
    "react-dynk": ("max_tokens", "forced_answer_tokens"),
    "search-o1": ("max_tokens", "reader_max_tokens", "forced_answer_tokens"),
    "search-r1": ("max_tokens",),
    "seeds-react": ("max_tokens", "forced_answer_tokens"),
    "seeds-o1": ("max_tokens", "reader_max_tokens", "forced_answer_tokens"),
    "seeds-r1": ("max_tokens",),
    "ircot": ("max_tokens", "answer_tokens"),
    "iter-retgen": ("max_tokens",),
    "seek": ("sketch_tokens", "query_tokens", "refine_tokens", "judge_tokens", "answer_tokens", "select_tokens"),
    "kair": ("step_tokens", "repair_tokens", "answer_tokens", "select_tokens"),
    "maps": ("plan_tokens", "refine_tokens", "judge_tokens", "answer_tokens", "select_tokens"),
}

TURN = 8192  # an agent turn, a reader call, a KAIR step, a SEEK/MAPS sketch, plan or refinement
SHORT = 4096  # a short decision after thinking: an answer, a selection, a judgement, a sub-query

THINKING: dict[str, dict[str, int]] = {
    "vanilla-llm": {"answer_tokens": SHORT},
    "vanilla-rag": {"answer_tokens": SHORT},
    "react": {"max_tokens": TURN, "forced_answer_tokens": SHORT},
    "react-dynk": {"max_tokens": TURN, "forced_answer_tokens": SHORT},
    "search-o1": {"max_tokens": TURN, "reader_max_tokens": TURN, "forced_answer_tokens": SHORT},
    "search-r1": {"max_tokens": 512},
    "seeds-react": {"max_tokens": TURN, "forced_answer_tokens": SHORT},
    "seeds-o1": {"max_tokens": TURN, "reader_max_tokens": TURN, "forced_answer_tokens": SHORT},
    "seeds-r1": {"max_tokens": 512},
    "ircot": {"max_tokens": SHORT, "answer_tokens": SHORT},
    "iter-retgen": {"max_tokens": TURN},
    "seek": {"sketch_tokens": TURN, "query_tokens": SHORT, "refine_tokens": TURN, "judge_tokens": SHORT,
             "answer_tokens": SHORT, "select_tokens": SHORT},
    "kair": {"step_tokens": TURN, "repair_tokens": TURN, "answer_tokens": SHORT, "select_tokens": SHORT},
    "maps": {"plan_tokens": TURN, "refine_tokens": TURN, "judge_tokens": SHORT, "answer_tokens": SHORT,
             "select_tokens": SHORT},
}

# What the papers or their public code state (README table: the source of each value); the rest
# is THINKING's. SEEK's code caps the page-filling calls at 32,768 (sub-query and fill) within a
# 40,900-token window, the outline at 4,096 and the answer at 1,024; KAIR's code gives every call
# 768 (max_model_len 8,192); Search-R1's max_response_length is 500 per turn.
PAPER_STATED: dict[str, dict[str, int]] = {
    "seek": {"sketch_tokens": 4096, "query_tokens": 32768, "refine_tokens": 32768, "answer_tokens": 1024},
    "kair": {"step_tokens": 768, "repair_tokens": 768, "answer_tokens": 768},
    "search-r1": {"max_tokens": 500},
}


def _defaults(method: str) -> dict[str, int]:
    fields = {f.name: f.default for f in dataclasses.fields(REGISTRY[method])}
    return {name: fields[name] for name in BUDGET_FIELDS[method]}


def _paper() -> dict[str, dict[str, int]]:
    return {method: {**THINKING[method], **PAPER_STATED.get(method, {})} for method in BUDGET_FIELDS}


def presets() -> dict[str, dict[str, dict[str, int]]]:
    """Every preset: name -> method -> {budget option: tokens}."""
    return {"small": {m: _defaults(m) for m in BUDGET_FIELDS}, "paper": _paper(), "thinking": dict(THINKING)}


PRESETS = ("small", "paper", "thinking")


def budget_options(preset: str | None, method: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``options`` with the preset's budgets added for ``method``; options given explicitly win.

    ``preset=None`` adds nothing (the method's defaults, i.e. ``small``). Unknown preset or method:
    ValueError naming the choices."""
    options = dict(options or {})
    if preset is None:
        return options
    if preset not in PRESETS:
        raise ValueError(f"budget preset must be one of {PRESETS}, not {preset!r}")
    if method not in BUDGET_FIELDS:
        raise ValueError(f"no budget presets for method {method!r}; they cover {sorted(BUDGET_FIELDS)}")
    return {**presets()[preset][method], **options}
