"""Two real processes (gloo) run PPO updates together through torchrun and accelerate."""
import json
import os
import socket
import subprocess
import sys


from envs.corpus import load_corpus
from envs.encoders import load_encoder
from envs.index import build_index

from conftest import PASSAGES
from tiny_models import tiny_llama, tiny_tokenizer

QUESTIONS = [("a", "What is the capital of France?", "Paris"), ("b", "Which river flows through Vienna?", "Danube"),
             ("c", "What is the capital of Japan?", "Tokyo"), ("d", "Which river flows through Berlin?", "Spree")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_gloo_processes_run_two_updates(tmp_path):
    tokenizer = tiny_tokenizer()
    model_dir = tmp_path / "model"
    tiny_llama(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "title": t, "text": x}) + "\n" for i, t, x in PASSAGES))
    build_index(load_corpus(corpus), load_encoder("hash"), tmp_path / "index", show_progress=False)
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"id": i, "question": q, "golden_answers": [a]}) + "\n" for i, q, a in QUESTIONS))
    out = tmp_path / "run"
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(f"""
model: {model_dir}
sft_warm_start: false
lora: {{enabled: true, r: 4, alpha: 8, critic: true}}
data: {data}
eval_data: {data}
eval_questions: 0
index: {tmp_path / 'index'}
env_config: null
env: {{max_actions: 3, max_searches: 1}}
train_questions: 4
questions_per_update: 2
samples_per_question: 1
num_envs: 1
rollout_batch_size: 1
max_turn_tokens: 8
max_context_tokens: 1024
updates: 2
critic_warmup_updates: 0
micro_batch_size: 1
output_dir: {out}
export: false
save_every: 1
""")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), "-m", "training.ppo", "--config", str(recipe)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in lines] == [1, 2]
    assert all(m["world_size"] == 2 for m in lines)  # two ranks, not one process twice
