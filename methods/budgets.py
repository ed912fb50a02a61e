"""Named generation-budget presets: per method, the ``max_tokens`` of each kind of LLM call.

The budgets stay the methods' own options (``max_tokens``, ``reader_max_tokens``,
``step_tokens``, ...); a preset only picks values for them, and an explicit option wins
(:func:`budget_options`). Three presets:

- ``small``: the methods' defaults, sized for small local instruct models (the embedded Gemma 3
  270M, SmolLM2): short per-call caps that stop a rambling small model early.
- ``paper``: the settings the papers (or their public code) state, where they state one; where
  they are silent the ``thinking`` value, since SEEDS, SEEK and MAPS ran reasoning models
  (QwQ-32B, Qwen3-32B). Sources per value: docs/methods.md, "Budgets and thinking models".
- ``thinking``: room for a reasoning model to think before it writes its tags: a few thousand
  tokens for short decisions (select, judge, answer), 8,192 for agent turns, readers and steps.
  Sized against a 32k context (QwQ-32B, Qwen3-32B: 32,768 native).

The trained protocols (``search-r1``, ``seeds-r1``) keep their per-turn budget in every preset
but ``paper``: a checkpoint is evaluated as it was trained.

A preset also sets each method's decoding (``temperature``, ``top_p``, ``top_k``: :data:`SAMPLING`)
and, under ``paper``, the search caps of the method's source per dataset (:func:`paper_env_limits`)
and its other settings: caps, prompt forms and worked examples (:data:`PAPER_OPTIONS`).
Without a preset every method decodes greedily with its ``paper_env`` caps, as before.
"""
from __future__ import annotations

import dataclasses
import re
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
    "seek": ("sketch_tokens", "query_tokens", "refine_tokens", "judge_tokens", "answer_tokens", "select_tokens",
             "update_tokens"),
    "kair": ("step_tokens", "repair_tokens", "answer_tokens", "select_tokens"),
    "maps": ("plan_tokens", "query_tokens", "refine_tokens", "judge_tokens", "answer_tokens", "select_tokens"),
    "main-rag": ("predict_tokens", "judge_tokens", "answer_tokens"),
    "deepnote": ("note_tokens", "query_tokens", "compare_tokens", "answer_tokens"),
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
             "answer_tokens": SHORT, "select_tokens": SHORT, "update_tokens": TURN},
    "kair": {"step_tokens": TURN, "repair_tokens": TURN, "answer_tokens": SHORT, "select_tokens": SHORT},
    "maps": {"plan_tokens": TURN, "query_tokens": SHORT, "refine_tokens": TURN, "judge_tokens": SHORT,
             "answer_tokens": SHORT, "select_tokens": SHORT},
    "main-rag": {"predict_tokens": SHORT, "judge_tokens": SHORT, "answer_tokens": SHORT},
    "deepnote": {"note_tokens": TURN, "query_tokens": SHORT, "compare_tokens": SHORT, "answer_tokens": SHORT},
}

# What the papers or their public code state (docs/methods.md table: the source of each value); the rest
# is THINKING's. SEEK's code caps the page-filling calls at 32,768 (sub-query and fill) within a
# 40,900-token window, the outline at 4,096 and the answer at 1,024; KAIR's code gives every call
# 768 (max_model_len 8,192); Search-R1's max_response_length is 500 per turn; DeepNote's code
# (src/main.py) gives every call 1,280. MAIN-RAG states none that we have (its THINKING values).
PAPER_STATED: dict[str, dict[str, int]] = {
    "seek": {"sketch_tokens": 4096, "query_tokens": 32768, "refine_tokens": 32768, "answer_tokens": 1024},
    "kair": {"step_tokens": 768, "repair_tokens": 768, "answer_tokens": 768},
    "search-r1": {"max_tokens": 500},
    "deepnote": {"note_tokens": 1280, "query_tokens": 1280, "compare_tokens": 1280, "answer_tokens": 1280},
}


# Decoding per preset and method: (temperature, top_p, top_k); temperature 0 is greedy. Values the
# papers' code states (shared/notes/rag_toolkits.md, seed_methods.md; read, not re-run):
SEARCH_O1_CODE = (0.7, 0.8, 20)  # Search-o1's run_search_o1.py: reasoner and Reason-in-Documents sampling (its
#                                  repetition_penalty 1.05 for QwQ has no option here: a named deviation)
PAGER_CODE = (0.7, 0.8, 20)  # PAGER (SEEK's code): every call (its repetition_penalty 1.02, seed 66: not applied)
KAIR_CODE = (0.1, 0.9, 0)  # KAIR's code: vLLM SamplingParams temperature 0.1, top_p 0.9 (no top_k: off)
DEEPNOTE_CODE = (0.1, 0.9, 0)  # DeepNote's src/main.py: the same SamplingParams (KAIR is built on it)
# Where the source is silent, reasoning-model decoding: the QwQ-32B and Qwen3 model cards ask for
# temperature 0.6, top_p 0.95, top_k 20 (20-40 for QwQ) in thinking mode and warn against greedy decoding.
REASONING_CARD = (0.6, 0.95, 20)
GREEDY = (0.0, 1.0, 0)  # the trained protocols: Search-R1 validates greedily (do_sample=False)

SAMPLING_THINKING: dict[str, tuple[float, float, int]] = {
    **{m: REASONING_CARD for m in BUDGET_FIELDS}, "search-r1": GREEDY, "seeds-r1": GREEDY}
