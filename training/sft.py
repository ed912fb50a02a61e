"""SFT warm start of the SEEDS-R1 policy (paper appendix E.2), with TRL's ``SFTTrainer``.

Three stages, each usable alone:

1. **Collect** trajectories in the SEEDS-R1 protocol (one JSONL record per episode):

   - the *scripted teacher* (:mod:`training.teachers.scripted_teacher`), no LLM, which never uses the
     gold answer: it searches the question (later, only a title it was shown), opens random
     candidates (``teacher.expand="random"``, the default: the protocol is taught, WHICH
     candidates to open is left to PPO; ``"positives"`` opens the gold-labelled positives and is
     gold-guided) and answers by a reader rule over what it opened (``teacher.reader``,
     default ``first_title``; ``unknown`` when it opened nothing). Short templated ``<think>``
     texts precede each action. Runs through :class:`SearchVectorEnv`.
   - the *method teacher* (:func:`collect_with_method`): a registered method (``seeds-react``
     or ``seeds-r1``, whose env actions are the SEEDS-R1 protocol) behind any backend spec, run by
     :mod:`methods.runner`; its env traces are rewritten as SEEDS-R1 trajectories.

2. **Filter and split**: :func:`acceptance` keeps an episode when the protocol was followed (no
   invalid action, every search followed by an expand, ended with an answer) AND the answer is
   exactly right or a gold answer appeared in some observation; :func:`split_train_dev` makes a
   seeded 90/10 split (``dev.fraction``). With ``teacher.target_accepted`` the collection stops once that many are
   accepted (:func:`training.warm_start.sft_collect.collect_until_accepted`). The acceptance rate is
   printed and written to ``acceptance.json`` and ``sft_summary.json``.

3. **Train** (:func:`train_sft`): every record becomes ``input_ids`` + ``labels`` in the exact
   token layout of :mod:`training.rollouts.rollout` (:func:`tokenize_trajectory`): prompt ids from
   ``tokenizer(prompt, add_special_tokens=True)``, model segments with
   ``add_special_tokens=False`` (loss on them, closing tags included), observations as
   ``"\\n" + observation + "\\n"`` (no loss), and the EOS after the final answer (loss on it).
   After each epoch :class:`DevEMCallback` runs the current model greedily over the dev
   questions (:func:`training.rollouts.rollout.collect_rollouts`) and saves it when its dev EM is the
   best so far; the best one is returned as a Hugging Face folder (LoRA merged on request).

Acceptance, the split and the token layout live in :mod:`training.teachers.trajectories`; the
collection stage in :mod:`training.warm_start.sft_collect`; the settings in :mod:`training.sft_config` (its
sections: :mod:`training.sft_sections`).
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
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script (accelerate launch training/sft.py)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml

from envs.atomic import write_jsonl_atomic, write_text_atomic
from envs.data import load_questions
from envs.typed_config import from_dict, merge_values
from envs.types import QAExample
from inference.models import load_tokenizer
from training.config import ConfigError, LoraSettings, PPOConfig, help_text, load_config
from training.sft_config import SFTDataSettings, SFTModelSettings, SFTRunSettings, WarmStartConfig
from training.teachers.trajectories import acceptance, split_train_dev
from training.warm_start import warm_start_cache
from training.warm_start.sft_collect import (
    acceptance_line,
    acceptance_stats,
    collect,
    collect_until_accepted,
    load_retriever,
    read_jsonl,
)
from training.warm_start.sft_trainer import build_trainer, dev_em, merge_adapter, model_token_nll, train_sft

log = logging.getLogger("training.sft")

# build_trainer, dev_em, merge_adapter, model_token_nll and train_sft live in training.warm_start.sft_trainer
__all__ = ["WarmStartConfig", "acceptance_stats", "build_trainer", "collect", "collect_until_accepted", "dev_em",
           "load_retriever", "merge_adapter", "model_token_nll", "read_jsonl", "run", "train_sft", "warm_start"]



# ================================================================================ pipeline

def load_examples(config: WarmStartConfig) -> list[QAExample]:
    """The questions to collect on: ``config.data.path`` (a split of it) or generated default questions."""
    data = config.data
    return load_questions(data.path, split=data.split, limit=data.num_questions, seed=data.question_seed)


def load_policy_tokenizer(config: WarmStartConfig) -> Any:
    return load_tokenizer(config.model.name)


def run(config: WarmStartConfig, collect_only: bool = False, retriever: Any = None, model: Any = None,
        tokenizer: Any = None, examples: Sequence[QAExample] | None = None, llm: Any = None,
        cache: bool = False) -> dict:
    """The whole warm start: collect (or read ``config.teacher.trajectories``), filter, split, train.

    Writes into ``run.output_dir``: ``config.yaml`` (resolved), ``trajectories.jsonl`` (all, with the
    acceptance verdicts), ``train.jsonl`` / ``dev.jsonl`` (accepted, split), ``acceptance.json``
    (acceptance rate, rejection reasons, questions used, whether ``teacher.target_accepted`` was reached),
    then the model (``model/``; ``adapter/`` too with LoRA) and ``sft_summary.json``. The envs of
    the collection count observation caps in the policy's tokens (``tokenizer``, else
    ``config.model.name``'s). ``cache``: take ``model/`` (and ``adapter/``) from an earlier warm start of
    the same config, records, code and versions, or keep this one for later runs
    (:mod:`training.warm_start.warm_start_cache`; the summary then names the entry as ``reused_from``).
    """
    out = Path(config.run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(yaml.safe_dump(config.to_dict(), sort_keys=False), out / "config.yaml")
    if config.teacher.trajectories:
        records = read_jsonl(config.teacher.trajectories)
        for record in records:  # re-judge with this code's filter
            record["accepted"], record["reason"] = acceptance(record)
        progress: dict = {"trajectories_file": config.teacher.trajectories}
    else:
        retriever = retriever if retriever is not None else load_retriever(config)
        examples = list(examples) if examples is not None else load_examples(config)
        policy_tokenizer = tokenizer if tokenizer is not None else load_policy_tokenizer(config)
        started = time.perf_counter()
        records, progress = collect_until_accepted(config, examples, retriever, tokenizer=policy_tokenizer, llm=llm)
        log.info("collected %d trajectories in %.1fs", len(records), time.perf_counter() - started)
        write_jsonl_atomic(records, out / "trajectories.jsonl")
    stats = {**acceptance_stats(records), **progress}
    train, dev = split_train_dev([r for r in records if r["accepted"]], config.dev.fraction, config.run.seed)
    write_jsonl_atomic(train, out / "train.jsonl")
    write_jsonl_atomic(dev, out / "dev.jsonl")
    stats.update(train=len(train), dev=len(dev))
    write_text_atomic(json.dumps(stats, indent=2), out / "acceptance.json")
    print(acceptance_line(stats), flush=True)
    if collect_only:
        return {"trajectories": str(out / "trajectories.jsonl"), **stats}
    key = warm_start_cache.warm_start_key(config, train, dev) if cache else None
    summary = warm_start_cache.restore_warm_start(key, out) if key else None
    if summary is not None:
        print(f"[sft] reused the warm start trained from the same inputs: {summary['reused_from']}", flush=True)
        return {**summary, **stats}
    if retriever is None and config.dev.enabled and dev:
        retriever = load_retriever(config)
    summary = train_sft(train, dev, config, model=model, tokenizer=tokenizer, retriever=retriever, collection=stats)
    if key:
        warm_start_cache.store_warm_start(key, out, summary)
    return {**summary, **stats}


# ================================================================================ PPO entry

def warm_start_config(ppo_cfg: PPOConfig) -> WarmStartConfig:
    """The :class:`WarmStartConfig` of a PPO run's automatic warm start.

    Composed from the PPO config's sections: the ``model`` section from ``model.name``, ``model.dtype``,
    ``model.cache_frozen_layers`` and the ``model.lora`` section itself (a LoRA PPO run gets a LoRA warm
    start on the same layers, merged; a full one a full fine-tune; ``warm_start.lora`` overrides its keys),
    with ``warm_start.device``, ``merge_lora`` and ``gradient_checkpointing``; the ``data`` section from
    ``data.index``, ``data.corpus``, ``data.retriever`` and ``warm_start.num_questions``; ``env``
    (resolved); ``run.seed`` and ``run.output_dir`` (the warm start goes into ``<output_dir>/sft``); and
    the ``warm_start`` section's own ``teacher``, ``train`` and ``dev`` sections as they are (defaults:
    the quick CPU warm start's; ``--warm_start.train.epochs 1``).
    """
    warm, model, data = ppo_cfg.warm_start, ppo_cfg.model, ppo_cfg.data
    lora = from_dict(LoraSettings, merge_values(dataclasses.asdict(model.lora), warm.lora))
    return WarmStartConfig(
        model=SFTModelSettings(name=str(model.name), dtype=str(model.dtype), device=warm.device, lora=lora,
                               merge_lora=warm.merge_lora, gradient_checkpointing=warm.gradient_checkpointing,
                               cache_frozen_layers=model.cache_frozen_layers),
        data=SFTDataSettings(num_questions=warm.num_questions, index=data.index, corpus=data.corpus,
                             retriever=data.retriever),
        env=dataclasses.asdict(ppo_cfg.env), teacher=warm.teacher, train=warm.train, dev=warm.dev,
        run=SFTRunSettings(output_dir=str(Path(ppo_cfg.run.output_dir) / "sft"), seed=int(ppo_cfg.run.seed)))


def warm_start(ppo_cfg: PPOConfig, retriever: Any = None, model: Any = None, tokenizer: Any = None,
               examples: Sequence[QAExample] | None = None) -> str:
    """Run the warm start of :func:`warm_start_config` (collect, filter, split, train); returns
    the Hugging Face folder of the warm-started policy (LoRA merged). ``examples``: the questions
    to collect on (the PPO trainer passes its TRAINING questions, so the warm start never sees a
    held-out one); None: the config's own."""
    config = warm_start_config(ppo_cfg)
    if retriever is None:
        retriever = load_retriever(config)
    if examples is not None and config.data.num_questions:
        examples = list(examples)[:config.data.num_questions]
    result = run(config, retriever=retriever, model=model, tokenizer=tokenizer, examples=examples,
                 cache=ppo_cfg.warm_start.cache and warm_start_cache.usable())
    return result["model_dir"]


