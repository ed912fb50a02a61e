"""Where the answer term goes: the scripted reader rules' table and what a policy's answers are.

    python scripts/run_reader_study.py                                          # the teacher table only (no model)
    python scripts/run_reader_study.py --model runs/ppo-default/sft/model      # + the warm start's answers
    python scripts/run_reader_study.py --model runs/ppo-default/final_hf -- --seed 3   # PPOConfig overrides after --

On the held-out questions of the PPO recipe (``--config``, default the main job's) in its env:
the scripted teacher with each expansion rule and reader rule (``training.studies.reader_study.teacher_table``),
then, with ``--model``, the policy's greedy episodes (as the trainer evaluates: constrained
verdicts, its turn and context limits) and where each answer came from
(``training.evaluation.answer_sources.answer_sources``), and its answers after the recipe's warm-start teacher's
own turns on the same questions (``training.studies.reader_study.forced_answers``: reading alone, whatever
its verdicts would open). Writes ``<out>/reader_study.json``; the last line is
``teacher_em=<EM of first_title at open_rate 0.5> policy_em=<x> first_opened=<share> question_copy=<share>
first_title_em=<EM had the policy answered with the first title it opened> forced_reads=<share of
teacher-forced answers that are the teacher's own>`` (the policy's fields are nan without ``--model``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.atomic import write_json_atomic  # noqa: E402
from envs.vector_env import SearchVectorEnv  # noqa: E402
from inference.backends.hf import HFBackend  # noqa: E402
from inference.models import load_causal_lm, load_tokenizer  # noqa: E402
from training.config import PPOConfig, load_config  # noqa: E402
from training.evaluation.answer_sources import ANSWER_SOURCES, answer_sources  # noqa: E402
from training.evaluation.ppo_report import greedy_rollout_config  # noqa: E402
from training.rollouts.rollout import collect_rollouts  # noqa: E402
from training.runtime.inputs import load_retriever, load_train_and_held_out  # noqa: E402
from training.sft import warm_start_config  # noqa: E402
from training.studies.reader_study import forced_answers, teacher_table  # noqa: E402
from training.teachers.scripted_teacher import collect_scripted  # noqa: E402
from training.teachers.trajectories import seeds_r1_prompt_fn  # noqa: E402


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a policy (Hugging Face folder or model key) whose answers to classify")
    parser.add_argument("--config", default="configs/ppo/default.yaml", help="the PPO recipe: questions and env")
    parser.add_argument("--out", type=Path, default=Path("runs/reader_study"))
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    return args, overrides


def policy_summaries(cfg: PPOConfig, model, tokenizer, examples: list, retriever, env_config) -> list[dict]:
    """The env summaries of the policy's greedy episodes on ``examples`` (the trainer's evaluation)."""
    backend = HFBackend(model, tokenizer, max_batch_size=cfg.rollout.rollout_batch_size,
                        max_context=cfg.rollout.max_context_tokens + 1)
    venv = SearchVectorEnv(retriever, num_envs=min(cfg.rollout.num_envs, len(examples)), config=env_config,
                           tokenizer=tokenizer)
    episodes = collect_rollouts(backend, venv, examples, greedy_rollout_config(cfg.rollout, cfg.run.seed),
                               seeds_r1_prompt_fn(env_config))
    return [episode.info for episode in episodes]


def teacher_forced(cfg: PPOConfig, model, tokenizer, examples: list, retriever, env_config) -> dict:
    """:func:`training.studies.reader_study.forced_answers` after the recipe's warm-start teacher on ``examples``."""
    records = collect_scripted(examples, retriever, env_config, warm_start_config(cfg).scripted_teacher(),
                               num_envs=cfg.rollout.num_envs, seed=cfg.evaluation.eval_seed, tokenizer=tokenizer)
    return forced_answers(model, tokenizer, records, env_config.judge_form,
                          max_new_tokens=cfg.rollout.max_turn_tokens)


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    cfg = load_config(PPOConfig, ["--config", args.config, *overrides])
    env_config = cfg.env
    _, held_out = load_train_and_held_out(cfg.data, cfg.evaluation)
    retriever = load_retriever(cfg.data)
    tokenizer = load_tokenizer(args.model or cfg.model.name)
    table = teacher_table(held_out, retriever, env_config, seed=cfg.evaluation.eval_seed, tokenizer=tokenizer)
    print(f"scripted teacher on {len(held_out)} held-out questions (EM, EM per kind, reward):")
    for expansion, readers in table.items():
        for reader, row in readers.items():
            print(f"  {expansion:24s} {reader:14s} " + " ".join(f"{k} {v:.3f}" for k, v in row.items()))
    result = {"questions": len(held_out), "teacher": table}
    policy = {k: float("nan") for k in ("em", "first_opened", "question_copy", "first_title_em", "forced_reads")}
    if args.model:
        model = load_causal_lm(args.model, device="cpu", dtype=cfg.model.dtype,
                               trust_remote_code=cfg.model.trust_remote_code)
        sources = answer_sources(policy_summaries(cfg, model, tokenizer, held_out, retriever, env_config))
        n = max(1, sources["episodes"])
        print(f"policy {args.model}: EM {sources['em']:.3f}; answers " +
              ", ".join(f"{k} {sources[k]}" for k in ANSWER_SOURCES) +
              f" (opened something on {sources['opened_something']}); answering with the first title it "
              f"opened would give EM {sources['first_title_em']:.3f}")
        forced = teacher_forced(cfg, model, tokenizer, held_out, retriever, env_config)
        print(f"after the warm-start teacher's own turns: says the teacher's answer on {forced['teacher_answer']} "
              f"of {forced['episodes']}, EM {forced['em']:.3f}; answers " +
              ", ".join(f"{k} {forced[k]}" for k in ANSWER_SOURCES))
        result.update(policy=sources, teacher_forced=forced)
        policy = {"em": sources["em"], "first_opened": sources["first_opened"] / n,
                  "question_copy": sources["question_copy"] / n, "first_title_em": sources["first_title_em"],
                  "forced_reads": forced["teacher_answer"] / max(1, forced["episodes"])}
    write_json_atomic(result, args.out / "reader_study.json")
    print(f"teacher_em={table['open_rate 0.5']['first_title']['em']:.4f} policy_em={policy['em']:.4f} "
          f"first_opened={policy['first_opened']:.4f} question_copy={policy['question_copy']:.4f} "
          f"first_title_em={policy['first_title_em']:.4f} forced_reads={policy['forced_reads']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
