"""CPU threads for training processes: all cores of the machine, shared among its processes.

``accelerate launch`` exports ``OMP_NUM_THREADS=1`` to the processes it starts unless its config
says ``use_cpu`` (and then it uses the physical-core count and prints a warning about it), so
a CPU run launched through a neutral config computes on one core however many the machine has.
:func:`use_all_cores` undoes that: on a CPU device, each process gets
``max(1, cores // processes on this machine)`` intra-op threads.

``SEEDS_RL_THREADS=N`` overrides the count (any device). ``OMP_NUM_THREADS`` is deliberately not
consulted: the one accelerate exports cannot be told apart from one the user set.

:func:`prefer_passive_openmp_wait` sets ``OMP_WAIT_POLICY=PASSIVE`` unless it is set: idle OpenMP
threads then sleep instead of spinning, which on a shared machine keeps a multi-thread run from
slowing down many times over whenever another process holds a core (a PPO run measured it at
20x on 2 cores). OpenMP reads the variable when torch loads it, so call it before the
first ``import torch``; this module imports torch only inside :func:`use_all_cores`.

Inter-op threads are left alone: eager training does not use that pool, and torch refuses to
resize it once any parallel work has run.
"""
from __future__ import annotations

import os

THREADS_ENV = "SEEDS_RL_THREADS"
# How launchers tell a process how many processes share its machine: torchrun / accelerate
# (LOCAL_WORLD_SIZE), then the MPI flavours accelerate also reads.
LOCAL_SIZE_ENVS = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE")


def prefer_passive_openmp_wait() -> None:
    """``OMP_WAIT_POLICY=PASSIVE`` unless already set; effective only before torch is imported."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask, which honours taskset and cpusets)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def positive_int_from_env(name: str) -> int | None:
    """The variable as an integer >= 1, None when unset or empty; ValueError naming it otherwise."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={raw!r}: expected a whole number of threads >= 1")
    return value


def processes_on_this_machine() -> int:
    """How many training processes share this machine, as the launcher says (1 when it says nothing)."""
    for name in LOCAL_SIZE_ENVS:
        raw = os.environ.get(name, "").strip()
        if raw.isdigit() and int(raw) >= 1:
            return int(raw)
    return 1


def threads_per_process(processes: int, cores: int) -> int:
    return max(1, cores // max(1, processes))


def use_all_cores(device=None, processes: int | None = None) -> int:
    """Set torch's intra-op threads for this process; returns the count now in use.

    ``device``: the process's compute device (``accelerator.device``); None means CPU unless CUDA
    is available. Off the CPU the count is left as it is, unless ``SEEDS_RL_THREADS`` is set.
    ``processes``: processes on this machine; None reads the launcher's environment.
    """
    import torch

    requested = positive_int_from_env(THREADS_ENV)
    if requested is None:
        on_cpu = (torch.device(device).type == "cpu") if device is not None else not torch.cuda.is_available()
        if not on_cpu:
            return torch.get_num_threads()
        local_processes = processes if processes is not None else processes_on_this_machine()
        requested = threads_per_process(local_processes, available_cores())
    torch.set_num_threads(requested)
    return torch.get_num_threads()
