"""A growing agent transcript, rendered as the prompt of the next turn.

:class:`ChatTranscript` keeps one user message (the instructions and question) and one growing
assistant message (model turns interleaved with env observations) that the model continues,
through the tokenizer's chat template or the plain fallback. :class:`TokenTranscript` is the
trainer's token-in/token-out form: the prompt's ids, then each turn's generated ids and the
observation's ids appended, never re-tokenised, so a trained checkpoint sees exactly the token
sequence it was trained on. Without a local tokenizer (an HTTP backend) it falls back to text.
"""
from __future__ import annotations

from typing import Any

from methods.llm import Completion, Prompt


class ChatTranscript:
    def __init__(self, instructions: str, system: str | None = None):
        self.messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": instructions}
        ]
        self.text = ""  # the assistant side so far

    def prompt(self) -> Prompt:
        if not self.text:
            return list(self.messages)
        return self.messages + [{"role": "assistant", "content": self.text}]

    def add_model(self, completion: Completion) -> None:
        self.text += completion.text

    def add_text(self, text: str) -> None:
        self.text += text

    def add_observation(self, observation: str) -> None:
        self.text += f"\n{observation}\n"


class TokenTranscript:
    def __init__(self, prompt_text: str, tokenizer: Any | None):
        self.tokenizer: Any = tokenizer  # None: text only (ids stays None, so _append never calls it)
        self.text = prompt_text
        self.ids: list[int] | None = None
        if tokenizer is not None:
            self.ids = tokenizer(prompt_text, add_special_tokens=True)["input_ids"]

    def prompt(self) -> Prompt:
        return list(self.ids) if self.ids is not None else self.text

    def add_model(self, completion: Completion) -> None:
        self.text += completion.text
        if self.ids is not None:
            self.ids += list(completion.token_ids)

    def add_text(self, text: str) -> None:
        self._append(text)

    def add_observation(self, observation: str) -> None:
        self._append(f"\n{observation}\n")

    def _append(self, text: str) -> None:
        self.text += text
        if self.ids is not None:
            self.ids += self.tokenizer(text, add_special_tokens=False)["input_ids"]
