"""Every hyper-parameter of the SEEDS-R1 PPO trainer, named once, in one tree of sections.

    python -m training.ppo --config configs/ppo/default.yaml --optim.updates 2 --model.lora.r 8

:class:`PPOConfig` is the root: ``model``, ``data``, ``env_config`` + ``env`` (the real
:class:`envs.config.EnvConfig`), ``rollout``, ``optim``, ``algorithm``, ``warm_start``,
``evaluation`` and ``run``, each a dataclass of :mod:`training.config_sections` (``warm_start``:
:class:`training.sft_sections.WarmStartSettings`, which holds the SFT config's own ``teacher``, ``train``
and ``dev`` sections). Recipes and overrides are read by the project's one
loader, :mod:`envs.typed_config` (``load_config(PPOConfig, argv)``; its names are re-exported here),
with one syntax, ``--section.field value``. The flat names of earlier recipes, run folders and
command lines (``--updates 10``) are still read, through :data:`OLD_FLAT_KEYS`, with one
deprecation line.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envs.config import EnvConfig
from envs.typed_config import (  # noqa: F401  (re-exported: the loader every entry point uses)
    OVERRIDES,
    RECIPE,
    ConfigError,
    deprecated,
    from_dict,
    help_text,
    load_config,
    move_old_keys,
    parse_overrides,
    read_recipe,
    recipe_values,
    save_resolved,
    to_dict,
    upgrade,
    with_values,
)
from training.config_sections import (  # noqa: F401  (re-exported)
    ANSWER_CREDITS,
    OUTCOME_ESTIMATORS,
    POLICY_LOSSES,
    VLLM_DTYPES,
    AlgorithmSettings,
    DataSettings,
    EvalSettings,
    LoraSettings,
    ModelSettings,
    OptimSettings,
    RolloutSettings,
    RunSettings,
    VLLMSettings,
    check_env_overrides,
    nest_flat_lora_keys,
)
from training.sft_sections import WarmStartSettings

DEFAULT_ENV_RECIPE = "configs/env/seeds_r1.yaml"


def default_env() -> EnvConfig:
    """The env of :data:`DEFAULT_ENV_RECIPE` (what ``PPOConfig()`` holds, as a loaded config would)."""
    return EnvConfig.from_dict(recipe_values(EnvConfig, DEFAULT_ENV_RECIPE))


@dataclass
class PPOConfig:
    model: ModelSettings = field(default_factory=ModelSettings)  # the policy: base model, precision, LoRA, SFT start
    data: DataSettings = field(default_factory=DataSettings)  # the training questions and the retriever
    # YAML recipe the `env` section starts from (configs/env/; its keys under env's): EnvConfig defaults <
    # this recipe < `env:` keys of the PPO recipe < --env.<key> overrides. None: EnvConfig() defaults
    env_config: str | None = DEFAULT_ENV_RECIPE
    env: EnvConfig = field(  # the search environment (EnvConfig), resolved: the env_config recipe and these keys
        default_factory=default_env, metadata={RECIPE: "env_config"})
    rollout: RolloutSettings = field(default_factory=RolloutSettings)  # sampling the episodes
    optim: OptimSettings = field(default_factory=OptimSettings)  # updates, epochs, batches, learning rates
    algorithm: AlgorithmSettings = field(default_factory=AlgorithmSettings)  # the PPO objective and its credit
    warm_start: WarmStartSettings = field(  # the automatic SFT warm start when model.sft_checkpoint is null
        default_factory=WarmStartSettings)
    evaluation: EvalSettings = field(default_factory=EvalSettings)  # greedy evaluation on held-out questions
    run: RunSettings = field(default_factory=RunSettings)  # run folder, checkpoints, export, seed, logging

    def __post_init__(self) -> None:
        """The checks that span two sections (each section checks its own fields)."""
        rollout, algorithm = self.rollout, self.algorithm
        if algorithm.dynamic_sampling and (
                rollout.samples_per_question < 2 or rollout.samples_per_question < self.optim.mini_batches
                or algorithm.dynamic_sampling_max_rounds < 0):
            raise ConfigError("dynamic_sampling needs samples_per_question >= 2 and >= mini_batches (a kept question "
                              "must fill every mini-batch) and dynamic_sampling_max_rounds >= 0")
        if algorithm.kl_estimator == "exact" and not rollout.constrain_verdicts:
            raise ConfigError("kl_estimator exact is the exact KL of a two-way verdict (yes/no): it needs "
                              "kl_tokens: verdicts and constrain_verdicts: true")
        check_sampling(rollout, algorithm)
        if self.run.export_update is not None and not 1 <= self.run.export_update <= self.optim.updates:
            raise ConfigError(f"export_update must be in [1, updates={self.optim.updates}] (or null: the last update)")
        if self.model.compile_trained_layers and rollout.rollout_engine == "hf" and not rollout.rollout_merge_lora:
            raise ConfigError("compile_trained_layers compiles the layers PPO trains, for its passes; the HF rollout "
                              "would decode through them too (untested, recompiling per cache length): set "
                              "rollout_merge_lora: true (or rollout_engine: vllm)")
        if algorithm.kl_verdict_level == "free" and not rollout.constrain_verdicts:
            raise ConfigError("kl_verdict_level free shifts the two-way verdicts' reference: it needs "
                              "constrain_verdicts: true")
        if algorithm.verdict_level_coef > 0 and not rollout.constrain_verdicts:
            raise ConfigError("verdict_level_coef reads the two-way verdicts' open logits: it needs "
                              "constrain_verdicts: true")
        if self.evaluation.verdict_cut != "level" and not rollout.constrain_verdicts:
            raise ConfigError("evaluation.verdict_cut compares the two-way verdicts' pi(yes): it needs "
                              "constrain_verdicts: true")
        if algorithm.verdict_credit > 0 and not rollout.constrain_verdicts:
            raise ConfigError("verdict_credit needs constrain_verdicts: true (the two-way yes/no distribution)")
        if self.warm_start.require_checkpoint and not self.model.sft_checkpoint:
            raise ConfigError(
                "this recipe requires model.sft_checkpoint (warm_start.require_checkpoint: true): the quick CPU warm "
                "start (32 generated questions, random expansions) is no warm start for this model. Train the "
                "paper's warm start first (python -m training.sft --config configs/sft/seeds_r1_paper.yaml "
                "--model.name ... --teacher.llm ...), then pass --model.sft_checkpoint <its run.output_dir>/model "
                "(also when resuming)")

    @classmethod
    def upgrade_keys(cls, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` with the flat keys of earlier recipes, run folders and command lines moved into
        their sections (:data:`OLD_FLAT_KEYS`; ``sft: {...}`` becomes ``warm_start: {...}``, whose own flat keys
        its section reads: :meth:`training.sft_sections.WarmStartSettings.upgrade_keys`), with one
        deprecation line naming them. ``model`` and ``data`` are old keys only when not a mapping."""
        out, keys = move_old_keys(values, OLD_FLAT_KEYS, SECTIONS)
        moved = [f"{key} -> {OLD_FLAT_KEYS[key]}" for key in keys]
        if moved:
            shown = ", ".join(moved[:6]) + (f" and {len(moved) - 6} more" if len(moved) > 6 else "")
            deprecated(f"old flat PPO config keys read as nested ones ({shown}); write section.field "
                       "(training.config.OLD_FLAT_KEYS; docs/training.md, \"Config\")")
        return out


