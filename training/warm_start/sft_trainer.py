"""The Trainer side of the SFT warm start: TRL's ``SFTTrainer`` over pre-tokenized SEEDS-R1
trajectories with the loss on model tokens only (:func:`model_token_nll`), the dev-EM callback
that keeps the best epoch, atomic saves and the LoRA merge. The recipe that drives it (collect,
filter, split, train) is :mod:`training.sft`."""
from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from datasets import Dataset
from peft import PeftModel
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer

from envs.atomic import write_text_atomic
from envs.config import EnvConfig
from envs.protocol import judge_form
from envs.types import QAExample
from envs.vector_env import SearchVectorEnv
from inference.backends.hf import HFBackend
from inference.models import ensure_pad_token, load_causal_lm, load_tokenizer
from training.models.frozen_prefix import PrefixCache, frozen_depth
from training.models.policy_models import lora_config, sequence_logprobs
from training.rollouts.rollout import RolloutConfig, collect_rollouts, rollout_stats
from training.sft_config import WarmStartConfig
from training.teachers.trajectories import example_of, seeds_r1_prompt_fn, sft_rows

log = logging.getLogger("training.sft")


def dev_em(model: Any, tokenizer: Any, examples: Sequence[QAExample], retriever: Any,
           env_config: EnvConfig | None = None, num_envs: int = 16, max_turn_tokens: int = 256,
           max_context_tokens: int = 4096, seed: int = 0) -> dict[str, float]:
    """Greedy SEEDS-R1 rollouts of ``model`` over ``examples``: :func:`rollout_stats` (``em`` etc.)."""
    was_training = model.training
    model.eval()
    try:
        backend = HFBackend(model, tokenizer, max_batch_size=num_envs)
        env_config = env_config or EnvConfig()
        venv = SearchVectorEnv(retriever, num_envs=max(1, min(num_envs, len(examples))), config=env_config,
                               tokenizer=tokenizer)
        config = RolloutConfig(max_turn_tokens=max_turn_tokens, max_context_tokens=max_context_tokens,
                               temperature=0.0, seed=seed)
        episodes = collect_rollouts(backend, venv, examples, config, prompt_fn=seeds_r1_prompt_fn(env_config))
    finally:
        model.train(was_training)
    return rollout_stats(episodes)


class DevEMCallback(TrainerCallback):
    """After each epoch: dev EM of the current model; saves it into ``best_dir`` when it is the best
    so far (ties go to the later epoch). ``history`` holds ``{"epoch", "em", ...}`` per evaluation."""

    def __init__(self, evaluate: Callable[[Any], dict], best_dir: Path, tokenizer: Any, eval_before: bool = True):
        self.evaluate, self.best_dir, self.tokenizer = evaluate, Path(best_dir), tokenizer
        self.eval_before = eval_before
        self.best_em: float | None = None
        self.best_epoch: float | None = None
        self.history: list[dict] = []

    def _run(self, model: Any, epoch: float) -> dict:
        started = time.perf_counter()
        stats = self.evaluate(model)
        entry = {"epoch": epoch, **{k: float(v) for k, v in stats.items()},
                 "eval_s": round(time.perf_counter() - started, 2)}
        self.history.append(entry)
        log.info("dev EM after epoch %s: %.4f", epoch, entry["em"])
        return entry

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.eval_before and state.is_world_process_zero:
            self._run(model, 0)

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero:
            return
        entry = self._run(model, round(state.epoch or 0, 4))
        if self.best_em is None or entry["em"] >= self.best_em:
            self.best_em, self.best_epoch = entry["em"], entry["epoch"]
            _save_model(model, self.tokenizer, self.best_dir)


