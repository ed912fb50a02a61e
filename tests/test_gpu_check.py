"""scripts/gpu_check.py: without a GPU it says so and skips; its checks themselves run on a CPU."""
from __future__ import annotations

import sys
from pathlib import Path

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


def test_deepspeed_runs_last():
    """accelerate's state is process-wide: DeepSpeed's check runs after the others (and releases its
    state). Its run on a CPU after another check is checked by hand (docs/gpu.md, "GPU check"): in the suite, what
    DeepSpeed leaves in the process (environment, process group) reaches later tests."""
    assert gpu_check.ordered_checks(["deepspeed", "grpo", "grpo", "gae"]) == ["grpo", "gae", "deepspeed"]
    assert gpu_check.ordered_checks(["gae"]) == ["gae"]
