"""training.runtime.cpu_threads: all cores shared among the machine's processes on CPU; SEEDS_RL_THREADS overrides;
and the README's launch config starts one process with no accelerate warning and all cores in use."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training.runtime import cpu_threads
from training.runtime.cpu_threads import THREADS_ENV, use_all_cores

REPO_ROOT = Path(__file__).resolve().parents[1]
LAUNCH_CONFIG = REPO_ROOT / "configs" / "accelerate" / "default.yaml"


@pytest.fixture(autouse=True)
def restore_threads(monkeypatch):
    """Each test starts with no override and no launcher variables; torch's thread count is restored."""
    for name in (THREADS_ENV, *cpu_threads.LOCAL_SIZE_ENVS):
        monkeypatch.delenv(name, raising=False)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def eight_cores(monkeypatch):
    monkeypatch.setattr(cpu_threads, "available_cores", lambda: 8)


def test_cpu_process_takes_all_cores(eight_cores):
    torch.set_num_threads(1)  # what accelerate's OMP_NUM_THREADS=1 leaves
    assert use_all_cores("cpu") == 8
    assert torch.get_num_threads() == 8


def test_cores_are_shared_among_the_processes_of_this_machine(eight_cores, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert use_all_cores(torch.device("cpu")) == 4
    assert use_all_cores("cpu", processes=3) == 2  # an explicit count wins over the environment


def test_mpi_local_size_is_read_when_torchrun_says_nothing(eight_cores, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    assert use_all_cores("cpu") == 2


def test_never_fewer_than_one_thread(monkeypatch):
    monkeypatch.setattr(cpu_threads, "available_cores", lambda: 2)
    assert use_all_cores("cpu", processes=4) == 1


def test_override_wins_on_any_device(eight_cores, monkeypatch):
    monkeypatch.setenv(THREADS_ENV, "3")
    assert use_all_cores("cpu") == 3
    torch.set_num_threads(1)
    assert use_all_cores("cuda") == 3  # torch.device("cuda") needs no GPU to be named


def test_gpu_process_is_left_alone(eight_cores):
    torch.set_num_threads(1)
    assert use_all_cores("cuda:0") == 1
    assert torch.get_num_threads() == 1


def test_no_device_means_cpu_unless_cuda_is_available(eight_cores, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert use_all_cores() == 8
    torch.set_num_threads(1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert use_all_cores() == 1


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_bad_override_is_an_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(THREADS_ENV, value)
    with pytest.raises(ValueError, match=THREADS_ENV):
        use_all_cores("cpu")


def test_empty_override_counts_as_unset(eight_cores, monkeypatch):
    monkeypatch.setenv(THREADS_ENV, " ")
    assert use_all_cores("cpu") == 8


def test_available_cores_follows_the_affinity_mask():
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert cpu_threads.available_cores() == expected


def test_passive_wait_is_a_default_only(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    cpu_threads.prefer_passive_openmp_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    cpu_threads.prefer_passive_openmp_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


PROBE = """
import sys
sys.path.insert(0, {root!r})
from training.runtime.cpu_threads import available_cores, use_all_cores
import os, torch
print("launched", os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads(), use_all_cores(), available_cores())
"""


def test_readme_launch_config_is_quiet_and_uses_all_cores(tmp_path):
    """A fresh machine (empty HOME, no `accelerate config`): one process, no 'values were not passed'
    warning; accelerate hands it OMP_NUM_THREADS=1 and use_all_cores takes every core back."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE.format(root=str(REPO_ROOT)), encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HOME", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", THREADS_ENV)}
    env.update(HOME=str(tmp_path), CUDA_VISIBLE_DEVICES="")  # the CPU case even on a GPU machine
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(LAUNCH_CONFIG), str(probe)]
    result = subprocess.run(launcher, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "were not passed" not in result.stdout + result.stderr
    lines = [line.split() for line in result.stdout.splitlines() if line.startswith("launched")]
    assert len(lines) == 1  # one process
    _, omp, threads_before, threads_after, cores = lines[0]
    assert (omp, threads_before) == ("1", "1")
    assert threads_after == cores
