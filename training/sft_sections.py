"""The sections of the SFT warm start's config (:class:`training.sft_config.WarmStartConfig`), one
dataclass each, and the PPO config's ``warm_start`` section (:class:`WarmStartSettings`), which holds
the same ``teacher``, ``train`` and ``dev`` sections with the quick CPU warm start's defaults.

Each section checks its own fields in ``__post_init__``; the checks that span two sections, and the
scripted teacher's rules (:class:`training.teachers.scripted_teacher.ScriptedTeacherConfig`), are the
root's (:meth:`training.sft_config.WarmStartConfig.__post_init__`). The flat names of earlier recipes,
run folders and command lines are read through one map per class (:data:`OLD_SFT_KEYS`,
:data:`OLD_WARM_START_KEYS`) with one deprecation line.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from envs.typed_config import DOCS_FROM, OVERRIDES, ConfigError, deprecated, move_old_keys
from training.config_sections import LoraSettings, nest_flat_lora_keys

SFT_LOSS_AGGS = ("token_mean", "turn_mean")  # training.warm_start.sft_trainer.model_token_nll
VERDICT_LABELS = ("teacher", "both")  # SFTTrainSettings.verdict_labels (training.teachers.trajectories)
TEACHER_KINDS = ("scripted", "method")  # TeacherSettings.kind


def sft_lora() -> LoraSettings:
    """The warm start's own LoRA default: off (a full fine-tune), dropout 0.05 on every linear layer when on."""
    return LoraSettings(enabled=False, dropout=0.05, target_modules="all-linear")


@dataclass
class SFTModelSettings:
    """The policy the warm start trains: its base model, precision, device, LoRA and how it is saved."""
    name: str = "gemma3-270m"  # spec for inference.models (packaged name, HF folder, cached hub id)
    dtype: str = "auto"  # float32 on CPU, bf16 on CUDA when supported
    device: str = "auto"  # "auto" (CUDA when available), "cpu", "cuda", ...: where the model trains
    # the PPO trainer's LoRA section (enabled: false = full fine-tune); the automatic warm start takes the PPO run's
    lora: LoraSettings = field(default_factory=sft_lora)
    merge_lora: bool = True  # save the best model with the adapter merged in (else the adapter folder)
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory, slower)
    cache_frozen_layers: bool = False  # LoRA on the top layers: run the frozen ones once per row, not per epoch


@dataclass
class SFTDataSettings:
    """The questions the teacher plays and the retriever they are searched with."""
    path: str | None = None  # QA spec for envs.data.load_qa; None: the embedded default questions
    split: str = "train"  # split of a hub dataset given as `path`
    num_questions: int | None = 200  # default questions generated, or the limit for `path` (None: all of it)
    question_seed: int = 1000  # seed of the generated questions (keep it apart from evaluation's seed 0)
    index: str | None = None  # retriever folder; None: the embedded default retriever
    corpus: str | None = None  # corpus file when it moved since the index was built
    retriever: str | None = None  # retrieval server URL (python -m envs.retrieval.server) to use instead of `index`

    def __post_init__(self) -> None:
        if self.path is None and (self.num_questions is None or self.num_questions < 1):
            raise ConfigError("num_questions must be at least 1 with the generated default questions (path: null)")


