"""Setting up a PPO run: the accelerator, seeds, resume point, SFT warm start, models,
optimizers (one ``accelerator.prepare`` per model) and the rollout backend, gathered in a
:class:`Run` that every phase of the update loop (:mod:`training.ppo`) reads. The whole config
stops here: a :class:`Run` holds the sections the phases read."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import yaml
from accelerate.utils import broadcast_object_list, set_seed

from envs.config import EnvConfig
from envs.protocol import judge_token_ids
from training import sft
from training.algorithm.kl_control import build_kl_controller
from training.config import (
    AlgorithmSettings,
    ModelSettings,
    OptimSettings,
    PPOConfig,
    RolloutSettings,
    RunSettings,
    save_resolved,
    to_dict,
    upgrade,
    with_values,
)
from training.evaluation.ppo_report import evaluate_policy
from training.models.checkpoint import load_latest
from training.models.compiled_layers import compile_trained_layers
from training.models.frozen_prefix import frozen_depth
from training.models.policy_models import build_models, uses_critic
from training.rollouts.rollout_engine import build_rollout_backend, sync_rollout_weights
from training.runtime.cpu_threads import use_all_cores
from training.runtime.distributed import check_process_count, configure_deepspeed, make_accelerator, uses_deepspeed
from training.runtime.inputs import load_retriever, load_train_and_held_out
from training.teachers.trajectories import seeds_r1_prompt_fn
from training.warm_start import warm_start_cache


def verdict_choice_ids(rollout: RolloutSettings, algorithm: AlgorithmSettings, env_config, tokenizer,
                       device) -> torch.Tensor | None:
    """(C,) ids of the verdict tokens constrained verdicts choose among, or None (free verdicts)."""
    if not env_config.judge_form.judged or not rollout.constrain_verdicts:
        if algorithm.kl_estimator == "exact":
            raise ValueError("kl_estimator exact is the KL of the two-way constrained verdicts: it needs the "
                             "judgement form (env expand_form: judge) with constrain_verdicts: true")
        reads_open_logits = {"verdict_credit_centred": algorithm.verdict_credit_centred,
                             "verdict_level_gain": algorithm.verdict_level_gain > 0,
                             "verdict_level_coef": algorithm.verdict_level_coef > 0,
                             "kl_verdict_level free": algorithm.kl_verdict_level == "free"}
        if any(reads_open_logits.values()):
            raise ValueError(f"{[k for k, on in reads_open_logits.items() if on]} read the two-way verdicts' "
                             "open logits: they need the judgement form (env expand_form: judge) with "
                             "constrain_verdicts: true")
        return None
    ids = judge_token_ids(tokenizer)
    if algorithm.kl_estimator == "exact" and len(ids) != 2:
        raise ValueError(f"kl_estimator exact needs two verdict choices, not {len(ids)}")
    return torch.tensor(ids, dtype=torch.long, device=device)


def check_judge_context(algorithm: AlgorithmSettings, env_config: EnvConfig, verdict_cut: str = "level") -> None:
    """Verdicts judged alone are rows of their own in the batch, with no value to learn: they need
    a critic-free estimator, whose per-episode advantage each of them takes. A greedy ``verdict_cut`` other
    than the level compares a snapshot's verdicts, which only verdicts judged alone are drawn together for."""
    if verdict_cut != "level" and not env_config.judge_form.alone:
        raise ValueError(f"evaluation.verdict_cut {verdict_cut!r} needs the judgement form judged alone "
                         f"(env expand_form: judge, judge_context: alone)")
    if env_config.judge_form.alone and uses_critic(algorithm):
        raise ValueError(f"judge_context alone needs a critic-free estimator (grpo, rloo, reinforce, reinforce_pp, "
                         f"reinforce_pp_baseline), not advantage {algorithm.advantage!r}: its verdict rows take "
                         f"their episode's advantage")


def _lr_lambda(warmup: int):
    return lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0



