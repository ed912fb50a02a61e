"""Thinking blocks of reasoning models (QwQ-32B, Qwen3, DeepSeek-R1), handled before any parsing.

A reasoning model opens its output with ``<think> ... </think>`` (or its chat template opens the
block in the prompt: QwQ-32B's and DeepSeek-R1's end the generation prompt with ``<think>``, so
the output holds only the closing tag). Only that *leading* block is thinking: a ``<think>`` tag
written later is a method's own format (KAIR's reasoning part, Search-R1's ``<think>`` turns).

:func:`split_thinking` separates the thinking from the visible text; methods parse the visible
text only, so a ``<search>`` or ``<answer>`` the model merely considers while thinking is never
taken as its action. :class:`methods.context.QuestionContext` also keeps a stop string from
ending a call inside the thinking: the call is continued (:func:`continuation_prompt`) until the
thinking closes and a stop fires in the visible text, or the call's token budget is spent. A
budget that runs out inside the thinking leaves no visible text, which the method records as its
usual invalid or missing output (and the context as a ``thinking_cut_off`` note).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from methods.llm import Completion, Prompt

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_OPEN = re.compile(re.escape(THINK_OPEN), re.IGNORECASE)
_CLOSE = re.compile(re.escape(THINK_CLOSE), re.IGNORECASE)
PROMPT_TAIL_TOKENS = 16  # tokens at the end of a prompt searched for an open <think>


@dataclass(frozen=True)
class ThinkingSplit:
    """One output, cut into its leading thinking and the visible rest."""

    visible: str  # what parsers, transcripts and the env see
    thinking: str  # the thinking block's content (without its tags); "" when there is none
    present: bool  # the output (or its prompt) opened a thinking block
    closed: bool  # ... and the block was closed (False: the output ended inside it)

    @property
    def cut_off(self) -> bool:
        """The output ended inside its thinking (no visible text at all)."""
        return self.present and not self.closed


def split_thinking(text: str, opened: bool = False) -> ThinkingSplit:
    """The leading thinking block of ``text`` and the visible text after it.

    ``opened``: the prompt already opened the block. A ``</think>`` that comes before any
    ``<think>`` is taken as the close of such a block too (a template we could not inspect).
    """
    close = _CLOSE.search(text)
    open_ = _OPEN.search(text)
    if not opened and close is not None and (open_ is None or close.start() < open_.start()):
        opened = True
    start = 0
    if not opened:
        if open_ is None or text[:open_.start()].strip():
            return ThinkingSplit(text, "", present=False, closed=False)
        start = open_.end()
    close = _CLOSE.search(text, start)
    if close is None:
        return ThinkingSplit("", text[start:].strip(), present=True, closed=False)
    return ThinkingSplit(text[close.end():].lstrip(), text[start:close.start()].strip(), present=True, closed=True)


def ends_inside_thinking(text: str) -> bool:
    """Whether the last ``<think>`` in ``text`` is still open (a prompt that opens the block)."""
    opens = list(_OPEN.finditer(text))
    return bool(opens) and _CLOSE.search(text, opens[-1].end()) is None


def prompt_opens_thinking(prompt: Prompt, prompt_token_ids: list[int], tokenizer: Any) -> bool:
    """Whether the rendered prompt ends inside a ``<think>`` block (QwQ-32B, DeepSeek-R1 templates).

    Raw text is read as it is; a rendered chat or token prompt is read from the last
    :data:`PROMPT_TAIL_TOKENS` of the ids the backend reported, decoded with its tokenizer.
    Without ids or tokenizer (a hosted API) this is False, and :func:`split_thinking` still
    recognises the block by its closing tag.
    """
    if isinstance(prompt, str):
        return ends_inside_thinking(prompt)
    if tokenizer is None or not prompt_token_ids:
        return False
    tail = tokenizer.decode(list(prompt_token_ids[-PROMPT_TAIL_TOKENS:]), skip_special_tokens=False)
    return ends_inside_thinking(tail)


def continuation_prompt(prompt: Prompt, prompt_token_ids: list[int], parts: list[Completion]) -> Prompt | None:
    """The prompt that continues ``prompt`` after the outputs ``parts`` (None: cannot continue).

    Token ids when the backend reported the prompt's ids and every part's ids (exact, whatever
    the chat template); else the text appended to a raw-text prompt, or to the chat's assistant
    message (continued, not closed)."""
    text = "".join(p.text for p in parts)
    if prompt_token_ids and all(p.token_ids for p in parts):
        return list(prompt_token_ids) + [t for p in parts for t in p.token_ids]
    if isinstance(prompt, str):
        return prompt + text
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        if prompt[-1].get("role") == "assistant":
            return prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + text}]
        return list(prompt) + [{"role": "assistant", "content": text}]
    return None


def needs_continuation(completion: Completion, split: ThinkingSplit) -> bool:
    """A stop string (or nothing) fired inside the thinking, or before any visible text followed it."""
    if completion.finish_reason != "stop" or not split.present:
        return False
    return not split.closed or not split.visible.strip()


def merged(parts: list[Completion], split: ThinkingSplit) -> Completion:
    """One completion for the parts of a continued call: visible text, every token, the last finish."""
    last = parts[-1]
    return Completion(split.visible, [t for p in parts for t in p.token_ids], [x for p in parts for x in p.logprobs],
                      last.finish_reason, last.stop_string, last.error, thinking=split.thinking)
