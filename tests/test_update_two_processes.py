"""One full PPO update of the default recipe's batch shape on two gloo processes with unequal rows
equals the same update on one process (tests/update_worker.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.ppo_runs import free_port

WORKER = Path(__file__).with_name("update_worker.py")


def launch(out: Path, processes: int) -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    cmd = [sys.executable, str(WORKER), str(out)]
    if processes > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), str(WORKER), str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_two_processes_with_unequal_rows_give_one_process_gradient(tmp_path):
    launch(tmp_path, 1)
    launch(tmp_path, 2)
    rows = [json.loads((tmp_path / f"rows_2_{r}.json").read_text()) for r in (0, 1)]
    assert rows[0]["episodes"] == rows[1]["episodes"] and rows[0]["rows"] != rows[1]["rows"]  # verdict rows differ
    one = torch.load(tmp_path / "grads_1_0.pt", weights_only=True)
    ranks = [torch.load(tmp_path / f"grads_2_{r}.pt", weights_only=True) for r in (0, 1)]
    assert one and ranks[0].keys() == one.keys() == ranks[1].keys()
    assert any(float(g.abs().max()) > 1e-4 for g in one.values())  # a real gradient, not zeros
    for name, grad in one.items():
        torch.testing.assert_close(ranks[0][name], ranks[1][name], rtol=0, atol=0, msg=name)  # DDP: one gradient
        torch.testing.assert_close(ranks[0][name], grad, rtol=1e-4, atol=1e-6, msg=name)