@dataclass
class TeacherSettings:
    """Who plays the training questions, and how many of its episodes are collected."""
    kind: str = "scripted"  # "scripted" or "method"
    expand: str = "random"  # scripted: "random", the GOLD-GUIDED "positives" (+ extra random), or noisy "labels"
    extra_expand: int = 0  # scripted, positives mode: random non-positives opened as well
    random_expand: int = 2  # scripted, random mode: candidates opened per snapshot
    open_rate: float | None = None  # scripted, random mode: each candidate opened with this probability instead
    positive_open_rate: float = 0.95  # scripted, labels mode (noisy, label-informed): P(open) of a positive
    negative_open_rate: float = 0.5  # scripted, labels mode: P(open) of a candidate not labelled positive
    second_search: bool = True  # scripted: search a shown title when nothing read touches the question
    think: bool = True  # scripted: a short <think> before every action
    reader: str = "first_title"  # scripted: reader rule over the opened passages (READER_RULES)
    # scripted: the first query's rule (QUERY_RULES): "question" copies the question, "quoted" its quoted clues
    query: str = "question"
    # scripted: episodes per question, each on coins of its own: one question read through different opened
    # sets and answered from each, so the answer turn has to look at what was opened (not at the question)
    samples: int = 1
    method: str = "seeds-react"  # method teacher: registered method name
    llm: str | None = None  # method teacher, REQUIRED: backend spec, e.g. vllm:<model>, openai:<served model>
    llm_options: dict = field(default_factory=dict)  # method teacher: backend options (as model.options)
    method_options: dict = field(default_factory=dict)  # method teacher: options, over the SEEDS-R1 limits
    concurrency: int = 32  # method teacher: questions in flight at once
    num_envs: int = 16  # scripted teacher: batched env slots
    target_accepted: int | None = None  # collect until this many are accepted (None: one episode per question)
    trajectories: str | None = None  # train from this JSONL instead of collecting

    def __post_init__(self) -> None:
        if self.kind not in TEACHER_KINDS:
            raise ConfigError(f"teacher.kind must be one of {TEACHER_KINDS}, not {self.kind!r}")
        if self.kind == "method" and not self.llm and not self.trajectories:
            raise ConfigError("teacher.kind method needs teacher.llm, the backend spec of the teacher model (e.g. "
                              "vllm:/models/<teacher> or openai:<model served at OPENAI_BASE_URL>); see "
                              "configs/sft/seeds_r1_paper.yaml")
        if self.samples < 1:
            raise ConfigError(f"teacher.samples must be at least 1, not {self.samples}")
        if self.samples > 1 and self.kind != "scripted":
            raise ConfigError("teacher.samples > 1 is the scripted teacher's (a method teacher runs one episode "
                              "per question: give it more questions instead)")
        if self.target_accepted is not None and self.target_accepted < 1:
            raise ConfigError("teacher.target_accepted must be at least 1 (or null)")


@dataclass
class SFTTrainSettings:
    """What the accepted trajectories teach (its rows) and the optimisation over them."""
    # judgement form: false = the teacher's verdicts are context, not targets (its random choices are not
    # imitated, so the policy keeps its own judgement of relevance for PPO to sharpen). Judged alone
    # (env judge_context: alone), true adds one short row per verdict (its alone context + the teacher's
    # verdict token): the random choices then set the warm start's yes rate, not which candidates it opens
    train_verdicts: bool = True
    # judged alone with train_verdicts: "teacher" = each row's label is the teacher's verdict; "both" = each
    # context twice, once with each verdict, so the loss is least at pi(yes) = 0.5 for every candidate: the
    # verdict's form with no preference and no yes bias left by where the teacher's coins fell
    verdict_labels: str = "teacher"
    epochs: int = 3  # training epochs over the accepted trajectories
    learning_rate: float = 1e-5  # peak learning rate (linear schedule after the warm-up)
    batch_size: int = 4  # rows per device batch
    # batches of rows of similar length (transformers' LengthGroupedSampler): less padding where short rows
    # (verdicts judged alone) train beside whole episodes
    group_by_length: bool = False
    gradient_accumulation_steps: int = 1  # batches per optimizer step
    # how labelled tokens are averaged: token_mean (every token the same; a trajectory's ~90-token copied query
    # outweighs its ~10-token answer) or turn_mean (every model turn the same: its tokens share one unit)
    loss_agg: str = "token_mean"
    warmup_ratio: float = 0.05  # fraction of the steps (TrainingArguments.warmup_steps as a float < 1)
    weight_decay: float = 0.0  # AdamW weight decay
    max_length: int = 4096  # longer trajectories are dropped (never cut: the answer is at the end)
    logging_steps: int = 5  # optimizer steps between the Trainer's log lines
    report_to: str = "none"  # the Trainer's report_to: "none", "wandb", ...
    progress: bool = True  # the Trainer's progress bar

    def __post_init__(self) -> None:
        if self.verdict_labels not in VERDICT_LABELS:
            raise ConfigError(f"verdict_labels must be one of {VERDICT_LABELS}, not {self.verdict_labels!r}")
        if self.loss_agg not in SFT_LOSS_AGGS:
            raise ConfigError(f"loss_agg must be one of {SFT_LOSS_AGGS}, not {self.loss_agg!r}")


