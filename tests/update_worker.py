"""One PPO update of the default recipe's batch shape, its actor gradient written to a file.

    python tests/update_worker.py OUT                                   # one process, every episode
    python -m torch.distributed.run --nproc_per_node 2 tests/update_worker.py OUT   # two gloo ranks

The batch is what the main job trains on: groups of samples per question, each episode with
verdicts judged alone (rows of their own), the default recipe's objective (grpo, seq_mean_token_mean,
k3 KL on the verdict tokens in the loss, verdict_credit, micro-batches by tokens, the frozen-layer
cache) with asymmetric clips and an entropy term. Under two ranks each takes half the questions,
and rank 1's episodes carry more verdicts than rank 0's, so the ranks hold different numbers of
rows. ``optimize`` runs with the optimizer step replaced by a capture of the accumulated (and, under
DDP, all-reduced) gradient: ``OUT/grads_<world>_<rank>.pt`` plus a JSON line of row counts.
"""
from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
torch.set_num_threads(1)

QUESTIONS, SAMPLES = 4, 3


def make_episodes(tokenizer, yes_no: tuple[int, int]) -> list[list]:
    """Per question, its SAMPLES episodes (deterministic); questions 2 and 3 have three verdicts per
    episode, questions 0 and 1 one."""
    from training.rollouts.rollout import Episode
    from training.rollouts.rollout_judge import VerdictRow

    rng = random.Random(11)
    vocab = len(tokenizer)
    questions = []
    for q in range(QUESTIONS):
        group = []
        for s in range(SAMPLES):
            n, prompt = rng.randint(18, 30), rng.randint(6, 10)
            ids = [rng.randrange(3, vocab) for _ in range(n)]
            mask = [0] * prompt + [1 if rng.random() < 0.7 else 0 for _ in range(n - prompt)]
            logprobs = [-rng.uniform(0.5, 4.0) if m else 0.0 for m in mask]
            verdicts = []
            for _ in range(1 if q < 2 else 3):
                context = [rng.randrange(3, vocab) for _ in range(rng.randint(6, 12))]
                token = yes_no[rng.randrange(2)]
                verdicts.append(VerdictRow(token_ids=context + [token], logprob=math.log(rng.uniform(0.2, 0.8)),
                                           reward_gap=rng.choice([0.25, -0.15, 0.0])))
            group.append(Episode(token_ids=ids, loss_mask=mask, sampler_logprobs=logprobs, turn_ids=[0] * n,
                                 prompt_length=prompt, example_id=f"q{q}", group_id=q,
                                 reward=rng.choice([-0.3, 0.0, 0.25, 0.5, 1.0]) + 0.01 * s, verdict_rows=verdicts))
        questions.append(group)
    return questions


def default_shape_config():
    from training.config import LoraSettings, PPOConfig, with_values

    return with_values(PPOConfig,
                       {"model.name": "tiny", "warm_start.enabled": False,
                        "model.lora": LoraSettings(r=4, alpha=8, top_layers=1), "model.cache_frozen_layers": True,
                        "algorithm.advantage": "grpo", "algorithm.loss_agg": "seq_mean_token_mean",
                        "algorithm.kl_coef": 1.0, "algorithm.kl_mode": "loss", "algorithm.kl_estimator": "k3",
                        "algorithm.kl_tokens": "verdicts", "algorithm.old_logprobs": "sampler",
                        "algorithm.verdict_credit": 2.0, "optim.micro_batch_size": 8, "optim.micro_batch_tokens": 96,
                        "optim.mini_batches": 1, "optim.ppo_epochs": 1, "algorithm.clip_low": 0.2,
                        "algorithm.clip_high": 0.28, "algorithm.entropy_coef": 0.01,
                        "rollout.questions_per_update": QUESTIONS, "rollout.samples_per_question": SAMPLES,
                        "evaluation.eval_questions": 0, "run.export": False})


def main(out: str) -> int:
    from accelerate import Accelerator

    import training.ppo as ppo
    from envs.protocol import judge_token_ids
    from tests.tiny_models import tiny_llama, tiny_tokenizer
    from training.models.policy_models import wrap_models
    from training.ppo_loop.ppo_score import score
    from training.ppo_loop.ppo_setup import Run, prepare_optimization
    from training.runtime.distributed import accelerator_handlers

    accelerator = Accelerator(kwargs_handlers=accelerator_handlers())
    rank, world = accelerator.process_index, accelerator.num_processes
    cfg = default_shape_config()
    tokenizer = tiny_tokenizer()
    models = wrap_models(tiny_llama(tokenizer, seed=0).train(), tokenizer, cfg.model, cfg.algorithm, cfg.rollout)
    choice_ids = torch.tensor(judge_token_ids(tokenizer))
    run = Run(model=cfg.model, rollout=cfg.rollout, optim=cfg.optim, algorithm=cfg.algorithm, run_settings=cfg.run,
              accelerator=accelerator, out=Path(out), retriever=None, examples=[], eval_examples=[],
              models=models, env_config=None, prompt_fn=None, local_questions=QUESTIONS // world,
              choice_ids=choice_ids)
    prepare_optimization(run)
    groups = make_episodes(tokenizer, tuple(choice_ids.tolist()))
    per_rank = QUESTIONS // world
    episodes = [e for group in groups[rank * per_rank:(rank + 1) * per_rank] for e in group]
    captured = {}

    def capture(accelerator, model, optimizer, scheduler, max_grad_norm):
        captured.update({name.removeprefix("module."): p.grad.detach().clone()
                         for name, p in model.named_parameters() if p.grad is not None})
        optimizer.zero_grad(set_to_none=True)
        return 0.0

    ppo.optimizer_step = capture
    batch, _ = score(run, episodes)
    ppo.optimize(run, batch, update=0, train_actor=True)
    torch.save(captured, Path(out) / f"grads_{world}_{rank}.pt")
    with open(Path(out) / f"rows_{world}_{rank}.json", "w") as f:
        json.dump({"rows": int(batch["model_mask"].shape[0]), "episodes": len(episodes)}, f)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
