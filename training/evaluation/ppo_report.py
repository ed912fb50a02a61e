"""What a PPO run shows and writes: greedy evaluations with the before/after comparison, the
per-update log line, ``metrics.jsonl``, ``samples.jsonl`` and the W&B sample table."""
from __future__ import annotations

import json
from pathlib import Path

from envs.atomic import write_json_atomic
from envs.protocol import judge_token_ids
from envs.question_match import question_digest
from envs.vector_env import SearchVectorEnv
from training.config import RolloutSettings, RunSettings
from training.evaluation.answer_sources import ANSWER_SHARE_KEYS, ANSWER_SOURCES, answer_shares
from training.evaluation.policy_eval import (
    compare_runs,
    gather_lists,
    gather_outcomes,
    question_outcomes,
    verdict_ranking,
    verdict_scores,
)
from training.rollouts.rollout import RolloutConfig, collect_rollouts, rollout_stats
from training.runtime.distributed import reduce_mean

# Metrics averaged over processes (rollout_stats keys plus the trainer's).
ROLLOUT_KEYS = ("reward_mean", "reward_std", "em", "f1", "precision", "recall", "fallout",
                "docs_read_per_question", "docs_shown_per_question", "positives_shown_per_question",
                "searches_per_question", "actions_per_question",
                "invalid_per_question", "model_tokens_mean", "episode_tokens_mean", "finish/answer",
                "finish/action_limit", "finish/context_limit", "finish/error")
SAMPLE_COLUMNS = ("update", "question", "reward", "finish", "text")
# the greedy held-out evaluation's figures logged every ``eval_every`` updates as eval/<key> (curves.png)
PERIODIC_EVAL_KEYS = ("reward_mean", "em", "precision", "recall", "docs_read_per_question", "verdict_auc")


def greedy_rollout_config(rollout: RolloutSettings, seed: int, verdict_cut: str = "level") -> RolloutConfig:
    """How the trainer evaluates: greedy, one episode per question, the run's turn and context limits
    (its ``rollout`` section), its seed and the evaluation's ``verdict_cut``."""
    return RolloutConfig(max_turn_tokens=rollout.max_turn_tokens, max_context_tokens=rollout.max_context_tokens,
                         temperature=0.0, samples_per_question=1, seed=seed,
                         constrain_verdicts=rollout.constrain_verdicts, verdict_cut=verdict_cut)


def evaluate_policy(backend, retriever, env_config, examples: list, rollout: RolloutSettings, seed: int, accelerator,
                    prompt_fn, tokenizer=None, verdict_cut: str = "level") -> tuple[dict, dict]:
    """Greedy episodes on held-out questions (each process its shard; the ``rollout`` section's envs and
    limits, the run's ``seed``, verdicts cut by ``verdict_cut``) -> (rollout_stats averaged over processes,
    per-question outcomes of ALL questions in order, for the paired bootstrap)."""
    indices = list(range(accelerator.process_index, len(examples), accelerator.num_processes))
    shard = [examples[i] for i in indices]
    stats = {k: 0.0 for k in ROLLOUT_KEYS + ANSWER_SHARE_KEYS}
    episodes = []
    if shard:
        venv = SearchVectorEnv(retriever, num_envs=min(rollout.num_envs, len(shard)), config=env_config,
                               tokenizer=tokenizer)
        episodes = collect_rollouts(backend, venv, shard, greedy_rollout_config(rollout, seed, verdict_cut), prompt_fn,
                                    progress="eval" if accelerator.is_local_main_process else None)
        found = rollout_stats(episodes)
        stats.update({k: found.get(k, 0.0) for k in ROLLOUT_KEYS})
        stats.update(answer_shares([e.info for e in episodes]))  # where the answers came from (reader_study)
    outcomes = gather_outcomes(accelerator, question_outcomes(episodes), indices, len(examples))
    stats = reduce_mean(accelerator, stats)
    judged_alone = tokenizer is not None and any(e.verdict_rows for e in episodes)
    pairs = gather_lists(accelerator, verdict_scores(episodes, judge_token_ids(tokenizer)[0]) if judged_alone else [])
    if pairs:  # the judgement form judged alone: how the verdicts rank, whatever greedy opens
        stats.update(verdict_ranking(pairs))
    return stats, outcomes