@dataclasses.dataclass
class Run:
    """Everything :func:`train` sets up once and every update reads: the config's sections the phases
    read (not the whole config), the accelerator, data, models, optimizers and the rollout backend."""

    model: ModelSettings
    rollout: RolloutSettings
    optim: OptimSettings
    algorithm: AlgorithmSettings
    run_settings: RunSettings  # the config's `run` section: seed, run folder, export, logging
    accelerator: Any
    out: Path
    retriever: Any
    examples: list
    eval_examples: list
    models: Any
    env_config: EnvConfig
    prompt_fn: Any
    local_questions: int  # questions per update on this process
    choice_ids: torch.Tensor | None  # the verdict tokens constrained verdicts choose among
    actor: Any = None  # prepared (DDP / DeepSpeed engine)
    critic: Any = None
    policy: Any = None  # the actor's live, unwrapped weights (the rollout backend's)
    value_model: Any = None
    optimizers: dict = dataclasses.field(default_factory=dict)
    schedulers: dict = dataclasses.field(default_factory=dict)
    backend: Any = None
    frozen_depth: int = 0  # cache_frozen_layers: the actor's bottom layers run once per update
    initial_weights: str | None = None  # the folder the actor was built from (the SFT checkpoint), if any
    kl_controller: Any = None  # β of the KL penalty, fixed or adaptive (algorithm/kl_control.py: current_kl_coef)
    # warm_start.cache: the resolved config as plain dicts, which keys the cached evaluation before PPO; None: no cache
    cached_eval_settings: dict | None = None
    verdict_cut: str = "level"  # evaluation.verdict_cut: how the greedy evaluations open from the verdicts

    @property
    def pad_id(self) -> int:
        return self.models.tokenizer.pad_token_id if self.models.tokenizer.pad_token_id is not None else 0


def resume_point(settings: RunSettings, model: ModelSettings) -> tuple[str | None, Path | None]:
    """With ``--resume`` (the ``run`` section, ``settings``): the SFT policy the interrupted run started
    from, where ``model.sft_checkpoint`` names none (else None), and the latest checkpoint."""
    out = Path(settings.output_dir)
    resume_from = load_latest(out) if settings.resume else None
    if settings.resume and resume_from is None:
        print(f"[ppo] --resume: no checkpoint in {out}; starting from scratch", flush=True)
    if resume_from is not None and not model.sft_checkpoint and (out / "config.yaml").is_file():
        saved = upgrade(PPOConfig, yaml.safe_load((out / "config.yaml").read_text()) or {})  # old run folders too
        return (saved.get("model") or {}).get("sft_checkpoint") or None, resume_from  # the same SFT policy
    return None, resume_from


def resolve_sft_checkpoint(cfg: PPOConfig, retriever=None, examples: list | None = None) -> PPOConfig:
    """No ``sft_checkpoint`` given: run the SFT warm start (``training.sft.warm_start``) first, on
    the training questions (``examples``), never on held-out ones."""
    if cfg.model.sft_checkpoint or not cfg.warm_start.enabled:
        return cfg
    with warm_start_cache.preserved_rng():  # the run goes on the same whether it trained or reused its warm start
        path = sft.warm_start(cfg, retriever=retriever, examples=examples)
    if path:
        print(f"[ppo] SFT warm start -> {path}", flush=True)
        return with_values(cfg, {"model.sft_checkpoint": str(path)})
    print("[ppo] SFT warm start returned no checkpoint: PPO starts from the base model", flush=True)
    return cfg


def prepare_optimization(run: Run) -> None:
    """AdamW + warm-up schedule per trained model, then one ``accelerator.prepare`` per model:
    under DeepSpeed each becomes its own engine, with its own optimizer and clipping (accelerate
    takes one model per prepare there; the DeepSpeed path calls each engine's backward itself)."""
    optim, accelerator, models = run.optim, run.accelerator, run.models
    trained = {"actor": (models.actor, optim.lr_actor)}
    if models.critic is not None:
        trained["critic"] = (models.critic, optim.lr_critic)
    if uses_deepspeed(accelerator):
        configure_deepspeed(accelerator, optim, run.local_questions * run.rollout.samples_per_question)
    for name, (model, lr) in trained.items():
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                                      weight_decay=optim.weight_decay)
        run.schedulers[name] = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(optim.warmup_updates))
        prepared, run.optimizers[name] = accelerator.prepare(model, optimizer)
        setattr(run, name, prepared)
    run.policy = accelerator.unwrap_model(run.actor)
    run.frozen_depth = frozen_depth(run.policy.lm) if run.model.cache_frozen_layers else 0
    if run.model.cache_frozen_layers and not run.frozen_depth and accelerator.is_main_process:
        print("[ppo] cache_frozen_layers: no frozen layers below the trainable ones (set lora.top_layers); "
              "nothing is cached", flush=True)
    if run.model.compile_trained_layers:
        compiled = compile_trained_layers(run.policy.lm)
        if accelerator.is_main_process:
            print(f"[ppo] compile_trained_layers: decoder layers {compiled} compile on the first pass", flush=True)
    run.value_model = accelerator.unwrap_model(run.critic) if run.critic is not None else None


