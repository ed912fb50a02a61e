"""SFT warm start of the SEEDS-R1 policy (paper appendix E.2), with TRL's ``SFTTrainer``.

Three stages, each usable alone:

1. **Collect** trajectories in the SEEDS-R1 protocol (one JSONL record per episode):

   - the *scripted teacher* (:mod:`training.scripted_teacher`), no LLM, which never uses the
     gold answer: it searches the question (later, only a title it was shown), opens random
     candidates (``teacher_expand="random"``, the default: the protocol is taught, WHICH
     candidates to open is left to PPO; ``"positives"`` opens the gold-labelled positives and is
     gold-guided) and answers by a reader rule over what it opened (``teacher_reader``,
     default ``first_title``; ``unknown`` when it opened nothing). Short templated ``<think>``
     texts precede each action. Runs through :class:`SearchVectorEnv`.
   - the *method teacher* (:func:`collect_with_method`): a registered method (``seeds-react``
     or ``seeds-r1``, whose env actions are the SEEDS-R1 protocol) behind any backend spec, run by
     :mod:`methods.runner`; its env traces are rewritten as SEEDS-R1 trajectories.

2. **Filter and split**: :func:`acceptance` keeps an episode when the protocol was followed (no
   invalid action, every search followed by an expand, ended with an answer) AND the answer is
   exactly right or a gold answer appeared in some observation; :func:`split_train_dev` makes a
   seeded 90/10 split. With ``target_accepted`` the collection stops once that many are
   accepted (:func:`training.sft_collect.collect_until_accepted`). The acceptance rate is
   printed and written to ``acceptance.json`` and ``sft_summary.json``.

3. **Train** (:func:`train_sft`): every record becomes ``input_ids`` + ``labels`` in the exact
   token layout of :mod:`training.rollout` (:func:`tokenize_trajectory`): prompt ids from
   ``tokenizer(prompt, add_special_tokens=True)``, model segments with
   ``add_special_tokens=False`` (loss on them, closing tags included), observations as
   ``"\\n" + observation + "\\n"`` (no loss), and the EOS after the final answer (loss on it).
   After each epoch :class:`DevEMCallback` runs the current model greedily over the dev
   questions (:func:`training.rollout.collect_rollouts`) and saves it when its dev EM is the
   best so far; the best one is returned as a Hugging Face folder (LoRA merged on request).

Acceptance, the split and the token layout live in :mod:`training.trajectories`; the
collection stage in :mod:`training.sft_collect`; the settings in :mod:`training.sft_config`.
Every env built for the warm start counts observation caps in the policy's tokens.
Observation segments hold the env's observation as returned; the ``"\\n"`` around it is added
by the layout. Entry points: :func:`warm_start` (used by the PPO trainer), :func:`run` and the
CLI (``python -m training.sft --config configs/sft/default.yaml`` or through
``accelerate launch training/sft.py ...``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script (accelerate launch training/sft.py)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml

from envs.atomic import write_jsonl_atomic, write_text_atomic
from envs.config import EnvConfig
from envs.types import QAExample
from training.sft_collect import (
    acceptance_line,
    acceptance_stats,
    collect,
    collect_until_accepted,
    load_retriever,
    read_jsonl,
)
from training.sft_config import WarmStartConfig
from training.trajectories import acceptance, example_of, seeds_r1_prompt_fn, sft_rows, split_train_dev

log = logging.getLogger("training.sft")

__all__ = ["WarmStartConfig", "acceptance_stats", "collect", "collect_until_accepted", "load_retriever",
           "read_jsonl", "run", "train_sft", "warm_start"]



# ================================================================================ records

def dev_em(model: Any, tokenizer: Any, examples: Sequence[QAExample], retriever: Any,
           env_config: EnvConfig | None = None, num_envs: int = 16, max_turn_tokens: int = 256,
           max_context_tokens: int = 4096, seed: int = 0) -> dict[str, float]:
    """Greedy SEEDS-R1 rollouts of ``model`` over ``examples``: :func:`rollout_stats` (``em`` etc.)."""
    from envs.vector_env import SearchVectorEnv
    from inference.backends.hf import HFBackend
    from training.rollout import RolloutConfig, collect_rollouts, rollout_stats

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


def _dev_eval_callback_class():
    from transformers import TrainerCallback

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

    return DevEMCallback


def _save_model(model: Any, tokenizer: Any, folder: Path) -> None:
    """Save beside ``folder``, then rename into place (a reader never sees half a model)."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