def sampled_verdict_auc(episodes: list, tokenizer) -> float:
    """The AUC of π(yes) for the candidates' labels over the sampled verdicts judged alone of an
    update's rollouts (how the verdicts rank, apart from what was sampled); NaN without such verdicts."""
    if tokenizer is None or not any(getattr(e, "verdict_rows", None) for e in episodes):
        return float("nan")
    pairs = verdict_scores(episodes, judge_token_ids(tokenizer)[0])
    return verdict_ranking(pairs)["verdict_auc"] if pairs else float("nan")


def periodic_evaluation_due(eval_every: int, updates: int, update: int) -> bool:
    """Whether update ``update`` (0-based) of ``updates`` ends with a greedy held-out evaluation (every
    ``eval_every``); the last update never does: the evaluation after PPO is that one."""
    return eval_every > 0 and (update + 1) % eval_every == 0 and update + 1 < updates


def periodic_stats(stats: dict) -> dict[str, float]:
    """A greedy evaluation's figures as the ``eval/<key>`` entries of an update's metrics."""
    return {f"eval/{key}": float(stats[key]) for key in PERIODIC_EVAL_KEYS if key in stats}


def report_before_after(accelerator, out: Path, eval_start: dict, eval_end: dict, outcomes_start: dict,
                        outcomes_end: dict, seed: int, questions: list[str] | None = None) -> dict:
    """Print the greedy before/after metrics with paired bootstrap 95% intervals of the
    differences, and write ``eval.json``; returns what was written. ``questions``: the held-out
    questions' texts in evaluation order, kept as digests (``question_digests``) so that runs pooled
    question by question (``training.seed_spread``) can be checked to hold the same questions."""
    comparison = compare_runs(outcomes_start, outcomes_end, seed=seed)
    n = len(outcomes_start["reward"])
    accelerator.print(f"[ppo] greedy evaluation on {n} held-out questions, before -> after PPO "
                      f"(after − before, paired bootstrap 95% interval):")
    for name, row in comparison.items():
        accelerator.print(f"[ppo]   {name:9s} {row['before']:.3f} -> {row['after']:.3f}  "
                          f"diff {row['diff']:+.3f} [{row['lo']:+.3f}, {row['hi']:+.3f}]")
    accelerator.print(f"[ppo]   documents read per question {eval_start['docs_read_per_question']:.2f} -> "
                      f"{eval_end['docs_read_per_question']:.2f}")
    if "verdict_auc" in eval_start and "verdict_auc" in eval_end:
        accelerator.print("[ppo]   verdicts: π(yes) positives / negatives "
                          f"{eval_start['yes_prob_positive']:.3f} / {eval_start['yes_prob_negative']:.3f} -> "
                          f"{eval_end['yes_prob_positive']:.3f} / {eval_end['yes_prob_negative']:.3f}, AUC "
                          f"{eval_start['verdict_auc']:.3f} -> {eval_end['verdict_auc']:.3f} "
                          f"({eval_end['verdicts']:.0f} verdicts)")
    if all(k in eval_start and k in eval_end for k in ANSWER_SHARE_KEYS):
        accelerator.print("[ppo]   answers: " + ", ".join(
            f"{k.replace('_', ' ')} {eval_start['answers_' + k]:.2f} -> {eval_end['answers_' + k]:.2f}"
            for k in ANSWER_SOURCES))
    report = {"before": eval_start, "after": eval_end, "questions": n, "comparison": comparison,
              "per_question": {"before": {k: v.tolist() for k, v in outcomes_start.items()},
                               "after": {k: v.tolist() for k, v in outcomes_end.items()}}}
    if questions is not None:
        report["question_digests"] = [question_digest(q) for q in questions]
    if accelerator.is_main_process:
        write_json_atomic(report, out / "eval.json")
    return report


