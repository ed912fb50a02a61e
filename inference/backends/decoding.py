"""Pieces of a local, token-by-token decode loop: incremental detokenisation with stop strings,
and per-row sampling with reproducible seeds. Used by :mod:`inference.backends.hf`."""
from __future__ import annotations

import hashlib
from typing import Any

import torch

DETOKENIZE_CONTEXT = 6  # prompt tokens kept before the completion so its first word decodes with its space
TOP_P_CANDIDATES = 1024  # top-p without top-k looks for the nucleus among this many tokens first


class IncrementalText:
    """The text of a growing token list, decoded a few tokens at a time, and stop-string matching.

    Decoding ``ids[prefix:]`` and subtracting the decoded ``ids[prefix:read]`` gives the new
    text with the spacing the earlier tokens imply. Text that ends in an incomplete UTF-8
    character (``"\\ufffd"``) is held back until the next token completes it.
    """

    def __init__(self, tokenizer: Any, context_ids: list[int], stops: tuple[str, ...]):
        self.tokenizer = tokenizer
        self.ids = list(context_ids[-DETOKENIZE_CONTEXT:])
        self.prefix, self.read = 0, len(self.ids)
        self.text = ""  # completion text committed so far
        self.pending = ""  # decoded but held back: ends in an incomplete character
        self.stops = tuple(s for s in stops if s)
        self._scanned = 0  # characters of text already searched for stop strings
        self._overlap = max((len(s) for s in self.stops), default=1) - 1

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token: int) -> str | None:
        """Add one token; return the stop string it completes (``text`` then ends with it), else None."""
        self.ids.append(token)
        new = self._decode(self.ids[self.prefix:])[len(self._decode(self.ids[self.prefix:self.read])):]
        if new.endswith("\ufffd"):
            self.pending = new
            visible = self.text + new.rstrip("\ufffd")
        else:
            self.text += new
            self.pending = ""
            self.prefix, self.read = self.read, len(self.ids)
            visible = self.text
        return self._match(visible)

    def _match(self, visible: str) -> str | None:
        if not self.stops:
            return None
        start = max(0, self._scanned - self._overlap)
        best: tuple[int, str] | None = None  # (end position, stop string) of the earliest-ending match
        for stop in self.stops:
            at = visible.find(stop, start)
            if at >= 0 and (best is None or at + len(stop) < best[0]):
                best = (at + len(stop), stop)
        self._scanned = len(visible)
        if best is None:
            return None
        self.text, self.pending = visible[: best[0]], ""
        return best[1]

    def final_text(self) -> str:
        """All text so far, including a held-back incomplete character (as ``"\\ufffd"``)."""
        return self.text + self.pending


def restrict_to_allowed(logits: torch.Tensor, allowed: list[tuple[int, ...]]) -> torch.Tensor:
    """``logits`` ``[b, V]`` with every token outside row ``i``'s ``allowed[i]`` set to -inf
    (rows with an empty tuple unchanged). Returns the same tensor when no row is constrained."""
    if not any(allowed):
        return logits
    keep = torch.zeros_like(logits, dtype=torch.bool)
    for i, ids in enumerate(allowed):
        if ids:
            keep[i, list(ids)] = True
        else:
            keep[i] = True
    return logits.masked_fill(~keep, float("-inf"))


def sample_seed(seed: int, sample: int) -> int:
    """The generator seed of sample ``sample`` of a request with ``seed`` (stable across runs)."""
    digest = hashlib.sha256(f"{seed}:{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def sample_tokens(logits: torch.Tensor, temperature: list[float], top_k: list[int], top_p: list[float],
                  generators: list[torch.Generator | None]) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row, each row with its own settings and generator.

    ``logits``: ``[b, V]`` float32; the lists have ``b`` entries (``temperature > 0``). Returns
    token ids ``[b]`` and their log-probs ``[b]`` under each row's sampling distribution
    (temperature-scaled, cut to ``top_k``, then to the ``top_p`` nucleus, renormalised).
    Rows without top-k/top-p are sampled together by inverse CDF: one uniform number per row from
    its generator, so a row's draw does not depend on the other rows.
    """
    b, vocab = logits.shape
    scores = logits / torch.tensor(temperature, device=logits.device, dtype=logits.dtype)[:, None]
    tokens = torch.empty(b, dtype=torch.long, device=logits.device)
    logprobs = torch.empty(b, dtype=logits.dtype, device=logits.device)
    plain = [i for i in range(b) if not 0 < top_k[i] < vocab and top_p[i] >= 1.0]
    if plain:
        index = torch.tensor(plain, device=logits.device)
        rows = scores[index]  # [p, V]
        log_norm = rows.logsumexp(-1, keepdim=True)  # [p, 1]
        cdf = (rows - log_norm).exp().cumsum(-1)  # [p, V]; float32: off by ~1e-5 at most, 10x faster than float64
        uniform = torch.stack([_uniform(generators[i], logits.device) for i in plain])  # [p]
        chosen = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True).clamp_(max=vocab - 1)
        tokens[index] = chosen[:, 0]
        logprobs[index] = (rows.gather(1, chosen) - log_norm)[:, 0]
    for i in range(b):
        if i not in plain:
            tokens[i], logprobs[i] = _sample_filtered(scores[i], top_k[i], top_p[i], generators[i])
    return tokens, logprobs


def _sample_filtered(scores: torch.Tensor, top_k: int, top_p: float,
                     generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token from one row of temperature-scaled ``scores`` ``[V]`` with top-k and/or top-p.
    Returns 0-d tensors ``(token, logprob)``."""
    vocab = scores.shape[-1]
    has_top_k = 0 < top_k < vocab
    values, index = scores.topk(top_k if has_top_k else min(vocab, TOP_P_CANDIDATES))  # sorted descending
    if top_p < 1.0:
        if has_top_k:
            probs = values.softmax(-1)  # top-p applies to the renormalised top-k distribution
        else:
            probs = (values - scores.logsumexp(-1)).exp()  # full-vocabulary mass of the candidates
            if probs.sum() < top_p and len(values) < vocab:  # the nucleus is wider: sort everything
                values, index = scores.sort(descending=True)
                probs = values.softmax(-1)
        values = values.masked_fill(probs.cumsum(-1) - probs >= top_p, float("-inf"))  # mass before reaches top_p
    logprobs = values.log_softmax(-1)
    choice = torch.multinomial(logprobs.exp(), 1, generator=generator)[0]
    return index[choice], logprobs[choice]


def _uniform(generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """One draw from U[0, 1) as a 0-d float32 tensor."""
    return torch.rand((), generator=generator, device=device)