# ================================================================================ CLI

USAGE = """python -m training.sft [--config recipe.yaml] [--section.field value ...] [--collect-only]

Any WarmStartConfig field is a --section.field (--train.epochs 1, --model.lora.enabled true, \
--run.output_dir runs/sft, --env.candidates_per_search 3);
values are YAML scalars. --collect-only writes the trajectories and stops; --teacher.trajectories FILE
trains from an existing trajectory file. The flat flags of earlier versions (--epochs 1) still work,
with a deprecation line (training.sft_sections.OLD_SFT_KEYS)."""


def resolve_config(argv: list[str] | None = None) -> tuple[WarmStartConfig, argparse.Namespace]:
    """Defaults < ``--config`` YAML < ``--section.field value`` overrides (the PPO trainer's convention,
    :func:`training.config.load_config`); ``--collect-only`` is the one flag that is not a field."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(USAGE + "\n\n" + help_text(WarmStartConfig))
        raise SystemExit(0)
    collect_only = "--collect-only" in argv or "--collect_only" in argv
    argv = [a for a in argv if a not in ("--collect-only", "--collect_only")]
    try:
        config = load_config(WarmStartConfig, argv)
    except (ConfigError, ValueError, TypeError) as err:
        raise SystemExit(f"training.sft: {err}") from err
    return config, argparse.Namespace(collect_only=collect_only)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config, args = resolve_config(argv)
    result = run(config, collect_only=args.collect_only)
    print(json.dumps({k: v for k, v in result.items() if k != "log_history"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