@dataclass
class DevSettings:
    """The dev split and its evaluation: greedy SEEDS-R1 rollouts after each epoch, the best epoch kept."""
    fraction: float = 0.1  # share of the accepted trajectories' questions held out as the dev set
    enabled: bool = True  # greedy rollouts on the dev questions after each epoch; best epoch kept
    limit: int | None = 100  # dev questions evaluated at most (None: all of them)
    before: bool = True  # also measure the model before training (logged, never selected)
    max_turn_tokens: int = 256  # new tokens at most per model turn
    max_context_tokens: int = 4096  # whole-episode token cap
    batch_size: int = 16  # episodes stepped together

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction < 1.0:
            raise ConfigError("dev.fraction must lie in [0, 1)")


@dataclass
class SFTRunSettings:
    """Where the warm start writes, and its seed."""
    output_dir: str = "runs/sft"  # run folder: config.yaml, trajectories.jsonl, the best model
    seed: int = 0  # seed of the teacher's coins, the train/dev split and training


def quick_train() -> SFTTrainSettings:
    """The quick CPU warm start's training: 2 epochs at 2e-4, 10% warm-up, trajectories up to 2048 tokens."""
    return SFTTrainSettings(epochs=2, learning_rate=2e-4, warmup_ratio=0.1, max_length=2048)


def quick_dev() -> DevSettings:
    """The quick CPU warm start's dev split, not evaluated (the PPO run evaluates the warm start itself)."""
    return DevSettings(enabled=False, before=False)


@dataclass
class WarmStartSettings:
    """The PPO run's automatic SFT warm start (``training.sft.warm_start_config``): whether it runs, and its
    ``teacher``, ``train`` and ``dev`` sections (those of :class:`training.sft_config.WarmStartConfig`, with the
    quick CPU warm start's defaults); the rest comes from the run's own sections (``model.name``, ``model.dtype``,
    ``model.lora``, ``model.cache_frozen_layers``, ``data.index``, ``data.corpus``, ``data.retriever``, ``env``,
    ``run.seed``, ``run.output_dir``)."""
    enabled: bool = True  # no model.sft_checkpoint: train a quick warm start first (training.sft.warm_start)
    # reuse a warm start trained from the same inputs, and its greedy evaluation before PPO, from an
    # earlier run (the seeds-rl cache; keys over config, data, code and versions: warm_start/warm_start_cache.py)
    cache: bool = True
    require_checkpoint: bool = False  # true: refuse to start without model.sft_checkpoint (no quick warm start)
    num_questions: int | None = 32  # the teacher plays the run's first this many training questions
    lora: dict[str, Any] = field(  # overrides of the PPO run's model.lora for the warm start (--warm_start.lora.r 8)
        default_factory=dict, metadata={OVERRIDES: LoraSettings})
    merge_lora: bool = True
    device: str = "auto"
    gradient_checkpointing: bool = False
    teacher: TeacherSettings = field(default_factory=TeacherSettings)  # the teacher and its collection
    train: SFTTrainSettings = field(default_factory=quick_train)  # the rows and the optimisation
    dev: DevSettings = field(default_factory=quick_dev)  # the dev split and its evaluation

    def __post_init__(self) -> None:
        unknown = sorted(set(self.lora) - {f.name for f in dataclasses.fields(LoraSettings)})
        if unknown:
            raise ConfigError(f"unknown warm_start.lora key(s) {unknown}")

    @classmethod
    def upgrade_keys(cls, values: dict[str, Any]) -> dict[str, Any]:
        """The flat keys of earlier PPO recipes and run folders (``warm_start: {epochs: 3, teacher_query:
        quoted, other: {teacher_llm: ...}}``, ``lora_r: 8``) moved into their sections (:data:`OLD_WARM_START_KEYS`)."""
        values = nest_flat_lora_keys(dict(values))
        other = values.pop("other", None) or {}
        if not isinstance(other, dict):
            raise ConfigError(f"warm_start.other: expected a mapping, got {other!r}")
        out, moved = move_old_keys({**other, **values}, OLD_WARM_START_KEYS, WARM_START_SECTIONS)
        if moved or other:
            shown = [f"{key} -> {OLD_WARM_START_KEYS[key]}" for key in moved] + (["other"] if other else [])
            deprecated(f"old flat warm_start keys read as nested ones ({_listed(shown)}); write "
                       "warm_start.section.field (training.sft_sections.OLD_WARM_START_KEYS)")
        return out


def _listed(items: list[str], shown: int = 6) -> str:
    return ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown else "")


