"""Actor, critic and reference for SEEDS-R1 PPO.

- Actor (:class:`PolicyModel`): the causal LM, full fine-tune or a peft LoRA. Its ``forward``
  returns per-token log-probs (and entropies) of the NEXT token, running the lm_head only on the
  positions asked for, so the (B, T, V) logits of a 262k vocabulary are never materialised.
- Critic (:class:`ValueHead`): its own copy of the same base decoder (same initial weights; LoRA
  on it when ``lora.critic``) + ``Linear(hidden, 1)``.
- Reference: the frozen SFT policy. With LoRA it is the actor with its adapter switched off
  (``disable_adapter()``, no second copy); without LoRA a frozen deep copy.

Alignment (shared with the trainer): for ``input_ids`` (B, T), position ``t`` of every (B, T−1)
output is about token ``t+1``: ``logp[:, t] = log π(ids[t+1] | ids[≤t])`` and
``values[:, t] = V(ids[≤t])``, the value of the state in which token ``t+1`` is chosen.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from torch.utils.checkpoint import checkpoint

from inference.models import ensure_pad_token, load_causal_lm, load_tokenizer, strip_gguf_quantizer
from training.algorithm.ppo_core import (
    choice_entropy_from_logits,
    choice_logprobs_from_logits,
    entropy_from_logits,
    logprobs_from_logits,
)
from training.config import AlgorithmSettings, LoraSettings, ModelSettings, RolloutSettings
from training.models.frozen_prefix import decoder_of, top_hidden, unwrap_peft
from training.models.prefix_tree import PackedRows, packed_hidden, unpacked

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _head_logits(lm: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """lm_head (+ final logit soft-capping, e.g. Gemma 2) on hidden states (N, H) -> (N, V)."""
    base = unwrap_peft(lm)
    logits = base.get_output_embeddings()(hidden)
    cap = getattr(base.config.get_text_config(), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def sequence_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, chunk: int = 1024,
                      target_mask: torch.Tensor | None = None, with_entropy: bool = False,
                      choice_mask: torch.Tensor | None = None, choice_ids: torch.Tensor | None = None,
                      prefix: torch.Tensor | None = None, prefix_depth: int = 0, temperature: float = 1.0,
                      packing: PackedRows | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(ids[t+1] | ids[≤t]) for t < T−1, and optionally the entropy of π(· | ids[≤t]).

    model: a causal LM (plain or peft); input_ids, attention_mask: (B, T), right-padded.
    target_mask: (B, T−1) or None; where given, the lm_head runs only on positions with mask 1
    (others get 0). choice_mask: (B, T−1) or None, with choice_ids (C,): at positions with mask 1
    the token was drawn among those choices only, and its log-prob and entropy are those of the
    distribution renormalised over them (constrained verdicts). prefix: (B, T, H) or None, the
    hidden states after the first ``prefix_depth`` (frozen) decoder layers
    (:mod:`training.models.frozen_prefix`): only the layers above them run. temperature: π = softmax(z / τ)
    (verl's ``logits.div_(temperature)``), the distribution the rollout sampled from, for the
    log-probs, the entropy and the constrained positions alike; must be > 0. packing: the rows
    packed as a prefix tree (:func:`training.models.prefix_tree.pack_rows` of these ``input_ids``):
    the decoder runs each shared beginning once; the results are the unpacked ones'.
    Returns logp (B, T−1) float32 and entropy (B, T−1) float32 or None.
    The lm_head runs ``chunk`` positions at a time; with gradients each chunk is checkpointed,
    so backward keeps the hidden states, not the (N, V) logits.
    """
    if packing is not None:
        hidden = unpacked(packed_hidden(model, packing, prefix, prefix_depth), packing)
    elif prefix is not None:
        hidden = top_hidden(model, prefix, attention_mask, prefix_depth)
    else:
        decoder = decoder_of(model)
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    hidden, labels = hidden[:, :-1], input_ids[:, 1:]
    B, T1 = labels.shape
    if target_mask is None:
        target_mask = attention_mask[:, 1:]
    rows, cols = torch.nonzero(target_mask.bool(), as_tuple=True)
    h, y = hidden[rows, cols], labels[rows, cols]  # (N, H), (N,)
    choices = None  # choice_ids when some target position is constrained
    c = torch.zeros_like(y, dtype=torch.bool)  # (N,)
    if choice_ids is not None and choice_mask is not None and bool(choice_mask.any()):
        choices, c = choice_ids, choice_mask[rows, cols].bool()

    def per_chunk(h_part: torch.Tensor, y_part: torch.Tensor,
                  c_part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = _head_logits(model, h_part)[None]  # (1, n, V)
        if temperature != 1.0:
            logits = logits.float() / temperature  # in float32, as the sampler divides
        logp = logprobs_from_logits(logits, y_part[None], chunk=None)[0]
        ent = entropy_from_logits(logits, chunk=None)[0] if with_entropy else torch.zeros_like(logp)
        if choices is not None:
            logp = torch.where(c_part, choice_logprobs_from_logits(logits[0], y_part, choices), logp)
            if with_entropy:
                ent = torch.where(c_part, choice_entropy_from_logits(logits[0], choices), ent)
        return logp, ent

    grad = torch.is_grad_enabled() and h.requires_grad
    logps, ents = [], []
    for s in range(0, h.shape[0], chunk):
        args = (h[s:s + chunk], y[s:s + chunk], c[s:s + chunk])
        lp, en = checkpoint(per_chunk, *args, use_reentrant=False) if grad else per_chunk(*args)
        logps.append(lp)
        ents.append(en)
    logp = hidden.new_zeros((B, T1), dtype=torch.float32)
    entropy = hidden.new_zeros((B, T1), dtype=torch.float32)
    if logps:
        logp = logp.index_put((rows, cols), torch.cat(logps))
        entropy = entropy.index_put((rows, cols), torch.cat(ents))
    elif grad:  # no target position: zeros still tied to the graph, so backward (and DDP's all-reduce) runs
        logp = logp + 0.0 * hidden.float().sum()
    return logp, (entropy if with_entropy else None)


class PolicyModel(nn.Module):
    """The actor. ``forward`` = :func:`sequence_logprobs` (so DDP/accelerate wrap the whole computation)."""

    def __init__(self, lm: nn.Module, chunk: int = 1024, temperature: float = 1.0):
        super().__init__()
        self.lm: Any = lm  # a transformers causal LM, plain or peft: its attributes are its class's own
        self.chunk = chunk
        self.temperature = temperature  # the rollout's: log-probs and entropy of softmax(z / temperature)

    @property
    def is_lora(self) -> bool:
        return callable(getattr(self.lm, "disable_adapter", None))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor | None = None,
                with_entropy: bool = False, choice_mask: torch.Tensor | None = None,
                choice_ids: torch.Tensor | None = None, prefix: torch.Tensor | None = None,
                prefix_depth: int = 0, packing: PackedRows | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        return sequence_logprobs(self.lm, input_ids, attention_mask, self.chunk, target_mask, with_entropy,
                                 choice_mask, choice_ids, prefix, prefix_depth, self.temperature, packing)


class ValueHead(nn.Module):
    """Critic: a base decoder + Linear(hidden, 1). ``forward`` -> values (B, T), one per position."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        # V = 0 everywhere at the start: hidden states of some bases (Gemma's scaled final norm) are
        # large, and a random head then starts the critic at |V| of several units, far from any return.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1).float()


def sequence_values(critic: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """V(ids[≤t]) for t < T−1, aligned with :func:`sequence_logprobs`. (B, T) -> (B, T−1)."""
    return critic(input_ids, attention_mask)[:, :-1]


@dataclass
class Models:
    actor: PolicyModel
    critic: ValueHead | None  # None: a critic-free estimator (grpo, reinforce)
    reference_logprobs: Callable[..., torch.Tensor]  # (input_ids, attention_mask, target_mask, ...) -> (B, T−1)
    tokenizer: Any


def lora_config(settings: LoraSettings, task_type: str | None, num_layers: int) -> LoraConfig:
    """peft LoraConfig; with ``settings.top_layers`` = N, only decoder layers ``num_layers−N ..`` get adapters."""
    top = settings.top_layers
    if top is not None and top > num_layers:
        raise ValueError(f"lora.top_layers={top} but the model has {num_layers} decoder layers")
    layers = list(range(num_layers - top, num_layers)) if top else None
    return LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                      target_modules=(settings.target_modules if isinstance(settings.target_modules, str)
                                      else list(settings.target_modules)), task_type=task_type, bias="none",
                      layers_to_transform=layers, layers_pattern="layers" if layers else None)


def uses_critic(algorithm: AlgorithmSettings) -> bool:
    """Only GAE needs a learned value; the others (grpo, rloo, reinforce, reinforce_pp) run without a critic."""
    return algorithm.advantage == "gae"


def wrap_models(lm: PreTrainedModel, tokenizer: Any, model: ModelSettings, algorithm: AlgorithmSettings,
                rollout: RolloutSettings) -> Models:
    """Actor, critic and reference around an already loaded causal LM (the SFT policy or the base):
    LoRA, log-prob chunks and checkpointing from ``model``, a critic where ``algorithm`` needs one. The
    actor and the reference score tokens under ``softmax(z / rollout.temperature)``, the rollout's."""
    lm = strip_gguf_quantizer(lm)  # a no-op for plain folders; GGUF-loaded models refuse training otherwise
    hidden_size = lm.config.get_text_config().hidden_size
    num_layers = lm.config.get_text_config().num_hidden_layers
    critic = None
    if uses_critic(algorithm):
        backbone = copy.deepcopy(decoder_of(lm))  # the critic's own copy, same initial weights
        if model.lora.enabled and model.lora.critic:
            backbone = get_peft_model(backbone, lora_config(model.lora, None, num_layers))
        critic = ValueHead(backbone, hidden_size)
    if model.lora.enabled:
        actor = PolicyModel(get_peft_model(lm, lora_config(model.lora, "CAUSAL_LM", num_layers)),
                            model.logprob_chunk,
                            rollout.temperature)

        def reference_logprobs(input_ids, attention_mask, target_mask=None, choice_mask=None, choice_ids=None,
                               prefix=None, prefix_depth=0):  # the frozen bottom has no adapter: its cache serves both
            with torch.no_grad(), actor.lm.disable_adapter():
                return sequence_logprobs(actor.lm, input_ids, attention_mask, actor.chunk, target_mask,
                                         choice_mask=choice_mask, choice_ids=choice_ids, prefix=prefix,
                                         prefix_depth=prefix_depth, temperature=actor.temperature)[0]
    else:
        frozen = copy.deepcopy(lm).eval().requires_grad_(False)
        actor = PolicyModel(lm, model.logprob_chunk, rollout.temperature)

        def reference_logprobs(input_ids, attention_mask, target_mask=None, choice_mask=None, choice_ids=None,
                               prefix=None, prefix_depth=0):
            if prefix is not None:  # a full fine-tune trains the embeddings: frozen_depth is 0, no cache
                raise ValueError("a frozen reference copy takes no frozen-layer cache")
            with torch.no_grad():
                return sequence_logprobs(frozen, input_ids, attention_mask, actor.chunk, target_mask,
                                         choice_mask=choice_mask, choice_ids=choice_ids,
                                         temperature=actor.temperature)[0]
    if model.gradient_checkpointing:
        kwargs = {"gradient_checkpointing_kwargs": {"use_reentrant": False}}
        unwrap_peft(actor.lm).gradient_checkpointing_enable(**kwargs)
        critic_base = unwrap_peft(critic.backbone) if critic is not None else None
        if critic_base is not None and hasattr(critic_base, "gradient_checkpointing_enable"):
            critic_base.gradient_checkpointing_enable(**kwargs)
    return Models(actor, critic, reference_logprobs, ensure_pad_token(tokenizer))


def build_models(model: ModelSettings, algorithm: AlgorithmSettings, rollout: RolloutSettings,
                 device: str | None = None) -> Models:
    """Load ``model.sft_checkpoint`` (or ``model.name``) and wrap it (see :func:`wrap_models`)."""
    spec = model.sft_checkpoint or model.name
    lm = load_causal_lm(spec, device=device or "auto", dtype=model.dtype,
                        trust_remote_code=model.trust_remote_code)
    tokenizer = load_tokenizer(spec, trust_remote_code=model.trust_remote_code)
    return wrap_models(lm.train(), tokenizer, model, algorithm, rollout)


def trainable_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Only the parameters being trained (LoRA + head, or everything in a full fine-tune)."""
    return {name: p.detach().cpu().clone() for name, p in model.named_parameters() if p.requires_grad}


def load_trainable_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    expected = {name for name, p in model.named_parameters() if p.requires_grad}
    if set(state) != expected:
        raise ValueError(f"checkpoint does not match the model's trainable parameters: missing "
                         f"{sorted(expected - set(state))[:5]}, unexpected {sorted(set(state) - expected)[:5]}")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)
