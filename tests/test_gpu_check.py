"""scripts/gpu_check.py: without a GPU it says so and skips; its checks themselves run on a CPU."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import gpu_check  # noqa: E402


def test_skips_cleanly_without_a_gpu(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "gpu_check=skipped"


def test_the_checks_run_one_update_each_on_a_cpu(capsys):
    assert gpu_check.main(["--device", "cpu", "--dtype", "float32", "--checks", "gae", "dr_grpo", "grpo+tis"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "gpu_check=3/3"
    for name in ("gae", "dr_grpo", "grpo+tis"):
        assert any(line.startswith(f"gpu_check {name}: ok policy_loss=") for line in lines)


def test_deepspeed_runs_last_and_leaves_no_state_behind(capsys):
    """accelerate's state is process-wide: a check after DeepSpeed's must not inherit its plugin."""
    pytest.importorskip("deepspeed")
    assert gpu_check.ordered_checks(["deepspeed", "grpo", "grpo"]) == ["grpo", "deepspeed"]
    assert gpu_check.main(["--device", "cpu", "--dtype", "float32", "--checks", "deepspeed", "grpo"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "gpu_check=2/2"
    assert gpu_check.main(["--device", "cpu", "--dtype", "float32", "--checks", "grpo"]) == 0  # and after it
    assert capsys.readouterr().out.strip().splitlines()[-1] == "gpu_check=1/1"
