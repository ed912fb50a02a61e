"""Local generation with Hugging Face ``transformers``: batched, KV-cached, exact stop strings.

:class:`HFBackend` runs its own decode loop instead of ``model.generate`` so that every row is
checked after every token:

- rows (``n`` per request) are sorted longest prompt first and run in batches of up to
  ``max_batch_size``; within a batch, prompts of similar length are prefilled together and the
  groups' KV caches merged into one left-padded batch (:mod:`inference.backends.hf_cache`, a
  cache that grows in place instead of concatenating every step); the lm_head runs on the last
  position only, which matters with Gemma's 262k vocabulary;
- each step feeds one token per live row; a row that ends (stop string, EOS, token budget) is
  dropped from the batch and from the KV cache at once, so no token is generated after a stop
  string and finished rows cost nothing;
- the text is detokenised incrementally (the last few tokens only) and scanned for stop strings
  (:class:`inference.backends.decoding.IncrementalText`).

Sampling is per row: ``temperature == 0`` is greedy (argmax); otherwise the logits are divided
by the temperature, cut to ``top_k`` and then to the smallest set holding ``top_p`` of the mass,
and sampled with the row's own ``torch.Generator``. With ``seed`` set, sample ``j`` of a request
draws from a generator seeded by ``(seed, j)``, so its tokens do not depend on which other
requests share the batch (up to the floating-point noise that padding and batch size add).

Log-probabilities (``Completion.logprobs``), by ``logprobs_mode``:

- ``"raw"`` (default): ``log_softmax(logits)[token]`` of the unmodified model, temperature 1, no
  top-k/top-p: what a separate full forward pass over prompt + completion reproduces.
- ``"processed"``: the log-probability under the distribution actually sampled from
  (temperature, top-k and top-p applied, renormalised); ``0.0`` for greedy rows.
- ``"sampled"``: ``"processed"`` for rows sampled with ``temperature > 0`` (the behaviour policy
  μ the token was drawn from: ``log_softmax(logits / temperature)[token]`` when top-k and top-p
  are off), ``"raw"`` for greedy rows (so a greedy evaluation still reads π(yes) of a verdict).
  The PPO rollout engine uses it (:mod:`training.rollouts.rollout_engine`); the trainer divides its logits
  by the same temperature (:func:`training.models.policy_models.sequence_logprobs`).

Guided decoding: a request with ``regex`` decodes only tokens that keep its completion a prefix
of the expression (:mod:`inference.backends.guided`, llguidance); as with ``allowed_token_ids``,
the sample and its log-prob (every mode) come from the masked logits.

Stop strings: the stop string ends ``text`` exactly. ``token_ids`` end with the token that
completed it, which may carry a few characters past the stop string (those are cut from
``text`` only). Stop strings are matched on the decoded text with special tokens skipped.
EOS (any of the generation config's and the tokenizer's EOS ids) ends a row with
``finish_reason="eos"``; the EOS token is not in ``token_ids``.

A prompt with no tokens or with at least ``max_context`` tokens gets one ``Completion`` per
sample with ``finish_reason="error"``; a completion that would run past the context stops with
``"length"``.

Multi-turn agents that resend a growing token context every turn can keep each row's KV cache
between calls instead: :meth:`HFBackend.session` (:mod:`inference.backends.hf_session`, same
sampling and results, only the new tokens run), or without keys, ``prefix_cache=N``: ``generate``
itself continues the cached row a prompt extends (:mod:`inference.backends.hf_prefix`). Both build
on the backend's public decoding steps: :meth:`~HFBackend.generate_rows`, :meth:`~HFBackend.in_use`,
:meth:`~HFBackend.prompt_problem`, :meth:`~HFBackend.last_logits`, :meth:`~HFBackend.sample_next` and
the one decode loop, :meth:`~HFBackend.decode`.
"""
from __future__ import annotations

