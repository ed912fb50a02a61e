"""Rows that begin alike, run once: a micro-batch packed as a prefix tree (``optim.share_prefixes``).

The rows of a PPO update repeat each other's beginnings: every episode starts with the same
instructions, the samples of a question share their whole prompt (often their copied query too),
and verdict rows judged alone repeat a candidate's preview. Run row by row, the trained layers
recompute those tokens once per row, forward and backward, in every epoch. Packed as a prefix tree,
each distinct beginning runs once:

    rows  a b c d e         packed  a b c d e f g x y        position  0 1 2 3 4 2 3 2 3
          a b f g                   (a b shared by all, c d e / f g / x y the branches)
          a b x y

Token ``j`` of the packed sequence attends to token ``k`` iff ``k`` lies on ``j``'s path from the
root (an ancestor, or ``j`` itself); its position is its depth, so rotary embeddings see each
row's own positions. The states of a row's tokens are then exactly those of the row run alone
(same layers, same inputs, same positions, same visible keys), and gradients through a shared
token add up over the rows that share it, as they would row by row. Only the summation order of
the attention kernels differs (floating-point noise).

Rows are sorted lexicographically, so that each row's longest common beginning with any earlier
row is its common beginning with the row just before it (the depth-first order of the tree). A row
joins the tree of the row before it only when it shares at least half of its tokens
(:func:`prefix_trees`): a tree runs with a dense mask, whose attention costs its whole length
squared, so rows that share little run alone. :func:`training.ppo_loop.ppo_batch.pack_micro_batches`
cuts a mini-batch into micro-batches of whole trees within ``budget`` packed positions;
:func:`pack_rows` (or :func:`shared_packing`) packs one of them, its trees right-padded to the longest.

Needs ``sdpa`` or ``eager`` attention (a custom 4-D mask). Decoders with sliding-window layers
(Gemma 3) get one mask per attention type, the window measured in positions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from training.models.frozen_prefix import decoder_of, top_hidden, unwrap_peft


@dataclass
class PackedRows:
    """A micro-batch of ``B`` rows (right-padded to ``T``) packed into ``P`` prefix trees of up to
    ``S`` tokens each (right-padded; a pad token attends to itself only).

    input_ids, position_ids: (P, S); path: (P, S, S) bool, ``path[p, j, k]`` = token ``k`` is on
    token ``j``'s path (attend); pack: (B,) the tree holding row ``i``; index: (B, T) long, the
    position in that tree of row ``i``'s position ``t`` (0 past the row's end: padding, masked
    everywhere downstream); lengths: (B,) each row's real tokens."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    path: torch.Tensor
    pack: torch.Tensor
    index: torch.Tensor
    lengths: torch.Tensor

    @property
    def tokens(self) -> int:
        """Packed positions run, padding included (P × S)."""
        return int(self.input_ids.numel())


def common_length(a: list[int], b: list[int]) -> int:
    """How many tokens ``a`` and ``b`` share from the start."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def row_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """Each right-padded row's real tokens. input_ids, attention_mask: (B, T)."""
    lengths = attention_mask.sum(-1).tolist()
    return [input_ids[i, :int(n)].tolist() for i, n in enumerate(lengths)]


def prefix_trees(tokens: list[list[int]], budget: int) -> list[list[tuple[int, int]]]:
    """The rows (``tokens``) grouped into trees: in lexicographic order, a row joins the tree of
    the row before it when it shares at least half of its tokens with that row and the tree stays
    within ``budget`` tokens; else it starts a tree. A tree packed with a dense mask costs attention
    over its whole length, so rows that share little run alone (a plain causal pass is cheaper).
    Returns each tree as ``(row, shared)`` pairs: the row and its tokens shared with the one before."""
    trees: list[list[tuple[int, int]]] = []
    size, previous = 0, None
    for i in sorted(range(len(tokens)), key=lambda r: tokens[r]):
        shared = common_length(tokens[previous], tokens[i]) if previous is not None else 0
        added = len(tokens[i]) - shared
        if trees and 2 * shared >= len(tokens[i]) and size + added <= budget:
            trees[-1].append((i, shared))
            size += added
        else:
            trees.append([(i, 0)])
            size = len(tokens[i])
        previous = i
    return trees


def tree_length(tokens: list[list[int]], tree: list[tuple[int, int]]) -> int:
    """Packed tokens of one tree."""
    return sum(len(tokens[i]) - shared for i, shared in tree)


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, budget: int | None = None) -> PackedRows:
    """Pack right-padded rows (B, T) into prefix trees (see the module docstring and
    :func:`prefix_trees`; ``budget``: a tree's most tokens, default B × T)."""
    tokens = row_tokens(input_ids, attention_mask)
    B, T = input_ids.shape
    return packed_trees(tokens, prefix_trees(tokens, budget or max(B * T, 1)), T, input_ids.device)


def shared_packing(micro_batch: dict[str, torch.Tensor], budget: int) -> PackedRows | None:
    """A micro-batch cut by :func:`training.ppo_loop.ppo_batch.pack_micro_batches` (same ``budget``)
    packed, or None when none of its rows shares with another (the plain pass, without a dense mask,
    is then the cheaper one; nothing is built)."""
    tokens = row_tokens(micro_batch["input_ids"], micro_batch["attention_mask"])
    trees = prefix_trees(tokens, budget)
    if len(trees) == len(tokens):
        return None
    return packed_trees(tokens, trees, micro_batch["input_ids"].shape[1], micro_batch["input_ids"].device)