def _save_model(model: Any, tokenizer: Any, folder: Path) -> None:
    """Save beside ``folder``, then rename into place (a reader never sees half a model)."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def _load_for_training(config: WarmStartConfig) -> tuple[Any, Any]:
    tokenizer = load_tokenizer(config.model.name)
    model = load_causal_lm(config.model.name, device=config.model.device, dtype=config.model.dtype)
    model.train()
    return model, tokenizer


def train_sft(train_records: Sequence[dict], dev_records: Sequence[dict], config: WarmStartConfig,
              model: Any = None, tokenizer: Any = None, retriever: Any = None, collection: dict | None = None) -> dict:
    """SFT on accepted ``train_records``; dev EM after each epoch on ``dev_records``' questions.

    ``model``/``tokenizer``: an already loaded model (default: ``config.model.name``). ``retriever``
    is needed for the dev evaluation (skipped without one, or with ``dev.enabled: false`` or no
    dev records; the final model is saved then). Returns ``{"model_dir", "best_epoch",
    "best_dev_em", "history", "train_loss"}``; ``model_dir`` is a Hugging Face folder.
    ``collection``: the collection's statistics (acceptance rate ...), kept in ``sft_summary.json``.
    """
    out, dev, seed = Path(config.run.output_dir), config.dev, config.run.seed
    out.mkdir(parents=True, exist_ok=True)
    if model is None or tokenizer is None:
        model, tokenizer = _load_for_training(config)
    ensure_pad_token(tokenizer)
    rows = sft_rows([r for r in train_records if r.get("accepted", True)], tokenizer, config.train.max_length,
                    form=judge_form((config.env or {}).get("expand_form", "list"),
                                    (config.env or {}).get("judge_context", "stream")),
                    train_verdicts=config.train.train_verdicts, verdict_labels=config.train.verdict_labels)
    if not rows:
        raise ValueError("no accepted training trajectories")
    callbacks = []
    dev_examples = _dev_examples(dev_records, dev.limit)
    best_dir = out / ("adapter" if config.model.lora.enabled else "model")
    callback = None
    if dev.enabled and dev_examples and retriever is not None:
        env_config = config.env_config()

        def evaluate(m: Any) -> dict:
            return dev_em(m, tokenizer, dev_examples, retriever, env_config, num_envs=dev.batch_size,
                          max_turn_tokens=dev.max_turn_tokens, max_context_tokens=dev.max_context_tokens, seed=seed)

        callback = DevEMCallback(evaluate, best_dir, tokenizer, eval_before=dev.before)
        callbacks.append(callback)
    trainer = build_trainer(rows, config, model, tokenizer, callbacks)
    result = trainer.train()
    if callback is None or callback.best_em is None:
        _save_model(trainer.model, tokenizer, best_dir)
    model_dir = best_dir
    if config.model.lora.enabled and config.model.merge_lora:
        model_dir = merge_adapter(best_dir, out / "model", base=config.model.name, tokenizer=tokenizer,
                                  base_model=None)
    summary = {
        "model_dir": str(model_dir),
        "best_epoch": None if callback is None else callback.best_epoch,
        "best_dev_em": None if callback is None else callback.best_em,
        "history": [] if callback is None else callback.history,
        "train_loss": float(result.training_loss),
        "log_history": trainer.state.log_history,
        "train_examples": len(rows),
        "dev_questions": len(dev_examples),
        "collection": collection or {},
        "frozen_prefix": None if trainer.prefix_cache is None else {
            "depth": trainer.prefix_cache.depth, "rows": len(trainer.prefix_cache.states),
            "reused": trainer.prefix_cache.hits},
    }
    write_text_atomic(json.dumps(summary, indent=2, default=str), out / "sft_summary.json")
    return summary


def build_trainer(rows: Sequence[dict], config: WarmStartConfig, model: Any, tokenizer: Any,
                  callbacks: Sequence[Any] = ()) -> Any:
    """TRL ``SFTTrainer`` over pre-tokenized rows (``input_ids`` + ``labels``; TRL keeps the labels
    as given, so the loss is on model tokens only), full fine-tune or LoRA (``config.model.lora``, built
    as the PPO trainer builds its adapters: :func:`training.models.policy_models.lora_config`); the loss is
    :func:`model_token_nll` (lm_head on labelled positions only)."""
    peft_config, train, seed = None, config.train, config.run.seed
    if config.model.lora.enabled:
        peft_config = lora_config(config.model.lora, "CAUSAL_LM", model.config.get_text_config().num_hidden_layers)
    parameter = next(model.parameters())
    on_gpu = parameter.device.type == "cuda" or (torch.cuda.is_available() and config.model.device != "cpu")
    bf16 = bool(on_gpu and parameter.dtype == torch.bfloat16)
    args = SFTConfig(
        output_dir=str(Path(config.run.output_dir) / "trainer"), num_train_epochs=train.epochs,
        learning_rate=train.learning_rate, per_device_train_batch_size=train.batch_size,
        gradient_accumulation_steps=train.gradient_accumulation_steps,
        warmup_steps=float(train.warmup_ratio) if train.warmup_ratio < 1 else int(train.warmup_ratio),
        weight_decay=train.weight_decay, lr_scheduler_type="linear", logging_steps=train.logging_steps,
        save_strategy="no", eval_strategy="no", report_to=train.report_to, max_length=None, bf16=bf16, fp16=False,
        seed=seed, data_seed=seed,
        train_sampling_strategy="group_by_length" if train.group_by_length else "random",
        use_cpu=not on_gpu, remove_unused_columns=False, disable_tqdm=not train.progress,
        **_checkpointing(config.model.gradient_checkpointing),
    )
    trainer = ModelTokenLossSFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(list(rows)),
                                       processing_class=tokenizer, peft_config=peft_config, callbacks=list(callbacks))
    trainer.loss_agg = train.loss_agg
    assert trainer.model is not None  # the model passed in (peft-wrapped with a peft_config)
    depth = frozen_depth(trainer.model) if config.model.cache_frozen_layers else 0
    if depth:
        trainer.prefix_cache = PrefixCache(depth)
    return trainer


def turn_weights(targets: torch.Tensor) -> torch.Tensor:
    """Weight 1/len(turn) on each labelled position, where a turn is a maximal run of consecutive
    labelled positions of a row (a model turn: observations and prompts between turns are unlabelled).

    targets: (B, T) bool -> (B, T) float32; each turn's weights sum to 1, unlabelled positions are 0.
    """
    starts = targets & ~torch.nn.functional.pad(targets, (1, 0))[:, :-1]  # (B, T) first position of a turn
    turn = (starts.long().cumsum(-1) - 1).clamp(min=0)  # (B, T) turn index within its row
    lengths = torch.zeros(targets.shape, dtype=torch.float32, device=targets.device)
    lengths = lengths.scatter_add(1, turn, targets.float())  # (B, T) tokens of turn k at column k
    return torch.where(targets, 1.0 / lengths.gather(1, turn).clamp(min=1.0), 0.0)


def model_token_nll(model: Any, input_ids: Any, attention_mask: Any, labels: Any, chunk: int = 1024,
                    prefix: Any = None, prefix_depth: int = 0, loss_agg: str = "token_mean") -> tuple[Any, Any]:
    """Weighted negative log-likelihood of the labelled tokens, and the weights' sum.

    input_ids, attention_mask, labels: (B, T); labels are -100 where no loss is taken (prompt,
    observations, padding). Position t of the model predicts token t+1, as in a causal LM loss.
    ``loss_agg``: ``token_mean`` weighs every labelled token 1 (the sum is the token count);
    ``turn_mean`` weighs each token 1/len(its turn) (:func:`turn_weights`; the sum is the turn count).
    The lm_head runs only on the positions whose next token is labelled
    (:func:`training.models.policy_models.sequence_logprobs`), so a 262k vocabulary never yields (B, T, V)
    logits. prefix (B, T, H), prefix_depth: start above the frozen layers (:mod:`training.models.frozen_prefix`).
    Returns (nll_sum () float32, weight_sum () float32).
    """
    targets = labels[:, 1:] != -100  # (B, T-1)
    weights = turn_weights(targets) if loss_agg == "turn_mean" else targets.float()
    logp, _ = sequence_logprobs(model, input_ids, attention_mask, chunk=chunk, target_mask=targets.long(),
                                prefix=prefix, prefix_depth=prefix_depth)
    return -(logp * weights).sum(), weights.sum()


class ModelTokenLossSFTTrainer(SFTTrainer):
    """TRL's SFTTrainer with the loss computed by :func:`model_token_nll`, without materialising
    logits for unlabelled positions. ``token_mean``: the token-mean cross-entropy over the whole
    accumulated batch when the Trainer passes ``num_items_in_batch``; ``turn_mean``: each
    micro-batch's mean over its turns, divided by the accumulation steps. Either way the loss is
    already scaled for gradient accumulation (``loss_is_scaled_for_ga``)."""

    prefix_cache: PrefixCache | None = None  # cache_frozen_layers: set by build_trainer when layers are frozen
    loss_agg: str = "token_mean"  # set by build_trainer from the config
    loss_is_scaled_for_ga = True  # type: ignore[assignment]  # trl's _BaseTrainer leaves it unannotated (None)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        prefix: dict[str, Any] = {}  # model_token_nll's prefix and prefix_depth
        if self.prefix_cache is not None:  # the frozen bottom layers run once per distinct row, not per epoch
            prefix = {"prefix": self.prefix_cache.prefix(model, inputs["input_ids"], inputs["attention_mask"]),
                      "prefix_depth": self.prefix_cache.depth}
        nll, weight = model_token_nll(model, inputs["input_ids"], inputs["attention_mask"], inputs["labels"],
                                      loss_agg=self.loss_agg, **prefix)
        if self.loss_agg == "token_mean" and num_items_in_batch is not None:
            denominator = num_items_in_batch  # labelled tokens of the whole accumulated batch
        else:
            denominator = weight.clamp(min=1) * getattr(self, "current_gradient_accumulation_steps", 1)
        if hasattr(denominator, "to"):
            denominator = denominator.to(nll.device)
        loss = nll / denominator
        if return_outputs:
            return loss, {"loss": loss}
        return loss


def _checkpointing(enabled: bool) -> dict:
    """Activation checkpointing under its current name (``gradient_checkpointing`` before transformers 5)."""
    fields = getattr(transformers.TrainingArguments, "__dataclass_fields__", {})
    return {"activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing": enabled}


def merge_adapter(adapter_dir: Path, out_dir: Path, base: str, tokenizer: Any, base_model: Any = None) -> Path:
    """Load ``base`` (a model spec) with the LoRA adapter in ``adapter_dir``, merge it, save a plain HF folder."""
    base_model = base_model if base_model is not None else load_causal_lm(base, device="cpu", dtype="float32")
    merged = PeftModel.from_pretrained(base_model, str(adapter_dir)).merge_and_unload()
    _save_model(merged, tokenizer, Path(out_dir))
    return Path(out_dir)


def _dev_examples(dev_records: Sequence[dict], limit: int | None) -> list[QAExample]:
    seen, examples = set(), []
    for record in dev_records:
        if record["id"] not in seen:
            seen.add(record["id"])
            examples.append(example_of(record))
    return examples[:limit] if limit else examples


