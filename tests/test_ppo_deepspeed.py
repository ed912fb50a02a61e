"""PPO under DeepSpeed ZeRO-2 through `accelerate launch`, two CPU processes (gloo).

The same tiny run is trained three ways: with configs/accelerate/deepspeed_zero2.yaml, with plain
DDP (torchrun), and resumed under DeepSpeed from the first run's checkpoint after one update.
DeepSpeed must reach DDP's weights (same token-mean loss, gradient accumulation over micro-batches,
clipping and learning rates: nothing scaled twice) and the resume must continue exactly.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.ppo_runs import free_port, write_tiny_run
from training.config import ConfigError, OptimSettings, with_values
from training.runtime.distributed import accelerator_handlers, configure_deepspeed

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="DeepSpeed is not installed (pip install -e '.[test]' brings it)")

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "ppo_worker.py"
MAX_GRAD_NORM = 0.05  # small enough that every optimizer step clips
# Two questions per process and update, one episode per micro-batch: two micro-batches accumulate
# into each optimizer step. The first update trains the critic only.
RECIPE = dict(questions_per_update=4, updates=2, critic_warmup_updates=1, lr_actor=1e-2, lr_critic=1e-2,
              max_grad_norm=MAX_GRAD_NORM, keep_checkpoints=2)


def launch(command: list[str], recipe: Path, *extra: str) -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("ACCELERATE_USE_CPU", None)
    done = subprocess.run([*command, "--config", str(recipe), *extra], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def deepspeed_zero2(recipe: Path, *extra: str) -> None:
    launch([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            "configs/accelerate/deepspeed_zero2.yaml", "--num_processes", "2", "--main_process_port",
            str(free_port()), str(WORKER)], recipe, *extra)


def ddp(recipe: Path, *extra: str) -> None:
    launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), str(WORKER)], recipe, *extra)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def saved(run: Path, update: int, name: str) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / f"update_{update:06d}" / f"{name}.pt", weights_only=True)


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=0.0, msg=key)


def with_deepspeed_config(values: dict) -> SimpleNamespace:
    """A stand-in for an Accelerator whose DeepSpeed plugin holds the config ``values``."""
    return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=values)))


def test_deepspeed_batch_and_clipping_values_come_from_the_ppo_config():
    optim = OptimSettings(micro_batch_size=2, mini_batches=2, max_grad_norm=0.5)
    ds_config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                 "gradient_clipping": "auto", "zero_optimization": {"stage": 2}}
    configure_deepspeed(with_deepspeed_config(ds_config), optim, episodes_per_process=9)  # mini-batches of 5 and 4
    assert ds_config["train_micro_batch_size_per_gpu"] == 2
    assert ds_config["gradient_accumulation_steps"] == 3  # micro-batches of 2, 2, 1
    assert ds_config["gradient_clipping"] == 0.5
    with pytest.raises(ConfigError, match="gradient_clipping"):
        configure_deepspeed(with_deepspeed_config({"gradient_clipping": 1.0}), optim, 9)
    with pytest.raises(ConfigError, match="ZeRO-3"):
        configure_deepspeed(with_deepspeed_config({"zero_optimization": {"stage": 3}}), optim, 9)
    with pytest.raises(ConfigError, match="micro_batch_tokens"):  # an engine counts its micro-steps
        configure_deepspeed(with_deepspeed_config({}), with_values(optim, {"micro_batch_tokens": 2048}), 9)


def test_two_cpu_processes_join_one_group_with_or_without_deepspeed(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "unset below, restored after the test")
    monkeypatch.delenv("ACCELERATE_USE_CPU")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    [handler] = accelerator_handlers()
    assert handler.backend == "gloo" and "ACCELERATE_USE_CPU" not in os.environ  # CPU mode would drop DeepSpeed
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    assert accelerator_handlers() == [] and os.environ["ACCELERATE_USE_CPU"] == "1"


def test_a_deepspeed_checkpoint_does_not_resume_without_deepspeed(tmp_path):
    from training.models.checkpoint import load_checkpoint, save_checkpoint

    actor, critic = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    optimizers = {"actor": torch.optim.AdamW(actor.parameters()), "critic": torch.optim.AdamW(critic.parameters())}
    schedulers = {name: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0) for name, opt in optimizers.items()}
    folder = save_checkpoint(tmp_path, 1, actor=actor, critic=critic, optimizers=optimizers, schedulers=schedulers,
                             state={"data_position": 2})
    (folder / "optim_actor.pt").rename(folder / "optim_actor_rank0.pt")  # as a ZeRO-2 run leaves it
    with pytest.raises(ValueError, match="DeepSpeed ZeRO partitions"):
        load_checkpoint(folder, actor=actor, critic=critic, optimizers=optimizers, schedulers=schedulers)


@pytest.fixture(scope="module")
def zero2_run(tmp_path_factory) -> tuple[Path, Path]:
    """(recipe, output folder) of the DeepSpeed ZeRO-2 run."""
    folder = tmp_path_factory.mktemp("deepspeed")
    recipe = write_tiny_run(folder, **RECIPE)
    deepspeed_zero2(recipe)
    return recipe, folder / "run"


@needs_deepspeed
def test_zero2_trains_on_two_processes(zero2_run):
    _, run = zero2_run
    workers = [json.loads((run / f"worker_{rank}.json").read_text()) for rank in (0, 1)]
    for rank, seen in enumerate(workers):
        assert (seen["rank"], seen["world_size"], seen["backend"]) == (rank, 2, "gloo")  # torch.distributed's view
        assert (seen["accelerate_rank"], seen["accelerate_processes"]) == (rank, 2)
        assert seen["distributed_type"] == "DEEPSPEED"
        assert seen["actor_moved"] and seen["base_unchanged"] and seen["reference_unchanged"]
    lines = metrics(run)
    assert [(m["update"], m["world_size"], m["critic_only"]) for m in lines] == [(1, 2, 1.0), (2, 2, 0.0)]
    assert lines[1]["grad_norm_actor"] > MAX_GRAD_NORM and lines[0]["grad_norm_critic"] > MAX_GRAD_NORM
    files = {p.name for p in (run / "checkpoints" / "update_000002").iterdir()}
    assert {"optim_actor_rank0.pt", "optim_actor_rank1.pt", "optim_critic_rank0.pt", "optim_critic_rank1.pt"} <= files
    assert "optim_actor.pt" not in files  # each process saved its own ZeRO partition


@needs_deepspeed
def test_zero2_reaches_the_weights_of_ddp(zero2_run, tmp_path):
    recipe, zero2 = zero2_run
    plain = tmp_path / "ddp"
    ddp(recipe, "--output_dir", str(plain))
    # Adam is blind to the gradients' scale; the norms before clipping are not. A missing or wrong
    # clip shows in the second update's norms (the first step moved the weights differently).
    for ours, theirs in zip(metrics(zero2), metrics(plain), strict=True):
        assert ours["reward_mean"] == theirs["reward_mean"]
        for key in ("grad_norm_critic", "grad_norm_actor", "value_loss", "lr_actor"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-9), key
    # A step moves a weight by about lr = 1e-2; the order of the reductions alone, by far less than
    # 1e-4 (Adam magnifies rounding only where a gradient is near zero).
    for update in (1, 2):
        assert_close(saved(zero2, update, "actor"), saved(plain, update, "actor"), atol=1e-4)
        assert_close(saved(zero2, update, "critic"), saved(plain, update, "critic"), atol=1e-4)


@needs_deepspeed
def test_zero2_resume_continues_exactly(zero2_run, tmp_path):
    recipe, zero2 = zero2_run
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(zero2 / "checkpoints" / "update_000001", resumed / "checkpoints" / "update_000001")
    deepspeed_zero2(recipe, "--output_dir", str(resumed), "--resume")
    assert [m["update"] for m in metrics(resumed)] == [2]
    assert_close(saved(resumed, 2, "actor"), saved(zero2, 2, "actor"), atol=1e-7)
    assert_close(saved(resumed, 2, "critic"), saved(zero2, 2, "critic"), atol=1e-7)
    assert metrics(resumed)[0]["reward_mean"] == metrics(zero2)[1]["reward_mean"]
