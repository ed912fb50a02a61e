"""SEEDS-R1 PPO, readable top to bottom (CleanRL style; the batch scoring is in :mod:`training.ppo_loop.ppo_score`).

    python -m training.ppo --config configs/ppo/default.yaml            # embedded default, CPU
    accelerate launch training/ppo.py --config configs/ppo/seeds_r1_qwen2.5_7b.yaml --model /models/qwen
    accelerate launch --config_file configs/accelerate/deepspeed_zero2.yaml training/ppo.py --config ...  # ZeRO-2
    python -m training.ppo --config configs/ppo/default.yaml --resume   # continue exactly

Every hyper-parameter lives in :class:`training.config.PPOConfig`. One update:

1. take the next ``questions_per_update`` questions (each process its own shard) and roll out
   ``samples_per_question`` episodes each with the CURRENT actor (``rollout_engine``: the HF
   backend over the live weights, LoRA active, or vLLM with the actor's weights synced in first,
   :mod:`training.rollouts.rollout_engine`), token-in/token-out (:mod:`training.rollouts.rollout`);
2. pad the episodes into (B, T) tensors; every per-token tensor is (B, T−1) and position ``t``
   is about token ``t+1`` (``model_mask[:, t] = loss_mask[t+1]``);
3. with no gradients: old log-probs (trainer's own forward, or the sampler's with ``old_logprobs: sampler``), reference
   log-probs (adapter off / frozen copy; with LoRA from the frozen-layer cache too), values;
4. token rewards: the episode reward on its last model token, −β·KL on model tokens when
   ``kl_mode == "reward"``; advantages and returns from the chosen estimator
   (:mod:`training.algorithm.advantages`: gae, grpo, rloo, reinforce, reinforce_pp, reinforce_pp_baseline), β from
   the KL controller (:mod:`training.algorithm.kl_control`); with ``tis``, the sampler's tokens get importance
   weights toward the trainer's old policy;
5. ``ppo_epochs`` × ``mini_batches`` optimizer steps, each accumulating micro-batches of the
   actor's per-token loss (``policy_loss``'s clipped surrogate − entropy_coef·H [+ β·KL]) aggregated by ``loss_agg``
   over the whole mini-batch on all W processes (``token_mean``: a true token mean), plus
   vf_coef · the critic's token-mean value loss;
   the first ``critic_warmup_updates`` updates train the critic only;
6. log, checkpoint every ``save_every`` updates and at the end; with ``export_update`` the policy
   after that update is exported to ``final_hf`` then (SEEDS reports step 450 of 500), else the last.

The policy is evaluated greedily on held-out questions before and after training. :func:`train`
reads top to bottom: :func:`training.ppo_loop.ppo_setup.set_up` (accelerator, data, warm start, models,
optimizers, rollout backend), the greedy evaluation, then per update :func:`collect` (1),
:func:`training.ppo_loop.ppo_score.score` (2-4), :func:`optimize` (5), :func:`update_stats` and the logs
(6), and :func:`finish`.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `accelerate launch training/ppo.py` runs this file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.runtime.cpu_threads import prefer_passive_openmp_wait  # before torch: see below

prefer_passive_openmp_wait()  # OpenMP reads OMP_WAIT_POLICY when torch loads it

import contextlib

import torch
from tqdm import tqdm

from envs.vector_env import SearchVectorEnv
from training.algorithm.dapo import EXTRA_STREAM_SEED, dynamic_sample, has_verdict_signal, shaped_reward
from training.algorithm.kl_control import current_kl_coef
from training.algorithm.kl_estimators import kl_penalty, kl_token_scope, level_hold_terms
from training.algorithm.kl_stop import approx_kl_sums, exceeds_target_kl, global_kl_sums, kl_summary
from training.algorithm.policy_losses import gspo_loss_terms
from training.algorithm.ppo_core import (
    aggregate_loss,
    explained_variance,
    global_sequence_count,
    global_token_count,
    masked_mean,
    masked_sum,
    policy_loss_terms,
    value_loss,
)
from training.config import AlgorithmSettings, PPOConfig, load_config
from training.evaluation.curves import write_curves_or_warn
from training.evaluation.policy_eval import result_line
from training.evaluation.ppo_report import (
    ROLLOUT_KEYS,
    format_update_stats,
    periodic_evaluation_due,
    periodic_stats,
    report_before_after,
    sampled_verdict_auc,
    write_update_logs,
)
from training.evaluation.selection_profile import selection_verdict
from training.models.checkpoint import export_hf, load_checkpoint, save_checkpoint
from training.models.policy_models import sequence_values
from training.models.prefix_tree import PackedRows, shared_packing
from training.ppo_loop.ppo_batch import micro_batches, mini_batch_rows, pack_micro_batches, select
from training.ppo_loop.ppo_score import prefix_of, score
from training.ppo_loop.ppo_setup import Run, evaluate, evaluate_before, set_up
from training.rollouts.rollout import RolloutConfig, collect_rollouts, rollout_stats
from training.rollouts.rollout_engine import close_rollout_backend, sync_rollout_weights
from training.runtime.distributed import accumulating, backward, optimizer_step, reduce_mean
from training.runtime.inputs import REPO_ROOT, next_questions
from training.warm_start.warm_start_cache import preserved_rng

DEFAULT_RECIPE = REPO_ROOT / "configs" / "ppo" / "default.yaml"


# ============================================================================== the objective


def actor_objective(algorithm: AlgorithmSettings, logp: torch.Tensor, entropy: torch.Tensor,
                    mb: dict[str, torch.Tensor], n_tokens: torch.Tensor, n_sequences: torch.Tensor,
                    kl_coef: float | None = None, *, max_context_tokens: int
                    ) -> tuple[torch.Tensor, float, float, dict]:
    """One micro-batch's share of the actor's loss, aggregated by ``algorithm.loss_agg``
    (:func:`training.algorithm.ppo_core.aggregate_loss`), and the token sums of the policy loss and the entropy.

    Per model token: the clipped surrogate of ``algorithm.policy_loss`` (PPO's per-token ratio, or GSPO's
    sequence ratio) times the importance weight with ``tis``, − entropy_coef·H_t (+ β·KL_t with
    ``kl_mode: loss``, at the tokens of ``kl_tokens``, :func:`~training.algorithm.kl_estimators.kl_token_scope`;
    β = ``kl_coef``, the KL controller's current value, default ``algorithm.kl_coef``; + c·d·(z_t − z_ref,t)
    at verdict tokens with ``verdict_level_coef`` c, :func:`training.algorithm.kl_estimators.level_hold_terms`);
    ``seq_mean_token_sum_norm`` divides by
    ``loss_agg_norm_tokens``, else by ``max_context_tokens`` (the rollout section's). logp, entropy: (B, T).
    """
    mask = mb["model_mask"]
    if algorithm.policy_loss == "gspo":
        surrogate, stats = gspo_loss_terms(logp, mb["old_logp"], mb["advantages"], mask, algorithm.clip_low,
                                           algorithm.clip_high)
    else:
        surrogate, stats = policy_loss_terms(logp, mb["old_logp"], mb["advantages"], mask, algorithm.clip_low,
                                             algorithm.clip_high, algorithm.dual_clip)
    if "is_weight" in mb:
        surrogate = surrogate * mb["is_weight"]
    per_token = surrogate - algorithm.entropy_coef * entropy
    if algorithm.kl_mode == "loss":
        kl = kl_penalty(logp, mb["ref_logp"], algorithm.kl_estimator)
        beta = algorithm.kl_coef if kl_coef is None else kl_coef
        per_token = per_token + beta * kl * kl_token_scope(algorithm.kl_tokens, mb)
    if algorithm.verdict_level_coef > 0:  # the verdicts' shared yes level held at the warm start's
        per_token = per_token + algorithm.verdict_level_coef * level_hold_terms(
            logp, mb["ref_logp"], mb["verdict_opened"], mb["choice_mask"], algorithm.verdict_level_target)
    norm = float(algorithm.loss_agg_norm_tokens or max_context_tokens)
    loss = aggregate_loss(per_token, mask, algorithm.loss_agg, n_tokens, n_sequences, norm)
    return loss, float(masked_sum(surrogate, mask).detach()), float(masked_sum(entropy, mask).detach()), stats


# ============================================================================== one update


def collect(run: Run, questions: list, update: int) -> tuple[list, dict, float]:
    """Sampled episodes of this process's shard of ``questions`` with the current actor ->
    (episodes, DAPO dynamic-sampling stats, weight-sync seconds)."""
    rollout, algorithm, seed = run.rollout, run.algorithm, run.run_settings.seed
    rank, n = run.accelerator.process_index, run.local_questions
    shard = questions[rank * n:(rank + 1) * n]
    venv = SearchVectorEnv(run.retriever,
                           num_envs=min(rollout.num_envs, len(shard) * rollout.samples_per_question),
                           config=run.env_config, tokenizer=run.models.tokenizer)
    rollout_cfg = RolloutConfig(max_turn_tokens=rollout.max_turn_tokens,
                                max_context_tokens=rollout.max_context_tokens,
                                temperature=rollout.temperature, top_p=rollout.top_p,
                                samples_per_question=rollout.samples_per_question,
                                seed=(seed * 100_003 + update) * 1_009 + rank,
                                constrain_verdicts=rollout.constrain_verdicts,
                                # the HF rollout keeps the trainer's frozen-layer states (rollouts/rollout_states.py)
                                record_states_after=run.frozen_depth if rollout.reuse_rollout_states else 0)
    t_sync = sync_rollout_weights(run.backend, run.policy)  # vLLM: the actor's current weights; hf: nothing to do
    episodes = collect_rollouts(run.backend, venv, shard, rollout_cfg, run.prompt_fn,
                                progress="rollout" if run.accelerator.is_local_main_process else None)
    if not algorithm.dynamic_sampling:
        return episodes, {}, t_sync

    def draw(round_: int) -> list:  # DAPO: more questions from the extra stream, to replace equal-reward groups
        assert rollout_cfg.seed is not None  # set above
        position = (update * algorithm.dynamic_sampling_max_rounds + round_ - 1) * rollout.questions_per_update
        extra = next_questions(run.examples, position, rollout.questions_per_update,
                               seed + EXTRA_STREAM_SEED)
        return collect_rollouts(run.backend, venv, extra[rank * n:(rank + 1) * n],
                                dataclasses.replace(rollout_cfg, seed=rollout_cfg.seed + 7_000_003 * round_),
                                run.prompt_fn)

    episodes, sampling_stats = dynamic_sample(
        episodes, draw, n, algorithm.dynamic_sampling_max_rounds,
        reward_of=lambda e: shaped_reward(e, algorithm.overlong_max_tokens, algorithm.overlong_buffer),
        own_signal=has_verdict_signal if algorithm.verdict_credit > 0 else lambda e: False)
    return episodes, sampling_stats, t_sync


def micro_step(run: Run, mb: dict[str, torch.Tensor], n_tokens, n_sequences, last: bool, train_actor: bool,
               sums: dict[str, float], packing: PackedRows | None = None) -> torch.Tensor | None:
    """Forward and backward of one micro-batch (critic's value loss, actor's objective), its sums
    added to ``sums``; returns the actor's log-probs (b, t), or None when only the critic trains.
    ``packing``: the micro-batch as a prefix tree, for the actor's pass (``optim.share_prefixes``)."""
    algorithm, accelerator, m = run.algorithm, run.accelerator, mb["model_mask"]
    W = accelerator.num_processes
    logp = None
    with contextlib.ExitStack() as stack:
        losses = []
        if run.critic is not None:
            stack.enter_context(accumulating(accelerator, run.critic, last))
            new_values = sequence_values(run.critic, mb["input_ids"], mb["attention_mask"])
            v_sum, v_stats = value_loss(new_values, mb["old_values"], mb["returns"], m, algorithm.value_clip)
            losses.append((run.critic, algorithm.vf_coef * v_sum * W / n_tokens))
            sums["value_loss"] += float(v_sum.detach())
            sums["value_clip_frac"] += float(v_stats["clip_frac"]) * float(m.sum())
        if train_actor:
            stack.enter_context(accumulating(accelerator, run.actor, last))
            logp, entropy = run.actor(mb["input_ids"], mb["attention_mask"], target_mask=m, with_entropy=True,
                                      choice_mask=mb["choice_mask"], choice_ids=run.choice_ids, packing=packing,
                                      **prefix_of(run, mb))
            actor_loss, p_sum, h_sum, p_stats = actor_objective(
                algorithm, logp, entropy, mb, n_tokens, n_sequences, current_kl_coef(run),
                max_context_tokens=run.rollout.max_context_tokens)
            losses.append((run.actor, actor_loss * W))
            count = float(m.sum())
            sums["policy_loss"] += p_sum
            sums["entropy"] += h_sum
            sums["clip_frac"] += float(p_stats["clip_frac"]) * count
            sums["approx_kl"] += float(p_stats["approx_kl"]) * count
        backward(accelerator, losses)
    sums["tokens"] += float(m.sum())
    return logp


def optimize(run: Run, batch: dict[str, torch.Tensor], update: int, train_actor: bool) -> dict:
    """``ppo_epochs`` × ``mini_batches`` optimizer steps, accumulating micro-batches; returns the
    loss sums, gradient norms and the sampler-vs-trainer log-prob gap before the first step."""
    optim, accelerator = run.optim, run.accelerator
    mask = batch["model_mask"]
    sums = dict.fromkeys(("policy_loss", "value_loss", "entropy", "clip_frac", "approx_kl", "value_clip_frac",
                          "tokens"), 0.0)
    grad_norms: dict[str, list[float]] = {"actor": [], "critic": []}
    gap = [0.0, 0.0]  # |sampler − trainer| log-prob sum and token count, before the first actor step
    kl_steps, stopped = [], False  # each mini-batch's KL sums (training/algorithm/kl_stop.py: target_kl)
    shuffle = torch.Generator().manual_seed(run.run_settings.seed * 1_000_003 + update)
    lengths = batch["attention_mask"].sum(-1)
    for epoch in range(optim.ppo_epochs):
        minis = mini_batch_rows(batch["group_id"], optim.mini_batches, shuffle, optim.mini_batch_by_group)
        for mini_index, mini in enumerate(minis):
            if stopped:
                break
            mini_kl = torch.zeros(4, device=mask.device)
            mini = mini[lengths[mini].argsort(stable=True)]  # micro-batches of similar lengths: less padding to run
            n_tokens = global_token_count(mask[mini], accelerator)
            n_sequences = global_sequence_count(mask[mini], accelerator)
            if optim.share_prefixes:  # rows in token order, up to micro_batch_tokens packed tokens each
                micro = pack_micro_batches(mini, batch["input_ids"], batch["attention_mask"], optim.micro_batch_tokens)
            else:
                micro = micro_batches(mini, lengths[mini], optim.micro_batch_size, optim.micro_batch_tokens)
            for k, rows in enumerate(micro):
                mb = select(batch, rows)
                packing = shared_packing(mb, optim.micro_batch_tokens) if optim.share_prefixes else None
                logp = micro_step(run, mb, n_tokens, n_sequences, k == len(micro) - 1, train_actor, sums, packing)
                if logp is not None:
                    mini_kl += approx_kl_sums(logp.detach(), mb["old_logp"], mb["model_mask"], mb["choice_mask"])
                if logp is not None and epoch == 0 and mini_index == 0:  # not moved yet: logp = trainer's old
                    gap[0] += float(masked_sum((mb["sampler_logp"] - logp.detach()).abs(), mb["model_mask"]))
                    gap[1] += float(mb["model_mask"].sum())
            for name, model in (("critic", run.critic), ("actor", run.actor if train_actor else None)):
                if model is not None:
                    grad_norms[name].append(optimizer_step(accelerator, model, run.optimizers[name],
                                                           run.schedulers[name], optim.max_grad_norm))
            mini_kl = global_kl_sums(mini_kl, accelerator)
            kl_steps.append(mini_kl)
            stopped = train_actor and exceeds_target_kl(mini_kl, optim.target_kl)  # this step taken, no more
    return {"sums": sums, "grad_norms": grad_norms, "gap": gap, "kl_steps": kl_steps, "kl_stopped": stopped}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def update_stats(run: Run, update: int, episodes: list, batch: dict, extras: dict, trained: dict,
                 train_actor: bool, timings: dict[str, float]) -> dict[str, float]:
    """The update's metrics, averaged over processes: rollout statistics, KL, entropy, clipping,
    losses, critic fit, gradient norms, DAPO/TIS figures and timings (docs/training.md, "Logged every update")."""
    mask, sums, gap, kl_scope = batch["model_mask"], trained["sums"], trained["gap"], extras["kl_scope"]
    tokens = max(sums["tokens"], 1.0)
    actor_mean = (lambda key: sums[key] / tokens) if train_actor else (lambda key: math.nan)
    critic_mean = (lambda key: sums[key] / tokens) if run.critic is not None else (lambda key: math.nan)
    algo = run.algorithm
    with_reference, recompute, tis = algo.kl_coef > 0, algo.old_logprobs == "recompute", extras["tis"]
    stats = {k: v for k, v in rollout_stats(episodes).items() if k in ROLLOUT_KEYS}
    stats.update({
        "kl": float(masked_mean(batch["old_logp"] - batch["ref_logp"], kl_scope)) if with_reference else math.nan,
        "kl_estimate": float(masked_mean(extras["kl_old"], kl_scope)) if with_reference else math.nan,
        "kl_coef": current_kl_coef(run),  # the β of this update (kl_target: the adaptive controller's)
        "entropy": actor_mean("entropy"), "clip_frac": actor_mean("clip_frac"),
        "approx_kl": actor_mean("approx_kl"), "policy_loss": actor_mean("policy_loss"),
        **kl_summary(trained["kl_steps"] if train_actor else []),
        "actor_steps": float(len(trained["grad_norms"]["actor"])), "kl_stopped": float(trained["kl_stopped"]),
        "value_loss": critic_mean("value_loss"), "value_clip_frac": critic_mean("value_clip_frac"),
        "explained_variance": (float(explained_variance(batch["old_values"], batch["returns"], mask))
                               if run.critic is not None else math.nan),
        "sampler_logp_gap": (float(masked_mean((batch["sampler_logp"] - batch["old_logp"]).abs(), mask))
                             if recompute else gap[0] / gap[1] if gap[1] else math.nan),
        "advantage_mean": float(masked_mean(batch["advantages"], mask)),
        "tis_weight_mean": float(tis["weight_mean"]) if tis else math.nan,
        **{f"dynamic_{k}": v for k, v in extras.get("dynamic", {}).items()},
        "overlong_penalty_mean": float(extras["overlong"].mean()) if algo.overlong_buffer > 0 else math.nan,
        "tis_clipped_frac": float(tis["clipped_frac"]) if tis else math.nan,
        "grad_norm_actor": _mean(trained["grad_norms"]["actor"]) if trained["grad_norms"]["actor"] else 0.0,
        "grad_norm_critic": _mean(trained["grad_norms"]["critic"]),
        "lr_actor": run.schedulers["actor"].get_last_lr()[0],
        "tokens_per_s": sum(len(e.token_ids) for e in episodes) / max(timings["update_s"], 1e-9),
        **timings,
        "critic_only": float(not train_actor),
        "reused_states": extras["reused_states"],  # share of rows whose frozen-layer states came from the rollout
        "verdict_price": extras["verdict_price"],  # the batch's price of opening: centring b plus the level hold
        "verdict_open_logit": extras["verdict_open_logit"],  # the sampled verdicts' mean log π(open)/π(skip)
        "verdict_level_shift": extras["verdict_level_shift"],  # δ: the yes level's shift from the warm start
        "verdict_auc": sampled_verdict_auc(episodes, run.models.tokenizer),  # ranking of the sampled verdicts
    })
    stats = reduce_mean(run.accelerator, stats)
    stats.update(update=update + 1, world_size=run.accelerator.num_processes)
    return stats


# ============================================================================== training


def train(cfg: PPOConfig, *, retriever=None, examples: list | None = None, eval_examples: list | None = None,
          models=None, accelerator=None) -> dict[str, Any]:
    """Run PPO as configured. Components may be injected (tests: tiny models, a toy retriever).

    Returns {"update", "data_position", "eval_start", "eval_end", "comparison", "history", "models"}.
    """
    run, cfg, resume_from = set_up(cfg, retriever, examples, eval_examples, models, accelerator)  # cfg: resolved
    accelerator = run.accelerator
    eval_start = outcomes_start = None
    if run.eval_examples:  # the policy PPO starts from: evaluated before a resumed run loads its checkpoint
        eval_start, outcomes_start = evaluate_before(run)
        accelerator.print(f"[ppo] eval before PPO: EM {eval_start['em']:.3f} precision {eval_start['precision']:.3f} "
                          f"reward {eval_start['reward_mean']:.3f} on {len(run.eval_examples)} held-out questions"
                          + (f" (an earlier run's evaluation of the same weights: {eval_start['cached_from']})"
                             if "cached_from" in eval_start else ""))
    start_update, data_position = 0, 0
    if resume_from is not None:
        state = load_checkpoint(resume_from, actor=run.policy, critic=run.value_model, optimizers=run.optimizers,
                                schedulers=run.schedulers, accelerator=accelerator)
        start_update, data_position = state["update"], state["data_position"]
        run.kl_controller.resume(state.get("kl_coef"))  # kl_target: the adapted β, not the initial one
        accelerator.print(f"[ppo] resumed from {resume_from} (update {start_update}, data position {data_position})")

    history = []
    bar = tqdm(range(start_update, cfg.optim.updates), initial=start_update, total=cfg.optim.updates, desc="ppo",
               disable=not accelerator.is_local_main_process)
    for update in bar:
        t0 = time.perf_counter()
        train_actor = update >= cfg.optim.critic_warmup_updates or run.critic is None
        questions = next_questions(run.examples, data_position, cfg.rollout.questions_per_update, cfg.run.seed)
        data_position += cfg.rollout.questions_per_update
        episodes, sampling_stats, t_sync = collect(run, questions, update)
        t_rollout = time.perf_counter() - t0
        batch, extras = score(run, episodes, train_actor)
        trained = optimize(run, batch, update, train_actor)
        timings = {"rollout_s": t_rollout, "weight_sync_s": t_sync, "update_s": time.perf_counter() - t0}
        stats = update_stats(run, update, episodes, batch, {**extras, "dynamic": sampling_stats}, trained,
                             train_actor, timings)
        if run.eval_examples and periodic_evaluation_due(cfg.evaluation.eval_every, cfg.optim.updates, update):
            with preserved_rng():  # the run draws the same numbers whether it evaluates on the way or not
                stats.update(periodic_stats(evaluate(run)[0]))
        history.append(stats)
        # kl_target: β moves toward the target by this update's KL, over its questions × samples episodes
        run.kl_controller.update(stats["kl_estimate"],
                                 cfg.rollout.questions_per_update * cfg.rollout.samples_per_question)
        accelerator.log(stats, step=update + 1)
        if accelerator.is_main_process:
            bar.write(f"update {update + 1}/{cfg.optim.updates}{' (critic only)' if not train_actor else ''} "
                      f"{format_update_stats(stats)}")
            bar.set_postfix_str(format_update_stats({k: stats[k] for k in ("reward_mean", "em", "kl") if k in stats}))
            write_update_logs(run.out, stats, episodes, run.models.tokenizer, cfg.run, accelerator,
                              bar.write)
        if (update + 1) % cfg.run.save_every == 0 or update + 1 == cfg.optim.updates:
            save_checkpoint(run.out, update + 1, actor=run.policy, critic=run.value_model, optimizers=run.optimizers,
                            schedulers=run.schedulers, state={"data_position": data_position, "seed": cfg.run.seed,
                                                              "kl_coef": run.kl_controller.value},
                            keep=cfg.run.keep_checkpoints, accelerator=accelerator)
        if cfg.run.export and cfg.run.export_update == update + 1 and accelerator.is_main_process:
            folder = export_hf(run.policy, run.models.tokenizer, run.out / "final_hf")
            bar.write(f"[ppo] exported the policy after update {update + 1} (export_update) to {folder}")
    bar.close()
    report = finish(run, eval_start, outcomes_start)
    return {"update": max(cfg.optim.updates, start_update), "data_position": data_position, "eval_start": eval_start,
            "eval_end": report["after"] if report else None, "comparison": report["comparison"] if report else None,
            "history": history, "models": run.models}


def finish(run: Run, eval_start: dict | None, outcomes_start: dict | None) -> dict | None:
    """Greedy evaluation after PPO with the paired before/after comparison, the exported policy,
    ``curves.png`` and the machine-readable last line; shuts the rollout backend down."""
    settings, accelerator = run.run_settings, run.accelerator
    report = None
    if run.eval_examples:
        assert eval_start is not None and outcomes_start is not None  # train evaluated before PPO
        eval_end, outcomes_end = evaluate(run)
        report = report_before_after(accelerator, run.out, eval_start, eval_end, outcomes_start, outcomes_end,
                                     settings.seed, questions=[e.question for e in run.eval_examples])
    if settings.export and settings.export_update is None and accelerator.is_main_process:
        folder = export_hf(run.policy, run.models.tokenizer, run.out / "final_hf")
        accelerator.print(f"[ppo] exported the policy to {folder} "
                          f"(python -m inference.evaluate --method.name seeds-r1 --model.name hf:{folder} ...)")
    if accelerator.is_main_process:
        write_curves_or_warn(run.out, log=accelerator.print)
    if report is not None:
        accelerator.print(f"[ppo] {selection_verdict(report['comparison'])}")
        accelerator.print(result_line(report["comparison"]))
    accelerator.wait_for_everyone()
    close_rollout_backend(run.backend)  # vLLM: shut down before end_training destroys the process group it shares
    accelerator.end_training()
    return report


# ============================================================================== command line


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
