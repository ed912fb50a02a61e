"""Per-candidate yes/no judgements: the SEEDS expand decision made one candidate at a time.

A snapshot of K previews becomes K short prompts that share a prefix (instruction + question) and
differ in the candidate part (one preview + the request to reply yes or no). The policy's decision
for candidate i is ONE token, "yes" or "no", and the ``<expand>`` action lists the candidates judged
yes, so the env still sees an ordinary SEEDS expand. The decision is sampled from the model's
distribution restricted to the two answer tokens: π(yes) = softmax(z_yes, z_no)[0] with z the
next-token logits, so every decision is well formed and its log-prob is exact for PPO.

For CPU speed the decoder can be split at layer L (:class:`SplitDecoder`): layers below L stay
frozen (LoRA goes on layers ≥ L only), so their output for a prompt never changes; it is computed
once (:meth:`SplitDecoder.bottom`, with the shared prefix run once per question through the KV
cache) and every later rollout or PPO epoch runs only layers ≥ L from it (:meth:`SplitDecoder.top`).
The numbers are those of the full forward pass (tested).
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

SYSTEM = "You decide which search results to read. Reply yes if reading the full result would help answer the question, otherwise no."
CANDIDATE = "Search result: {preview}"
ANSWERS = ("yes", "no")  # index 0 = open the candidate

_SNAPSHOT_LINE = re.compile(r"^\[(\d+)\] ", re.MULTILINE)


def parse_snapshot(observation: str) -> list[str]:
    """The previews of a ``<snapshot>`` observation, in the order shown (``[i] `` stripped).

    A preview that itself holds line breaks stays whole: a new candidate starts only at a line
    ``[n] `` with the next expected number.
    """
    body = observation.strip()
    body = body.removeprefix("<snapshot>").removesuffix("</snapshot>").strip()
    previews: list[str] = []
    start = None
    for match in _SNAPSHOT_LINE.finditer(body):
        if int(match.group(1)) != len(previews) + (start is not None) + 1:
            continue
        if start is not None:
            previews.append(body[start:match.start()].strip())
        start = match.end()
    if start is not None:
        previews.append(body[start:].strip())
    return previews


def expand_action(decisions: Sequence[bool]) -> str:
    """``<expand>`` listing the (1-based) candidates judged yes, or ``none``."""
    ids = [str(i) for i, yes in enumerate(decisions, start=1) if yes]
    return f"<expand>{', '.join(ids) if ids else 'none'}</expand>"


@dataclass(frozen=True)
class JudgePrompts:
    """Token ids of the judgement prompts: ``prefix(question) + candidate(preview)``, then the answer.

    With a chat template (chat-tuned models) the prefix is the system message and the start of the
    user turn, and the candidate part ends with the assistant header, so the next token is the
    answer; without one, a plain ``Question: ... Answer:`` layout is used.
    """

    tokenizer: Any
    system: str = SYSTEM
    candidate_text: str = CANDIDATE
    max_preview_tokens: int = 96

    @property
    def chat(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def _render(self, question: str, preview: str) -> str:
        user = f"Question: {question}\n{self.candidate_text.format(preview=preview)}"
        if self.chat:
            messages = [{"role": "system", "content": self.system}, {"role": "user", "content": user}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return f"{self.system}\n\n{user}\nAnswer:"

    def split(self, question: str) -> tuple[str, str]:
        """Text of the prefix and the text that follows the preview, found by rendering a marker."""
        marker = "\u0000PREVIEW\u0000"
        text = self._render(question, marker)
        before, after = text.split(marker)
        head = self.candidate_text.split("{preview}")[0]
        cut = before.rindex(head) if head else len(before)
        return before[:cut], before[cut:] + "{preview}" + after

    def prefix_ids(self, question: str) -> list[int]:
        prefix, _ = self.split(question)
        return self.tokenizer(prefix, add_special_tokens=not self.chat)["input_ids"]

    def candidate_ids(self, question: str, preview: str) -> list[int]:
        _, template = self.split(question)
        ids = self.tokenizer(preview, add_special_tokens=False)["input_ids"][: self.max_preview_tokens]
        head, tail = template.split("{preview}")
        return (self.tokenizer(head, add_special_tokens=False)["input_ids"] + ids
                + self.tokenizer(tail, add_special_tokens=False)["input_ids"])

    def answer_ids(self) -> tuple[int, int]:
        """Token ids of "yes" and "no" (each must be one token)."""
        ids = []
        for word in ANSWERS:
            tokens = self.tokenizer(word, add_special_tokens=False)["input_ids"]
            if len(tokens) != 1:
                raise ValueError(f"{word!r} is {len(tokens)} tokens for this tokenizer; the judge needs one")
            ids.append(tokens[0])
        return ids[0], ids[1]


# --------------------------------------------------------------------------- the split decoder


class _PassThrough(nn.Module):
    """Stands in for a decoder layer that must not run: returns its input hidden states."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return hidden_states


