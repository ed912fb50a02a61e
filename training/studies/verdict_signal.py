"""How much do a policy's verdicts know, and how much could labels teach them?

A diagnostic for the judgement form (``expand_form: judge``). It takes sampled episodes and reads off
each judged candidate: its label (positive or not), the policy's π(yes) at that verdict, and how many of
its words the question shares. It then trains LoRA adapters on the verdict tokens ALONE, with a
class-balanced logistic loss on the labels, to measure how fast the verdicts could learn. That is the
best case for PPO's per-verdict credit (``verdict_credit``), with no noise from the other tokens.
Driven by ``scripts/run_verdict_signal.py``.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from peft import get_peft_model
from transformers.masking_utils import create_causal_mask

from training.config import LoraSettings
from training.evaluation.policy_eval import roc_auc  # noqa: F401 (scripts/run_verdict_signal.py imports it from here)
from training.models.policy_models import lora_config
from training.teachers.scripted_teacher import content_words


@dataclass
class JudgedEpisode:
    """One episode's verdicts: its tokens up to the last verdict, the verdict positions and labels."""

    group: int  # the question (Episode.group_id)
    token_ids: list[int]
    positions: list[int]  # index of each verdict token in token_ids
    labels: list[bool]  # candidate i is a positive
    candidate_texts: list[str]  # what the stream showed between the previous verdict and this one


def judged_episodes(episodes: Sequence, tokenizer) -> tuple[list[JudgedEpisode], int]:
    """The episodes that judged candidates, with each verdict matched to its candidate's label (the
    search records' ``positive`` lists, in the order shown). Returns (judged, skipped): an episode
    whose verdict count differs from its candidates' (a refused or cut-off judgement) is skipped."""
    judged, skipped = [], 0
    for episode in episodes:
        positions = [i for i, chosen in enumerate(episode.choice_mask) if chosen]
        if not positions:
            continue
        labels = [bool(p) for search in episode.info.get("searches", []) for p in search.get("positive", [])]
        if len(labels) != len(positions):
            skipped += 1
            continue
        starts = [max(0, positions[0] - 100)] + [p + 1 for p in positions[:-1]]
        texts = [tokenizer.decode(episode.token_ids[s:p]) for s, p in zip(starts, positions)]
        judged.append(JudgedEpisode(episode.group_id, list(episode.token_ids[:positions[-1] + 1]), positions,
                                    labels, texts))
    return judged, skipped


def question_overlap(question: str, text: str) -> float:
    """Share of ``text``'s content words that also occur in ``question`` (0 when it has none)."""
    words = content_words(text)
    return len(words & content_words(question)) / len(words) if words else 0.0


def verdict_yes_logits(model, judged: JudgedEpisode, choice_ids: torch.Tensor) -> torch.Tensor:
    """z(yes) − z(no) at each verdict, i.e. logit π(yes) renormalised over the two verdict tokens.

    choice_ids: (2,) the yes and no token ids -> (V,) float32, V = len(judged.positions).
    """
    with torch.no_grad():
        logits = model(torch.tensor([judged.token_ids], device=model.device)).logits[0]
    z = logits[torch.tensor(judged.positions) - 1][:, choice_ids].float()
    return (z[:, 0] - z[:, 1]).cpu()


class TopLayerVerdicts:
    """The model's top ``top_layers`` decoder layers with fresh LoRA adapters, run on hidden states
    cached below them (the lower layers are frozen, so they are computed once per episode)."""

    def __init__(self, model, top_layers: int, rank: int = 16, alpha: int = 32):
        base = copy.deepcopy(model)
        self.first = base.config.num_hidden_layers - top_layers
        settings = LoraSettings(r=rank, alpha=alpha, top_layers=top_layers)  # the recipe's adapters
        config = lora_config(settings, None, base.config.num_hidden_layers)
        self.peft = get_peft_model(base, config)
        self.lm: Any = self.peft.base_model.model  # the transformers causal LM (its attributes are its class's own)

    def cache(self, judged: JudgedEpisode) -> torch.Tensor:
        """Hidden states entering the first adapted layer: (1, T, d)."""
        with torch.no_grad():
            ids = torch.tensor([judged.token_ids], device=self.lm.device)
            return self.lm.model(ids, output_hidden_states=True).hidden_states[self.first]

    def yes_logits(self, hidden: torch.Tensor, positions: list[int], choice_ids: torch.Tensor) -> torch.Tensor:
        """z(yes) − z(no) at the verdicts from cached hidden states. hidden: (1, T, d) -> (V,) float32."""
        position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        rotary = self.lm.model.rotary_emb(hidden, position_ids=position_ids)
        mask = create_causal_mask(config=self.lm.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                                  position_ids=position_ids)
        for layer in self.lm.model.layers[self.first:]:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=rotary, position_ids=position_ids)
        rows = torch.tensor(positions, device=hidden.device) - 1
        z = self.lm.lm_head(self.lm.model.norm(hidden[0, rows])).float()[:, choice_ids]
        return z[:, 0] - z[:, 1]


def _scores(learner: TopLayerVerdicts, cached: list, choice_ids: torch.Tensor) -> tuple[list[bool], list[float]]:
    labels, scores = [], []
    with torch.no_grad():
        for hidden, judged in cached:
            scores += learner.yes_logits(hidden, judged.positions, choice_ids).tolist()
            labels += judged.labels
    return labels, scores


def supervised_bound(model, train: list[JudgedEpisode], test: list[JudgedEpisode], choice_ids: torch.Tensor,
                     top_layers: int, epochs: int, lr: float = 1e-3, batch_episodes: int = 8,
                     seed: int = 0) -> list[dict]:
    """Held-out and training AUC of the verdicts before training (epoch 0) and after each epoch of a
    class-balanced logistic loss on the verdict tokens only, LoRA on the top ``top_layers`` layers."""
    torch.manual_seed(seed)
    learner = TopLayerVerdicts(model, top_layers)
    train_cached = [(learner.cache(j), j) for j in train]
    test_cached = [(learner.cache(j), j) for j in test]
    n_verdicts = sum(len(j.labels) for j in train)
    n_positive = sum(sum(j.labels) for j in train)
    positive_weight = (n_verdicts - n_positive) / max(n_positive, 1)
    params = [p for p in learner.peft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for epoch in range(epochs + 1):
        if epoch:
            order = torch.randperm(len(train_cached), generator=generator).tolist()
            for start in range(0, len(order), batch_episodes):
                optimizer.zero_grad(set_to_none=True)
                loss = torch.zeros(())
                for k in order[start:start + batch_episodes]:
                    hidden, judged = train_cached[k]
                    z = learner.yes_logits(hidden, judged.positions, choice_ids)
                    y = torch.tensor(judged.labels, dtype=torch.float32)
                    weight = torch.where(y > 0, torch.tensor(positive_weight), torch.tensor(1.0))
                    loss = loss + torch.nn.functional.binary_cross_entropy_with_logits(z, y, weight=weight,
                                                                                         reduction="sum")
                (loss / n_verdicts * len(order) / batch_episodes).backward()
                optimizer.step()
        rows.append({"epoch": epoch, "heldout_auc": roc_auc(*_scores(learner, test_cached, choice_ids)),
                     "train_auc": roc_auc(*_scores(learner, train_cached, choice_ids))})
    return rows
