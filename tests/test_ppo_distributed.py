"""Two real processes (gloo) run PPO updates together through torchrun and accelerate."""
import json
import os
import subprocess
import sys

from tests.ppo_runs import free_port, write_tiny_run


def test_two_gloo_processes_run_two_updates(tmp_path):
    recipe = write_tiny_run(tmp_path)
    out = tmp_path / "run"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "training.ppo", "--config", str(recipe)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in lines] == [1, 2]
    assert all(m["world_size"] == 2 for m in lines)  # two ranks, not one process twice
