"""The settings of one SFT warm start (:class:`WarmStartConfig`): YAML recipes in ``configs/sft/``,
``--key value`` overrides on top (:func:`training.sft.resolve_config`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from envs import typed_config
from envs.config import EnvConfig
from training.config_sections import (  # noqa: F401  (nest_flat_lora_keys re-exported)
    LoraSettings,
    check_env_overrides,
    nest_flat_lora_keys,
)
from training.teachers.scripted_teacher import ScriptedTeacherConfig
from training.teachers.trajectories import VERDICT_LABELS

PAPER_RECIPE = "configs/sft/seeds_r1_paper.yaml"
SFT_LOSS_AGGS = ("token_mean", "turn_mean")  # training.warm_start.sft_trainer.model_token_nll


@dataclass
class WarmStartConfig:
    """Everything one warm start needs; loadable from YAML (:meth:`from_yaml`), CLI overrides on top."""

    # ---- model
    model: str = "gemma3-270m"  # spec for inference.models (packaged name, HF folder, cached hub id)
    dtype: str = "auto"  # float32 on CPU, bf16 on CUDA when supported
    device: str = "auto"  # "auto" (CUDA when available), "cpu", "cuda", ...: where the model trains
    output_dir: str = "runs/sft"  # run folder: config.yaml, trajectories.jsonl, the best model
    seed: int = 0  # seed of the teacher's coins, the train/dev split and training
    # ---- data
    data: str | None = None  # QA spec for envs.data.load_qa; None: the embedded default questions
    split: str = "train"  # split of a hub dataset given as `data`
    num_questions: int | None = 200  # default questions generated, or the limit for `data` (None: all of it)
    question_seed: int = 1000  # seed of the generated questions (keep it apart from evaluation's seed 0)
    index: str | None = None  # retriever folder; None: the embedded default retriever
    corpus: str | None = None  # corpus file when it moved since the index was built
    retriever: str | None = None  # retrieval server URL (python -m envs.retrieval.server) to use instead of `index`
    env: dict = field(  # EnvConfig overrides (defaults = SEEDS-R1 limits)
        default_factory=dict, metadata={typed_config.OVERRIDES: EnvConfig})
    # ---- teacher
    teacher: str = "scripted"  # "scripted" or "method"
    teacher_expand: str = "random"  # scripted: "random", or the GOLD-GUIDED "positives" (+ extra random)
    teacher_extra_expand: int = 0  # scripted, positives mode: random non-positives opened as well
    teacher_random_expand: int = 2  # scripted, random mode: candidates opened per snapshot
    teacher_open_rate: float | None = None  # scripted, random mode: each candidate opened with this probability instead
    # judgement form: false = the teacher's verdicts are context, not targets (its random choices are not
    # imitated, so the policy keeps its own judgement of relevance for PPO to sharpen). Judged alone
    # (env judge_context: alone), true adds one short row per verdict (its alone context + the teacher's
    # verdict token): the random choices then set the warm start's yes rate, not which candidates it opens
    train_verdicts: bool = True
    # judged alone with train_verdicts: "teacher" = each row's label is the teacher's verdict; "both" = each
    # context twice, once with each verdict, so the loss is least at pi(yes) = 0.5 for every candidate: the
    # verdict's form with no preference and no yes bias left by where the teacher's coins fell
    verdict_labels: str = "teacher"
    teacher_second_search: bool = True  # scripted: search a shown title when nothing read touches the question
    teacher_think: bool = True  # scripted: a short <think> before every action
    teacher_reader: str = "first_title"  # scripted: reader rule over the opened passages (READER_RULES)
    # scripted: the first query's rule (QUERY_RULES): "question" copies the question, "quoted" its quoted clues
    teacher_query: str = "question"
    # scripted: episodes per question, each on coins of its own: one question read through different opened
    # sets and answered from each, so the answer turn has to look at what was opened (not at the question)
    teacher_samples: int = 1
    teacher_method: str = "seeds-react"  # method teacher: registered method name
    teacher_llm: str | None = None  # method teacher, REQUIRED: backend spec, e.g. vllm:<model>, openai:<served model>
    teacher_llm_options: dict = field(default_factory=dict)  # method teacher: backend options (as model.options)
    teacher_method_options: dict = field(default_factory=dict)  # method teacher: options, over the SEEDS-R1 limits
    teacher_concurrency: int = 32  # method teacher: questions in flight at once
    num_envs: int = 16  # batched env slots (scripted teacher, dev evaluation)
    target_accepted: int | None = None  # collect until this many are accepted (None: one episode per question)
    trajectories: str | None = None  # train from this JSONL instead of collecting
    dev_fraction: float = 0.1  # share of the accepted trajectories' questions held out as the dev set
    # ---- training
    # the PPO trainer's LoRA section (enabled: false = full fine-tune); the automatic warm start takes the PPO run's
    lora: LoraSettings = field(default_factory=lambda: LoraSettings(enabled=False, dropout=0.05,
                                                                    target_modules="all-linear"))
    merge_lora: bool = True  # save the best model with the adapter merged in (else the adapter folder)
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
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory, slower)
    cache_frozen_layers: bool = False  # LoRA on the top layers: run the frozen ones once per row, not per epoch
    logging_steps: int = 5  # optimizer steps between the Trainer's log lines
    report_to: str = "none"  # the Trainer's report_to: "none", "wandb", ...
    progress: bool = True  # the Trainer's progress bar
    # ---- dev evaluation (greedy SEEDS-R1 rollouts after each epoch; best checkpoint kept)
    dev_eval: bool = True  # greedy rollouts on the dev questions after each epoch; best epoch kept
    dev_limit: int | None = 100  # dev questions evaluated at most (None: all of them)
    eval_before: bool = True  # also measure the model before training (logged, never selected)
    eval_max_turn_tokens: int = 256  # dev evaluation: new tokens at most per model turn
    eval_max_context_tokens: int = 4096  # dev evaluation: whole-episode token cap
    eval_batch_size: int = 16  # dev evaluation: episodes stepped together

    def __post_init__(self) -> None:
        check_env_overrides(self.env)
        if self.teacher not in ("scripted", "method"):
            raise ValueError(f"teacher must be 'scripted' or 'method', not {self.teacher!r}")
        self.scripted_teacher()  # validates the scripted teacher's settings
        if self.teacher == "method" and not self.teacher_llm and not self.trajectories:
            raise ValueError(f"teacher: method needs teacher_llm, the backend spec of the teacher model "
                             f"(e.g. vllm:/models/<teacher> or openai:<model served at OPENAI_BASE_URL>); "
                             f"see {PAPER_RECIPE}")
        if self.teacher_samples < 1:
            raise ValueError(f"teacher_samples must be at least 1, not {self.teacher_samples}")
        if self.teacher_samples > 1 and self.teacher != "scripted":
            raise ValueError("teacher_samples > 1 is the scripted teacher's (a method teacher runs one episode "
                             "per question: give it more questions instead)")
        if self.target_accepted is not None and self.target_accepted < 1:
            raise ValueError("target_accepted must be at least 1 (or null)")
        if self.data is None and (self.num_questions is None or self.num_questions < 1):
            raise ValueError("num_questions must be at least 1 with the generated default questions (data: null)")
        if self.verdict_labels not in VERDICT_LABELS:
            raise ValueError(f"verdict_labels must be one of {VERDICT_LABELS}, not {self.verdict_labels!r}")
        if self.loss_agg not in SFT_LOSS_AGGS:
            raise ValueError(f"loss_agg must be one of {SFT_LOSS_AGGS}, not {self.loss_agg!r}")
        if not 0.0 <= self.dev_fraction < 1.0:
            raise ValueError("dev_fraction must lie in [0, 1)")

    def scripted_teacher(self) -> ScriptedTeacherConfig:
        return ScriptedTeacherConfig(expand=self.teacher_expand, extra_expand=self.teacher_extra_expand,
                                     random_expand=self.teacher_random_expand, open_rate=self.teacher_open_rate,
                                     second_search=self.teacher_second_search, think=self.teacher_think,
                                     reader=self.teacher_reader, query=self.teacher_query)

    @classmethod
    def from_dict(cls, values: dict) -> WarmStartConfig:
        """Strictly, through the project's one loader (:func:`envs.typed_config.from_dict`); the
        flat LoRA keys of earlier recipes (``lora: true``, ``lora_r: 8``, ...) are read into the
        ``lora`` section, with a DeprecationWarning."""
        values = {k.replace("-", "_"): v for k, v in (values or {}).items()}
        return typed_config.from_dict(cls, nest_flat_lora_keys(values))

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict | None = None) -> WarmStartConfig:
        """A recipe (``base: other.yaml`` allowed) with ``overrides`` on top."""
        return cls.from_dict({**typed_config.read_recipe(Path(path)), **(overrides or {})})

    def env_config(self) -> EnvConfig:
        return EnvConfig.from_dict(self.env) if self.env else EnvConfig()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
