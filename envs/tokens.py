"""Counting and truncating text in policy tokens (or whitespace words without a tokenizer)."""
from __future__ import annotations

import re
from typing import Any


class TokenCounter:
    """Counts tokens with a Hugging Face tokenizer, or whitespace-separated words when none is given."""

    def __init__(self, tokenizer: Any | None = None):
        self.tokenizer: Any = tokenizer  # None means whitespace words; every caller of _ids checks it

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def count(self, text: str) -> int:
        if self.tokenizer is None:
            return len(text.split())
        return len(self._ids(text))

    def truncate(self, text: str, max_tokens: int) -> tuple[str, bool]:
        """Return ``text`` cut to at most ``max_tokens`` tokens and whether anything was cut."""
        if self.tokenizer is None:
            words = text.split()
            if len(words) <= max_tokens:
                return text, False
            return " ".join(words[:max_tokens]), True
        ids = self._ids(text)
        if len(ids) <= max_tokens:
            return text, False
        return self.tokenizer.decode(ids[:max_tokens], skip_special_tokens=True), True

    def kept_chars(self, text: str, max_tokens: int) -> int:
        """How many leading characters of ``text`` the first ``max_tokens`` tokens cover (what
        :meth:`truncate` keeps, located in the original text); ``len(text)`` when nothing is cut."""
        if self.tokenizer is None:
            words = list(re.finditer(r"\S+", text))
            return len(text) if len(words) <= max_tokens else words[max_tokens - 1].end() if max_tokens > 0 else 0
        if getattr(self.tokenizer, "is_fast", False):
            offsets = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            if len(offsets) <= max_tokens:
                return len(text)
            return offsets[max_tokens - 1][1] if max_tokens > 0 else 0
        kept, cut = self.truncate(text, max_tokens)
        return len(kept) if cut else len(text)
