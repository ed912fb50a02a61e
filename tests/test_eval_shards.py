"""Data-parallel evaluation: shards of the questions per process, one run folder, the metrics of
a single process; by hand (--shard i/n, --merge) and with two real processes under torchrun."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_evaluate import argv, setup  # noqa: F401  (the evaluation fixture)

from inference import evaluate as ev
from inference.predictions import load_predictions
from inference.shards import Shard, parse_shard, pin_devices, resolve_shard

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("mean_latency_s",)  # wall-clock figures: the only ones allowed to differ between runs


def strict_metrics(out: Path) -> dict:
    metrics = json.loads((out / "metrics.json").read_text())
    return {k: v for k, v in metrics.items() if k not in TIMING}


def outcomes(out: Path) -> dict:
    return {r["id"]: (r["prediction"], r["metrics"], r["searches"], r["finish_reason"])
            for r in load_predictions(out / "predictions.jsonl")}


def single_run(setup, tmp_path) -> Path:  # noqa: F811
    out = tmp_path / "single"
    ev.main(argv(dict(setup, out=out)))
    return out


def test_shard_specs_and_launcher_environment():
    assert parse_shard("1/4") == Shard(1, 4) and Shard(1, 4).take(list("abcdefg")) == ["b", "f"]
    for bad in ("4/4", "1", "a/b", "0/0"):
        with pytest.raises(ValueError):
            parse_shard(bad)
    launched = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert resolve_shard(None, dict(launched)) == Shard(5, 8, 1, 4)
    assert resolve_shard(None, {}) == Shard() and not Shard().sharded
    with pytest.raises(ValueError, match="one or the other"):
        resolve_shard("0/2", dict(launched))


def test_each_process_gets_its_own_gpus_and_no_rendezvous_variables():
    environ = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    shard = resolve_shard(None, environ)
    assert pin_devices(shard, environ) == ["2", "3"]  # 8 GPUs, 4 processes: two each (tensor parallel 2)
    assert environ == {"CUDA_VISIBLE_DEVICES": "2,3"}
    one_each = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                "CUDA_VISIBLE_DEVICES": "4,6"}
    assert pin_devices(resolve_shard(None, one_each), one_each) == ["6"]
    cpu = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": ""}
    assert pin_devices(resolve_shard(None, cpu), cpu) == [] and cpu == {"CUDA_VISIBLE_DEVICES": ""}


def test_shards_by_hand_merge_into_the_single_process_result(setup, tmp_path, capsys):  # noqa: F811
    single = single_run(setup, tmp_path)
    out = setup["out"]
    assert ev.main(argv(setup, "seeds-react", "--run.shard", "1/2")) == 0  # question b
    assert not (out / "metrics.json").exists()  # a and c are not done yet: no merge
    parts = sorted(p.name for p in (out / "shards").iterdir())
    assert parts == ["part-001-of-002.jsonl"]
    assert ev.main(argv(setup, "seeds-react", "--run.shard", "0/2")) == 0  # a and c: the last one merges
    assert list((out / "shards").iterdir()) == []
    assert [r["id"] for r in load_predictions(out / "predictions.jsonl")] == ["a", "b", "c"]
    assert strict_metrics(out) == strict_metrics(single)
    assert outcomes(out) == outcomes(single)
    assert ev.main(["--merge", "--run.output_dir", str(out)]) == 0  # merging again changes nothing
    assert strict_metrics(out) == strict_metrics(single)


def test_merge_names_missing_questions_and_a_single_process_finishes_the_run(setup, tmp_path):  # noqa: F811
    out = setup["out"]
    ev.main(argv(setup, "vanilla-rag", "--run.shard", "0/2"))
    with pytest.raises(SystemExit, match="1 of 3 questions have no prediction yet"):
        ev.main(["--merge", "--run.output_dir", str(out)])
    calls = len(setup["llm"].prompts)
    ev.main(argv(setup, "vanilla-rag"))  # one process resumes: runs b only, then merges the shard
    assert len(setup["llm"].prompts) - calls == 1
    assert sorted(r["id"] for r in load_predictions(out / "predictions.jsonl")) == ["a", "b", "c"]
    assert json.loads((out / "metrics.json").read_text())["questions"] == 3
    with pytest.raises(SystemExit, match="no run to merge"):
        ev.main(["--merge", "--run.output_dir", str(tmp_path / "elsewhere")])


def test_a_killed_shard_resumes_without_duplicates(setup):  # noqa: F811
    out = setup["out"]
    ev.main(argv(setup, "vanilla-rag", "--run.shard", "0/2"))
    part = out / "shards" / "part-000-of-002.jsonl"
    first = part.read_text().splitlines()[0]
    part.write_text(first + '\n{"id": "c", "question": "torn')  # killed while writing its second question
    calls = len(setup["llm"].prompts)
    ev.main(argv(setup, "vanilla-rag", "--run.shard", "0/2"))
    assert len(setup["llm"].prompts) - calls == 1
    assert sorted(r["id"] for r in load_predictions(part)) == ["a", "c"]
    with pytest.raises(SystemExit, match="would race"):
        ev.main(argv(setup, "vanilla-rag", "--run.shard", "0/2", "--run.overwrite"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_processes_under_torchrun_give_the_single_process_metrics(setup, tmp_path):  # noqa: F811
    single = single_run(setup, tmp_path)
    out = tmp_path / "parallel"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(ROOT / "tests" / "eval_shard_worker.py"),
           *argv(dict(setup, out=out))]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[shard 0/2]" in done.stderr and "[shard 1/2]" in done.stderr  # two processes, one shard each
    assert list((out / "shards").iterdir()) == []
    assert strict_metrics(out) == strict_metrics(single)
    assert outcomes(out) == outcomes(single)
