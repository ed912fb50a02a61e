"""Two real processes (gloo) run PPO updates together through torchrun and accelerate."""
import json
import os
import subprocess
import sys

from tests.ppo_runs import free_port, write_tiny_run


def run_two_ranks(tmp_path, **overrides) -> list[dict]:
    recipe = write_tiny_run(tmp_path, **overrides)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "training.ppo", "--config", str(recipe)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_two_gloo_processes_run_two_updates(tmp_path):
    lines = run_two_ranks(tmp_path)
    assert [m["update"] for m in lines] == [1, 2]
    assert all(m["world_size"] == 2 for m in lines)  # two ranks, not one process twice


def test_both_ranks_stop_at_the_same_step_on_target_kl(tmp_path):
    """Each rank measures KL on its own rows; the stop is decided on the sums over both, so neither
    waits in a gradient all-reduce the other never joins (that would hang until the timeout)."""
    lines = run_two_ranks(tmp_path, samples_per_question=2, ppo_epochs=2, mini_batches=2, lr_actor=5e-2,
                          advantage="grpo", target_kl=1e-6)
    assert [m["update"] for m in lines] == [1, 2]
    assert all(m["actor_steps"] == 2 and m["kl_stopped"] == 1.0 for m in lines), lines
