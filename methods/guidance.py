"""Action formats as regular expressions, for grammar-guided decoding of agent turns.

A method whose turns end in one action tag (``<search>…</search>``, ``<expand>…</expand>``,
``<answer>…</answer>``, ``<read>…</read>``) declares its tags (:attr:`methods.base.Method.action_tags`);
with guided actions on (``python -m inference.evaluate --model.guided_actions``) each turn's request
carries :func:`action_regex` of those tags, and the backend decodes only tokens that keep the
completion a prefix of it: some free text (the model's reasoning, no ``<``), then exactly one
well-formed action, then the end. The prompt is unchanged; only impossible continuations are
masked, so a small model that would ramble or leave a tag open still ends each turn in an action.

Each turn is narrowed to the actions the env accepts at that point (:func:`open_tags`): only
``<expand>`` (candidate numbers of the latest snapshot) while a snapshot awaits its expand, no
``<search>`` once the searches are spent, no ``<expand>`` with nothing to expand.

Every action is bounded, so that a guided turn always closes its action within its token budget:
an answer is one line of at most ``answer_chars`` characters, a query one line of at most
``query_chars`` (method settings of the guided methods, defaults :data:`ANSWER_CHARS` and
:data:`QUERY_CHARS`), expand and read hold numbers only. The bounds are in characters, not tokens,
because the expression also travels to vLLM and OpenAI-compatible servers as a plain regular
expression, which cannot count tokens. A character bound is a token bound: every token writes at
least one character (one byte: a non-ASCII character written byte by byte is the one exception),
so given the turn's ``max_tokens`` (:func:`turn_regex`), the free text before each action gets at
most ``max_tokens`` minus that action's longest form in characters (and at most
:data:`THOUGHT_CHARS`), and no completion of the expression can outrun the budget.
"""
from __future__ import annotations

from envs.config import EnvConfig
from envs.episode import EpisodeState

THOUGHT_CHARS = 300  # free text before the action, at most
QUERY_CHARS = 120  # a search query: one line (about 20 words; the papers' queries are short keyword queries)
ANSWER_CHARS = 80  # an answer: one line (the datasets' answers are short entities, dates and numbers)
MAX_EXPAND_IDS = 20

_NUMBER = "[0-9]{1,3}"


def line(chars: int) -> str:
    """One line of 1..``chars`` characters, without tags."""
    return f"[^<>\\n]{{1,{chars}}}"


ACTION_CONTENT = {  # what each action tag may hold (with the default bounds)
    "search": line(QUERY_CHARS),
    "answer": line(ANSWER_CHARS),
    "expand": f"(none|{_NUMBER}((, ?| ){_NUMBER}){{0,{MAX_EXPAND_IDS - 1}}})",
    "read": _NUMBER,
}


def expand_content(candidates: int, max_expand: int) -> str:
    """``none`` or 1..``max_expand`` distinct-or-not numbers among ``1..candidates``."""
    number = "(" + "|".join(str(i) for i in range(candidates, 0, -1)) + ")"  # longest first: 10 before 1
    return f"(none|{number}((, ?| ){number}){{0,{max(0, max_expand - 1)}}})"


def _longest(tag: str, chars: int) -> int:
    """Characters of the longest ``<tag>content</tag>`` whose content is at most ``chars`` long."""
    return len(f"<{tag}></{tag}>") + chars


def action_regex(tags: tuple[str, ...], thought_chars: int = THOUGHT_CHARS, candidates: int | None = None,
                 max_expand: int = MAX_EXPAND_IDS, *, answer_chars: int = ANSWER_CHARS,
                 query_chars: int = QUERY_CHARS, max_tokens: int | None = None) -> str:
    """The regular expression of one agent turn: up to ``thought_chars`` characters of free text
    without ``<``, then exactly one ``<tag>content</tag>`` for a tag of ``tags``, then nothing.
    Contents: an answer one line of at most ``answer_chars`` characters, a query one line of at most
    ``query_chars``, ``<expand>`` numbers (with ``candidates``: of ``1..candidates`` only, at most
    ``max_expand`` of them), ``<read>`` one number. With ``max_tokens`` (the turn's budget), each
    action's free text is also cut to ``max_tokens`` minus the action's longest form, so that the
    whole turn is at most ``max_tokens`` characters (hence tokens). ``ValueError`` for an unknown tag,
    or for a budget too small to hold one of the actions."""
    if not tags:
        raise ValueError("an action format needs at least one tag")
    unknown = [t for t in tags if t not in ACTION_CONTENT]
    if unknown:
        raise ValueError(f"no action content known for tag(s) {unknown}; known: {sorted(ACTION_CONTENT)}")
    if min(answer_chars, query_chars) < 1:
        raise ValueError(f"answer_chars and query_chars must be positive, not {answer_chars} and {query_chars}")
    content = {**ACTION_CONTENT, "search": line(query_chars), "answer": line(answer_chars)}
    longest = {"search": _longest("search", query_chars), "answer": _longest("answer", answer_chars),
               "expand": _longest("expand", 3 * MAX_EXPAND_IDS + 2 * (MAX_EXPAND_IDS - 1)),
               "read": _longest("read", 3)}
    if candidates:
        content["expand"] = expand_content(candidates, max_expand)
        ids = max(1, max_expand)
        longest["expand"] = _longest("expand", max(4, len(str(candidates)) * ids + 2 * (ids - 1)))
    if max_tokens is None:
        actions = "|".join(f"<{tag}>{content[tag]}</{tag}>" for tag in tags)
        return f"[^<]{{0,{thought_chars}}}({actions})"
    short = [tag for tag in tags if longest[tag] > max_tokens]
    if short:
        raise ValueError(f"a turn of {max_tokens} tokens cannot hold a whole <{short[0]}> action "
                         f"({longest[short[0]]} characters): raise max_tokens or lower answer_chars/query_chars")
    turns = "|".join(f"[^<]{{0,{min(thought_chars, max_tokens - longest[tag])}}}<{tag}>{content[tag]}</{tag}>"
                     for tag in tags)
    return f"({turns})"


def open_tags(tags: tuple[str, ...], episode: EpisodeState, config: EnvConfig) -> tuple[str, ...]:
    """The tags of ``tags`` whose action the env accepts in this state (all of ``tags`` when it
    would accept none of them: the env then says why)."""
    preview = config.admission == "preview"
    pending = preview and config.require_expand and episode.awaiting_expand
    expandable = preview and episode.awaiting_expand
    accepted = {"search": not pending and episode.n_searches < config.max_searches, "expand": expandable,
                "read": expandable, "answer": not pending}
    narrowed = tuple(tag for tag in tags if accepted.get(tag, True))
    return narrowed or tags


def turn_regex(tags: tuple[str, ...], episode: EpisodeState, config: EnvConfig, *, max_tokens: int | None = None,
               answer_chars: int = ANSWER_CHARS, query_chars: int = QUERY_CHARS) -> str:
    """:func:`action_regex` of the actions the env accepts now, expand numbers from the latest
    snapshot, within a turn budget of ``max_tokens`` when given."""
    latest = episode.latest
    candidates = len(latest.hits) if latest is not None and episode.awaiting_expand else None
    return action_regex(open_tags(tags, episode, config), candidates=candidates or None, max_expand=config.max_expand,
                        answer_chars=answer_chars, query_chars=query_chars, max_tokens=max_tokens)