def packed_trees(tokens: list[list[int]], trees: list[list[tuple[int, int]]], T: int,
                 device: torch.device) -> PackedRows:
    """The rows ``tokens`` (B, each at most ``T`` long) laid out as :func:`prefix_trees` grouped them."""
    B = len(tokens)
    S = max(max((tree_length(tokens, tree) for tree in trees), default=1), 1)
    P = max(len(trees), 1)
    packed = torch.zeros((P, S), dtype=torch.long)
    depth = torch.zeros((P, S), dtype=torch.long)
    path = torch.eye(S, dtype=torch.bool).repeat(P, 1, 1)  # padding attends to itself (no empty softmax)
    pack = torch.zeros(B, dtype=torch.long)
    index = torch.zeros((B, T), dtype=torch.long)
    for p, tree in enumerate(trees):
        used, previous_path = 0, list[int]()
        for i, shared in tree:
            row = tokens[i]
            fresh = list(range(used, used + len(row) - shared))
            packed[p, used:used + len(fresh)] = torch.tensor(row[shared:], dtype=torch.long)
            depth[p, used:used + len(fresh)] = torch.arange(shared, len(row))
            used += len(fresh)
            row_path = previous_path[:shared] + fresh
            previous_path = row_path
            pack[i] = p
            if row_path:
                at = torch.tensor(row_path, dtype=torch.long)
                index[i, :len(at)] = at
                path[p, at[:, None], at[None, :]] |= torch.ones((len(at), len(at)), dtype=torch.bool).tril()
    return PackedRows(input_ids=packed.to(device), position_ids=depth.to(device), path=path.to(device),
                      pack=pack.to(device), index=index.to(device),
                      lengths=torch.tensor([len(t) for t in tokens], dtype=torch.long, device=device))


def packed_states(states: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """Per-row states (B, T, H) (e.g. the cached frozen prefix) laid out as the packed trees:
    (P, S, H), each packed token taking the state of a row that holds it (all such rows agree;
    padding: zeros)."""
    B, T, H = states.shape
    P, S = packed.input_ids.shape
    source = torch.full((P * S,), B * T, dtype=torch.long, device=states.device)  # B·T: the zero row
    valid = torch.arange(T, device=states.device)[None, :] < packed.lengths[:, None]  # (B, T)
    target = packed.pack[:, None] * S + packed.index  # (B, T)
    source[target[valid]] = torch.arange(B * T, device=states.device).view(B, T)[valid]
    flat = torch.cat([states.reshape(B * T, H), states.new_zeros((1, H))])
    return flat[source].view(P, S, H)


def unpacked(hidden: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """The packed trees' states (P, S, H) back in the rows' layout (B, T, H) (gradients of a
    shared token's state add up over the rows that read it)."""
    return hidden[packed.pack[:, None], packed.index]


def attention_masks(packed: PackedRows, config: Any, dtype: torch.dtype) -> Any:
    """The 4-D mask(s) the decoder takes for the packed trees: (P, 1, S, S), boolean for
    ``sdpa`` (True: attend), additive for ``eager``; a dict by attention type where the decoder
    has sliding-window layers (keys within ``sliding_window`` positions of the query)."""
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    if implementation not in ("sdpa", "eager"):
        raise ValueError(f"optim.share_prefixes needs sdpa or eager attention, not {implementation!r}")
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    layer_types = set(getattr(text, "layer_types", None) or ())
    masks = {"full_attention": packed.path}
    if "sliding_attention" in layer_types:
        window = int(text.sliding_window)
        position = packed.position_ids  # (P, S)
        masks["sliding_attention"] = packed.path & ((position[:, :, None] - position[:, None, :]) < window)
    unknown = layer_types - set(masks)
    if unknown:
        raise ValueError(f"optim.share_prefixes: no packed mask for attention types {sorted(unknown)}")

    def as_4d(allowed: torch.Tensor) -> torch.Tensor:
        if implementation == "sdpa":
            return allowed[:, None]
        blocked = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return blocked.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]

    if len(masks) == 1:
        return as_4d(masks["full_attention"])
    return {name: as_4d(mask) for name, mask in masks.items()}


def packed_hidden(lm: Any, packed: PackedRows, prefix: torch.Tensor | None = None, prefix_depth: int = 0
                  ) -> torch.Tensor:
    """The decoder's last hidden states (P, S, H) over the packed trees: from its tokens, or
    from the rows' cached frozen states ``prefix`` (B, T, H) after ``prefix_depth`` layers
    (:mod:`training.models.frozen_prefix`), only the layers above them running."""
    config = unwrap_peft(lm).config
    if prefix is not None:
        masks = attention_masks(packed, config, prefix.dtype)
        return top_hidden(lm, packed_states(prefix, packed), masks, prefix_depth, packed.position_ids)
    decoder = decoder_of(lm)
    masks = attention_masks(packed, config, decoder.get_input_embeddings().weight.dtype)
    return decoder(input_ids=packed.input_ids, attention_mask=masks, position_ids=packed.position_ids,
                   use_cache=False).last_hidden_state
