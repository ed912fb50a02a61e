"""Turn a request's prompt into text or token ids for a local model.

Chat messages use the tokenizer's chat template when it has one. A model without one (the
offline default, Gemma 3 270M base) gets a plain-text transcript ending in an open
``Assistant:`` turn, which a base model continues naturally.

Thinking mode (``thinking``): ``True``/``False`` is passed to the template as
``enable_thinking`` (Qwen3's switch; templates that read the variable under that name);
``None`` leaves the template's default. :func:`check_thinking_switch` refuses a setting the
template would silently ignore.
"""
from __future__ import annotations

from typing import Any, cast

from methods.llm import ChatMessages, Prompt

_ROLE_NAMES = {"system": "Instructions", "user": "User", "assistant": "Assistant"}


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def plain_chat(messages: list[dict[str, str]]) -> str:
    """The fallback format: ``Role: content`` blocks separated by blank lines, then ``Assistant:``.

    A trailing assistant message is continued rather than closed, so a caller can prefill the
    start of the answer.
    """
    blocks = [f"{_ROLE_NAMES.get(m['role'], m['role'].title())}: {m['content']}" for m in messages]
    if messages and messages[-1]["role"] == "assistant":
        return "\n\n".join(blocks)
    return "\n\n".join(blocks + ["Assistant:"])


THINKING_MODES = {"on": True, "off": False, "auto": None}
THINKING_SWITCH = "enable_thinking"


def thinking_setting(mode: str | bool | None) -> bool | None:
    """``"on"``/``"off"``/``"auto"`` (or True/False/None) as the ``enable_thinking`` value to pass."""
    if mode is None or isinstance(mode, bool):
        return mode
    if mode not in THINKING_MODES:
        raise ValueError(f"thinking must be one of {tuple(THINKING_MODES)}, not {mode!r}")
    return THINKING_MODES[mode]


def check_thinking_switch(tokenizer: Any, thinking: bool | None) -> None:
    """ValueError when thinking is set on or off but the chat template has no ``enable_thinking`` switch."""
    if thinking is None:
        return
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    template = " ".join(template.values()) if isinstance(template, dict) else (template or "")
    if THINKING_SWITCH not in template:
        raise ValueError(f"thinking={'on' if thinking else 'off'} needs a chat template with an "
                         f"{THINKING_SWITCH!r} switch (Qwen3 has one; QwQ-32B and DeepSeek-R1 always think, "
                         "and a model without a chat template has none); use thinking=auto")


def render_chat(tokenizer: Any, messages: list[dict[str, str]], thinking: bool | None = None) -> str:
    """Chat messages as the text the model sees (template, or the plain fallback); ``thinking``:
    the template's ``enable_thinking`` (None: its default)."""
    if not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
        raise ValueError("chat messages must be dicts with 'role' and 'content'")
    if tokenizer is not None and has_chat_template(tokenizer):
        continue_last = messages[-1]["role"] == "assistant"
        switch = {} if thinking is None else {THINKING_SWITCH: thinking}
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=not continue_last, continue_final_message=continue_last,
            **switch,
        )
    return plain_chat(messages)


def prompt_token_ids(tokenizer: Any, prompt: Prompt, thinking: bool | None = None) -> list[int]:
    """Token ids for any prompt form: ids pass through, text and chat are tokenised once
    (``thinking``: see :func:`render_chat`)."""
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) and prompt:
        return list(cast(list[int], prompt))
    # a list that is not token ids is chat messages
    text = render_chat(tokenizer, cast(ChatMessages, prompt), thinking) if isinstance(prompt, list) else prompt
    if not isinstance(text, str):
        raise ValueError(f"unsupported prompt type: {type(prompt).__name__}")
    # Chat templates already hold the BOS token; raw text gets the tokenizer's usual specials.
    add_special = not (isinstance(prompt, list) and has_chat_template(tokenizer))
    return tokenizer(text, add_special_tokens=add_special)["input_ids"]
