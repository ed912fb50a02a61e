"""Action formats as regular expressions, for grammar-guided decoding of agent turns.

A method whose turns end in one action tag (``<search>…</search>``, ``<expand>…</expand>``,
``<answer>…</answer>``, ``<read>…</read>``) declares its tags (:attr:`methods.base.Method.action_tags`);
with guided actions on (``python -m inference.evaluate --guided-actions``) each turn's request
carries :func:`action_regex` of those tags, and the backend decodes only tokens that keep the
completion a prefix of it: some free text (the model's reasoning, no ``<``), then exactly one
well-formed action, then the end. The prompt is unchanged; only impossible continuations are
masked, so a small model that would ramble or leave a tag open still ends each turn in an action.

Lengths are bounded in characters so that a turn fits its token budget (``max_tokens`` 256 with
the defaults: about 300 characters of reasoning and a 200-character query are well under it).
"""
from __future__ import annotations

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


def action_regex(tags: tuple[str, ...], thought_chars: int = THOUGHT_CHARS) -> str:
    """The regular expression of one agent turn: up to ``thought_chars`` characters of free text
    without ``<``, then exactly one ``<tag>content</tag>`` for a tag of ``tags`` (contents as in
    :data:`ACTION_CONTENT`), then nothing. ``ValueError`` for a tag without a known content."""
    if not tags:
        raise ValueError("an action format needs at least one tag")
    unknown = [t for t in tags if t not in ACTION_CONTENT]
    if unknown:
        raise ValueError(f"no action content known for tag(s) {unknown}; known: {sorted(ACTION_CONTENT)}")
    actions = "|".join(f"<{tag}>{ACTION_CONTENT[tag]}</{tag}>" for tag in tags)
    return f"[^<]{{0,{thought_chars}}}({actions})"
