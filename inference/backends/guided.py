"""Grammar-guided decoding for the local decode loop (:mod:`inference.backends.hf`), with llguidance.

A request with ``regex`` (:class:`methods.llm.GenerationRequest`) gets one matcher per sampled
row: before each token, the row's logits outside the tokens that keep the completion a prefix of
the expression are set to -inf; after it, the matcher consumes the token. When the expression is
complete, only an end token is allowed, so the row ends there (``finish_reason`` is ``"stop"``
when a stop string closed it first, as the action tags do, else ``"eos"``). llguidance computes
each mask lazily from a token trie (no per-vocabulary precompilation: a few milliseconds per
token, also with Gemma's 262k tokens).
"""
from __future__ import annotations

from typing import Any

import torch

INSTALL_HINT = "guided decoding (a request's regex) needs llguidance: pip install llguidance"


def _llguidance() -> Any:
    try:
        import llguidance
        import llguidance.hf
        import llguidance.torch
    except ImportError as err:
        raise ImportError(INSTALL_HINT) from err
    return llguidance


class RegexGuides:
    """Matchers for one backend's tokenizer: :meth:`problem` checks an expression, :meth:`matcher`
    starts a row, :meth:`mask` restricts a batch's logits."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: frozenset[int]):
        llguidance = _llguidance()
        self._llguidance = llguidance
        eos = sorted(eos_ids) or None
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos)
        self._grammars: dict[str, str] = {}

    def _grammar(self, regex: str) -> str:
        if regex not in self._grammars:
            self._grammars[regex] = self._llguidance.LLMatcher.grammar_from_regex(regex)
        return self._grammars[regex]

    def problem(self, regex: str) -> str | None:
        """Why ``regex`` cannot guide decoding (None: it can)."""
        try:
            error = self._llguidance.LLMatcher.validate_grammar(self._grammar(regex), self.tokenizer)
        except Exception as err:  # a malformed expression fails its own request only
            error = str(err)
        if isinstance(error, tuple):  # (is_error, messages) in some releases
            error = "; ".join(error[1]) if error[0] else ""
        return f"regex {regex!r} cannot guide decoding: {error}" if error else None

    def matcher(self, regex: str) -> Any:
        """A fresh matcher at the start of a completion."""
        return self._llguidance.LLMatcher(self.tokenizer, self._grammar(regex), log_level=0)

    def mask(self, logits: torch.Tensor, matchers: list[Any]) -> torch.Tensor:
        """``logits`` ``[b, V]`` with each guided row (a matcher, not None) restricted to the tokens
        its matcher allows next. Returns the same tensor when no row is guided."""
        guided = [k for k, m in enumerate(matchers) if m is not None]
        if not guided:
            return logits
        llt = self._llguidance.torch
        bitmask = llt.allocate_token_bitmask(len(guided), self.tokenizer.vocab_size)  # [g, ceil(V/32)] int32
        for row, k in enumerate(guided):
            llt.fill_next_token_bitmask(matchers[k], bitmask, row)
        rows = logits[guided].clone()  # [g, V]
        llt.apply_token_bitmask_inplace(rows, bitmask.to(rows.device))
        logits = logits.clone()
        logits[guided] = rows
        return logits
