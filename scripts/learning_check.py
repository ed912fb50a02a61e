"""Learning check: does PPO teach a small policy WHICH candidates to open, in our env, on a CPU?

    python scripts/learning_check.py            # the default check (SmolLM2-135M-Instruct + LoRA)

Episodes run in the real env (``SearchVectorEnv`` over the embedded default retriever, SEEDS-R1
limits: K=5 candidates, default reward weights) with ``shuffle_candidates=True``, so the candidate
shown first is not the retriever's top hit (in rank order, always opening [1] would already
score well). Questions come from ``generate_default_questions``; the held-out questions are
disjoint from the training ones.

One episode, three actions:

1. ``<search>``: scripted — the question itself is the query.
2. ``<expand>``: the POLICY. For each candidate preview of the snapshot it makes one yes/no
   judgement (:mod:`training.candidate_judge`): the prompt is the question plus that preview,
   and the decision is the model's next token restricted to "yes"/"no" (sampled at temperature 1
   in training, greedy in evaluation). The expand action lists the candidates judged yes.
3. ``<answer>``: scripted — a naive reader answers with the title of the first passage it read
   (the first one in the ``<information>`` observation), or "unknown" when nothing was opened.
   The env's answers are article titles, so the answer is right when the first passage opened is
   the answer's article; opening negatives before it costs the answer.

The reward is the env's: EM + 0.1·positives opened − 0.05·negatives opened − 0.05·missed
positives (wrong answers only). Precision = positives opened / documents opened, pooled over the
held-out questions (as ``training.rollout.rollout_stats``).

Training:

- **Warm start** (SFT): a teacher that opens RANDOM candidates (each with probability
  ``teacher_open_rate``) runs in the env, and the policy is trained for a few steps to reproduce
  its yes/no judgements (cross-entropy over the whole vocabulary, so the answer format is learned).
  It teaches the protocol, not which candidates to open.
- **PPO**: each update samples episodes for ``batch_questions`` training questions; the episode's
  yes/no decisions are its model tokens, the env's reward is put on the last one
  (``token_level_rewards``), advantages are GAE (γ = λ = 1) against a learned value head and
  whitened, the policy loss is PPO's clipped surrogate, the value loss the clipped one (all from
  :mod:`training.ppo_core`), plus an entropy bonus; no format penalty can arise (every decision is
  a valid token), so exploration stays alive. The value head (a small MLP on the policy's last
  hidden state at the decision, stop-gradient into the policy) is trained alone for the first
  ``critic_warmup`` updates. LoRA sits on the top ``trainable_layers`` decoder layers; the layers
  below are frozen, so their output for a prompt is computed once (in ``bottom_dtype``) and
  cached: the policy is the same function as the whole model with those LoRA layers.

Evaluation: greedy, on the same held-out questions with the same seeds (same candidate order),
after the warm start (= start of PPO), every ``eval_every`` updates, and at the end. Reference
rows (no model: open none, open all, random half, oracle = exactly the positives) show the scale.
Results go to ``runs/learning_check/result.json``; the last printed line is
``reward_start=… reward_end=… precision_start=… precision_end=…``.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import os
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# Idle OpenMP threads sleep instead of spinning: on a shared 2-core box, spinning threads slow a
# 2-thread run down many times over whenever another process holds a core (measured: 20x).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from torch import nn

from envs.atomic import write_json_atomic
from envs.config import EnvConfig
from envs.default_questions import generate_default_questions
from envs.defaults import default_retriever
from envs.protocol import format_answer, format_search
from envs.types import QAExample
from envs.vector_env import SearchVectorEnv
from training.candidate_judge import (
    JudgePrompts,
    SplitDecoder,
    expand_action,
    judge_logits,
    parse_snapshot,
    two_way_entropy,
    yes_logprobs,
)
from training.ppo_core import (
    compute_advantages,
    entropy_sum,
    explained_variance,
    global_token_count,
    policy_loss,
    token_level_rewards,
    value_loss,
)

NO_ANSWER = "unknown"
_FIRST_TITLE = re.compile(r"^\[\d+\] (.+)$", re.MULTILINE)


@dataclass
class CheckConfig:
    model: str = "smollm2-135m"  # a spec of inference.models.load_causal_lm
    seed: int = 0
    threads: int = 2
    question_seed: int = 0  # seed of generate_default_questions
    train_questions: int = 160
    eval_questions: int = 80
    trainable_layers: int = 2  # LoRA on the top N decoder layers; those below are frozen and cached
    bottom_dtype: str = "bfloat16"  # dtype of the frozen layers ("float32" for exactness)
    top_dtype: str = "float32"  # "bfloat16": the trained layers run under CPU autocast
    lora_r: int = 16
    lora_alpha: int = 32
    lr: float = 1e-3
    lr_warmup: int = 5  # updates of linear learning-rate warm-up (Adam's first steps are full-size)
    value_lr: float = 1e-3
    updates: int = 100
    batch_questions: int = 4
    samples_per_question: int = 16  # episodes per question per update (one forward pass serves them all)
    ppo_epochs: int = 4
    clip: float = 0.2
    value_clip: float = 0.2
    entropy_coef: float = 0.05
    kl_coef: float = 0.0  # exact KL(π‖π_ref) of each yes/no decision to the warm-started policy, as a loss
    max_grad_norm: float = 1.0
    critic_warmup: int = 2
    warm_steps: int = 12
    warm_batch_questions: int = 4
    warm_lr: float = 2e-3
    teacher_open_rate: float = 0.5
    eval_every: int = 20
    out: str = "runs/learning_check"


# --------------------------------------------------------------------------- episodes in the env


@dataclass
class EpisodeBatch:
    """One batch of finished episodes: per-episode env results and the judgements made."""

    examples: list[QAExample]
    previews: list[list[str]]  # the snapshot each episode saw, in the order shown
    rewards: list[float]
    summaries: list[dict]
    decisions: list[list[bool]]
    labels: list[list[bool]]  # which candidates were positives (for metrics only; the policy never sees them)
    judged: dict  # whatever the policy returned besides the decisions (logits, hidden states)


def first_read_title(observation: str) -> str:
    """The naive reader: the title of the first passage in an ``<information>`` observation."""
    match = _FIRST_TITLE.search(observation)
    return match.group(1).strip() if match else NO_ANSWER


class Episodes:
    """Runs search → expand → answer episodes through batched envs (one per batch size)."""

    def __init__(self, retriever, config: EnvConfig, tokenizer):
        self.retriever, self.config, self.tokenizer = retriever, config, tokenizer
        self._venvs: dict[int, SearchVectorEnv] = {}

    def _venv(self, n: int) -> SearchVectorEnv:
        if n not in self._venvs:
            self._venvs[n] = SearchVectorEnv(self.retriever, n, config=self.config, tokenizer=self.tokenizer)
        return self._venvs[n]

    def run(self, examples: Sequence[QAExample], seeds: Sequence[int], decide: Callable) -> EpisodeBatch:
        """``decide(examples, previews, records) -> (decisions, extra)`` makes the expand decisions."""
        venv = self._venv(len(examples))
        venv.reset(seed=list(seeds), examples=list(examples))
        total = [0.0] * len(examples)
        obs, rewards, *_ = venv.step([format_search(ex.question) for ex in examples])
        total = [t + r for t, r in zip(total, rewards)]
        previews = [parse_snapshot(o) if o.startswith("<snapshot>") else [] for o in obs]
        records = [env.episode.latest for env in venv.envs]
        decisions, extra = decide(examples, previews, records)
        obs, rewards, *_ = venv.step([expand_action(d) for d in decisions])
        total = [t + r for t, r in zip(total, rewards)]
        obs, rewards, terminated, _, infos = venv.step([format_answer(first_read_title(o)) for o in obs])
        total = [t + r for t, r in zip(total, rewards)]
        assert all(terminated), "every episode ends with its answer"
        summaries = [info["episode"] for info in infos]
        for t, s in zip(total, summaries):
            assert math.isclose(t, s["reward"]["total"], abs_tol=1e-9)
        labels = [list(r.positive) if r is not None else [] for r in records]
        return EpisodeBatch(list(examples), previews, total, summaries, decisions, labels, extra)


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve of ``scores`` for ``labels`` (ties count half); NaN without both classes."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def batch_metrics(batches: Sequence[EpisodeBatch]) -> dict:
    summaries = [s for b in batches for s in b.summaries]
    rewards = [r for b in batches for r in b.rewards]
    n = len(summaries)

    def total(key: str) -> int:
        return sum(s[key] for s in summaries)

    opened, shown_pos = total("docs_read"), total("positives_shown")
    return {
        "episodes": n,
        "reward": sum(rewards) / n,
        "precision": total("positives_opened") / opened if opened else 0.0,
        "em": sum(s["metrics"]["em"] for s in summaries) / n,
        "docs_read": opened / n,
        "open_rate_positive": total("positives_opened") / shown_pos if shown_pos else 0.0,
        "open_rate_negative": total("negatives_opened") / max(1, total("docs_shown") - shown_pos),
    }


# --------------------------------------------------------------------------- the policy


class ValueHead(nn.Module):
    """V(state of one decision): an MLP on the policy's final hidden state at that decision and the
    mean of those of the whole snapshot (stop-gradient: the critic does not move the policy)."""

    def __init__(self, hidden_size: int, width: int = 128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2 * hidden_size, width), nn.Tanh(), nn.Linear(width, 1))

    def forward(self, hidden: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """hidden (N, H) of N candidates, snapshot after snapshot of the given sizes -> values (N,)."""
        hidden = hidden.detach().float()
        context = torch.cat([h.mean(dim=0, keepdim=True).expand_as(h) for h in torch.split(hidden, list(sizes))])
        return self.net(torch.cat([hidden, context], dim=-1)).squeeze(-1)


class JudgePolicy:
    """Per-candidate yes/no judgements over cached frozen-layer states (see the module docstring)."""

    def __init__(self, lm, tokenizer, cfg: CheckConfig):
        from peft import LoraConfig, get_peft_model

        n_layers = lm.config.get_text_config().num_hidden_layers
        split = n_layers - cfg.trainable_layers
        if not 0 <= split < n_layers:
            raise ValueError(f"trainable_layers must lie in 1..{n_layers}")
        bottom_lm = copy.deepcopy(lm).to(getattr(torch, cfg.bottom_dtype)).eval().requires_grad_(False)
        self.bottom = SplitDecoder(bottom_lm, split)
        lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, bias="none",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                          layers_to_transform=list(range(split, n_layers)), task_type="CAUSAL_LM")
        self.lm = get_peft_model(lm, lora).eval()
        self.top = SplitDecoder(self.lm, split)
        self.prompts = JudgePrompts(tokenizer)
        self.answer_ids = self.prompts.answer_ids()
        self.value = ValueHead(self.top.hidden_size)
        self.autocast = cfg.top_dtype == "bfloat16"
        self._prefix: dict[str, torch.Tensor] = {}
        self._candidate: dict[tuple[str, str], torch.Tensor] = {}
        self.bottom_seconds = 0.0
        self.bottom_tokens = 0

    def lora_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.lm.parameters() if p.requires_grad]

    def freeze_reference(self) -> None:
        """Keep the current (warm-started) LoRA weights as the reference policy."""
        self._reference = {n: p.detach().clone() for n, p in self.lm.named_parameters() if p.requires_grad}
        self._ref_logits: dict[tuple[str, str], torch.Tensor] = {}

    @torch.no_grad()
    def reference_logits(self, examples: Sequence[QAExample], previews: Sequence[Sequence[str]]) -> torch.Tensor:
        """Yes/no logits (N, 2) of the reference policy (computed once per prompt, then cached)."""
        missing = [(ex, prev) for ex, prev in zip(examples, previews)
                   if any((ex.question, p) not in self._ref_logits for p in prev)]
        if missing:
            params = dict(self.lm.named_parameters())
            current = {n: params[n].detach().clone() for n in self._reference}
            for n, value in self._reference.items():
                params[n].copy_(value)
            try:
                logits, _ = self.forward([ex for ex, _ in missing], [prev for _, prev in missing])
            finally:
                for n, value in current.items():
                    params[n].copy_(value)
            keys = [(ex.question, p) for ex, prev in missing for p in prev]
            self._ref_logits.update(zip(keys, logits))
        rows = [self._ref_logits[(ex.question, p)] for ex, prev in zip(examples, previews) for p in prev]
        return torch.stack(rows) if rows else torch.zeros((0, 2))

    def states(self, question: str, previews: Sequence[str]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Frozen-layer states of the question's prefix and of each preview, computed once and cached."""
        missing = [p for p in dict.fromkeys(previews) if (question, p) not in self._candidate]
        if missing:
            start = time.perf_counter()
            prefix = self.prompts.prefix_ids(question)
            cands = [self.prompts.candidate_ids(question, p) for p in missing]
            h_prefix, h_cands = self.bottom.bottom(prefix, cands)
            self._prefix.setdefault(question, h_prefix)
            for preview, state in zip(missing, h_cands):
                self._candidate[(question, preview)] = state
            self.bottom_seconds += time.perf_counter() - start
            self.bottom_tokens += len(prefix) + sum(len(c) for c in cands)
        prefix = self._prefix[question].float() if previews else None
        return prefix, [self._candidate[(question, p)].float() for p in previews]

    def forward(self, examples: Sequence[QAExample], previews: Sequence[Sequence[str]]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Yes/no logits (N, 2) and final hidden states (N, H) of all candidates, episode by episode."""
        states = [self.states(ex.question, prev) for ex, prev in zip(examples, previews)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            logits, hidden = judge_logits(self.top, states, self.answer_ids)
        return logits.float(), hidden.float()

    def vocab_logits(self, examples, previews) -> torch.Tensor:
        """Next-token logits over the whole vocabulary at each judgement position (N, V)."""
        _, hidden = self.forward(examples, previews)
        return self.top.vocab_logits(hidden)


def split_per_episode(flat: torch.Tensor, previews: Sequence[Sequence[str]]) -> list[torch.Tensor]:
    sizes = [len(p) for p in previews]
    return list(torch.split(flat, sizes)) if flat.shape[0] else [flat[:0] for _ in sizes]


def to_padded(per_episode: Sequence[torch.Tensor], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """List of (k_i,) -> (B, width) values and mask (decisions in the order shown)."""
    out = torch.zeros((len(per_episode), width))
    mask = torch.zeros((len(per_episode), width))
    for i, row in enumerate(per_episode):
        out[i, : row.shape[0]] = row
        mask[i, : row.shape[0]] = 1.0
    return out, mask


# --------------------------------------------------------------------------- decisions


def greedy_decide(policy: JudgePolicy):
    def decide(examples, previews, records):
        with torch.no_grad():
            logits, _ = policy.forward(examples, previews)
        yes = (logits[:, 0] > logits[:, 1]).tolist()
        p_yes = torch.softmax(logits, dim=-1)[:, 0].tolist()
        return _regroup(yes, previews), {"p_yes": p_yes}
    return decide


def scripted_decide(rule: str, rng: random.Random, rate: float = 0.5):
    """Reference decisions without a model: none, all, random (each with ``rate``), oracle (labels)."""
    def decide(examples, previews, records):
        out = []
        for prev, record in zip(previews, records):
            if rule == "oracle":
                out.append(list(record.positive[: len(prev)]))
            else:
                out.append([rule == "all" or (rule == "random" and rng.random() < rate) for _ in prev])
        return out, {}
    return decide


def _regroup(flat: list, previews) -> list[list[bool]]:
    out, k = [], 0
    for prev in previews:
        out.append([bool(x) for x in flat[k : k + len(prev)]])
        k += len(prev)
    return out


# --------------------------------------------------------------------------- evaluation, warm start, PPO


def evaluate(policy: JudgePolicy, episodes: Episodes, questions, seeds, batch: int) -> dict:
    batches = [episodes.run(questions[i : i + batch], seeds[i : i + batch], greedy_decide(policy))
               for i in range(0, len(questions), batch)]
    metrics = batch_metrics(batches)
    p_yes = [p for b in batches for p in b.judged["p_yes"]]
    labels = [y for b in batches for row in b.labels for y in row]
    metrics["p_yes_mean"] = sum(p_yes) / max(1, len(p_yes))
    metrics["auc"] = auc(p_yes, labels)  # how well P(yes) ranks positives above negatives
    return metrics


def warm_start(policy: JudgePolicy, episodes: Episodes, questions, cfg: CheckConfig) -> dict:
    """SFT on a random teacher's judgements (teaches the yes/no format, not which to open)."""
    rng = random.Random(cfg.seed + 17)
    optimizer = torch.optim.AdamW(policy.lora_parameters(), lr=cfg.warm_lr, weight_decay=0.0)
    # linear decay to 0, so the last steps settle near the teacher's open rate instead of overshooting
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / cfg.warm_steps)
    yes_id, no_id = policy.answer_ids
    teacher = scripted_decide("random", rng, cfg.teacher_open_rate)
    losses, mass = [], []
    for step in range(cfg.warm_steps):
        chosen = rng.sample(list(questions), cfg.warm_batch_questions)
        seeds = [cfg.seed * 7919 + 100_000 + step * 1000 + i for i in range(len(chosen))]
        batch = episodes.run(chosen, seeds, teacher)
        targets = torch.tensor([yes_id if d else no_id for row in batch.decisions for d in row])
        logits = policy.vocab_logits(chosen, batch.previews)
        loss = nn.functional.cross_entropy(logits, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        with torch.no_grad():
            probs = torch.softmax(logits.detach(), dim=-1)
            mass.append(float((probs[:, yes_id] + probs[:, no_id]).mean()))
        losses.append(float(loss.detach()))
    return {"loss_first": losses[0], "loss_last": losses[-1], "answer_mass_first": mass[0], "answer_mass_last": mass[-1]}


class PPO:
    """PPO on the yes/no decisions. Each update takes ``batch_questions`` questions and runs
    ``samples_per_question`` episodes of each (own seeds, so own candidate orders and own sampled
    decisions). A question's judgement prompts do not depend on the order or on other decisions, so
    ONE forward pass per question gives the log-probs of every sample's decisions; the loss is the
    token mean over all samples' decisions."""

    def __init__(self, policy: JudgePolicy, cfg: CheckConfig):
        self.policy, self.cfg = policy, cfg
        self.actor_opt = torch.optim.AdamW(policy.lora_parameters(), lr=cfg.lr, weight_decay=0.0)
        self.critic_opt = torch.optim.AdamW(policy.value.parameters(), lr=cfg.value_lr, weight_decay=0.0)
        self.generator = torch.Generator().manual_seed(cfg.seed)

    def _decide(self, store: dict):
        """Sampling ``decide`` for :meth:`Episodes.run`; keeps the forward pass (with its graph) in ``store``."""
        policy = self.policy

        def decide(examples, previews, records):
            first: dict[str, int] = {}  # question id -> its first episode
            for i, ex in enumerate(examples):
                first.setdefault(ex.id, i)
            unique = list(first.values())
            u_examples, u_previews = [examples[i] for i in unique], [previews[i] for i in unique]
            if self.cfg.kl_coef:  # before the forward pass: it swaps the LoRA weights in and out
                store["ref_logits"] = policy.reference_logits(u_examples, u_previews)
            logits, hidden = policy.forward(u_examples, u_previews)
            offsets, at = {}, 0
            for i in unique:
                offsets[examples[i].id] = at
                at += len(previews[i])
            index = []  # per episode: rows of the flat per-question tensors, in the order shown
            for ex, record in zip(examples, records):
                rows = [h.row for h in records[first[ex.id]].hits] if record is not None else []
                index.append([offsets[ex.id] + rows.index(h.row) for h in (record.hits if record else [])])
            with torch.no_grad():
                p_yes = torch.softmax(logits.detach(), dim=-1)[:, 0]
            decisions = []
            for rows in index:
                draw = torch.rand(len(rows), generator=self.generator)
                decisions.append([bool(d < p_yes[r]) for d, r in zip(draw, rows)])
            u_labels = [y for i in unique for y in (records[i].positive if records[i] is not None else [])]
            store.update(u_examples=u_examples, u_previews=u_previews, logits=logits, hidden=hidden, index=index,
                         u_labels=u_labels)  # labels for the log only
            return decisions, {}

        return decide

    def update(self, update: int, episodes: Episodes, examples, seeds) -> dict:
        cfg, policy = self.cfg, self.policy
        store: dict = {}
        batch = episodes.run(examples, seeds, self._decide(store))
        index, sizes = store["index"], [len(p) for p in store["u_previews"]]
        width = max(1, max(len(rows) for rows in index))
        gather = torch.zeros((len(index), width), dtype=torch.long)
        mask = torch.zeros((len(index), width))
        opened = torch.zeros((len(index), width), dtype=torch.bool)
        for e, (rows, decided) in enumerate(zip(index, batch.decisions)):
            gather[e, : len(rows)] = torch.tensor(rows, dtype=torch.long)
            mask[e, : len(rows)] = 1.0
            opened[e, : len(rows)] = torch.tensor(decided, dtype=torch.bool)

        def per_decision(flat: torch.Tensor) -> torch.Tensor:
            """(U, ...) per question-candidate -> (E, width, ...) per episode decision (0 where masked)."""
            out = flat[gather]
            return out * mask.view(*mask.shape, *([1] * (out.dim() - 2)))

        def logp_of(logits: torch.Tensor) -> torch.Tensor:
            chosen = per_decision(yes_logprobs(logits))
            return torch.where(opened, chosen[..., 0], chosen[..., 1]) * mask

        with torch.no_grad():
            old_logp = logp_of(store["logits"].detach())
            old_values = per_decision(policy.value(store["hidden"], sizes))
        scores = torch.tensor(batch.rewards, dtype=torch.float32)
        token_rewards = token_level_rewards(scores, mask)
        advantages, returns = compute_advantages("gae", token_rewards=token_rewards, values=old_values,
                                                 model_mask=mask, gamma=1.0, lam=1.0, whiten=True)
        count = global_token_count(mask)
        actor_on = update >= cfg.critic_warmup
        ref_logp = yes_logprobs(store["ref_logits"]) if cfg.kl_coef else None
        stats = {}
        for epoch in range(cfg.ppo_epochs):
            if epoch == 0 or not actor_on:  # the sampling pass (its graph), or an unchanged policy
                logits, hidden = store["logits"], store["hidden"]
            else:
                logits, hidden = policy.forward(store["u_examples"], store["u_previews"])
            logp = logp_of(logits)
            entropy = per_decision(two_way_entropy(logits))
            values = per_decision(policy.value(hidden, sizes))
            p_loss, p_stats = policy_loss(logp, old_logp, advantages, mask, cfg.clip, cfg.clip)
            v_loss, _ = value_loss(values, old_values, returns, mask, cfg.value_clip)
            loss = v_loss / count
            if actor_on:
                loss = loss + (p_loss - cfg.entropy_coef * entropy_sum(entropy, mask)) / count
                if ref_logp is not None:
                    now = yes_logprobs(logits)
                    kl = per_decision((now.exp() * (now - ref_logp)).sum(dim=-1))  # exact KL of the two-way choice
                    loss = loss + cfg.kl_coef * entropy_sum(kl, mask) / count
            self.actor_opt.zero_grad()
            self.critic_opt.zero_grad()
            loss.backward()
            if actor_on:
                nn.utils.clip_grad_norm_(policy.lora_parameters(), cfg.max_grad_norm)
                warm = min(1.0, (update - cfg.critic_warmup + 1) / max(1, cfg.lr_warmup))
                for group in self.actor_opt.param_groups:
                    group["lr"] = cfg.lr * warm
                self.actor_opt.step()
            self.critic_opt.step()
            if epoch == cfg.ppo_epochs - 1:
                stats = {"approx_kl": float(p_stats["approx_kl"]), "clip_frac": float(p_stats["clip_frac"]),
                         "value_loss": float(v_loss.detach() / count),
                         "entropy": float(entropy_sum(entropy.detach(), mask) / count)}
        stats.update({f"train_{k}": v for k, v in batch_metrics([batch]).items() if k != "episodes"})
        p_yes = torch.softmax(store["logits"].detach(), dim=-1)[:, 0]
        stats["train_p_yes"] = float(p_yes.mean())
        stats["train_auc"] = auc(p_yes.tolist(), store["u_labels"])
        stats["explained_variance"] = float(explained_variance(old_values, returns, mask))
        return stats


# --------------------------------------------------------------------------- main


def parse_args(argv=None) -> CheckConfig:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(CheckConfig):
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, type=type(f.default), default=f.default, help=f"default: {f.default}")
    return CheckConfig(**vars(parser.parse_args(argv)))


