"""Break the trainer's objective on purpose and check that the tests notice (a mutation pass).

    python scripts/mutation_pass.py                 # every mutation, its tests, a table
    python scripts/mutation_pass.py --only tis_weight_dropped entropy_sign_flipped

Each mutation is one textual edit of one file (a sign flipped, a mask dropped, clips swapped, an
all-reduce skipped). For each, the repository's tracked and untracked files are copied to a temporary
folder, the edit is applied there (the working tree is never touched) and the named tests run
against the copy. A mutation is *caught* when at least one of its tests fails. The table lists
which tests caught which mutation; the last line is ``mutations_caught=<caught>/<total>``.
docs/rl_algorithms.md ("Tests that catch a broken objective") holds the table of the last pass.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = ["tests/test_actor_objective.py", "tests/test_ppo_core.py", "tests/test_advantages.py"]
RANKS = ["tests/test_unequal_ranks.py", "tests/test_update_two_processes.py"]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = [
    Mutation("tis_weight_dropped", "training/ppo.py", 'surrogate = surrogate * mb["is_weight"]',
             "surrogate = surrogate", tuple(CORE)),
    Mutation("entropy_sign_flipped", "training/ppo.py", "per_token = surrogate - cfg.algorithm.entropy_coef * entropy",
             "per_token = surrogate + cfg.algorithm.entropy_coef * entropy", tuple(CORE)),
    Mutation("clips_swapped", "training/ppo.py",
             "mask, cfg.algorithm.clip_low,\n" + " " * 45 + "cfg.algorithm.clip_high,",
             "mask, cfg.algorithm.clip_high,\n" + " " * 45 + "cfg.algorithm.clip_low,", tuple(CORE)),
    Mutation("kl_loss_sign_flipped", "training/ppo.py", "per_token = per_token + beta *",
             "per_token = per_token - beta *", tuple(CORE) + ("tests/test_kl_tokens.py",)),
    Mutation("dual_clip_skipped", "training/algorithm/ppo_core.py",
             "loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)",
             "loss = loss", tuple(CORE)),
    Mutation("loss_mask_dropped", "training/algorithm/ppo_core.py", "per_row = (loss * m).sum(dim=1)  # (B,)",
             "per_row = loss.sum(dim=1)  # (B,)", tuple(CORE)),
    Mutation("sequence_count_per_row_reduce", "training/algorithm/ppo_core.py",
             "_reduce_sum((mask.sum(dim=1) > 0).to(torch.float32).sum(), accelerator)",
             "_reduce_sum((mask.sum(dim=1) > 0).to(torch.float32), accelerator).sum()", tuple(RANKS)),
    Mutation("token_count_all_reduce_skipped", "training/algorithm/ppo_core.py",
             "return _reduce_sum(mask.detach().to(torch.float32).sum(), accelerator).clamp(min=1.0)",
             "return mask.detach().to(torch.float32).sum().clamp(min=1.0)", tuple(RANKS)),
    Mutation("verdict_rms_all_reduce_skipped", "training/algorithm/advantages.py",
             "n, square_sum = _reduce_sum(torch.stack([m.sum().double(), (a.double() ** 2).sum()]), "
             "accelerator).unbind()",
             "n, square_sum = torch.stack([m.sum().double(), (a.double() ** 2).sum()]).unbind()", tuple(RANKS)),
    Mutation("reinforce_local_baseline", "training/algorithm/advantages.py",
             "baseline = global_mean(scores, batch.accelerator).expand_as(scores)",
             "baseline = scores.mean().expand_as(scores)", ("tests/test_unequal_ranks.py",)),
    Mutation("grpo_sign_flipped", "training/algorithm/advantages.py", "dev = scores.to(torch.float64) - mean",
             "dev = mean - scores.to(torch.float64)", tuple(CORE)),
    Mutation("kl_left_out_of_outcome_scores", "training/ppo_loop/ppo_score.py",
             "return token_level_rewards(terminal, mask[:E], kl[:E], kl_coef), reward - kl_coef * total",
             "return token_level_rewards(terminal, mask[:E], kl[:E], kl_coef), reward", ("tests/test_kl_reward.py",)),
    Mutation("verdict_kl_not_charged", "training/ppo_loop/ppo_score.py", "terminal = reward - kl_coef * (total - own)",
             "terminal = reward", ("tests/test_kl_reward.py",)),
    Mutation("dapo_filter_ignores_verdict_signal", "training/algorithm/dapo.py",
             "> 1 or any(own_signal(e) for e in g)]", "> 1]", ("tests/test_dapo_filter.py",)),
]


def copy_repo(target: Path) -> None:
    """The files git knows of (tracked, and untracked but not ignored) copied under ``target``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def run_mutation(mutation: Mutation, timeout: int) -> tuple[bool, list[str]]:
    """(caught, the tests that failed) for one mutation, in a fresh copy of the repository."""
    with tempfile.TemporaryDirectory(prefix="mutation-") as folder:
        root = Path(folder)
        copy_repo(root)
        path = root / mutation.path
        text = path.read_text()
        if text.count(mutation.old) != 1:
            raise SystemExit(f"{mutation.name}: the text to mutate is not found exactly once in {mutation.path}")
        path.write_text(text.replace(mutation.old, mutation.new))
        failed = []
        for test in mutation.tests:
            env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
            try:
                done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", test],
                                      cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
                if done.returncode != 0:
                    failed.append(test)
            except subprocess.TimeoutExpired:
                failed.append(f"{test} (timed out: a hang counts as caught)")
        return bool(failed), failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="names of the mutations to run (default: all)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test file before it counts as a hang")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    caught = 0
    print("| mutation | file | caught by |\n|---|---|---|")
    for mutation in chosen:
        hit, failed = run_mutation(mutation, args.timeout)
        caught += hit
        names = ", ".join(f"`{Path(t.split(' ')[0]).name}`" + (" (hang)" if "timed out" in t else "") for t in failed)
        print(f"| `{mutation.name}` | `{mutation.path}` | {names or '**not caught**'} |", flush=True)
    print(f"mutations_caught={caught}/{len(chosen)}")
    return 0 if caught == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