# ================================================================================ training

def _load_for_training(config: WarmStartConfig) -> tuple[Any, Any]:
    from inference.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(config.model)
    model = load_causal_lm(config.model, device=config.device, dtype=config.dtype)
    model.train()
    return model, tokenizer


def train_sft(train_records: Sequence[dict], dev_records: Sequence[dict], config: WarmStartConfig,
              model: Any = None, tokenizer: Any = None, retriever: Any = None, collection: dict | None = None) -> dict:
    """SFT on accepted ``train_records``; dev EM after each epoch on ``dev_records``' questions.

    ``model``/``tokenizer``: an already loaded model (default: ``config.model``). ``retriever``
    is needed for the dev evaluation (skipped without one, or with ``dev_eval=False`` or no
    dev records; the final model is saved then). Returns ``{"model_dir", "best_epoch",
    "best_dev_em", "history", "train_loss"}``; ``model_dir`` is a Hugging Face folder.
    ``collection``: the collection's statistics (acceptance rate ...), kept in ``sft_summary.json``.
    """
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if model is None or tokenizer is None:
        model, tokenizer = _load_for_training(config)
    from inference.models import ensure_pad_token

    ensure_pad_token(tokenizer)
    rows = sft_rows([r for r in train_records if r.get("accepted", True)], tokenizer, config.max_length,
                    expand_form=(config.env or {}).get("expand_form", "list"), train_verdicts=config.train_verdicts)
    if not rows:
        raise ValueError("no accepted training trajectories")
    callbacks = []
    dev_examples = _dev_examples(dev_records, config.dev_limit)
    best_dir = out / ("adapter" if config.lora else "model")
    callback = None
    if config.dev_eval and dev_examples and retriever is not None:
        env_config = config.env_config()

        def evaluate(m: Any) -> dict:
            return dev_em(m, tokenizer, dev_examples, retriever, env_config, num_envs=config.eval_batch_size,
                          max_turn_tokens=config.eval_max_turn_tokens,
                          max_context_tokens=config.eval_max_context_tokens, seed=config.seed)

        callback = _dev_eval_callback_class()(evaluate, best_dir, tokenizer, eval_before=config.eval_before)
        callbacks.append(callback)
    trainer = build_trainer(rows, config, model, tokenizer, callbacks)
    result = trainer.train()
    if callback is None or callback.best_em is None:
        _save_model(trainer.model, tokenizer, best_dir)
    model_dir = best_dir
    if config.lora and config.merge_lora:
        model_dir = merge_adapter(best_dir, out / "model", base=config.model, tokenizer=tokenizer,
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
    }
    write_text_atomic(json.dumps(summary, indent=2, default=str), out / "sft_summary.json")
    return summary


