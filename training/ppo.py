"""SEEDS-R1 PPO, in one file, readable top to bottom (CleanRL style).

    python -m training.ppo --config configs/ppo/default.yaml            # embedded default, CPU
    accelerate launch training/ppo.py --config configs/ppo/seeds_r1_qwen2.5_7b.yaml --model /models/qwen
    accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml training/ppo.py --config ...  # ZeRO-2
    python -m training.ppo --config configs/ppo/default.yaml --resume   # continue exactly

Every hyper-parameter lives in :class:`training.config.PPOConfig`. One update:

1. take the next ``questions_per_update`` questions (each process its own shard) and roll out
   ``samples_per_question`` episodes each with the CURRENT actor (``rollout_engine``: the HF
   backend over the live weights, LoRA active, or vLLM with the actor's weights synced in first,
   :mod:`training.rollout_engine`), token-in/token-out (:mod:`training.rollout`);
2. pad the episodes into (B, T) tensors; every per-token tensor is (B, T−1) and position ``t``
   is about token ``t+1`` (``model_mask[:, t] = loss_mask[t+1]``);
3. with no gradients: old log-probs (trainer's own forward, or the sampler's with ``old_logprobs: sampler``), reference
   log-probs (adapter off / frozen copy), values;
4. token rewards: the episode reward on its last model token, −β·KL on model tokens when
   ``kl_mode == "reward"``; advantages and returns from the chosen estimator
   (:mod:`training.advantages`: gae, grpo, rloo, reinforce, reinforce_pp); with ``tis``, the sampler's
   tokens get importance weights toward the trainer's old policy;
5. ``ppo_epochs`` × ``mini_batches`` optimizer steps, each accumulating micro-batches of the
   actor's per-token loss (clipped surrogate − entropy_coef·H [+ β·KL]) aggregated by ``loss_agg``
   over the whole mini-batch on all W processes (``token_mean``: a true token mean), plus
   vf_coef · the critic's token-mean value loss;
   the first ``critic_warmup_updates`` updates train the critic only;
6. log, checkpoint every ``save_every`` updates and at the end.

The policy is evaluated greedily on held-out questions before and after training.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import math
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `accelerate launch training/ppo.py` runs this file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.cpu_threads import prefer_passive_openmp_wait, use_all_cores  # before torch: see below

prefer_passive_openmp_wait()  # OpenMP reads OMP_WAIT_POLICY when torch loads it

import torch
import yaml

from training.config import ConfigError, PPOConfig, load_config, save_resolved, to_dict
from training.curves import write_curves_or_warn
from training.policy_eval import result_line
from training.advantages import AdvantageBatch, compute_advantages, two_choice_advantages
from training.dapo import EXTRA_STREAM_SEED, dynamic_sample, overlong_penalty
from training.ppo_core import (
    aggregate_loss,
    explained_variance,
    global_sequence_count,
    global_token_count,
    importance_weights,
    kl_penalty,
    masked_mean,
    masked_sum,
    policy_loss_terms,
    token_level_rewards,
    value_loss,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
# Metrics averaged over processes (rollout_stats keys plus the trainer's).
ROLLOUT_KEYS = ("reward_mean", "reward_std", "em", "f1", "selection_precision", "open_rate_positive",
                "open_rate_negative", "docs_read_per_question", "searches_per_question", "actions_per_question",
                "invalid_per_question", "model_tokens_mean", "episode_tokens_mean", "finish/answer",
                "finish/action_limit", "finish/context_limit", "finish/error")


# ============================================================================== data and environment


def load_env_config(cfg: PPOConfig):
    """EnvConfig from ``cfg.env_config`` (a YAML recipe) with ``cfg.env`` overrides."""
    from envs.config import EnvConfig

    base = EnvConfig()
    if cfg.env_config:
        path = Path(cfg.env_config)
        base = EnvConfig.from_yaml(path if path.is_file() else REPO_ROOT / path)
    values = dataclasses.asdict(base)
    for key, value in cfg.env.items():
        values[key] = {**values[key], **value} if isinstance(value, dict) and isinstance(values.get(key), dict) else value
    return EnvConfig.from_dict(values)


def prompt_fn_for(env_config):
    """The exact SEEDS-R1 prompt, stating the env's own limits."""
    from methods.seeds import SeedsR1

    return SeedsR1(k=env_config.top_k, max_expand=env_config.max_expand, max_searches=env_config.max_searches,
                   max_actions=env_config.max_actions, expand_form=env_config.expand_form).prompt


def load_questions(cfg: PPOConfig) -> tuple[list, list]:
    """(training, held-out evaluation) questions; held-out ones never repeat a training question."""
    if cfg.data:
        from envs.data import load_qa

        everything = load_qa(cfg.data)
        if cfg.eval_data:
            train, held_out = everything, load_qa(cfg.eval_data, limit=cfg.eval_questions or None)
        else:  # hold out the LAST eval_questions of the file
            cut = len(everything) - cfg.eval_questions
            train, held_out = everything[:cut], everything[cut:]
        if cfg.train_questions:
            train = train[:cfg.train_questions]
    else:
        from envs.default_questions import generate_default_questions

        train = generate_default_questions(cfg.train_questions, seed=cfg.question_seed)
        seen = {q.question for q in train}
        extra = generate_default_questions(cfg.eval_questions * 2 + 20, seed=cfg.eval_seed) if cfg.eval_questions else []
        held_out = [q for q in extra if q.question not in seen][:cfg.eval_questions]
    if not train:
        raise ValueError("no training questions")
    return train, held_out[:cfg.eval_questions]