def main(argv=None) -> dict:
    cfg = parse_args(argv)
    wall_start = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    from tqdm import tqdm

    from inference.models import ensure_pad_token, load_causal_lm, load_tokenizer

    timings = {}
    start = time.perf_counter()
    retriever = default_retriever(show_progress=False)
    questions = generate_default_questions(cfg.train_questions + cfg.eval_questions, seed=cfg.question_seed)
    train, held_out = questions[: cfg.train_questions], questions[cfg.train_questions :]
    assert not {q.question for q in train} & {q.question for q in held_out}, "held-out questions overlap training"
    retriever.search([q.question for q in questions], EnvConfig().top_k)  # one batched encode, then cached
    timings["retriever_and_questions_s"] = time.perf_counter() - start

    start = time.perf_counter()
    tokenizer = ensure_pad_token(load_tokenizer(cfg.model))
    lm = load_causal_lm(cfg.model, device="cpu", dtype="float32")
    policy = JudgePolicy(lm, tokenizer, cfg)
    timings["model_load_s"] = time.perf_counter() - start

    env_config = EnvConfig(shuffle_candidates=True)
    episodes = Episodes(retriever, env_config, tokenizer)
    eval_seeds = [cfg.seed * 7919 + 1_000_000 + i for i in range(len(held_out))]
    batch = cfg.batch_questions
    rng = random.Random(cfg.seed)

    reference = {}
    for rule in ("none", "all", "random", "oracle"):
        decide = scripted_decide(rule, random.Random(cfg.seed))
        reference[rule] = batch_metrics([episodes.run(held_out[i : i + batch], eval_seeds[i : i + batch], decide)
                                         for i in range(0, len(held_out), batch)])
    print(f"held-out reference (no model), {len(held_out)} questions:")
    for rule, m in reference.items():
        print(f"  open {rule:6s}: reward={m['reward']:.3f} precision={m['precision']:.3f} em={m['em']:.3f} "
              f"docs_read={m['docs_read']:.2f}")

    start = time.perf_counter()
    zero_shot = evaluate(policy, episodes, held_out, eval_seeds, batch)
    timings["first_eval_s"] = time.perf_counter() - start  # includes the frozen layers of the held-out prompts
    start = time.perf_counter()
    warm = warm_start(policy, episodes, train, cfg)
    policy.freeze_reference()
    timings["warm_start_s"] = time.perf_counter() - start
    start = time.perf_counter()
    start_metrics = evaluate(policy, episodes, held_out, eval_seeds, batch)
    timings["eval_s"] = time.perf_counter() - start
    print(f"zero-shot (before warm start): {_fmt(zero_shot)}")
    print(f"warm start ({cfg.warm_steps} SFT steps on a random teacher): loss {warm['loss_first']:.3f} -> "
          f"{warm['loss_last']:.3f}, P(yes)+P(no) {warm['answer_mass_first']:.3f} -> {warm['answer_mass_last']:.3f}")
    print(f"start of PPO (update 0): {_fmt(start_metrics)}")

    curve = [{"update": 0, **start_metrics}]
    history = []
    ppo = PPO(policy, cfg)
    order: list[int] = []
    start = time.perf_counter()
    bar = tqdm(range(1, cfg.updates + 1), desc="PPO", unit="update", dynamic_ncols=True)
    for update in bar:
        if len(order) < batch:
            order += rng.sample(range(len(train)), len(train))
        chosen, order = order[:batch], order[batch:]
        examples = [train[i] for i in chosen for _ in range(cfg.samples_per_question)]
        seeds = [cfg.seed * 7919 + update * 10_000 + i for i in range(len(examples))]
        stats = ppo.update(update - 1, episodes, examples, seeds)
        history.append({"update": update, **stats})
        bar.set_postfix(reward=f"{stats['train_reward']:.3f}", prec=f"{stats['train_precision']:.2f}",
                        p_yes=f"{stats['train_p_yes']:.2f}", auc=f"{stats['train_auc']:.2f}")
        if update % cfg.eval_every == 0 or update == cfg.updates:
            metrics = evaluate(policy, episodes, held_out, eval_seeds, batch)
            curve.append({"update": update, **metrics})
            tqdm.write(f"update {update:3d} held-out: {_fmt(metrics)}")
    bar.close()
    timings["ppo_s"] = time.perf_counter() - start
    timings["frozen_layers_s"] = policy.bottom_seconds
    timings["wall_s"] = time.perf_counter() - wall_start

    end_metrics = curve[-1]
    ratio = end_metrics["reward"] / start_metrics["reward"] if start_metrics["reward"] > 0 else float("nan")
    gain = end_metrics["precision"] - start_metrics["precision"]
    targets = {"reward_ratio": ratio, "reward_x1.5": bool(start_metrics["reward"] > 0 and ratio >= 1.5),
               "precision_gain": gain, "precision_+0.2": bool(gain >= 0.2)}
    result = {"config": dataclasses.asdict(cfg), "env": dataclasses.asdict(env_config), "reference": reference,
              "zero_shot": zero_shot, "warm_start": warm, "start": start_metrics, "end": end_metrics,
              "curve": curve, "updates": history, "targets": targets, "timings": timings,
              "frozen_layer_tokens": policy.bottom_tokens, "threads": cfg.threads}
    path = write_json_atomic(result, Path(cfg.out) / "result.json")

    print("held-out curve (greedy):")
    for row in curve:
        print(f"  update {row['update']:3d}: reward={row['reward']:.3f} precision={row['precision']:.3f} "
              f"em={row['em']:.3f} docs_read={row['docs_read']:.2f}")
    print(f"reward weights: env defaults ({env_config.reward}); candidates shuffled; {len(train)} training / "
          f"{len(held_out)} held-out questions; wall time {timings['wall_s'] / 60:.1f} min on {cfg.threads} threads")
    print(f"targets: reward x{ratio:.2f} (>= 1.5: {targets['reward_x1.5']}), precision {gain:+.3f} "
          f"(>= +0.2: {targets['precision_+0.2']}); results in {path}")
    print(f"reward_start={start_metrics['reward']:.3f} reward_end={end_metrics['reward']:.3f} "
          f"precision_start={start_metrics['precision']:.3f} precision_end={end_metrics['precision']:.3f}")
    return result


def _fmt(m: dict) -> str:
    return (f"reward={m['reward']:.3f} precision={m['precision']:.3f} em={m['em']:.3f} docs_read={m['docs_read']:.2f} "
            f"open_pos={m['open_rate_positive']:.2f} open_neg={m['open_rate_negative']:.2f} p_yes={m['p_yes_mean']:.2f} "
            f"auc={m['auc']:.2f}")


if __name__ == "__main__":
    main()