def build_trainer(rows: Sequence[dict], config: WarmStartConfig, model: Any, tokenizer: Any,
                  callbacks: Sequence[Any] = ()) -> Any:
    """TRL ``SFTTrainer`` over pre-tokenized rows (``input_ids`` + ``labels``; TRL keeps the labels
    as given, so the loss is on model tokens only), full fine-tune or LoRA (``config.lora``); the
    loss is :func:`model_token_nll` (lm_head on labelled positions only)."""
    import torch
    from datasets import Dataset
    from trl import SFTConfig

    peft_config = None
    if config.lora:
        from peft import LoraConfig

        top = config.lora_top_layers
        n_layers = model.config.get_text_config().num_hidden_layers
        if top is not None and not 1 <= top <= n_layers:
            raise ValueError(f"lora_top_layers={top}: the model has {n_layers} decoder layers")
        peft_config = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                                 target_modules=config.lora_target_modules, task_type="CAUSAL_LM",
                                 layers_to_transform=list(range(n_layers - top, n_layers)) if top else None,
                                 layers_pattern="layers" if top else None)
    parameter = next(model.parameters())
    on_gpu = parameter.device.type == "cuda" or (torch.cuda.is_available() and config.device != "cpu")
    bf16 = bool(on_gpu and parameter.dtype == torch.bfloat16)
    args = SFTConfig(
        output_dir=str(Path(config.output_dir) / "trainer"), num_train_epochs=config.epochs,
        learning_rate=config.learning_rate, per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps, warmup_steps=float(config.warmup_ratio) if config.warmup_ratio < 1 else int(config.warmup_ratio),
        weight_decay=config.weight_decay, lr_scheduler_type="linear", logging_steps=config.logging_steps,
        save_strategy="no", eval_strategy="no", report_to=config.report_to, max_length=None, bf16=bf16, fp16=False,
        seed=config.seed, data_seed=config.seed,
        use_cpu=not on_gpu, remove_unused_columns=False, disable_tqdm=not config.progress, **_checkpointing(config.gradient_checkpointing),
    )
    trainer_class = _model_token_loss_trainer_class()
    return trainer_class(model=model, args=args, train_dataset=Dataset.from_list(list(rows)), processing_class=tokenizer,
                         peft_config=peft_config, callbacks=list(callbacks))


def model_token_nll(model: Any, input_ids: Any, attention_mask: Any, labels: Any, chunk: int = 1024) -> tuple[Any, Any]:
    """Summed negative log-likelihood of the labelled tokens, and how many there are.

    input_ids, attention_mask, labels: (B, T); labels are -100 where no loss is taken (prompt,
    observations, padding). Position t of the model predicts token t+1, as in a causal LM loss.
    The lm_head runs only on the positions whose next token is labelled
    (:func:`training.models.sequence_logprobs`), so a 262k vocabulary never yields (B, T, V)
    logits. Returns (nll_sum () float32, n_tokens () int64).
    """
    from training.models import sequence_logprobs

    targets = labels[:, 1:] != -100  # (B, T-1)
    logp, _ = sequence_logprobs(model, input_ids, attention_mask, chunk=chunk, target_mask=targets.long())
    return -(logp * targets).sum(), targets.sum()