def _unwrap(lm: nn.Module) -> nn.Module:
    get_base = getattr(lm, "get_base_model", None)
    return get_base() if callable(get_base) else lm


class SplitDecoder:
    """A causal LM run in two parts: frozen layers ``< split`` (cached) and layers ``≥ split``.

    ``bottom`` -> per-prompt hidden states after layer ``split − 1`` (no gradient);
    ``top(hidden, attention_mask)`` -> final (normed) hidden states, with gradient when enabled.
    Layers outside a part are swapped for pass-through modules while it runs, so each layer keeps
    its own index (Gemma 3 alternates sliding and global attention by layer index).
    """

    def __init__(self, lm: nn.Module, split: int):
        self.lm = lm
        base = _unwrap(lm)
        self.decoder = base.get_decoder()
        self.n_layers = len(self.decoder.layers)
        if not 0 <= split <= self.n_layers:
            raise ValueError(f"split must lie in 0..{self.n_layers}, got {split}")
        self.split = split
        head = base.get_output_embeddings()
        self._head_weight = head.weight
        self._softcap = getattr(base.config.get_text_config(), "final_logit_softcapping", None)
        self.hidden_size = base.config.get_text_config().hidden_size

    @contextlib.contextmanager
    def _only(self, start: int, stop: int) -> Iterator[None]:
        layers = self.decoder.layers
        saved = list(layers)
        try:
            for i in range(self.n_layers):
                if not start <= i < stop:
                    layers[i] = _PassThrough()
            yield
        finally:
            for i, layer in enumerate(saved):
                layers[i] = layer

    def _run_bottom(self, **kwargs) -> torch.Tensor:
        """Hidden states after layer split−1 (before the final norm); split ≥ 1."""
        captured = {}
        hook = self.decoder.layers[self.split - 1].register_forward_hook(
            lambda module, args, output: captured.__setitem__("h", output[0] if isinstance(output, tuple) else output))
        try:
            with self._only(0, self.split):
                self.decoder(**kwargs)
        finally:
            hook.remove()
        return captured["h"]

    @torch.no_grad()
    def bottom(self, prefix: Sequence[int], candidates: Sequence[Sequence[int]]
               ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Hidden states after layer split−1 of ``prefix`` (P, H) and of each candidate (C_i, H).

        The prefix runs once; the candidates run together on its KV cache (right-padded), each at
        positions P, P+1, ... as in the full prompt ``prefix + candidate_i``.
        """
        device = self._head_weight.device
        if self.split == 0:
            embed = self.decoder.get_input_embeddings()
            return (embed(torch.tensor(list(prefix), device=device)),
                    [embed(torch.tensor(list(c), device=device)) for c in candidates])
        cache = self._new_cache()
        h_prefix = self._run_bottom(input_ids=torch.tensor([list(prefix)], device=device), cache=cache,
                                    use_cache=True)[0]
        ids, mask, positions, lengths = self._candidate_batch(len(prefix), [torch.tensor(list(c)) for c in candidates],
                                                              h_prefix.dtype)
        cache.batch_repeat_interleave(len(candidates))
        h_cand = self._run_bottom(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True,
                                  position_ids=positions)  # (n, C, H)
        return h_prefix, [h_cand[i, :n] for i, n in enumerate(lengths)]

    def _new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=_unwrap(self.lm).config)

    def _candidate_batch(self, P: int, candidates: Sequence[torch.Tensor], dtype: torch.dtype):
        """Right-padded candidates after a shared prefix of P tokens.

        candidates: n tensors (C_i, ...) -> values (n, C, ...), an additive 4D attention mask
        (n, 1, C, P + C) in ``dtype`` (candidate token c of row i sees the whole prefix and its own
        tokens up to c; never another candidate's), position ids (n, C) = P, P+1, ... and the lengths.
        The mask is given in 4D so that it does not depend on how the KV cache counts past tokens.
        """
        device = self._head_weight.device
        lengths = [c.shape[0] for c in candidates]
        n, C = len(candidates), max(lengths)
        values = candidates[0].new_zeros((n, C, *candidates[0].shape[1:])).to(device)
        for i, c in enumerate(candidates):
            values[i, : lengths[i]] = c
        causal = torch.ones((C, C), dtype=torch.bool, device=device).tril()
        allowed = torch.ones((n, 1, C, P + C), dtype=torch.bool, device=device)
        allowed[:, 0, :, P:] = causal
        for i, length in enumerate(lengths):
            allowed[i, 0, :, P + length :] = False  # padding keys; padded queries still see the prefix
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
        positions = torch.arange(P, P + C, device=device)[None].expand(n, C)
        return values, mask, positions, lengths

    def top(self, prefix: torch.Tensor, candidates: Sequence[torch.Tensor]) -> torch.Tensor:
        """Final (normed) hidden state at the last token of each ``prefix + candidate_i``: (n, H).

        ``prefix`` (P, H) and ``candidates`` (C_i, H) are layer-split inputs from :meth:`bottom`.
        The prefix runs once and the candidates attend to it through the KV cache; gradients flow
        through both (the cache is built from differentiable tensors).
        """
        cache = self._new_cache()
        values, mask, positions, lengths = self._candidate_batch(prefix.shape[0], list(candidates), prefix.dtype)
        with self._only(self.split, self.n_layers):
            self.decoder(inputs_embeds=prefix[None], cache=cache, use_cache=True)
            cache.batch_repeat_interleave(len(lengths))
            final = self.decoder(inputs_embeds=values, attention_mask=mask, position_ids=positions, cache=cache,
                                 use_cache=True).last_hidden_state
        last = torch.tensor(lengths, device=final.device) - 1
        return final[torch.arange(len(lengths), device=final.device), last]

    def vocab_logits(self, final_hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the whole vocabulary from final hidden states: (N, H) -> (N, V)."""
        return self._logits(final_hidden, self._head_weight)

    def answer_logits(self, final_hidden: torch.Tensor, answer_ids: Sequence[int]) -> torch.Tensor:
        """Logits of the answer tokens from final hidden states: (N, H) -> (N, len(answer_ids))."""
        return self._logits(final_hidden, self._head_weight[list(answer_ids)])

    def _logits(self, final_hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        logits = final_hidden.to(weight.dtype) @ weight.T
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits.float()


def judge_logits(split: SplitDecoder, questions: Sequence[tuple[torch.Tensor, Sequence[torch.Tensor]]],
                 answer_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Answer logits (N, 2) and final hidden states at the answer position (N, H).

    ``questions``: per question, the cached (prefix, candidates) states of :meth:`SplitDecoder.bottom`;
    rows follow the questions and, within one, the candidates, in order.
    """
    finals = [split.top(prefix, cands) for prefix, cands in questions if len(cands)]
    if not finals:
        return torch.zeros((0, len(answer_ids))), torch.zeros((0, split.hidden_size))
    final = torch.cat(finals)
    return split.answer_logits(final, answer_ids), final


def yes_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """log π(yes), log π(no) under the two-way softmax: (N, 2) logits -> (N, 2) log-probs."""
    return torch.log_softmax(logits.float(), dim=-1)


def action_logprobs(logits: torch.Tensor, opened: torch.Tensor) -> torch.Tensor:
    """log π(action) of each decision: logits (N, 2), opened (N,) bool -> (N,)."""
    logp = yes_logprobs(logits)
    return torch.where(opened.bool(), logp[:, 0], logp[:, 1])


def two_way_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the yes/no distribution: (N, 2) -> (N,)."""
    logp = yes_logprobs(logits)
    return -(logp.exp() * logp).sum(dim=-1)