def set_up(cfg: PPOConfig, retriever, examples, eval_examples, models, accelerator
           ) -> tuple[Run, PPOConfig, Path | None]:
    """The accelerator, seeds, data, models (after the SFT warm start), optimizers and the rollout backend
    -> (the run, the resolved config: resume point and warm start filled in, the checkpoint to resume from)."""
    accelerator = accelerator or make_accelerator(cfg.run.report_to, cfg.run.output_dir)
    check_process_count(accelerator)
    use_all_cores(accelerator.device)  # accelerate launch exports OMP_NUM_THREADS=1; SEEDS_RL_THREADS=N overrides
    set_seed(cfg.run.seed)
    sft_checkpoint, resume_from = resume_point(cfg.run, cfg.model)
    if sft_checkpoint:  # resume on top of the same SFT policy
        cfg = with_values(cfg, {"model.sft_checkpoint": sft_checkpoint})
    check_judge_context(cfg.algorithm, cfg.env, cfg.evaluation.verdict_cut)
    retriever = retriever if retriever is not None else load_retriever(cfg.data)
    if examples is None or eval_examples is None:
        loaded_train, loaded_eval = load_train_and_held_out(cfg.data, cfg.evaluation)
        examples = loaded_train if examples is None else examples
        eval_examples = loaded_eval if eval_examples is None else eval_examples
    initial_weights = None
    if models is None:
        cfg = resolve_sft_checkpoint(cfg, retriever, examples)
        models = build_models(cfg.model, cfg.algorithm, cfg.rollout, device=str(accelerator.device))
        checkpoint = cfg.model.sft_checkpoint
        initial_weights = checkpoint if checkpoint and Path(checkpoint).is_dir() else None
    out = Path(cfg.run.output_dir)
    if accelerator.is_main_process:
        save_resolved(cfg, out)
    W = accelerator.num_processes
    if cfg.rollout.questions_per_update % W:
        raise ValueError(f"questions_per_update ({cfg.rollout.questions_per_update}) must divide among {W} processes")
    if cfg.rollout.questions_per_update // W * cfg.rollout.samples_per_question < cfg.optim.mini_batches:
        raise ValueError("each process needs at least one episode per mini-batch")
    env_config = cfg.env
    run = Run(model=cfg.model, rollout=cfg.rollout, optim=cfg.optim, algorithm=cfg.algorithm, run_settings=cfg.run,
              accelerator=accelerator, out=out, retriever=retriever, examples=examples,
              eval_examples=eval_examples, models=models, env_config=env_config,
              prompt_fn=seeds_r1_prompt_fn(env_config), local_questions=cfg.rollout.questions_per_update // W,
              choice_ids=verdict_choice_ids(cfg.rollout, cfg.algorithm, env_config, models.tokenizer,
                                            accelerator.device),
              initial_weights=initial_weights, kl_controller=build_kl_controller(cfg.algorithm),
              cached_eval_settings=to_dict(cfg) if cfg.warm_start.cache else None,
              verdict_cut=cfg.evaluation.verdict_cut)
    prepare_optimization(run)
    # HF over the live weights, or a vLLM engine that gets the actor's weights before every rollout phase
    run.backend = build_rollout_backend(cfg.rollout, cfg.model, run.policy, models.tokenizer, accelerator,
                                        seed=cfg.run.seed)
    if cfg.run.report_to == "wandb":
        accelerator.init_trackers(cfg.run.wandb_project, config=to_dict(cfg))
    return run, cfg, resume_from


def evaluate(run: Run) -> tuple[dict, dict]:
    """Greedy episodes of the current policy on the held-out questions."""
    sync_rollout_weights(run.backend, run.policy)
    return evaluate_policy(run.backend, run.retriever, run.env_config, run.eval_examples, run.rollout,
                           run.run_settings.seed, run.accelerator, run.prompt_fn, run.models.tokenizer,
                           verdict_cut=run.verdict_cut)


def evaluate_before(run: Run) -> tuple[dict, dict]:
    """The greedy evaluation before PPO, of the policy as built (the warm start; a resumed run calls
    this before loading its checkpoint). With ``warm_start.cache``, where the actor was built from a
    checkpoint folder: the evaluation an earlier run (or this one before it was interrupted) made of the
    same weights under the same settings (:func:`training.warm_start.warm_start_cache.evaluation_key`; its
    stats name the entry as ``cached_from``), or this one, kept for later runs. The main process's answer
    holds for all."""
    settings, key, cached = run.cached_eval_settings, None, None
    if settings is not None and run.initial_weights and warm_start_cache.usable():
        if run.accelerator.is_main_process:
            key = warm_start_cache.evaluation_key(settings, run.env_config, run.initial_weights, run.eval_examples,
                                                 run.retriever)
            cached = warm_start_cache.load_evaluation(key, len(run.eval_examples))
        if run.accelerator.num_processes > 1:
            cached = broadcast_object_list([cached])[0]
    if cached is not None:
        return cached
    with warm_start_cache.preserved_rng():  # PPO draws the same numbers whether this ran or was reused
        stats, outcomes = evaluate(run)
    if key is not None:
        warm_start_cache.store_evaluation(key, stats, outcomes)
    return stats, outcomes