import inspect
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from inference.backends.chat import check_thinking_switch, prompt_token_ids, thinking_setting
from inference.backends.decoding import IncrementalText, restrict_to_allowed, sample_seed, sample_tokens
from inference.backends.guided import RegexGuides
from inference.backends.hf_cache import (
    growing_cache_supported,
    keep_rows,
    merge_left_padded,
    new_growing_cache,
    prefill_groups,
)
from inference.backends.hf_prefix import PrefixCache
from inference.backends.hf_session import HFSession, session_supported
from inference.models import DEFAULT_MODEL, ensure_pad_token, load_causal_lm, load_tokenizer, resolve_torch_dtype
from methods.llm import Completion, GenerationRequest, GenerationResult, LLMBackend

LOGPROBS_MODES = ("raw", "processed", "sampled")


@dataclass
class DecodeRow:
    """One sample being generated: a request's prompt, its settings and its output so far."""

    request: int
    sample: int
    prompt: list[int]
    settings: GenerationRequest
    limit: int  # new tokens allowed (max_tokens, capped by the context)
    text: IncrementalText
    generator: torch.Generator | None = None
    guide: Any = None  # an llguidance matcher when the request has a regex (inference.backends.guided)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_string: str | None = None

    def push(self, token: int, logprob: float, eos_ids: frozenset[int]) -> bool:
        """Record the sampled token; return True while the row goes on."""
        if self.guide is not None:
            self.guide.consume_token(token)
        if token in eos_ids:
            self.finish_reason = "eos"
            return False
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        self.stop_string = self.text.push(token)
        if self.stop_string is not None:
            self.finish_reason = "stop"
        elif len(self.token_ids) >= self.limit:
            self.finish_reason = "length"
        return self.finish_reason is None

    def completion(self) -> Completion:
        return Completion(self.text.final_text(), self.token_ids, self.logprobs, self.finish_reason or "length",
                          self.stop_string)


