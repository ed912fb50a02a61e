"""A finished run's two greedy evaluations played again under another verdict cut.

    python -m training.reevaluate RUN_DIR --verdict_cut snapshot_mean [--out DIR]

The trainer evaluates its warm start before PPO and its policy after it, greedy, with the cut its
``evaluation.verdict_cut`` names (:func:`envs.protocol.cut_verdicts`). Under the default ``level`` a
candidate is opened when its own π(yes) > 0.5, so a drift of the yes level that all candidates share
decides what is opened as much as the ranking does; ``snapshot_mean`` opens the candidates above their
snapshot's mean π(yes). This plays a finished run's warm start (its ``model.sft_checkpoint``) and its
export (``final_hf``, or ``--after``) on the run's held-out questions, with the run's env, limits and
seed, under the cut asked for, and reports the change as the trainer does (the same paired bootstrap,
the same printout). It writes ``<out>/config.yaml`` (the run's, with the cut) and ``<out>/eval.json``
(:func:`training.evaluation.ppo_report.report_before_after`), so ``python -m training.seed_spread``
pools such folders like run folders. Default ``--out``: ``RUN_DIR/recut-<cut>``. The last line is the
trainer's (:func:`training.evaluation.policy_eval.result_line`).

Only runs whose verdicts are judged alone, constrained to yes/no, can be cut another way; others are
refused with the reason. Nothing is trained and the run folder itself is not changed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from accelerate import Accelerator

from envs.config import EnvConfig
from envs.protocol import VERDICT_CUTS
from envs.typed_config import ConfigError, load_config, save_resolved, with_values
from inference.backends.hf import HFBackend
from inference.models import load_causal_lm, load_tokenizer
from training.config import ModelSettings, PPOConfig, RolloutSettings
from training.evaluation.policy_eval import result_line
from training.evaluation.ppo_report import evaluate_policy, report_before_after
from training.runtime.cpu_threads import use_all_cores
from training.runtime.inputs import load_retriever, load_train_and_held_out
from training.seed_spread import RunFolderError
from training.teachers.trajectories import seeds_r1_prompt_fn


def recut_config(folder: Path, verdict_cut: str) -> PPOConfig:
    """The run's resolved config (``folder/config.yaml``) with ``evaluation.verdict_cut`` set; refuses a
    run folder this version cannot read, or whose verdicts cannot be cut another way."""
    path = Path(folder) / "config.yaml"
    if not path.is_file():
        raise RunFolderError(f"{path}: no config.yaml (not a training.ppo run folder)")
    try:
        cfg = with_values(load_config(PPOConfig, ["--config", str(path)]), {"evaluation.verdict_cut": verdict_cut})
    except (ConfigError, TypeError, ValueError) as error:
        raise RunFolderError(f"{path}: not a PPO config this version reads with verdict_cut {verdict_cut!r} "
                             f"({error})") from error
    if not cfg.env.judge_form.alone:
        raise RunFolderError(f"{path}: its verdicts are not judged alone (env judge_context), so there is no "
                             f"snapshot of verdicts to cut")
    return cfg


def policy_folders(folder: Path, model: ModelSettings, after: str | None) -> tuple[Path, Path]:
    """(the warm start's weights, the trained policy's weights): the run's ``model.sft_checkpoint`` and
    ``final_hf`` (or ``after``); refuses a folder that is not there."""
    if not model.sft_checkpoint:
        raise RunFolderError(f"{folder}: its config names no model.sft_checkpoint (the weights before PPO)")
    before, trained = Path(model.sft_checkpoint), Path(after) if after else Path(folder) / "final_hf"
    for path in (before, trained):
        if not (path / "config.json").is_file():
            raise RunFolderError(f"{path}: no Hugging Face model folder there (config.json)")
    return before, trained


def evaluate_folder(weights: Path, model: ModelSettings, rollout: RolloutSettings, env_config: EnvConfig,
                    seed: int, verdict_cut: str, retriever, held_out: list, accelerator) -> tuple[dict, dict]:
    """The trainer's greedy evaluation (:func:`training.evaluation.ppo_report.evaluate_policy`) of the
    model in ``weights`` (loaded as the run's ``model`` section says) with the run's rollout limits, env
    and seed, its verdicts cut by ``verdict_cut``."""
    tokenizer = load_tokenizer(str(weights))
    lm = load_causal_lm(str(weights), device=str(accelerator.device), dtype=model.dtype,
                        trust_remote_code=model.trust_remote_code)
    backend = HFBackend(lm, tokenizer, max_batch_size=rollout.rollout_batch_size,
                        max_context=rollout.max_context_tokens + 1)
    return evaluate_policy(backend, retriever, env_config, held_out, rollout, seed, accelerator,
                           seeds_r1_prompt_fn(env_config), tokenizer, verdict_cut=verdict_cut)


def reevaluate(folder: Path, verdict_cut: str, out: Path | None = None, after: str | None = None,
               retriever=None, held_out: list | None = None, accelerator=None) -> dict:
    """Play the run's weights before and after PPO again under ``verdict_cut``; write and return the
    report (``out``: default ``folder/recut-<cut>``)."""
    cfg = recut_config(folder, verdict_cut)
    before, trained = policy_folders(folder, cfg.model, after)
    out = Path(out) if out is not None else Path(folder) / f"recut-{verdict_cut}"
    if accelerator is None:
        accelerator = Accelerator()
        use_all_cores(accelerator.device)
    if retriever is None or held_out is None:
        retriever = load_retriever(cfg.data) if retriever is None else retriever
        held_out = load_train_and_held_out(cfg.data, cfg.evaluation)[1] if held_out is None else held_out
    out.mkdir(parents=True, exist_ok=True)
    save_resolved(cfg, out)
    sides = [evaluate_folder(weights, cfg.model, cfg.rollout, cfg.env, cfg.run.seed, verdict_cut, retriever, held_out,
                             accelerator) for weights in (before, trained)]
    (stats_before, outcomes_before), (stats_after, outcomes_after) = sides
    accelerator.print(f"[reevaluate] {folder}: {before} -> {trained}, verdict_cut {verdict_cut}")
    return report_before_after(accelerator, out, stats_before, stats_after, outcomes_before, outcomes_after,
                               cfg.run.seed, [example.question for example in held_out])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a finished training.ppo run folder")
    parser.add_argument("--verdict_cut", choices=VERDICT_CUTS, default="snapshot_mean",
                        help="how greedy decoding opens from the verdicts (envs.protocol.cut_verdicts)")
    parser.add_argument("--out", type=Path, help="where config.yaml and eval.json go (default RUN_DIR/recut-CUT)")
    parser.add_argument("--after", help="the trained policy's folder (default RUN_DIR/final_hf)")
    args = parser.parse_args(argv)
    try:
        report = reevaluate(args.run_dir, args.verdict_cut, args.out, args.after)
    except RunFolderError as error:
        print(f"training.reevaluate: {error}", file=sys.stderr)
        return 2
    print(result_line(report["comparison"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