def _model_token_loss_trainer_class():
    from trl import SFTTrainer

    class ModelTokenLossSFTTrainer(SFTTrainer):
        """TRL's SFTTrainer with the loss computed by :func:`model_token_nll`: the same token-mean
        cross-entropy over labelled tokens (over the whole accumulated batch when the Trainer
        passes ``num_items_in_batch``), without materialising logits for unlabelled positions."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            nll, count = model_token_nll(model, inputs["input_ids"], inputs["attention_mask"], inputs["labels"])
            denominator = num_items_in_batch if num_items_in_batch is not None else count.clamp(min=1)
            if hasattr(denominator, "to"):
                denominator = denominator.to(nll.device)
            loss = nll / denominator
            if return_outputs:
                return loss, {"loss": loss}
            return loss

    return ModelTokenLossSFTTrainer


def _checkpointing(enabled: bool) -> dict:
    """Activation checkpointing under its current name (``gradient_checkpointing`` before transformers 5)."""
    import transformers

    fields = getattr(transformers.TrainingArguments, "__dataclass_fields__", {})
    return {"activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing": enabled}


def merge_adapter(adapter_dir: Path, out_dir: Path, base: str, tokenizer: Any, base_model: Any = None) -> Path:
    """Load ``base`` (a model spec) with the LoRA adapter in ``adapter_dir``, merge it, save a plain HF folder."""
    from peft import PeftModel

    from inference.models import load_causal_lm

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


# ================================================================================ pipeline

def load_examples(config: WarmStartConfig) -> list[QAExample]:
    if config.data:
        from envs.data import load_qa

        return load_qa(config.data, split=config.split, limit=config.num_questions)
    from envs.default_questions import generate_default_questions

    return generate_default_questions(config.num_questions, seed=config.question_seed)


def load_policy_tokenizer(config: WarmStartConfig) -> Any:
    from inference.models import load_tokenizer

    return load_tokenizer(config.model)


def run(config: WarmStartConfig, collect_only: bool = False, retriever: Any = None, model: Any = None,
        tokenizer: Any = None, examples: Sequence[QAExample] | None = None, llm: Any = None) -> dict:
    """The whole warm start: collect (or read ``config.trajectories``), filter, split, train.

    Writes into ``output_dir``: ``config.yaml`` (resolved), ``trajectories.jsonl`` (all, with the
    acceptance verdicts), ``train.jsonl`` / ``dev.jsonl`` (accepted, split), ``acceptance.json``
    (acceptance rate, rejection reasons, questions used, whether ``target_accepted`` was reached),
    then the model (``model/``; ``adapter/`` too with LoRA) and ``sft_summary.json``. The envs of
    the collection count observation caps in the policy's tokens (``tokenizer``, else
    ``config.model``'s).
    """
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(yaml.safe_dump(config.to_dict(), sort_keys=False), out / "config.yaml")
    if config.trajectories:
        records = read_jsonl(config.trajectories)
        for record in records:  # re-judge with this code's filter
            record["accepted"], record["reason"] = acceptance(record)
        progress: dict = {"trajectories_file": config.trajectories}
    else:
        retriever = retriever if retriever is not None else load_retriever(config)
        examples = list(examples) if examples is not None else load_examples(config)
        policy_tokenizer = tokenizer if tokenizer is not None else load_policy_tokenizer(config)
        started = time.perf_counter()
        records, progress = collect_until_accepted(config, examples, retriever, tokenizer=policy_tokenizer, llm=llm)
        log.info("collected %d trajectories in %.1fs", len(records), time.perf_counter() - started)
        write_jsonl_atomic(records, out / "trajectories.jsonl")
    stats = {**acceptance_stats(records), **progress}
    train, dev = split_train_dev([r for r in records if r["accepted"]], config.dev_fraction, config.seed)
    write_jsonl_atomic(train, out / "train.jsonl")
    write_jsonl_atomic(dev, out / "dev.jsonl")
    stats.update(train=len(train), dev=len(dev))
    write_text_atomic(json.dumps(stats, indent=2), out / "acceptance.json")
    print(acceptance_line(stats), flush=True)
    if collect_only:
        return {"trajectories": str(out / "trajectories.jsonl"), **stats}
    if retriever is None and config.dev_eval and dev:
        retriever = load_retriever(config)
    summary = train_sft(train, dev, config, model=model, tokenizer=tokenizer, retriever=retriever, collection=stats)
    return {**summary, **stats}


# ================================================================================ PPO entry

# The quick warm start the PPO trainer runs when it is given no SFT checkpoint: LoRA (merged) when PPO uses LoRA,
# random expansions (the protocol is taught, the choice of candidates is left to PPO), no dev
# evaluation (the PPO trainer evaluates before and after). Sized for the 20-minute CPU default.
PPO_WARM_START = {
    "num_questions": 32, "teacher": "scripted", "teacher_expand": "random", "teacher_random_expand": 2,
    "lora_dropout": 0.0, "merge_lora": True, "epochs": 2,
    "learning_rate": 2e-4, "batch_size": 4, "warmup_ratio": 0.1, "max_length": 2048, "dev_eval": False,
    "eval_before": False,
}


def warm_start_config(ppo_cfg: Any) -> WarmStartConfig:
    """The :class:`WarmStartConfig` of a PPO run's automatic warm start.

    From the PPO config: ``model``, ``dtype``, ``seed``, ``index``, ``corpus``, the env (``env_config``
    recipe plus ``env`` overrides, resolved by :func:`training.ppo.load_env_config`), the LoRA
    settings (a LoRA PPO run gets a LoRA warm start, merged; a full one a full fine-tune), and ``output_dir`` (the warm start goes into ``<output_dir>/sft``). On top of
    :data:`PPO_WARM_START`, ``ppo_cfg.sft`` overrides any field (``--sft.epochs 1``).
    """
    from training.ppo import load_env_config

    values = dict(PPO_WARM_START)
    values.update(model=str(ppo_cfg.model), dtype=str(ppo_cfg.dtype), seed=int(ppo_cfg.seed), index=ppo_cfg.index,
                  corpus=ppo_cfg.corpus, retriever=getattr(ppo_cfg, "retriever", None),
                  output_dir=str(Path(ppo_cfg.output_dir) / "sft"),
                  env=dataclasses.asdict(load_env_config(ppo_cfg)),
                  lora=bool(ppo_cfg.lora.enabled), lora_r=int(ppo_cfg.lora.r), lora_alpha=int(ppo_cfg.lora.alpha),
                  lora_target_modules=list(ppo_cfg.lora.target_modules),
                  lora_top_layers=ppo_cfg.lora.top_layers)
    overrides = dict(getattr(ppo_cfg, "sft", None) or {})
    return WarmStartConfig.from_dict({**values, **overrides})


def warm_start(ppo_cfg: Any, retriever: Any = None, model: Any = None, tokenizer: Any = None,
               examples: Sequence[QAExample] | None = None) -> str:
    """Run the warm start of :func:`warm_start_config` (collect, filter, split, train); returns
    the Hugging Face folder of the warm-started policy (LoRA merged). ``examples``: the questions
    to collect on (the PPO trainer passes its TRAINING questions, so the warm start never sees a
    held-out one); None: the config's own."""
    config = warm_start_config(ppo_cfg)
    if retriever is None:
        retriever = load_retriever(config)
    if examples is not None and config.num_questions:
        examples = list(examples)[:config.num_questions]
    result = run(config, retriever=retriever, model=model, tokenizer=tokenizer, examples=examples)
    return result["model_dir"]