def upgrade_sft_keys(values: dict[str, Any]) -> dict[str, Any]:
    """A flat WarmStartConfig recipe's keys (``epochs: 3``, ``teacher_expand: random``, ``lora: true``,
    ``lora_r: 8``) moved into their sections (:data:`OLD_SFT_KEYS`), with one deprecation line."""
    values = nest_flat_lora_keys({key.replace("-", "_"): value for key, value in values.items()})
    out, moved = move_old_keys(values, OLD_SFT_KEYS, SFT_SECTIONS)
    if moved:
        shown = _listed([f"{key} -> {OLD_SFT_KEYS[key]}" for key in moved])
        deprecated(f"old flat SFT config keys read as nested ones ({shown}); write section.field "
                   "(training.sft_sections.OLD_SFT_KEYS; docs/training.md, \"Config\")")
    return out


SFT_SECTIONS = ("model", "data", "env", "teacher", "train", "dev", "run")
WARM_START_SECTIONS = ("teacher", "train", "dev")

# The one map from the flat names of WarmStartConfig before its sections (configs/sft recipes, the config.yaml of
# training.sft run folders, command lines) to today's dotted ones; read by WarmStartConfig.upgrade_keys. Keep it as
# it is: a field added later has no flat name. (`env` kept its name and form; flat LoRA keys: nest_flat_lora_keys.)
OLD_SFT_KEYS = {
    "model": "model.name", "dtype": "model.dtype", "device": "model.device", "lora": "model.lora",
    "merge_lora": "model.merge_lora", "gradient_checkpointing": "model.gradient_checkpointing",
    "cache_frozen_layers": "model.cache_frozen_layers", "output_dir": "run.output_dir", "seed": "run.seed",
    "data": "data.path", "split": "data.split", "num_questions": "data.num_questions",
    "question_seed": "data.question_seed", "index": "data.index", "corpus": "data.corpus",
    "retriever": "data.retriever", "teacher": "teacher.kind", "teacher_expand": "teacher.expand",
    "teacher_extra_expand": "teacher.extra_expand", "teacher_random_expand": "teacher.random_expand",
    "teacher_open_rate": "teacher.open_rate", "teacher_positive_open_rate": "teacher.positive_open_rate",
    "teacher_negative_open_rate": "teacher.negative_open_rate", "teacher_second_search": "teacher.second_search",
    "teacher_think": "teacher.think", "teacher_reader": "teacher.reader", "teacher_query": "teacher.query",
    "teacher_samples": "teacher.samples", "teacher_method": "teacher.method", "teacher_llm": "teacher.llm",
    "teacher_llm_options": "teacher.llm_options", "teacher_method_options": "teacher.method_options",
    "teacher_concurrency": "teacher.concurrency", "num_envs": "teacher.num_envs",
    "target_accepted": "teacher.target_accepted", "trajectories": "teacher.trajectories",
    "dev_fraction": "dev.fraction", "train_verdicts": "train.train_verdicts", "verdict_labels": "train.verdict_labels",
    "epochs": "train.epochs", "learning_rate": "train.learning_rate", "batch_size": "train.batch_size",
    "group_by_length": "train.group_by_length", "gradient_accumulation_steps": "train.gradient_accumulation_steps",
    "loss_agg": "train.loss_agg", "warmup_ratio": "train.warmup_ratio", "weight_decay": "train.weight_decay",
    "max_length": "train.max_length", "logging_steps": "train.logging_steps", "report_to": "train.report_to",
    "progress": "train.progress", "dev_eval": "dev.enabled", "dev_limit": "dev.limit", "eval_before": "dev.before",
    "eval_max_turn_tokens": "dev.max_turn_tokens", "eval_max_context_tokens": "dev.max_context_tokens",
    "eval_batch_size": "dev.batch_size",
}
# The PPO warm_start section's flat names (and those of its old `other` dict and of the older `sft:` key) are
# WarmStartConfig's: the same map, less the fields the run's own sections set; num_questions, merge_lora, device
# and gradient_checkpointing kept their names in the section.
OLD_WARM_START_KEYS = {old: new for old, new in OLD_SFT_KEYS.items() if new.split(".")[0] in WARM_START_SECTIONS}

# the warm start's flat fields are documented where the SFT config's sections define them
setattr(WarmStartSettings, DOCS_FROM, (SFTModelSettings, SFTDataSettings))