def format_update_stats(stats: dict[str, float]) -> str:
    """The short per-update log line: reward, EM, precision, KL, entropy, clipping, critic, speed."""
    names = [("reward_mean", "R", ".3f"), ("em", "EM", ".2f"), ("precision", "prec", ".2f"),
             ("kl", "KL", ".4f"), ("entropy", "H", ".2f"), ("clip_frac", "clip", ".3f"),
             ("value_loss", "VL", ".4f"), ("explained_variance", "EV", ".2f"),
             ("sampler_logp_gap", "|dlogp|", ".4f"), ("tokens_per_s", "tok/s", ".0f")]
    return " ".join(f"{short} {stats[key]:{spec}}" for key, short, spec in names if key in stats)


def log_sample_table(accelerator, samples: list[dict], step: int) -> None:
    """The update's sample trajectories as a W&B table (``samples``), next to the scalar metrics."""
    import wandb  # optional extra: only with report_to: wandb

    tracker = accelerator.get_tracker("wandb", unwrap=True)
    table = wandb.Table(columns=list(SAMPLE_COLUMNS), data=[[s[c] for c in SAMPLE_COLUMNS] for s in samples])
    tracker.log({"samples": table}, step=step)


def episode_turns(episode, tokenizer) -> list[list[list[str]]]:
    """The episode after its prompt as turns, each a list of ``[source, text]`` pieces in order:
    ``"model"`` for sampled tokens (loss mask 1), ``"env"`` for text the model did not write
    (observations, a forced ``<answer>`` opening)."""
    turns: dict[int, list[list]] = {}
    for position in range(episode.prompt_length, len(episode.token_ids)):
        source = "model" if episode.loss_mask[position] else "env"
        pieces = turns.setdefault(episode.turn_ids[position], [])
        if pieces and pieces[-1][0] == source:
            pieces[-1][1].append(episode.token_ids[position])
        else:
            pieces.append([source, [episode.token_ids[position]]])
    return [[[source, tokenizer.decode(ids, skip_special_tokens=False)] for source, ids in turns[t]]
            for t in sorted(turns)]


def sample_record(episode, update: int, tokenizer) -> dict:
    """One line of ``samples.jsonl``: the W&B columns (``SAMPLE_COLUMNS``), the env's episode
    summary (question, golds, answer, metrics, reward breakdown, searches with candidates) and the
    turns (:func:`episode_turns`), which ``python -m inference.view`` shows."""
    completion = tokenizer.decode(episode.token_ids[episode.prompt_length:], skip_special_tokens=False)
    return {"update": update, "question": episode.example_id, "reward": episode.reward,
            "finish": episode.finish_reason, "text": completion, "episode": episode.info,
            "turns": episode_turns(episode, tokenizer)}


def write_update_logs(out: Path, stats: dict, episodes: list, tokenizer, settings: RunSettings, accelerator,
                      write) -> None:
    """Main process: append the update's metrics to ``metrics.jsonl`` and its first ``log_samples``
    episodes (of the ``run`` section, ``settings``) to ``samples.jsonl`` (and W&B), and ``write`` a line about each."""
    update = int(stats["update"])
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(stats) + "\n")
    samples = []
    with open(out / "samples.jsonl", "a", encoding="utf-8") as handle:
        for e in episodes[:settings.log_samples]:
            sample = sample_record(e, update, tokenizer)
            samples.append(sample)
            handle.write(json.dumps(sample, ensure_ascii=False) + "\n")
            write(f"  sample [{e.example_id}] reward {e.reward:.2f} ({e.finish_reason}): {sample['text'][-400:]!r}")
    if settings.report_to == "wandb" and samples:
        log_sample_table(accelerator, samples, step=update)
