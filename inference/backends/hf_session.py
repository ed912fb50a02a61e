"""Multi-turn generation on :class:`~inference.backends.hf.HFBackend` that keeps KV caches between calls.

A token-in/token-out agent (training rollouts, :class:`methods.transcript.TokenTranscript`) sends
the whole context every turn: prompt, earlier completions, observations. ``HFBackend.generate``
prefills all of it again each time. An :class:`HFSession` keeps, for every row (one episode,
named by a caller's key), the keys and values of the tokens it has already run, and runs only
the new ones::

    session = backend.session()
    results = session.generate(requests, keys)    # what backend.generate(requests) returns
    logits = session.next_logits(sequences, keys)  # [b, V] after each sequence (an EOS log-prob)

A request's token ids should extend its row's previous context (the prompt and completion of the
last call); the cache is used up to the longest common prefix, so anything else still works,
only slower. A row's cache stays until :meth:`HFSession.release` (or the session) drops it. ``n``
must be 1 (a row is one sample).

Sampling, seeds, stop strings, token accounting and log-probs are the backend's own: a session
prefills its rows from their caches and hands them to the backend's decode loop
(:meth:`~inference.backends.hf.HFBackend.generate_rows`, :meth:`~inference.backends.hf.HFBackend.decode`,
with :meth:`~inference.backends.hf.HFBackend.sample_next` and
:meth:`~inference.backends.hf.HFBackend.last_logits`), so the same request gives the same
completion as ``backend.generate``, up to the floating-point noise that a different batch layout adds.

Cache layout: no holes, ever. Between calls each row's cache is *parked*: a compact copy
``[kv_heads, L, head_dim]`` per layer of its ``L`` cached tokens. A call sorts rows longest
first into batches of ``max_batch_size``; inside a batch, rows with similar numbers ``n`` of new
tokens form prefill groups (:func:`~inference.backends.hf_cache.prefill_groups`). In a group whose
largest count is ``M``, each row re-runs its last ``M - n`` cached tokens along with its ``n``
new ones (the compute that padding would cost), so every row is ``[left padding][tokens]``,
contiguous; groups are merged left-padded and decoded one token per live row per step, as the
backend does. A row that finishes leaves the batch, its cache parked. Each row therefore sees
exactly the attention pattern of a left-padded prompt, with positions ``cumsum(mask) - 1``; this
holds for sliding-window layers too (the window compares cache indices, and with no holes their
differences are position differences), so Gemma 3 uses the session like Llama.

Rows of one call that begin alike share that beginning (``share_prefixes``, on by default):
a GRPO-style rollout sends each question's prompt several times, and every prompt starts with
the same instructions. Before the call's own prefill, rows whose contexts hold a common prefix at
least :data:`MIN_SHARED_PREFIX` tokens longer than what any of them has cached
(:func:`shared_prefix_groups`) run that prefix once, as a template row, and each starts from a copy
of its cache; this repeats while groups form, so the instructions run once per call and each
question's whole prompt once per question. Up to the floating-point noise of another batch layout,
as every reuse of a parked cache.

An ``observer`` (optional) is told after every forward pass which tokens each row ran: a list,
in batch order, of ``(key, first, count)``: row ``i`` of that pass ran positions ``first ..
first + count - 1`` of row ``key``'s context, in its last ``count`` input columns (so a forward
hook on a decoder layer can keep each row's hidden states by position;
:mod:`training.rollouts.rollout_states` keeps the frozen bottom layers' states for the trainer). Shared
prefixes need an observer that also has ``fork(source, targets)`` (rows ``targets`` now hold row
``source``'s cached tokens: give them what it recorded for those) and ``forget(keys)``; with any
other observer each row runs its whole context, so the observer sees every position run for it.

Supported when the backend has the growing cache (transformers >= 4.56) and every layer is an
attention layer (:func:`session_supported`); otherwise callers keep calling ``generate``.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

import torch

from inference.backends.chat import prompt_token_ids
from inference.backends.hf_cache import (
    GrowingLayer,
    growing_cache_supported,
    merge_left_padded,
    new_growing_cache,
    prefill_groups,
)
from methods.llm import GenerationRequest, GenerationResult

ATTENTION_LAYER_TYPES = {"full_attention", "sliding_attention"}
MIN_SHARED_PREFIX = 16  # tokens: rows sharing fewer than this beyond their caches each run them
MAX_SHARING_LEVELS = 8  # template passes per call (each lengthens every member's cached prefix)


class ForkingObserver(Protocol):
    """An observer that follows shared prefixes too (see the module docstring)."""

    def __call__(self, ran: list[tuple[Hashable, int, int]]) -> None: ...

    def fork(self, source: Hashable, targets: list[Hashable]) -> None: ...

    def forget(self, keys: list[Hashable]) -> None: ...


@dataclass
class _Parked:
    """A row's cache between calls: the token ids run so far and, per layer, their keys and
    values ``[kv_heads, len(ids), head_dim]``."""

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]


def session_supported(backend: Any) -> bool:
    """Whether ``backend`` can keep KV caches across calls: an HF backend, the growing cache, and
    attention layers only (no linear-attention or state-space layers, which cannot be re-aligned)."""
    if not getattr(backend, "supports_kv_sessions", False) or not growing_cache_supported():
        return False
    layer_types = getattr(backend.model.config.get_text_config(), "layer_types", None)
    return layer_types is None or set(layer_types) <= ATTENTION_LAYER_TYPES


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])


def shared_prefix_groups(contexts: Sequence[list[int]], cached: Sequence[int],
                         min_shared: int = MIN_SHARED_PREFIX) -> list[tuple[list[int], int]]:
    """Rows worth running a common beginning for once: ``(members, length)`` per group, where every
    member's context begins with the same ``length`` tokens, ``length`` is at least ``min_shared``
    more than any member's ``cached`` tokens, and each member keeps at least one token of its own
    to run (its logits are the next token's). Neighbours in token order form the groups (in that
    order a group's common prefix is its first and last member's); where a group of neighbours
    falls short, its most-cached members leave it one at a time until the rest can share."""
    order = sorted(range(len(contexts)), key=lambda i: contexts[i])
    groups: list[tuple[list[int], int]] = []
    run: list[int] = order[:1]

    def close() -> None:
        members = list(run)
        while len(members) > 1:
            usable = min([common_prefix(contexts[members[0]], contexts[members[-1]])]
                         + [len(contexts[i]) - 1 for i in members])
            if usable >= max(cached[i] for i in members) + min_shared:
                groups.append((members, usable))
                return
            members.remove(max(members, key=lambda i: (cached[i], -len(contexts[i]))))

    for a, b in zip(order, order[1:]):
        if common_prefix(contexts[a], contexts[b]) >= max(cached[a], cached[b]) + min_shared:
            run.append(b)
        else:
            close()
            run = [b]
    close()
    return groups


class _Template:
    """The session key of a shared prefix's template row (never a caller's key)."""

    def __init__(self, number: int):
        self.number = number

    def __repr__(self) -> str:
        return f"<shared prefix {self.number}>"


class HFSession:
    def __init__(self, backend: Any, observer: Callable[[list[tuple[Hashable, int, int]]], None] | None = None,
                 share_prefixes: bool = True):
        if not session_supported(backend):
            raise ValueError("this backend or model cannot keep KV caches across calls (see session_supported)")
        self.backend = backend
        self.parked: dict[Hashable, _Parked] = {}
        self.observer = observer  # told (key, first position, count) per row after every forward pass
        forks = observer is None or all(callable(getattr(observer, name, None)) for name in ("fork", "forget"))
        self.share_prefixes = share_prefixes and forks
        self.templates_run = 0  # template rows run for shared prefixes (and their tokens, below)
        self.shared_tokens_run = 0
        self.prefill_tokens_run = 0  # input columns × rows of every prefill pass (padding, templates included)

    # ----------------------------------------------------------------------------- public API

    def generate(self, requests: Sequence[GenerationRequest], keys: Sequence[Hashable]) -> list[GenerationResult]:
        """``backend.generate(requests)``, request ``i`` continuing row ``keys[i]``'s cache."""
        if len(keys) != len(requests) or len(set(keys)) != len(keys):
            raise ValueError("give one distinct key per request")
        if any(request.n != 1 for request in requests):
            raise ValueError("a session row is one sample: n must be 1")
        taken = self._take(keys)
        prompts = [self._prompt_ids(request) for request in requests]
        self._share_prefixes(prompts, keys, taken)
        # the backend runs the ids found here: a text or chat prompt is tokenised once per call
        requests = [replace(r, prompt=ids) if ids else r for r, ids in zip(requests, prompts)]

        def decode(batch: list) -> None:
            self._decode(batch, [keys[row.request] for row in batch], taken)

        return self.backend.generate_rows(requests, decode)

    def next_logits(self, sequences: Sequence[list[int]], keys: Sequence[Hashable]) -> torch.Tensor:
        """Logits ``[b, V]`` (float32) of the position after each token sequence, row ``keys[i]``
        continuing its cache; the rows stay in the session with the whole sequence cached."""
        if len(keys) != len(sequences) or len(set(keys)) != len(keys) or not all(sequences):
            raise ValueError("give one distinct key per sequence, and no empty sequence")
        backend = self.backend
        taken = self._take(keys)
        self._share_prefixes([list(sequence) for sequence in sequences], keys, taken)
        out: list[torch.Tensor | None] = [None] * len(sequences)
        by_length = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
        with backend.in_use():
            for first in range(0, len(by_length), backend.max_batch_size):
                batch = by_length[first:first + backend.max_batch_size]
                contexts = [list(sequences[i]) for i in batch]
                order, logits, mask, cache = self._prefill(contexts, [taken.get(keys[i]) for i in batch], 0,
                                                           [keys[i] for i in batch])
                for row, j in enumerate(order):
                    out[batch[j]] = logits[row]
                    self._park(keys[batch[j]], contexts[j], cache, row, mask)
        filled = [logits for logits in out if logits is not None]
        assert len(filled) == len(out)  # every sequence is in some batch
        return torch.stack(filled) if filled else torch.empty(0)

    def release(self, keys: Sequence[Hashable]) -> None:
        """Forget these rows' caches."""
        for key in keys:
            self.parked.pop(key, None)

    # ----------------------------------------------------------------------------- internals

    def _take(self, keys: Sequence[Hashable]) -> dict[Hashable, _Parked]:
        """Hand the named rows' caches to this call (a row that fails is not parked again)."""
        return {key: self.parked.pop(key) for key in keys if key in self.parked}

    def _prompt_ids(self, request: GenerationRequest) -> list[int] | None:
        """The request's prompt ids as the backend will run them; None where it will refuse them."""
        backend = self.backend
        try:
            ids = prompt_token_ids(backend.tokenizer, request.prompt, backend.thinking)
        except Exception:  # the backend's own path reports the prompt
            return None
        return None if backend.prompt_problem(ids, request.allowed_token_ids) else ids

    def _share_prefixes(self, contexts: list[list[int] | None], keys: Sequence[Hashable],
                        taken: dict[Hashable, _Parked]) -> None:
        """Run the common beginnings of this call's rows once (:func:`shared_prefix_groups`), level by
        level, and hand each member a copy of its group's cache in ``taken``. ``contexts[i]``: row
        ``keys[i]``'s token ids, None to leave the row alone."""
        if not self.share_prefixes:
            return
        rows = [i for i, context in enumerate(contexts) if context]
        row_contexts = [context for context in contexts if context]  # row_contexts[m] is contexts[rows[m]]
        for _ in range(MAX_SHARING_LEVELS):
            cached = [self._reusable(taken.get(keys[i]), context) for i, context in zip(rows, row_contexts)]
            groups = shared_prefix_groups(row_contexts, cached)
            if not groups:
                return
            templates = []
            for members, length in groups:
                donor = max(members, key=lambda m: cached[m])  # the member that has the most of it cached
                templates.append(([keys[rows[m]] for m in members], row_contexts[donor][:length],
                                  keys[rows[donor]]))
            self._run_templates(templates, taken)

    def _run_templates(self, templates: list[tuple[list[Hashable], list[int], Hashable]],
                       taken: dict[Hashable, _Parked]) -> None:
        """Prefill each template (members' keys, the shared ids, the donor whose cache it starts
        from) as a row of its own; every member then starts from its cache."""
        backend = self.backend
        observer = cast("ForkingObserver | None", self.observer)  # prefixes are shared only with such a one
        names: list[Hashable] = []
        for _members, _ids, donor in templates:
            self.templates_run += 1
            names.append(_Template(self.templates_run))
            if observer is not None and donor in taken:
                observer.fork(donor, [names[-1]])  # the template holds what the donor recorded
        contexts = [ids for _members, ids, _donor in templates]
        parked = [taken.get(donor) for _members, _ids, donor in templates]
        with backend.in_use():
            for first in range(0, len(templates), backend.max_batch_size):
                part = slice(first, first + backend.max_batch_size)
                order, _logits, mask, cache = self._prefill(contexts[part], parked[part], 0, names[part])
                for row, j in enumerate(order):
                    self._park(names[part][j], contexts[part][j], cache, row, mask)
        for (members, ids, _donor), name, before in zip(templates, names, parked):
            self.shared_tokens_run += len(ids) - self._reusable(before, ids)
            shared = self.parked.pop(name)
            for key in members:
                taken[key] = shared  # read-only: a row's cache is copied out of it (_fill), never into it
            if observer is not None:
                observer.fork(name, members)
                observer.forget([name])

    def _decode(self, rows: list, keys: list[Hashable], taken: dict[Hashable, _Parked]) -> None:
        """Prefill one batch from the rows' caches and run the backend's decode loop over it
        (:meth:`~inference.backends.hf.HFBackend.decode`), parking each finished row's cache under its key."""
        room = max(row.limit for row in rows)
        order, logits, mask, cache = self._prefill([row.prompt for row in rows], [taken.get(k) for k in keys], room,
                                                   keys)
        rows, keys = [rows[i] for i in order], [keys[i] for i in order]

        def finished(i: int, k: int, mask: torch.Tensor) -> None:
            self._park(keys[i], rows[i].prompt + rows[i].token_ids[:self._fed(rows[i])], cache, k, mask)

        def stepped(live: list[int]) -> None:  # each live row ran its newest token
            assert self.observer is not None  # passed to decode only with an observer
            self.observer([(keys[i], len(rows[i].prompt) + len(rows[i].token_ids) - 1, 1) for i in live])

        self.backend.decode(rows, logits, mask, cache, on_finish=finished,
                            on_step=stepped if self.observer is not None else None)

    @staticmethod
    def _fed(row: Any) -> int:
        """How many of a finished row's completion tokens went through the model: all but the last
        one, which ended the row (an EOS is not in ``token_ids`` and was not run either)."""
        return len(row.token_ids) if row.finish_reason == "eos" else len(row.token_ids) - 1

    @staticmethod
    def _reusable(parked: _Parked | None, context: list[int]) -> int:
        """Cached tokens a row can keep: the common prefix, leaving at least one token to run
        (its logits are the next token's)."""
        if parked is None:
            return 0
        return min(common_prefix(parked.ids, context), len(context) - 1)

    def _prefill(self, contexts: list[list[int]], parked: list[_Parked | None], room: int,
                 keys: Sequence[Hashable]) -> tuple[list[int], torch.Tensor, torch.Tensor, Any]:
        """Run what each row's cache lacks of its context, in groups of similar counts.

        ``room``: decoding steps to reserve in the cache. Returns ``order`` (row ``r`` of the
        outputs is ``contexts[order[r]]``: most new tokens first), the last-position logits
        ``[b, V]``, the attention mask ``[b, width]`` and the merged cache (rows right-aligned,
        left padding only).
        """
        counts = [len(c) - self._reusable(p, c) for c, p in zip(contexts, parked)]
        order = sorted(range(len(contexts)), key=lambda i: -counts[i])
        contexts, parked, counts = [contexts[i] for i in order], [parked[i] for i in order], [counts[i] for i in order]
        keys = [keys[i] for i in order]
        groups = prefill_groups(counts)
        single = len(groups) == 1
        logits, masks, caches = [], [], []
        for start, end in groups:
            logit, mask, cache = self._prefill_group(contexts[start:end], parked[start:end], counts[start],
                                                     room if single else 0, keys[start:end])
            logits.append(logit)
            masks.append(mask)
            caches.append(cache)
        if single:
            return order, logits[0], masks[0], caches[0]
        width = max(m.shape[1] for m in masks)
        masks = [torch.nn.functional.pad(m, (width - m.shape[1], 0)) for m in masks]  # zeros on the left
        return order, torch.cat(logits), torch.cat(masks), merge_left_padded(caches, width + room)

    def _prefill_group(self, contexts: list[list[int]], parked: list[_Parked | None], new: int,
                       room: int, keys: Sequence[Hashable]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """One forward pass over ``new`` input columns for rows that each keep the first
        ``len(context) - new`` cached tokens (or none, left-padding a short context).

        Returns logits ``[g, V]``, mask ``[g, kept + new]`` and the group's cache (with ``room``
        spare positions).
        """
        backend = self.backend
        self.prefill_tokens_run += len(contexts) * new
        kept = [max(0, len(c) - new) for c in contexts]
        width = max(kept)
        cache = new_growing_cache(reserve=room)
        if width:
            self._fill(cache, parked, kept, width, width + new + room)
        ids = torch.full((len(contexts), new), backend.pad_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), width + new), dtype=torch.long)
        for i, (context, keep) in enumerate(zip(contexts, kept)):
            tail = context[keep:]
            ids[i, new - len(tail):] = torch.tensor(tail)
            mask[i, width - keep:width] = 1
            mask[i, width + new - len(tail):] = 1
        ids, mask = ids.to(backend.device), mask.to(backend.device)
        position = (mask.cumsum(-1) - 1).clamp(min=0)[:, width:]
        logits = backend.last_logits(ids, mask, position, cache)
        if self.observer is not None:  # row i ran its context from position kept[i] on (its tail)
            self.observer([(key, keep, len(context) - keep) for key, context, keep in zip(keys, contexts, kept)])
        return logits, mask, cache

    @staticmethod
    def _fill(cache: Any, parked: list[_Parked | None], kept: list[int], width: int, capacity: int) -> None:
        """Write each row's first ``kept[i]`` parked tokens right-aligned at ``width`` into ``cache``
        (``capacity`` positions per layer)."""
        rows = [(row, p, keep) for row, (p, keep) in enumerate(zip(parked, kept)) if keep and p is not None]
        assert len(rows) == sum(1 for keep in kept if keep)  # only a row with a parked cache keeps tokens
        source = rows[0][1]
        for layer_index, (keys, values) in enumerate(source.layers):
            layer = GrowingLayer(reserve=0)
            layer.allocate(len(kept), capacity, keys[None], values[None])
            layer_keys, layer_values = layer.buffers()
            for row, p, keep in rows:
                part_keys, part_values = p.layers[layer_index]
                layer_keys[row, :, width - keep:width] = part_keys[:, :keep]
                layer_values[row, :, width - keep:width] = part_values[:, :keep]
            layer.expose(width)
            cache.layers.append(layer)

    def _park(self, key: Hashable, ids: list[int], cache: Any, row: int, mask: torch.Tensor) -> None:
        """Keep a compact copy of row ``row``'s cache (its last ``len(ids)`` positions) under ``key``.
        ``mask``: the batch's attention mask ``[b, width]``, whose row must count ``len(ids)`` tokens."""
        if int(mask[row].sum()) != len(ids):
            raise AssertionError(f"row {key!r} has {int(mask[row].sum())} cached tokens, expected {len(ids)}")
        layers = []
        for layer in cache.layers:
            length = layer.keys.shape[-2]
            if len(ids) > length:
                raise AssertionError(f"row holds {length} cached positions, fewer than its {len(ids)} tokens")
            layers.append((layer.keys[row, :, length - len(ids):].clone(),
                           layer.values[row, :, length - len(ids):].clone()))
        self.parked[key] = _Parked(list(ids), layers)