SECTIONS = ("model", "data", "env", "rollout", "optim", "algorithm", "warm_start", "evaluation", "run")

# The one map from the flat names of the PPO config before its sections (recipes, run folders' config.yaml,
# experiments/runs.csv command lines) to today's dotted ones; read by PPOConfig.upgrade_keys. Keep it as it is:
# a field added later has no flat name.
OLD_FLAT_KEYS = {
    "model": "model.name", "sft_checkpoint": "model.sft_checkpoint", "sft_warm_start": "warm_start.enabled",
    "require_sft_checkpoint": "warm_start.require_checkpoint", "sft": "warm_start",
    "cache_warm_start": "warm_start.cache", "dtype": "model.dtype", "trust_remote_code": "model.trust_remote_code",
    "gradient_checkpointing": "model.gradient_checkpointing", "cache_frozen_layers": "model.cache_frozen_layers",
    "reuse_rollout_states": "rollout.reuse_rollout_states", "logprob_chunk": "model.logprob_chunk",
    "lora": "model.lora", "data": "data.train_data", "eval_data": "evaluation.eval_data", "index": "data.index",
    "corpus": "data.corpus", "retriever": "data.retriever", "train_questions": "data.train_questions",
    "question_seed": "data.question_seed", "eval_questions": "evaluation.eval_questions",
    "eval_seed": "evaluation.eval_seed", "questions_per_update": "rollout.questions_per_update",
    "samples_per_question": "rollout.samples_per_question", "num_envs": "rollout.num_envs",
    "rollout_engine": "rollout.rollout_engine", "vllm": "rollout.vllm",
    "rollout_batch_size": "rollout.rollout_batch_size", "rollout_merge_lora": "rollout.rollout_merge_lora",
    "temperature": "rollout.temperature", "constrain_verdicts": "rollout.constrain_verdicts",
    "top_p": "rollout.top_p", "max_turn_tokens": "rollout.max_turn_tokens",
    "max_context_tokens": "rollout.max_context_tokens", "updates": "optim.updates", "ppo_epochs": "optim.ppo_epochs",
    "mini_batches": "optim.mini_batches", "micro_batch_size": "optim.micro_batch_size",
    "micro_batch_tokens": "optim.micro_batch_tokens", "lr_actor": "optim.lr_actor", "lr_critic": "optim.lr_critic",
    "warmup_updates": "optim.warmup_updates", "weight_decay": "optim.weight_decay", "clip_low": "algorithm.clip_low",
    "clip_high": "algorithm.clip_high", "dual_clip": "algorithm.dual_clip", "policy_loss": "algorithm.policy_loss",
    "value_clip": "algorithm.value_clip", "vf_coef": "algorithm.vf_coef", "entropy_coef": "algorithm.entropy_coef",
    "kl_coef": "algorithm.kl_coef", "kl_mode": "algorithm.kl_mode", "kl_target": "algorithm.kl_target",
    "kl_horizon": "algorithm.kl_horizon", "kl_estimator": "algorithm.kl_estimator",
    "kl_tokens": "algorithm.kl_tokens", "old_logprobs": "algorithm.old_logprobs", "gamma": "algorithm.gamma",
    "lam": "algorithm.lam", "advantage": "algorithm.advantage", "grpo_std_normalize": "algorithm.grpo_std_normalize",
    "loss_agg": "algorithm.loss_agg", "loss_agg_norm_tokens": "algorithm.loss_agg_norm_tokens",
    "dynamic_sampling": "algorithm.dynamic_sampling",
    "dynamic_sampling_max_rounds": "algorithm.dynamic_sampling_max_rounds",
    "overlong_buffer": "algorithm.overlong_buffer", "overlong_max_tokens": "algorithm.overlong_max_tokens",
    "tis": "algorithm.tis", "tis_mode": "algorithm.tis_mode", "tis_cap": "algorithm.tis_cap",
    "tis_low": "algorithm.tis_low", "verdict_credit": "algorithm.verdict_credit",
    "verdict_episode_credit": "algorithm.verdict_episode_credit",
    "verdict_credit_centred": "algorithm.verdict_credit_centred", "answer_credit": "algorithm.answer_credit",
    "critic_warmup_updates": "optim.critic_warmup_updates", "max_grad_norm": "optim.max_grad_norm",
    "target_kl": "optim.target_kl", "seed": "run.seed", "output_dir": "run.output_dir",
    "save_every": "run.save_every", "keep_checkpoints": "run.keep_checkpoints", "resume": "run.resume",
    "export": "run.export", "export_update": "run.export_update", "log_samples": "run.log_samples",
    "eval_every": "evaluation.eval_every", "report_to": "run.report_to", "wandb_project": "run.wandb_project",
    "compile_trained_layers": "model.compile_trained_layers",
}