SAMPLING_PAPER: dict[str, tuple[float, float, int]] = {
    **SAMPLING_THINKING,
    "search-o1": SEARCH_O1_CODE,
    "seeds-o1": SEARCH_O1_CODE,  # SEEDS §F.1 builds SEEDS-o1 on Search-o1 and states no sampling of its own
    "seek": PAGER_CODE,
    "kair": KAIR_CODE,
    "deepnote": DEEPNOTE_CODE,
}
SAMPLING = {"small": {m: GREEDY for m in BUDGET_FIELDS}, "paper": SAMPLING_PAPER, "thinking": SAMPLING_THINKING}
GREEDY_OPTIONS = dict(zip(("temperature", "top_p", "top_k"), GREEDY))  # --method.greedy: under any preset

# Search caps of the papers' sources per dataset kind, applied under ``--method.budget paper`` only (the
# methods' ``paper_env`` stays the default without a preset, so earlier results do not move).
# Search-o1's released code (run_search_o1.py): MAX_SEARCH_LIMIT 10, MAX_TURN 15 on HotpotQA, 2Wiki,
# MuSiQue and Bamboogle; MAX_SEARCH_LIMIT 5 on NQ and TriviaQA (MAX_TURN there: the argparse default
# 15). One Search-o1 turn ends in one search or the answer: one env action.
SINGLE_HOP = ("nq", "triviaqa", "popqa", "squad", "webq")  # "NQ-style": Search-o1's 5-search sets (nq, triviaqa)
MULTI_HOP = ("hotpotqa", "2wiki", "musique", "bamboogle")  # Search-o1's 10-search sets
SEARCH_O1_LIMITS = {"single_hop": {"max_searches": 5, "max_actions": 15},
                    "multi_hop": {"max_searches": 10, "max_actions": 15}}
PAPER_LIMITS: dict[str, dict[str, dict[str, int]]] = {
    "search-o1": SEARCH_O1_LIMITS,
    # SEEDS-o1 is Search-o1 with an admission step (SEEDS §F.1; no caps of its own in our text): Search-o1's
    # searches, and its 15 turns plus one expand per allowed search (our mapping).
    "seeds-o1": {kind: {"max_searches": c["max_searches"], "max_actions": 15 + c["max_searches"]}
                 for kind, c in SEARCH_O1_LIMITS.items()},
}


# Method options that are not budgets, set under ``--method.budget paper`` only to their source's setting
# (each one's default is a named deviation: docs/paper_settings.md). SEEK, as PAGER's code runs it: no
# cap on the sketch's topics, whole documents for the fill call, the sketch's analysis before its
# topics and reasoning before a tagged answer. SEEDS-ReAct and SEEDS-o1: the paper's prompts are
# instructions only (SEEDS §A.4), without our worked example.
PAPER_OPTIONS: dict[str, dict[str, Any]] = {
    "seek": {"max_slots": None, "doc_chars": None, "reasoning_first": True},
    "seeds-react": {"example": False},
    "seeds-o1": {"example": False},
}


def dataset_kind(name: str | None) -> str | None:
    """``single_hop`` or ``multi_hop`` for a dataset name or data file path: the kind of the first
    word of its file name (split at anything not a letter or digit) that starts with a known name
    (``hotpotqa_dev.jsonl``, ``2WikiMultihopQA`` -> multi_hop; ``nq_test.jsonl``,
    ``FlashRAG_datasets/nq`` -> single_hop); None: no known name."""
    if not name:
        return None
    words = re.split(r"[^a-z0-9]+", str(name).replace("\\", "/").rsplit("/", 1)[-1].lower())
    for word in words:
        for kind, names in (("multi_hop", MULTI_HOP), ("single_hop", SINGLE_HOP)):
            if any(word.startswith(n) for n in names):
                return kind
    return None


def paper_env_limits(preset: str | None, method: str, dataset: str | None) -> dict[str, int]:
    """The env caps ``preset`` gives ``method`` on ``dataset`` (a name or data path): under
    ``paper``, its source's caps for the dataset's kind (multi-hop when the kind is unknown:
    Search-o1's argparse defaults); otherwise none (the method's ``paper_env``)."""
    if preset != "paper" or method not in PAPER_LIMITS:
        return {}
    return dict(PAPER_LIMITS[method][dataset_kind(dataset) or "multi_hop"])


def _defaults(method: str) -> dict[str, int]:
    fields: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(REGISTRY[method])}
    return {name: fields[name] for name in BUDGET_FIELDS[method]}


def _paper() -> dict[str, dict[str, int]]:
    return {method: {**THINKING[method], **PAPER_STATED.get(method, {})} for method in BUDGET_FIELDS}


def presets() -> dict[str, dict[str, dict[str, int]]]:
    """Every preset: name -> method -> {budget option: tokens}."""
    return {"small": {m: _defaults(m) for m in BUDGET_FIELDS}, "paper": _paper(), "thinking": dict(THINKING)}


PRESETS = ("small", "paper", "thinking")


def budget_options(preset: str | None, method: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``options`` with the preset's budgets and decoding (:data:`SAMPLING`) added for ``method``,
    and under ``paper`` its source's other settings (:data:`PAPER_OPTIONS`); options given
    explicitly win (``temperature=0``: greedy under any preset; ``example=true`` under paper).

    ``preset=None`` adds nothing (the method's defaults, i.e. ``small``). Unknown preset or method:
    ValueError naming the choices."""
    options = dict(options or {})
    if preset is None:
        return options
    if preset not in PRESETS:
        raise ValueError(f"budget preset must be one of {PRESETS}, not {preset!r}")
    if method not in BUDGET_FIELDS:
        raise ValueError(f"no budget presets for method {method!r}; they cover {sorted(BUDGET_FIELDS)}")
    sampling = dict(zip(("temperature", "top_p", "top_k"), SAMPLING[preset][method]))
    settings = PAPER_OPTIONS.get(method, {}) if preset == "paper" else {}
    return {**presets()[preset][method], **sampling, **settings, **options}