def load_retriever(cfg: PPOConfig):
    from envs.retrieval.defaults import open_retriever

    if cfg.retriever:
        return open_retriever(cfg.retriever)
    return open_retriever(cfg.index, corpus=cfg.corpus)


@lru_cache(maxsize=4)
def _epoch_order(n: int, seed: int) -> tuple[int, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randperm(n, generator=generator).tolist())


def next_questions(examples: list, position: int, count: int, seed: int) -> list:
    """Questions ``position .. position+count−1`` of the endless stream of shuffled passes over
    ``examples`` (pass ``e`` shuffled with seed ``seed + e``): a pure function of the position,
    so a resumed run continues with exactly the questions it would have seen."""
    n = len(examples)
    return [examples[_epoch_order(n, seed + p // n)[p % n]] for p in range(position, position + count)]


# ============================================================================== tensors


def episodes_to_batch(episodes: list, pad_id: int, device: Any) -> dict[str, torch.Tensor]:
    """Right-padded tensors. input_ids/attention_mask (B, T); per-token tensors (B, T−1), where
    position t is about token t+1 (the log-prob at t predicts token t+1); reward/group_id (B,)."""
    width = max(len(e.token_ids) for e in episodes)
    B = len(episodes)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    attention = torch.zeros((B, width), dtype=torch.long)
    loss_mask = torch.zeros((B, width), dtype=torch.float32)
    sampler = torch.zeros((B, width), dtype=torch.float32)
    choice = torch.zeros((B, width), dtype=torch.float32)
    gap = torch.zeros((B, width), dtype=torch.float32)
    for i, e in enumerate(episodes):
        n = len(e.token_ids)
        ids[i, :n] = torch.tensor(e.token_ids)
        attention[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(e.loss_mask, dtype=torch.float32)
        sampler[i, :n] = torch.tensor(e.sampler_logprobs, dtype=torch.float32)
        if e.choice_mask:
            choice[i, :n] = torch.tensor(e.choice_mask, dtype=torch.float32)
        if e.choice_reward_gap:
            gap[i, :n] = torch.tensor(e.choice_reward_gap, dtype=torch.float32)
    batch = {"input_ids": ids, "attention_mask": attention, "model_mask": loss_mask[:, 1:],
             "sampler_logp": sampler[:, 1:], "choice_mask": choice[:, 1:],
             "choice_reward_gap": gap[:, 1:],
             "reward": torch.tensor([e.reward for e in episodes]),
             "group_id": torch.tensor([e.group_id for e in episodes])}
    return {k: v.to(device) for k, v in batch.items()}


def select(batch: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows of a batch, columns cut to the longest selected episode (less padding to run)."""
    width = int(batch["attention_mask"][rows].sum(-1).max())
    out = {}
    for key, value in batch.items():
        value = value[rows]
        if value.dim() == 2:
            value = value[:, :width] if value.shape[1] == batch["input_ids"].shape[1] else value[:, :width - 1]
        out[key] = value
    return out


def put(full: torch.Tensor, rows: torch.Tensor, part: torch.Tensor) -> None:
    full[rows, :part.shape[1]] = part.to(full.dtype)


# ============================================================================== helpers


def reduce_mean(accelerator, stats: dict[str, float]) -> dict[str, float]:
    if accelerator.num_processes == 1:
        return stats
    keys = sorted(stats)
    values = accelerator.reduce(torch.tensor([float(stats[k]) for k in keys], device=accelerator.device), "mean")
    return dict(zip(keys, values.tolist()))


def evaluate_policy(backend, retriever, env_config, examples: list, cfg: PPOConfig, accelerator, prompt_fn,
                    tokenizer=None) -> tuple[dict, dict]:
    """Greedy episodes on held-out questions (each process its shard) -> (rollout_stats averaged
    over processes, per-question outcomes of ALL questions in order, for the paired bootstrap)."""
    from envs.vector_env import SearchVectorEnv
    from training.policy_eval import gather_outcomes, question_outcomes
    from training.rollout import RolloutConfig, collect_rollouts, rollout_stats

    indices = list(range(accelerator.process_index, len(examples), accelerator.num_processes))
    shard = [examples[i] for i in indices]
    stats = {k: 0.0 for k in ROLLOUT_KEYS}
    episodes = []
    if shard:
        venv = SearchVectorEnv(retriever, num_envs=min(cfg.num_envs, len(shard)), config=env_config,
                               tokenizer=tokenizer)
        rollout = RolloutConfig(max_turn_tokens=cfg.max_turn_tokens, max_context_tokens=cfg.max_context_tokens,
                                temperature=0.0, samples_per_question=1, seed=cfg.seed,
                                constrain_verdicts=cfg.constrain_verdicts)
        episodes = collect_rollouts(backend, venv, shard, rollout, prompt_fn,
                                    progress="eval" if accelerator.is_local_main_process else None)
        found = rollout_stats(episodes)
        stats.update({k: found.get(k, 0.0) for k in ROLLOUT_KEYS})
    outcomes = gather_outcomes(accelerator, question_outcomes(episodes), indices, len(examples))
    return reduce_mean(accelerator, stats), outcomes


def verdict_choice_ids(cfg: PPOConfig, env_config, tokenizer, device) -> torch.Tensor | None:
    """(C,) ids of the verdict tokens constrained verdicts choose among, or None (free verdicts)."""
    from envs.protocol import judge_token_ids

    if env_config.expand_form != "judge" or not cfg.constrain_verdicts:
        return None
    return torch.tensor(judge_token_ids(tokenizer), dtype=torch.long, device=device)


def actor_objective(cfg: PPOConfig, logp: torch.Tensor, entropy: torch.Tensor, mb: dict[str, torch.Tensor],
                    n_tokens: torch.Tensor, n_sequences: torch.Tensor) -> tuple[torch.Tensor, float, float, dict]:
    """One micro-batch's share of the actor's loss, aggregated by ``cfg.loss_agg``
    (:func:`training.ppo_core.aggregate_loss`), and the token sums of the policy loss and the entropy.

    Per model token: PPO's clipped surrogate (times the importance weight with ``tis``)
    − entropy_coef·H_t (+ kl_coef·KL_t with ``kl_mode: loss``). logp, entropy: (B, T).
    """
    mask = mb["model_mask"]
    surrogate, stats = policy_loss_terms(logp, mb["old_logp"], mb["advantages"], mask, cfg.clip_low,
                                         cfg.clip_high, cfg.dual_clip)
    if "is_weight" in mb:
        surrogate = surrogate * mb["is_weight"]
    per_token = surrogate - cfg.entropy_coef * entropy
    if cfg.kl_mode == "loss":
        per_token = per_token + cfg.kl_coef * kl_penalty(logp, mb["ref_logp"], cfg.kl_estimator)
    norm = float(cfg.loss_agg_norm_tokens or cfg.max_context_tokens)
    loss = aggregate_loss(per_token, mask, cfg.loss_agg, n_tokens, n_sequences, norm)
    return loss, float(masked_sum(surrogate, mask).detach()), float(masked_sum(entropy, mask).detach()), stats


def set_train_mode(training: bool, *models) -> None:
    for model in models:
        if model is not None:
            model.train(training)


def accelerator_handlers() -> list:
    """The Accelerator's ``kwargs_handlers``, and the environment it needs, for this launch.

    Launched by torchrun on a machine without CUDA, accelerate would start every rank as a lone
    single process (distributed type NO). Asking for CPU makes it join the gloo group. Asking for
    CPU also turns DeepSpeed off, so under DeepSpeed (``ACCELERATE_USE_DEEPSPEED``) the gloo
    backend is named instead: without it accelerate 1.x reports "process 0 of 1" on every rank
    while DeepSpeed trains on all of them."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or torch.cuda.is_available():
        return []
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        from accelerate.utils import InitProcessGroupKwargs

        return [InitProcessGroupKwargs(backend="gloo")]
    os.environ.setdefault("ACCELERATE_USE_CPU", "1")
    return []


def _check_process_count(accelerator) -> None:
    """accelerate and torch.distributed must agree on how many processes train together."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() != accelerator.num_processes:
        raise RuntimeError(f"accelerate sees {accelerator.num_processes} process(es) ({accelerator.distributed_type}) "
                           f"but torch.distributed has {dist.get_world_size()}: every process would train on "
                           "the same data; launch with accelerate's config for this machine")


# ------------------------------------------------------------------------------ DDP or DeepSpeed


def uses_deepspeed(accelerator) -> bool:
    """Prepared models are DeepSpeed engines (one per model), which accumulate, clip and step themselves."""
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.DEEPSPEED


def configure_deepspeed(accelerator, cfg: PPOConfig, episodes_per_process: int) -> None:
    """Set the DeepSpeed config's batch and clipping values from the PPO config before ``prepare``
    (with no dataloader prepared, accelerate cannot fill their "auto"). The trainer cuts its own
    micro-batches and marks the accumulation boundary itself, so these values are bookkeeping for
    DeepSpeed, except ``gradient_clipping``, which each engine applies in its ``step()``."""
    ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
    if ds_config.get("zero_optimization", {}).get("stage", 0) == 3:
        raise ConfigError("ZeRO-3 is not supported by the PPO trainer: rollouts on the HF backend, the "
                          "reference log-probs and the checkpoints need whole parameters on every process; "
                          "use configs/deepspeed/zero2.json (configs/accelerate/deepspeed_zero2.yaml)")
    rows_per_mini_batch = math.ceil(episodes_per_process / cfg.mini_batches)
    settings = {"train_micro_batch_size_per_gpu": cfg.micro_batch_size,
                "gradient_accumulation_steps": math.ceil(rows_per_mini_batch / cfg.micro_batch_size),
                "gradient_clipping": cfg.max_grad_norm}
    for key, value in settings.items():
        if ds_config.get(key, "auto") not in ("auto", value):
            raise ConfigError(f"the DeepSpeed config sets {key} to {ds_config[key]!r}, the PPO config implies "
                              f"{value}: set it to \"auto\"")
        ds_config[key] = value


@contextlib.contextmanager
def accumulating(accelerator, model, last: bool):
    """Around one micro-batch's forward/backward: gradients are all-reduced only on the ``last``
    micro-batch of a mini-batch (DDP: ``no_sync`` before it; DeepSpeed: the engine's boundary)."""
    if uses_deepspeed(accelerator):
        model.set_gradient_accumulation_boundary(last)
        yield
    elif last:
        yield
    else:
        with accelerator.no_sync(model):
            yield


def backward(accelerator, losses: list[tuple[Any, torch.Tensor]]) -> None:
    """Gradients of the summed losses, one (model, loss) pair per trained model. A DeepSpeed engine
    runs the backward of its own loss (the actor's and the critic's graphs are disjoint), without
    dividing it by its accumulation steps: the losses are already means over the whole mini-batch."""
    if uses_deepspeed(accelerator):
        for engine, loss in losses:
            engine.backward(loss, scale_wrt_gas=False)
    else:
        accelerator.backward(sum(loss for _, loss in losses))


def optimizer_step(accelerator, model, optimizer, scheduler, max_grad_norm: float) -> float:
    """Clip, step, advance the learning rate and clear the gradients; returns the gradient norm
    before clipping. A DeepSpeed engine does all but the learning rate in its ``step()``, clipping
    to its ``gradient_clipping`` (= ``max_grad_norm``, :func:`configure_deepspeed`)."""
    if uses_deepspeed(accelerator):
        model.step()
        norm = model.get_global_grad_norm()
    else:
        norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return float(norm)


def resolve_sft_checkpoint(cfg: PPOConfig, retriever=None, examples: list | None = None) -> PPOConfig:
    """No ``sft_checkpoint`` given: run the SFT warm start (``training.sft.warm_start``) first, on
    the training questions (``examples``), never on held-out ones."""
    if cfg.sft_checkpoint or not cfg.sft_warm_start:
        return cfg
    from training import sft

    path = sft.warm_start(cfg, retriever=retriever, examples=examples)
    if path:
        print(f"[ppo] SFT warm start -> {path}", flush=True)
        return dataclasses.replace(cfg, sft_checkpoint=str(path))
    print("[ppo] SFT warm start returned no checkpoint: PPO starts from the base model", flush=True)
    return cfg


SAMPLE_COLUMNS = ("update", "question", "reward", "finish", "text")


def log_sample_table(accelerator, samples: list[dict], step: int) -> None:
    """The update's sample trajectories as a W&B table (``samples``), next to the scalar metrics."""
    import wandb

    tracker = accelerator.get_tracker("wandb", unwrap=True)
    table = wandb.Table(columns=list(SAMPLE_COLUMNS), data=[[s[c] for c in SAMPLE_COLUMNS] for s in samples])
    tracker.log({"samples": table}, step=step)


def _lr_lambda(warmup: int):
    return lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def _fmt(stats: dict[str, float]) -> str:
    names = [("reward_mean", "R", ".3f"), ("em", "EM", ".2f"), ("selection_precision", "selP", ".2f"),
             ("kl", "KL", ".4f"), ("entropy", "H", ".2f"), ("clip_frac", "clip", ".3f"),
             ("value_loss", "VL", ".4f"), ("explained_variance", "EV", ".2f"),
             ("sampler_logp_gap", "|dlogp|", ".4f"), ("tokens_per_s", "tok/s", ".0f")]
    return " ".join(f"{short} {stats[key]:{spec}}" for key, short, spec in names if key in stats)


def report_before_after(accelerator, out: Path, eval_start: dict, eval_end: dict, outcomes_start: dict,
                        outcomes_end: dict, cfg: PPOConfig) -> dict:
    """Print the greedy before/after metrics with paired bootstrap 95% intervals of the
    differences, and write ``eval.json``; returns what was written."""
    from envs.atomic import write_json_atomic
    from training.policy_eval import compare_runs

    comparison = compare_runs(outcomes_start, outcomes_end, seed=cfg.seed)
    n = len(outcomes_start["reward"])
    accelerator.print(f"[ppo] greedy evaluation on {n} held-out questions, before -> after PPO "
                      f"(after − before, paired bootstrap 95% interval):")
    for name, row in comparison.items():
        accelerator.print(f"[ppo]   {name:9s} {row['before']:.3f} -> {row['after']:.3f}  "
                          f"diff {row['diff']:+.3f} [{row['lo']:+.3f}, {row['hi']:+.3f}]")
    accelerator.print(f"[ppo]   documents read per question {eval_start['docs_read_per_question']:.2f} -> "
                      f"{eval_end['docs_read_per_question']:.2f}")
    report = {"before": eval_start, "after": eval_end, "questions": n, "comparison": comparison,
              "per_question": {"before": {k: v.tolist() for k, v in outcomes_start.items()},
                               "after": {k: v.tolist() for k, v in outcomes_end.items()}}}
    if accelerator.is_main_process:
        write_json_atomic(report, out / "eval.json")
    return report


# ============================================================================== training


def train(cfg: PPOConfig, *, retriever=None, examples: list | None = None, eval_examples: list | None = None,
          models=None, accelerator=None) -> dict[str, Any]:
    """Run PPO as configured. Components may be injected (tests: tiny models, a toy retriever).

    Returns {"update", "data_position", "eval_start", "eval_end", "history", "models"}.
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from tqdm import tqdm

    from envs.vector_env import SearchVectorEnv
    from training.checkpoint import export_hf, load_checkpoint, load_latest, save_checkpoint
    from training.models import build_models, sequence_values
    from training.rollout import RolloutConfig, collect_rollouts, rollout_stats
    from training.rollout_engine import build_rollout_backend, close_rollout_backend, sync_rollout_weights

    # ---------------------------------------------------------------- setup
    if accelerator is None:
        if cfg.report_to == "wandb" and not os.environ.get("WANDB_API_KEY"):
            os.environ.setdefault("WANDB_MODE", "offline")
            os.environ.setdefault("WANDB_DIR", cfg.output_dir)
            print(f"[ppo] W&B: no WANDB_API_KEY, logging offline under {cfg.output_dir}/wandb "
                  "(upload later with `wandb sync`)", flush=True)
        accelerator = Accelerator(log_with="wandb" if cfg.report_to == "wandb" else None,
                                  kwargs_handlers=accelerator_handlers())
    _check_process_count(accelerator)
    use_all_cores(accelerator.device)  # accelerate launch exports OMP_NUM_THREADS=1; SEEDS_RL_THREADS=N overrides
    set_seed(cfg.seed)
    out = Path(cfg.output_dir)
    resume_from = load_latest(out) if cfg.resume else None
    if cfg.resume and resume_from is None:
        accelerator.print(f"[ppo] --resume: no checkpoint in {out}; starting from scratch")
    if resume_from is not None and not cfg.sft_checkpoint and (out / "config.yaml").is_file():
        saved = yaml.safe_load((out / "config.yaml").read_text()) or {}
        if saved.get("sft_checkpoint"):  # resume on top of the same SFT policy
            cfg = dataclasses.replace(cfg, sft_checkpoint=saved["sft_checkpoint"])
    retriever = retriever if retriever is not None else load_retriever(cfg)
    if examples is None or eval_examples is None:
        loaded_train, loaded_eval = load_questions(cfg)
        examples = loaded_train if examples is None else examples
        eval_examples = loaded_eval if eval_examples is None else eval_examples
    if models is None:
        cfg = resolve_sft_checkpoint(cfg, retriever, examples)
        models = build_models(cfg, device=str(accelerator.device))
    if accelerator.is_main_process:
        save_resolved(cfg, out)
    tokenizer = models.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    W, rank = accelerator.num_processes, accelerator.process_index
    env_config = load_env_config(cfg)
    prompt_fn = prompt_fn_for(env_config)
    if cfg.questions_per_update % W:
        raise ValueError(f"questions_per_update ({cfg.questions_per_update}) must divide among {W} processes")
    local_questions = cfg.questions_per_update // W
    if local_questions * cfg.samples_per_question < cfg.mini_batches:
        raise ValueError("each process needs at least one episode per mini-batch")

    choice_ids = verdict_choice_ids(cfg, env_config, tokenizer, accelerator.device)
    use_critic = models.critic is not None  # GAE; group baselines (grpo, reinforce) train no critic
    actor_params = [p for p in models.actor.parameters() if p.requires_grad]
    opt_actor = torch.optim.AdamW(actor_params, lr=cfg.lr_actor, weight_decay=cfg.weight_decay)
    sched_actor = torch.optim.lr_scheduler.LambdaLR(opt_actor, _lr_lambda(cfg.warmup_updates))
    optimizers, schedulers = {"actor": opt_actor}, {"actor": sched_actor}
    if use_critic:
        critic_params = [p for p in models.critic.parameters() if p.requires_grad]
        opt_critic = torch.optim.AdamW(critic_params, lr=cfg.lr_critic, weight_decay=cfg.weight_decay)
        sched_critic = torch.optim.lr_scheduler.LambdaLR(opt_critic, _lr_lambda(cfg.warmup_updates))
        optimizers["critic"], schedulers["critic"] = opt_critic, sched_critic
    if uses_deepspeed(accelerator):
        configure_deepspeed(accelerator, cfg, local_questions * cfg.samples_per_question)
    # One prepare per model: under DeepSpeed each becomes its own engine, with its own optimizer and
    # clipping (accelerate takes one model per prepare there, and warns that its `backward` follows
    # the first engine only: the DeepSpeed path calls each engine's backward itself, see `backward`).
    actor, opt_actor = accelerator.prepare(models.actor, opt_actor)
    critic = value_model = None
    if use_critic:
        critic, opt_critic = accelerator.prepare(models.critic, opt_critic)
        value_model = accelerator.unwrap_model(critic)
    optimizers.update(actor=opt_actor, **({"critic": opt_critic} if use_critic else {}))
    policy = accelerator.unwrap_model(actor)  # the live weights, shared by the rollout backend

    start_update, data_position = 0, 0
    if resume_from is not None:
        state = load_checkpoint(resume_from, actor=policy, critic=value_model, optimizers=optimizers,
                                schedulers=schedulers, accelerator=accelerator)
        start_update, data_position = state["update"], state["data_position"]
        accelerator.print(f"[ppo] resumed from {resume_from} (update {start_update}, data position {data_position})")

    # HF over the live weights, or a vLLM engine that gets the actor's weights before every rollout phase
    backend = build_rollout_backend(cfg, policy, tokenizer, accelerator)
    if cfg.report_to == "wandb":
        accelerator.init_trackers(cfg.wandb_project, config=to_dict(cfg))

    eval_start = None
    if eval_examples:
        sync_rollout_weights(backend, policy)
        eval_start, outcomes_start = evaluate_policy(backend, retriever, env_config, eval_examples, cfg, accelerator,
                                                     prompt_fn, tokenizer)
        accelerator.print(f"[ppo] eval before (update {start_update}): EM {eval_start['em']:.3f} "
                          f"selection precision {eval_start['selection_precision']:.3f} "
                          f"reward {eval_start['reward_mean']:.3f} on {len(eval_examples)} held-out questions")

    # ---------------------------------------------------------------- updates
    history = []
    bar = tqdm(range(start_update, cfg.updates), initial=start_update, total=cfg.updates, desc="ppo",
               disable=not accelerator.is_local_main_process)
    for update in bar:
        t0 = time.perf_counter()
        train_actor = update >= cfg.critic_warmup_updates or not use_critic

        # 1. rollouts with the current actor, each process its own shard of the questions
        questions = next_questions(examples, data_position, cfg.questions_per_update, cfg.seed)
        data_position += cfg.questions_per_update
        shard = questions[rank * local_questions:(rank + 1) * local_questions]
        venv = SearchVectorEnv(retriever, num_envs=min(cfg.num_envs, len(shard) * cfg.samples_per_question),
                               config=env_config, tokenizer=tokenizer)
        rollout_cfg = RolloutConfig(max_turn_tokens=cfg.max_turn_tokens, max_context_tokens=cfg.max_context_tokens,
                                    temperature=cfg.temperature, top_p=cfg.top_p,
                                    samples_per_question=cfg.samples_per_question,
                                    seed=(cfg.seed * 100_003 + update) * 1_009 + rank,
                                    constrain_verdicts=cfg.constrain_verdicts)
        t_sync = sync_rollout_weights(backend, policy)  # vLLM: the actor's current weights; hf: nothing to do
        episodes = collect_rollouts(backend, venv, shard, rollout_cfg, prompt_fn,
                                    progress="rollout" if accelerator.is_local_main_process else None)
        sampling_stats = {}
        if cfg.dynamic_sampling:  # DAPO: drop groups with equal rewards, refill from the extra stream
            def draw(round_: int, update: int = update, rollout_cfg: RolloutConfig = rollout_cfg) -> list:
                position = (update * cfg.dynamic_sampling_max_rounds + round_ - 1) * cfg.questions_per_update
                extra = next_questions(examples, position, cfg.questions_per_update, cfg.seed + EXTRA_STREAM_SEED)
                return collect_rollouts(backend, venv, extra[rank * local_questions:(rank + 1) * local_questions],
                                        dataclasses.replace(rollout_cfg, seed=rollout_cfg.seed + 7_000_003 * round_),
                                        prompt_fn)

            episodes, sampling_stats = dynamic_sample(episodes, draw, local_questions,
                                                      cfg.dynamic_sampling_max_rounds)
        t_rollout = time.perf_counter() - t0

        # 2. tensors: (B, T) ids, (B, T-1) per-token quantities aligned with next-token log-probs
        batch = episodes_to_batch(episodes, pad_id, accelerator.device)
        B = batch["input_ids"].shape[0]
        mask = batch["model_mask"]
        overlong = torch.zeros_like(batch["reward"])
        if cfg.overlong_buffer > 0:  # DAPO: a soft penalty on episodes near or past overlong_max_tokens
            overlong = overlong_penalty(mask.sum(dim=1), cfg.overlong_max_tokens, cfg.overlong_buffer)
            batch["reward"] = batch["reward"] + overlong.to(batch["reward"].dtype)
        all_rows = torch.arange(B, device=accelerator.device)

        # 3. old log-probs (the trainer's recomputation, or the sampler's), reference log-probs and
        #    values, no gradients
        recompute = cfg.old_logprobs == "recompute"
        old_logp = torch.zeros_like(mask) if recompute else batch["sampler_logp"] * mask
        # kl_coef 0: no KL term, so no reference pass (one forward fewer; KL is then not logged)
        with_reference = cfg.kl_coef > 0
        ref_logp, values = torch.zeros_like(mask), torch.zeros_like(mask)
        set_train_mode(False, actor, critic)
        with torch.no_grad():
            for rows in all_rows.split(cfg.micro_batch_size):
                mb = select(batch, rows)
                choices = {"choice_mask": mb["choice_mask"], "choice_ids": choice_ids}
                if recompute:
                    put(old_logp, rows, actor(mb["input_ids"], mb["attention_mask"], target_mask=mb["model_mask"],
                                              **choices)[0])
                if with_reference:
                    put(ref_logp, rows, models.reference_logprobs(mb["input_ids"], mb["attention_mask"],
                                                                  mb["model_mask"], **choices))
                if use_critic:
                    put(values, rows, sequence_values(critic, mb["input_ids"], mb["attention_mask"]))
        set_train_mode(True, actor, critic)
        values = values * mask

        # 4. token rewards and advantages
        kl_old = kl_penalty(old_logp, ref_logp, cfg.kl_estimator) * mask if with_reference else torch.zeros_like(mask)
        token_rewards = token_level_rewards(batch["reward"], mask, kl_old if cfg.kl_mode == "reward" else None,
                                            cfg.kl_coef)
        advantages, returns = compute_advantages(cfg.advantage, AdvantageBatch(
            model_mask=mask, token_rewards=token_rewards, values=values, scores=batch["reward"],
            group_ids=batch["group_id"], gamma=cfg.gamma, lam=cfg.lam, std_normalize=cfg.grpo_std_normalize,
            accelerator=accelerator))
        if cfg.verdict_credit > 0:  # each verdict's own candidate term, on top of the episode's advantage
            advantages = advantages + cfg.verdict_credit * two_choice_advantages(
                old_logp, batch["choice_reward_gap"], batch["choice_mask"] * mask, accelerator)
        batch.update(old_logp=old_logp, ref_logp=ref_logp, old_values=values, advantages=advantages,
                     returns=returns)
        tis_stats = {}
        if cfg.tis != "none":  # the sampler's tokens reweighted toward the trainer's old policy
            batch["is_weight"], tis_stats = importance_weights(old_logp, batch["sampler_logp"], mask, cfg.tis,
                                                               cfg.tis_mode, cfg.tis_cap, cfg.tis_low)

        # 5. PPO epochs x mini-batches, gradient accumulation over micro-batches
        sums = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "clip_frac": 0.0, "approx_kl": 0.0,
                "value_clip_frac": 0.0, "tokens": 0.0}
        grad_norms = {"actor": [], "critic": []}
        gap = [0.0, 0.0]  # |sampler - trainer| log-prob sum and token count, before the first actor step
        shuffle = torch.Generator().manual_seed(cfg.seed * 1_000_003 + update)
        for epoch in range(cfg.ppo_epochs):
            order = torch.randperm(B, generator=shuffle).to(accelerator.device)
            for mini_index, mini in enumerate(order.tensor_split(cfg.mini_batches)):
                n_tokens = global_token_count(mask[mini], accelerator)
                n_sequences = global_sequence_count(mask[mini], accelerator)
                micro = mini.split(cfg.micro_batch_size)
                for k, rows in enumerate(micro):
                    mb = select(batch, rows)
                    m = mb["model_mask"]
                    last = k == len(micro) - 1  # only the last micro-batch all-reduces gradients
                    with contextlib.ExitStack() as stack:
                        losses = []
                        if use_critic:
                            stack.enter_context(accumulating(accelerator, critic, last))
                            new_values = sequence_values(critic, mb["input_ids"], mb["attention_mask"])
                            v_sum, v_stats = value_loss(new_values, mb["old_values"], mb["returns"], m,
                                                        cfg.value_clip)
                            losses.append((critic, cfg.vf_coef * v_sum * W / n_tokens))
                        if train_actor:
                            stack.enter_context(accumulating(accelerator, actor, last))
                            logp, entropy = actor(mb["input_ids"], mb["attention_mask"], target_mask=m,
                                                  with_entropy=True, choice_mask=mb["choice_mask"],
                                                  choice_ids=choice_ids)
                            actor_loss, p_sum, h_sum, p_stats = actor_objective(cfg, logp, entropy, mb, n_tokens,
                                                                                n_sequences)
                            if epoch == 0 and mini_index == 0:  # the actor has not moved yet: logp = trainer's old
                                gap[0] += float(masked_sum((mb["sampler_logp"] - logp.detach()).abs(), m))
                                gap[1] += float(m.sum())
                            losses.append((actor, actor_loss * W))
                        backward(accelerator, losses)
                    count = float(m.sum())
                    sums["tokens"] += count
                    if use_critic:
                        sums["value_loss"] += float(v_sum.detach())
                        sums["value_clip_frac"] += float(v_stats["clip_frac"]) * count
                    if train_actor:
                        sums["policy_loss"] += p_sum
                        sums["entropy"] += h_sum
                        sums["clip_frac"] += float(p_stats["clip_frac"]) * count
                        sums["approx_kl"] += float(p_stats["approx_kl"]) * count
                if use_critic:
                    grad_norms["critic"].append(optimizer_step(accelerator, critic, opt_critic, sched_critic,
                                                               cfg.max_grad_norm))
                if train_actor:
                    grad_norms["actor"].append(optimizer_step(accelerator, actor, opt_actor, sched_actor,
                                                              cfg.max_grad_norm))
        elapsed = time.perf_counter() - t0

        # 6. logging
        tokens = max(sums["tokens"], 1.0)
        stats = {k: v for k, v in rollout_stats(episodes).items() if k in ROLLOUT_KEYS}
        stats.update({
            "kl": float(masked_mean(old_logp - ref_logp, mask)) if with_reference else math.nan,
            "kl_estimate": float(masked_mean(kl_old, mask)) if with_reference else math.nan,
            "entropy": sums["entropy"] / tokens if train_actor else math.nan,
            "clip_frac": sums["clip_frac"] / tokens if train_actor else math.nan,
            "approx_kl": sums["approx_kl"] / tokens if train_actor else math.nan,
            "policy_loss": sums["policy_loss"] / tokens if train_actor else math.nan,
            "value_loss": sums["value_loss"] / tokens if use_critic else math.nan,
            "value_clip_frac": sums["value_clip_frac"] / tokens if use_critic else math.nan,
            "explained_variance": float(explained_variance(values, returns, mask)) if use_critic else math.nan,
            "sampler_logp_gap": (float(masked_mean((batch["sampler_logp"] - old_logp).abs(), mask)) if recompute
                                 else gap[0] / gap[1] if gap[1] else math.nan),
            "advantage_mean": float(masked_mean(advantages, mask)),
            "tis_weight_mean": float(tis_stats["weight_mean"]) if tis_stats else math.nan,
            **{f"dynamic_{k}": v for k, v in sampling_stats.items()},
            "overlong_penalty_mean": float(overlong.mean()) if cfg.overlong_buffer > 0 else math.nan,
            "tis_clipped_frac": float(tis_stats["clipped_frac"]) if tis_stats else math.nan,
            "grad_norm_actor": sum(grad_norms["actor"]) / len(grad_norms["actor"]) if grad_norms["actor"] else 0.0,
            "grad_norm_critic": (sum(grad_norms["critic"]) / len(grad_norms["critic"]) if grad_norms["critic"]
                                 else math.nan),
            "lr_actor": sched_actor.get_last_lr()[0],
            "tokens_per_s": sum(len(e.token_ids) for e in episodes) / max(elapsed, 1e-9),
            "rollout_s": t_rollout,
            "weight_sync_s": t_sync,
            "update_s": elapsed,
            "critic_only": float(not train_actor),
        })
        stats = reduce_mean(accelerator, stats)
        stats["update"] = update + 1
        stats["world_size"] = W
        history.append(stats)
        accelerator.log(stats, step=update + 1)
        if accelerator.is_main_process:
            line = f"update {update + 1}/{cfg.updates}{' (critic only)' if not train_actor else ''} {_fmt(stats)}"
            bar.write(line)
            bar.set_postfix_str(_fmt({k: stats[k] for k in ("reward_mean", "em", "kl") if k in stats}))
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "metrics.jsonl", "a", encoding="utf-8") as handle:
                handle.write(json.dumps(stats) + "\n")
            samples = []
            with open(out / "samples.jsonl", "a", encoding="utf-8") as handle:
                for e in episodes[:cfg.log_samples]:
                    completion = tokenizer.decode(e.token_ids[e.prompt_length:], skip_special_tokens=False)
                    sample = {"update": update + 1, "question": e.example_id, "reward": e.reward,
                              "finish": e.finish_reason, "text": completion}
                    samples.append(sample)
                    handle.write(json.dumps(sample) + "\n")
                    bar.write(f"  sample [{e.example_id}] reward {e.reward:.2f} ({e.finish_reason}): "
                              f"{completion[-400:]!r}")
            if cfg.report_to == "wandb" and samples:
                log_sample_table(accelerator, samples, step=update + 1)

        # 7. checkpoint
        done = update + 1
        if done % cfg.save_every == 0 or done == cfg.updates:
            save_checkpoint(out, done, actor=policy, critic=value_model, optimizers=optimizers,
                            schedulers=schedulers, state={"data_position": data_position, "seed": cfg.seed},
                            keep=cfg.keep_checkpoints, accelerator=accelerator)
    bar.close()

    # ---------------------------------------------------------------- the end
    eval_end = report = None
    if eval_examples:
        sync_rollout_weights(backend, policy)
        eval_end, outcomes_end = evaluate_policy(backend, retriever, env_config, eval_examples, cfg, accelerator,
                                                 prompt_fn, tokenizer)
        report = report_before_after(accelerator, out, eval_start, eval_end, outcomes_start, outcomes_end, cfg)
    if cfg.export and accelerator.is_main_process:
        folder = export_hf(policy, tokenizer, out / "final_hf")
        accelerator.print(f"[ppo] exported the policy to {folder} "
                          f"(python -m inference.evaluate --method seeds-r1 --llm hf:{folder} ...)")
    if accelerator.is_main_process:
        write_curves_or_warn(out, log=accelerator.print)
    if report is not None:
        accelerator.print(result_line(report["comparison"]))
    accelerator.wait_for_everyone()
    close_rollout_backend(backend)  # vLLM: shut down before end_training destroys the process group it shares
    accelerator.end_training()
    return {"update": max(cfg.updates, start_update), "data_position": data_position, "eval_start": eval_start,
            "eval_end": eval_end, "comparison": report["comparison"] if report else None, "history": history, "models": models}


DEFAULT_RECIPE = REPO_ROOT / "configs" / "ppo" / "default.yaml"


def resolve_argv(argv: list[str]) -> list[str]:
    """Without ``--config`` the embedded-default recipe (``configs/ppo/default.yaml``) is used, so
    ``accelerate launch training/ppo.py`` alone runs the CPU default; ``--config none`` starts from
    the bare dataclass defaults instead."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        value = arg.partition("=")[2] if arg.startswith("--config=") else (
            argv[i + 1] if arg == "--config" and i + 1 < len(argv) else None)
        if value is not None:
            if value.lower() in ("none", "null"):
                return argv[:i] + argv[i + (1 if "=" in arg else 2):]
            return argv
    return ["--config", str(DEFAULT_RECIPE), *argv]


def main(argv: list[str] | None = None) -> int:
    cfg = load_config(PPOConfig, resolve_argv(sys.argv[1:] if argv is None else argv))
    train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
