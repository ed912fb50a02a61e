"""Action formats as regular expressions, for grammar-guided decoding of agent turns.

A method whose turns end in one action tag (``<search>…</search>``, ``<expand>…</expand>``,
``<answer>…</answer>``, ``<read>…</read>``) declares its tags (:attr:`methods.base.Method.action_tags`);
with guided actions on (``python -m inference.evaluate --guided-actions``) each turn's request
carries :func:`action_regex` of those tags, and the backend decodes only tokens that keep the
completion a prefix of it: some free text (the model's reasoning, no ``<``), then exactly one
well-formed action, then the end. The prompt is unchanged; only impossible continuations are
masked, so a small model that would ramble or leave a tag open still ends each turn in an action.

Each turn is narrowed to the actions the env accepts at that point (:func:`open_tags`): only
``<expand>`` (candidate numbers of the latest snapshot) while a snapshot awaits its expand, no
``<search>`` once the searches are spent, no ``<expand>`` with nothing to expand.

Lengths are bounded in characters so that a turn fits its token budget (``max_tokens`` 256 with
the defaults: about 300 characters of reasoning and a 200-character query are well under it).
"""
from __future__ import annotations

from envs.config import EnvConfig
from envs.episode import EpisodeState

THOUGHT_CHARS = 300  # free text before the action
QUERY_CHARS = 200
ANSWER_CHARS = 150
MAX_EXPAND_IDS = 20

_NUMBER = "[0-9]{1,3}"
ACTION_CONTENT = {  # what each action tag may hold
    "search": f"[^<>]{{1,{QUERY_CHARS}}}",
    "answer": f"[^<>]{{1,{ANSWER_CHARS}}}",
    "expand": f"(none|{_NUMBER}((, ?| ){_NUMBER}){{0,{MAX_EXPAND_IDS - 1}}})",
    "read": _NUMBER,
}


def expand_content(candidates: int, max_expand: int) -> str:
    """``none`` or 1..``max_expand`` distinct-or-not numbers among ``1..candidates``."""
    number = "(" + "|".join(str(i) for i in range(candidates, 0, -1)) + ")"  # longest first: 10 before 1
    return f"(none|{number}((, ?| ){number}){{0,{max(0, max_expand - 1)}}})"


def action_regex(tags: tuple[str, ...], thought_chars: int = THOUGHT_CHARS, candidates: int | None = None,
                 max_expand: int = MAX_EXPAND_IDS) -> str:
    """The regular expression of one agent turn: up to ``thought_chars`` characters of free text
    without ``<``, then exactly one ``<tag>content</tag>`` for a tag of ``tags`` (contents as in
    :data:`ACTION_CONTENT`; with ``candidates``, ``<expand>`` holds numbers of ``1..candidates``
    only, at most ``max_expand`` of them), then nothing. ``ValueError`` for an unknown tag."""
    if not tags:
        raise ValueError("an action format needs at least one tag")
    unknown = [t for t in tags if t not in ACTION_CONTENT]
    if unknown:
        raise ValueError(f"no action content known for tag(s) {unknown}; known: {sorted(ACTION_CONTENT)}")
    content = dict(ACTION_CONTENT)
    if candidates:
        content["expand"] = expand_content(candidates, max_expand)
    actions = "|".join(f"<{tag}>{content[tag]}</{tag}>" for tag in tags)
    return f"[^<]{{0,{thought_chars}}}({actions})"


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


def turn_regex(tags: tuple[str, ...], episode: EpisodeState, config: EnvConfig) -> str:
    """:func:`action_regex` of the actions the env accepts now, expand numbers from the latest snapshot."""
    latest = episode.latest
    candidates = len(latest.hits) if latest is not None and episode.awaiting_expand else None
    return action_regex(open_tags(tags, episode, config), candidates=candidates or None, max_expand=config.max_expand)
