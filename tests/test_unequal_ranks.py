"""Every statistic the trainer forms over processes, on two real gloo processes that hold different
numbers of rows (verdict rows and dynamic sampling make that the usual case), against the same
statistic over the union of the rows in one process."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.ppo_runs import free_port
from training.algorithm.advantages import (
    AdvantageBatch,
    centred_reward_gaps,
    compute_advantages,
    global_mean,
    two_choice_advantages,
)
from training.algorithm.ppo_core import global_masked_moments, global_sequence_count, global_token_count

ROWS = (3, 4)  # rows on rank 0 and rank 1
T = 5


def rows_of(rank: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s rows (deterministic); ``rank`` None: both ranks' rows, in rank order."""
    g = torch.Generator().manual_seed(7)
    parts = []
    for n in ROWS:
        mask = (torch.rand(n, T, generator=g) < 0.6).float()
        mask[0, :] = 0.0  # a row with no model token: it is not a sequence
        parts.append({"mask": mask, "x": torch.randn(n, T, generator=g), "scores": torch.randn(n, generator=g),
                      "logp": -torch.rand(n, T, generator=g) * 2, "gap": torch.randn(n, T, generator=g),
                      "opened": (torch.rand(n, T, generator=g) < 0.5).float()})
    if rank is not None:
        return parts[rank]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def statistics(rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    mask = rows["mask"]
    mean, var = global_masked_moments(rows["x"], mask)
    adv, _ = compute_advantages("reinforce", AdvantageBatch(model_mask=mask, scores=rows["scores"]))
    _, price = centred_reward_gaps(rows["logp"], rows["gap"], rows["opened"], mask)
    return {"sequences": global_sequence_count(mask), "tokens": global_token_count(mask), "mean": mean, "var": var,
            "baseline": global_mean(rows["scores"]), "reinforce": adv,
            "two_choice": two_choice_advantages(rows["logp"], rows["gap"], mask), "price": torch.tensor(price)}


def _worker(rank: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        # plain lists: a tensor would travel as a shared-memory handle that dies with this process
        queue.put((rank, {k: (v.tolist(), str(v.dtype)) for k, v in statistics(rows_of(rank)).items()}))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def per_rank() -> dict[int, dict[str, torch.Tensor]]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        out = dict(queue.get(timeout=90) for _ in procs)  # a rank that died leaves the other waiting
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    return {rank: {k: torch.tensor(values, dtype=getattr(torch, dtype.removeprefix("torch.")))
                   for k, (values, dtype) in stats.items()} for rank, stats in out.items()}


def test_global_counts_and_moments_match_one_process_over_unequal_rows(per_rank):
    one = statistics(rows_of(None))
    assert float(one["sequences"]) == ROWS[0] - 1 + ROWS[1] - 1  # the empty row of each rank is no sequence
    for rank in (0, 1):
        for key in ("sequences", "tokens", "mean", "var", "baseline", "price"):
            torch.testing.assert_close(per_rank[rank][key], one[key], rtol=1e-6, atol=1e-6, msg=key)


def test_per_row_statistics_use_the_global_baseline_and_scale(per_rank):
    """REINFORCE's baseline and the verdicts' unit-RMS scale are the same on both ranks as in one process."""
    one = statistics(rows_of(None))
    both = {key: torch.cat([per_rank[0][key], per_rank[1][key]]) for key in ("reinforce", "two_choice")}
    for key, value in both.items():
        torch.testing.assert_close(value, one[key], rtol=1e-5, atol=1e-6, msg=key)