class HFBackend(LLMBackend):
    """A local ``transformers`` causal LM behind the :class:`LLMBackend` interface.

    ``model``: a spec for :func:`inference.models.load_causal_lm` (``"gemma3-270m"``,
    ``"smollm2-135m"``, a folder) or an already loaded model (then ``tokenizer`` is required;
    ``device``/``dtype`` other than ``"auto"`` move it). ``max_batch_size``: rows per forward
    batch, and requests per batch formed from concurrent ``agenerate`` calls.
    ``max_context``: the longest prompt + completion (default: the config's
    ``max_position_embeddings``). ``thinking``: ``"on"``/``"off"`` sets the chat template's
    ``enable_thinking`` switch (ValueError when it has none), ``"auto"``/None keeps its default.
    ``prefix_cache``: keep the KV caches of this many finished rows and run only the new tokens of
    a prompt that continues one (:mod:`inference.backends.hf_prefix`; 0, the default: off).
    """

    name = "hf"
    supports_kv_sessions = True  # session(): multi-turn generation that keeps each row's KV cache

    def __init__(self, model: Any = DEFAULT_MODEL, tokenizer: Any = None, device: str = "auto", dtype: Any = "auto",
                 max_batch_size: int = 16, trust_remote_code: bool = False, logprobs_mode: str = "raw",
                 max_context: int | None = None, thinking: str | bool | None = None, prefix_cache: int = 0):
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}")
        if isinstance(model, (str, os.PathLike)):
            if tokenizer is None:
                tokenizer = model
            model = load_causal_lm(model, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
        else:
            if tokenizer is None:
                raise ValueError("pass the tokenizer along with a loaded model")
            if device != "auto":
                model = model.to(device)
            if dtype != "auto":
                model = model.to(resolve_torch_dtype(dtype, str(model.device)))
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = load_tokenizer(tokenizer, trust_remote_code=trust_remote_code)
        self.model = model
        self.tokenizer = ensure_pad_token(tokenizer)  # padding itself is done here, on the left
        self.thinking = thinking_setting(thinking)
        check_thinking_switch(self.tokenizer, self.thinking)
        self.device = model.device
        self.max_batch_size = max_batch_size
        self.logprobs_mode = logprobs_mode
        self.max_context = max_context or getattr(model.config.get_text_config(), "max_position_embeddings", None)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.eos_ids = self._eos_ids()
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids, default=0)  # padded slots are masked anyway
        params = inspect.signature(self._base_model().forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.x
        self._keep_last_only = "logits_to_keep" in params
        self._lock = threading.Lock()  # one batch at a time on the model
        self._regex_guides: RegexGuides | None = None
        self._prefix_cache = self._new_prefix_cache(prefix_cache)

    # ----------------------------------------------------------------------------- public API

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        if self._prefix_cache is not None:
            return self._prefix_cache.generate(requests)
        return self.generate_rows(requests)

    def session(self, observer: Callable | None = None) -> Any:
        """A :class:`~inference.backends.hf_session.HFSession`: multi-turn generation that keeps each
        row's KV cache between calls (token-id prompts that extend the previous call's); ``observer``:
        told which tokens each row ran after every forward pass (see the session)."""
        return HFSession(self, observer)

    # ------------------------------------------ decoding steps (for hf_session and hf_prefix)

    def generate_rows(self, requests: list[GenerationRequest],
                      decode_batch: Callable[[list[DecodeRow]], None] | None = None) -> list[GenerationResult]:
        """:meth:`generate` without the prefix cache, each batch of rows (longest prompt first, at most
        ``max_batch_size``) decoded by ``decode_batch``: by default its prompts are prefilled and
        :meth:`decode` runs them to their ends; a session passes its cache-keeping prefill instead."""
        decode_batch = decode_batch or self._decode_batch
        start = time.perf_counter()
        prompts: list[list[int]] = []
        errors: dict[int, str] = {}
        rows: list[DecodeRow] = []
        for i, request in enumerate(requests):
            try:
                ids = prompt_token_ids(self.tokenizer, request.prompt, self.thinking)
            except Exception as err:  # a malformed prompt fails its own request only
                ids, errors[i] = [], f"could not tokenise the prompt: {err}"
            prompts.append(ids)
            if i not in errors and (problem := self.prompt_problem(ids, request.allowed_token_ids)):
                errors[i] = problem
            if i not in errors and request.regex is not None and (problem := self._guides().problem(request.regex)):
                errors[i] = problem
            if i not in errors:
                rows.extend(self._rows(i, ids, request))
        finished_at = [start] * len(requests)
        rows.sort(key=lambda row: -len(row.prompt))  # similar lengths together: little padding
        with self.in_use():
            for first in range(0, len(rows), self.max_batch_size):
                batch = rows[first:first + self.max_batch_size]
                decode_batch(batch)
                for row in batch:
                    finished_at[row.request] = time.perf_counter()
        by_request: list[list[DecodeRow]] = [[] for _ in requests]
        for row in sorted(rows, key=lambda r: (r.request, r.sample)):
            by_request[row.request].append(row)
        results = []
        for i, request in enumerate(requests):
            if i in errors:
                completions = [Completion("", finish_reason="error", error=errors[i]) for _ in range(request.n)]
            else:
                completions = [row.completion() for row in by_request[i]]
            results.append(GenerationResult(completions, prompts[i], finished_at[i] - start))
        return results

    @contextmanager
    def in_use(self) -> Iterator[None]:
        """The model to one caller at a time (one batch at a time on it), in eval mode under
        ``torch.inference_mode``; a policy shared with training gets its training flag back after."""
        with self._lock, torch.inference_mode():
            was_training = self.model.training
            self.model.eval()
            try:
                yield
            finally:
                self.model.train(was_training)

    def prompt_problem(self, ids: list[int], allowed: tuple[int, ...] = ()) -> str | None:
        """Why this backend refuses a prompt of token ids ``ids`` (with ``allowed_token_ids``
        ``allowed``): no tokens, too long for the context, ids outside the vocabulary; None if it
        takes it."""
        if any(t >= self.vocab_size for t in allowed):
            return f"allowed_token_ids outside the vocabulary (size {self.vocab_size}): {list(allowed)}"
        if not ids:
            return "the prompt has no tokens"
        if self.max_context is not None and len(ids) >= self.max_context:
            return f"the prompt has {len(ids)} tokens; the model's context holds {self.max_context}"
        outside = [t for t in ids if not 0 <= t < self.vocab_size]
        if outside:
            return f"token ids outside the vocabulary (size {self.vocab_size}): {outside[:5]}"
        return None

    def last_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                    cache: Any) -> torch.Tensor:
        """Logits of the last position. ``input_ids``/``position_ids``: ``[b, t]``; ``attention_mask``:
        ``[b, past + t]``. Returns ``[b, V]`` float32."""
        options = {self._cache_kwarg: cache, "use_cache": True}
        if self._keep_last_only:
            options["logits_to_keep"] = 1  # the lm_head runs on one position, not the whole prompt
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **options)
        return out.logits[:, -1, :].float()

    def decode(self, rows: list[DecodeRow], logits: torch.Tensor, mask: torch.Tensor, cache: Any,
               on_finish: Callable[[int, int, torch.Tensor], None] | None = None,
               on_step: Callable[[list[int]], None] | None = None) -> None:
        """Generate every row of one prefilled batch to its end (fills each row's tokens, log-probs
        and reason): the decode loop of :meth:`generate` and of every session.

        ``logits`` ``[b, V]``, ``mask`` ``[b, width]`` (1 = real token) and ``cache``: the prefill's
        outputs, row ``i`` of them being ``rows[i]``. Each step samples one token per live row, drops
        the rows that ended from the batch and the KV cache, and runs the others' new tokens.
        ``on_finish(i, k, mask)``: row ``rows[i]`` ended while at batch position ``k`` of ``mask``
        (the cache still holds it there). ``on_step(live)``: after each forward pass, the indices
        into ``rows`` that ran their newest token."""
        next_position = mask.sum(-1, keepdim=True)  # [b, 1]: real tokens count from 0
        live = list(range(len(rows)))  # indices into rows, in batch order
        while True:
            tokens, logprobs = self.sample_next(logits, [rows[i] for i in live])  # [b], [b]
            going = [rows[i].push(token, logprob, self.eos_ids)
                     for i, token, logprob in zip(live, tokens.tolist(), logprobs.tolist())]
            if on_finish is not None:
                for k, i in enumerate(live):
                    if not going[k]:
                        on_finish(i, k, mask)
            keep = [k for k, on in enumerate(going) if on]
            if not keep:
                return
            if len(keep) < len(live):  # finished rows leave the batch and the KV cache
                mask, next_position, tokens = keep_rows(cache, keep, mask, next_position, tokens)
                live = [live[k] for k in keep]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
            logits = self.last_logits(tokens[:, None], mask, next_position, cache)
            if on_step is not None:
                on_step(live)
            next_position = next_position + 1

    def sample_next(self, logits: torch.Tensor, rows: list[DecodeRow]) -> tuple[torch.Tensor, torch.Tensor]:
        """Next token of every row. ``logits``: ``[b, V]`` float32. Returns token ids ``[b]`` and
        their log-probs ``[b]`` as ``logprobs_mode`` defines them. Rows with ``allowed_token_ids``
        choose among those tokens only: their logits are restricted first, so both the sample and
        its log-prob (every mode) are those of the model's distribution renormalised over the choices."""
        logits = restrict_to_allowed(logits, [row.settings.allowed_token_ids for row in rows])
        if any(row.guide is not None for row in rows):
            logits = self._guides().mask(logits, [row.guide for row in rows])
        tokens = logits.argmax(-1)  # greedy rows keep these
        processed = torch.zeros(len(rows), device=logits.device)  # log 1 for greedy rows
        sampled = [k for k, row in enumerate(rows) if row.settings.temperature > 0]
        if sampled:
            settings = [rows[k].settings for k in sampled]
            index = torch.tensor(sampled, device=logits.device)
            tokens[index], processed[index] = sample_tokens(
                logits[index], [s.temperature for s in settings], [s.top_k for s in settings],
                [s.top_p for s in settings], [rows[k].generator for k in sampled])
        if self.logprobs_mode == "processed":
            return tokens, processed
        raw = logits.gather(1, tokens[:, None])[:, 0] - logits.logsumexp(-1)  # log_softmax at the token only
        if self.logprobs_mode == "sampled" and sampled:  # μ's log-prob where sampled, raw where greedy
            raw[index] = processed[index]
        return tokens, raw

    # ----------------------------------------------------------------------------- internals

    def _new_prefix_cache(self, rows: int) -> PrefixCache | None:
        if not rows:
            return None
        if not session_supported(self):
            warnings.warn("prefix_cache needs the growing KV cache and attention-only layers; it is off",
                          stacklevel=3)
            return None
        return PrefixCache(self, rows)

    def _guides(self) -> RegexGuides:
        """The llguidance matchers over this tokenizer (built on the first guided request)."""
        if self._regex_guides is None:
            self._regex_guides = RegexGuides(self.tokenizer, self.vocab_size, self.eos_ids)
        return self._regex_guides

    def _base_model(self) -> Any:
        """The transformers model under wrappers such as peft (for signature checks)."""
        get_base = getattr(self.model, "get_base_model", None)
        return get_base() if callable(get_base) else self.model

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        config_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        for value in (config_eos, self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif value is not None:
                ids.update(int(v) for v in value)
        return frozenset(ids)

    def _rows(self, index: int, ids: list[int], request: GenerationRequest) -> list[DecodeRow]:
        limit = request.max_tokens
        if self.max_context is not None:
            limit = min(limit, self.max_context - len(ids))
        rows = []
        for j in range(request.n):
            generator = None
            if request.temperature > 0:
                seed = sample_seed(request.seed, j) if request.seed is not None else int(
                    torch.randint(0, 2**62, (1,)).item())  # follows torch.manual_seed when no seed is given
                generator = torch.Generator(device=self.device).manual_seed(seed)
            guide = self._guides().matcher(request.regex) if request.regex is not None else None
            rows.append(DecodeRow(index, j, ids, request, limit, IncrementalText(self.tokenizer, ids, request.stop),
                             generator, guide))
        return rows

    def _decode_batch(self, rows: list[DecodeRow]) -> None:
        """Prefill one batch of rows and :meth:`decode` it (what :meth:`generate` does per batch)."""
        self.decode(rows, *self._prefill(rows))

    def _prefill(self, rows: list[DecodeRow]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Run the prompts of ``rows`` (longest first) through the model.

        Prompts of similar length are prefilled together, each group left-padded to its longest
        prompt, and the groups' caches are merged into one left-padded batch, so padding costs
        little compute. Returns the last-position logits ``[b, V]``, the attention mask
        ``[b, width]`` (1 = real token) and the KV cache.
        """
        width = len(rows[0].prompt)
        room = width + max(row.limit for row in rows)
        if not growing_cache_supported():  # older transformers: one padded batch, concatenating cache
            from transformers import DynamicCache

            cache = DynamicCache()
            ids, mask = self._left_padded([row.prompt for row in rows], width)
            return self.last_logits(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), cache), mask, cache
        groups = prefill_groups([len(row.prompt) for row in rows])
        logits, masks, caches = [], [], []
        for start, end in groups:
            cache = new_growing_cache(reserve=room - width if len(groups) == 1 else 0)
            ids, mask = self._left_padded([row.prompt for row in rows[start:end]], len(rows[start].prompt))
            logits.append(self.last_logits(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), cache))
            masks.append(torch.nn.functional.pad(mask, (width - mask.shape[1], 0)))  # zeros on the left
            caches.append(cache)
        cache = caches[0] if len(caches) == 1 else merge_left_padded(caches, room)
        return torch.cat(logits), torch.cat(masks), cache

    def _left_padded(self, prompts: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask, both ``[b, width]``, prompts right-aligned (left padding)."""
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt):] = torch.tensor(prompt)
            mask[i, width - len(prompt):] = 1
        return ids.to(self.device), mask.to(self.device)