def check_sampling(rollout: RolloutSettings, algorithm: AlgorithmSettings) -> None:
    """Refuse sampling settings under which the rollout's log-probs would pass for π_old's, the
    trainer's ``softmax(z / temperature)``, while they are another distribution's."""
    if rollout.top_p < 1 and algorithm.old_logprobs == "sampler":
        raise ConfigError(f"top_p {rollout.top_p} with old_logprobs: sampler: the sampler's log-probs are those of "
                          "the nucleus distribution, not of π_old = softmax(z / temperature). Use old_logprobs: "
                          "recompute (with tis: token to correct for the nucleus)")
    if rollout.rollout_engine == "vllm" and (rollout.temperature != 1 or rollout.top_p < 1) and (
            algorithm.old_logprobs != "recompute" or algorithm.tis != "none"):
        raise ConfigError("rollout_engine vllm records raw log-probs (temperature 1, no top_p), not those of the "
                          f"distribution it samples from (temperature {rollout.temperature}, top_p {rollout.top_p}): "
                          "use old_logprobs: recompute with tis: none, or rollout_engine: hf")


def dotted_keys(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` keyed by :data:`OLD_FLAT_KEYS` names and dotted ones alike, all dotted (for
    :func:`with_values`; keyword helpers of tests and scripts): ``{"updates": 2}`` -> ``{"optim.updates": 2}``."""
    return {OLD_FLAT_KEYS.get(key, key): value for key, value in values.items()}