# ================================================================================ CLI

USAGE = """python -m training.sft [--config recipe.yaml] [--key value ...] [--collect-only]

Any WarmStartConfig field is a --key (--epochs 1, --lora true, --output_dir runs/sft, --env.top_k 3);
values are YAML scalars. --collect-only writes the trajectories and stops; --trajectories FILE trains
from an existing trajectory file."""


def resolve_config(argv: list[str] | None = None) -> tuple[WarmStartConfig, argparse.Namespace]:
    """Defaults < ``--config`` YAML < ``--key value`` overrides (the PPO trainer's convention,
    :func:`training.config.load_config`); ``--collect-only`` is the one flag that is not a field."""
    from training.config import ConfigError, help_text, load_config

    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(USAGE + "\n\n" + help_text(WarmStartConfig))
        raise SystemExit(0)
    collect_only = "--collect-only" in argv or "--collect_only" in argv
    argv = [a for a in argv if a not in ("--collect-only", "--collect_only")]
    try:
        config = load_config(WarmStartConfig, argv)
    except (ConfigError, ValueError, TypeError) as err:
        raise SystemExit(f"training.sft: {err}")
    return config, argparse.Namespace(collect_only=collect_only)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config, args = resolve_config(argv)
    result = run(config, collect_only=args.collect_only)
    print(json.dumps({k: v for k, v in result.items() if k != "log_history"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
