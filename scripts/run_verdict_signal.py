"""Where is the verdict signal, and how much data does learning it take? (the judgement form)

    python scripts/run_verdict_signal.py --model runs/ppo-default/sft/model        # the main job's warm start
    python scripts/run_verdict_signal.py --model M --train-questions 160 --test-questions 64 --top-layers 4 12
    python scripts/run_verdict_signal.py --model M -- --env.judge_question true     # PPOConfig overrides after --

Samples episodes of the PPO recipe's env (``--config``, default the main job's) with the policy
``--model`` on training questions: the first ``--train-questions`` for training, the next
``--test-questions`` held out. For each judged candidate it reads the label, the policy's π(yes)
and the share of its words that the question shares (``training.studies.verdict_signal``). It prints the
AUC of both. Then, for each ``--top-layers``, it trains fresh LoRA adapters on the verdict tokens
alone with the labels (class-balanced logistic loss, the best case for PPO's per-verdict credit) and
prints held-out and training AUC per epoch. Writes ``<out>/verdict_signal.json``; the last line is
``policy_auc=<x> overlap_auc=<y> bound_auc=<held-out AUC after the last epoch, first --top-layers>``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from envs.atomic import write_json_atomic  # noqa: E402
from envs.protocol import judge_token_ids  # noqa: E402
from envs.vector_env import SearchVectorEnv  # noqa: E402
from inference.backends.hf import HFBackend  # noqa: E402
from inference.models import load_causal_lm, load_tokenizer  # noqa: E402
from training.config import PPOConfig, load_config  # noqa: E402
from training.rollouts.rollout import RolloutConfig, collect_rollouts  # noqa: E402
from training.runtime.inputs import load_retriever, load_train_and_held_out  # noqa: E402
from training.studies.verdict_signal import (  # noqa: E402,E501
    judged_episodes,
    question_overlap,
    roc_auc,
    supervised_bound,
    verdict_yes_logits,
)
from training.teachers.trajectories import seeds_r1_prompt_fn  # noqa: E402


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the policy (a Hugging Face folder or a model key)")
    parser.add_argument("--config", default="configs/ppo/default.yaml", help="the PPO recipe whose env is sampled")
    parser.add_argument("--train-questions", type=int, default=160)
    parser.add_argument("--test-questions", type=int, default=64)
    parser.add_argument("--top-layers", type=int, nargs="+", default=[4])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default="runs/verdict_signal")
    args, overrides = parser.parse_known_args(argv)
    return args, [o for o in overrides if o != "--"]


def sample(cfg: PPOConfig, args, model, tokenizer, retriever, questions: list) -> tuple[list, list]:
    """(training episodes, held-out episodes) of ``questions[:train]`` and the next ``test``, at temperature 1."""
    env_config = cfg.env
    if not env_config.judge_form.judged:
        raise SystemExit(f"the recipe's env judges nothing (expand_form {env_config.expand_form!r}); "
                         "this diagnostic needs expand_form: judge")
    if not env_config.judge_form.in_stream:
        raise SystemExit("this diagnostic reads verdicts in the episode's token stream; the recipe judges each "
                         f"candidate {env_config.judge_context} (add `-- --env.judge_context stream`)")
    wanted = args.train_questions + args.test_questions
    if len(questions) < wanted:
        raise SystemExit(f"{wanted} questions asked for, the recipe has {len(questions)} training questions")
    venv = SearchVectorEnv(retriever, num_envs=min(32, wanted), config=env_config, tokenizer=tokenizer)
    rollout = RolloutConfig(max_turn_tokens=cfg.rollout.max_turn_tokens,
                            max_context_tokens=cfg.rollout.max_context_tokens,
                            temperature=1.0, seed=args.seed)
    backend = HFBackend(model, tokenizer)
    prompt = seeds_r1_prompt_fn(env_config)
    return (collect_rollouts(backend, venv, questions[:args.train_questions], rollout, prompt, progress="train"),
            collect_rollouts(backend, venv, questions[args.train_questions:wanted], rollout, prompt,
                             progress="held-out"))


def verdict_table(judged: list, questions: list, model, choice_ids: torch.Tensor) -> tuple[list, list, list]:
    """(labels, policy pi(yes), question-word overlap) over every verdict of ``judged``."""
    labels, policy, overlap = [], [], []
    for episode in judged:
        question = questions[episode.group].question
        labels += episode.labels
        policy += torch.sigmoid(verdict_yes_logits(model, episode, choice_ids)).tolist()
        overlap += [question_overlap(question, text) for text in episode.candidate_texts]
    return labels, policy, overlap


def measure(cfg: PPOConfig, args, model, tokenizer, retriever, questions: list) -> dict:
    """Sample, read off the verdicts, print their AUCs and the supervised bound per --top-layers."""
    train_eps, test_eps = sample(cfg, args, model, tokenizer, retriever, questions)
    choice_ids = torch.tensor(judge_token_ids(tokenizer))
    train, skipped_train = judged_episodes(train_eps, tokenizer)
    test, skipped_test = judged_episodes(test_eps, tokenizer)
    a = verdict_table(train, questions[:args.train_questions], model, choice_ids)
    b = verdict_table(test, questions[args.train_questions:], model, choice_ids)
    labels, policy, overlap = a[0] + b[0], a[1] + b[1], a[2] + b[2]
    result = {"verdicts": len(labels), "positives": sum(labels), "judged_episodes": len(train) + len(test),
              "skipped_episodes": skipped_train + skipped_test,
              "policy_auc": roc_auc(labels, policy), "overlap_auc": roc_auc(labels, overlap),
              "pi_yes_positive": _mean([p for p, y in zip(policy, labels) if y]),
              "pi_yes_negative": _mean([p for p, y in zip(policy, labels) if not y]), "bounds": {}}
    print(f"{result['verdicts']} verdicts ({result['positives']} positives) in {result['judged_episodes']} episodes "
          f"({result['skipped_episodes']} skipped); AUC of the policy's pi(yes) {result['policy_auc']:.3f} "
          f"(positives {result['pi_yes_positive']:.3f}, negatives {result['pi_yes_negative']:.3f}); "
          f"AUC of the question-word overlap {result['overlap_auc']:.3f}", flush=True)
    for top in args.top_layers:
        rows = supervised_bound(model, train, test, choice_ids, top, args.epochs, lr=args.lr)
        result["bounds"][str(top)] = rows
        for row in rows:
            print(f"LoRA top {top} layers, epoch {row['epoch']}: held-out AUC {row['heldout_auc']:.3f}, "
                  f"train AUC {row['train_auc']:.3f}", flush=True)
    return result


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    """Load the policy and the recipe's questions, measure, write the JSON, print the last line."""
    args, overrides = parse_args(argv)
    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer(args.model)
    model = load_causal_lm(args.model, device="cpu", dtype="native").eval()
    cfg = load_config(PPOConfig, ["--config", args.config, *overrides])
    result = measure(cfg, args, model, tokenizer, load_retriever(cfg.data),
                     load_train_and_held_out(cfg.data, cfg.evaluation)[0])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic({"args": vars(args), "overrides": overrides, **result}, out / "verdict_signal.json")
    bound = result["bounds"][str(args.top_layers[0])][-1]["heldout_auc"]
    print(f"policy_auc={result['policy_auc']:.4f} overlap_auc={result['overlap_auc']:.4f} bound_auc={bound:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
