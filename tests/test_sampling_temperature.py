"""Temperature and top_p in PPO: the rollout records the behaviour policy μ = softmax(z / τ), the
trainer scores tokens under the same softmax(z / τ), and the config refuses what would mix the two
(tiny random Llama, float32, CPU)."""
from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_llama, tiny_tokenizer

from envs.protocol import judge_token_ids
from inference.backends.hf import HFBackend
from methods.llm import GenerationRequest
from training.config import ConfigError, LoraSettings, PPOConfig, dotted_keys, with_values
from training.models.policy_models import PolicyModel, sequence_logprobs, wrap_models
from training.rollouts.rollout_engine import MergedLoraHFBackend, build_rollout_backend
from training.rollouts.rollout_generation import TurnGenerator, eos_logprobs

TAU = 0.7
ATOL = 3e-5  # float32 noise: a left-padded, KV-cached batch against one full forward pass
PROMPTS = ["What is the capital of France?", "Which river flows through Berlin? <search>",
           "The capital of Japan is", "<answer>"]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def lm(tokenizer):
    return tiny_llama(tokenizer, init=0.3)


def prompt_ids(tokenizer) -> list[list[int]]:
    return [tokenizer(p)["input_ids"] for p in PROMPTS]


def next_logits(lm, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Logits ``[n, V]`` (float32) before each of ``tokens`` after ``prompt``: one unbatched
    forward pass, no cache."""
    with torch.no_grad():
        return lm(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()


def at(logits: torch.Tensor, tokens: list[int], temperature: float = 1.0,
       choices: tuple[int, ...] = ()) -> list[float]:
    """log softmax(logits / temperature)[token] per row (``[n, V]`` → n values), over ``choices``
    only when given."""
    z = logits / temperature
    if choices:
        z = torch.full_like(z, float("-inf")).index_copy(1, torch.tensor(choices), z[:, list(choices)])
    return z.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def requests_at(tokenizer, temperature: float, choices: tuple[int, ...]) -> list[GenerationRequest]:
    """Four free rows of 8 tokens and four one-token verdicts among ``choices``, all sampled."""
    prompts = prompt_ids(tokenizer)
    free = [GenerationRequest(p, max_tokens=8, temperature=temperature, seed=i) for i, p in enumerate(prompts)]
    verdicts = [GenerationRequest(p, max_tokens=1, temperature=temperature, seed=10 + i, allowed_token_ids=choices)
                for i, p in enumerate(prompts)]
    return free + verdicts


@pytest.fixture(scope="module")
def sampled_rows(lm, tokenizer):
    """(prompt, completion, sampler log-probs, constrained?) of every row sampled at ``TAU``."""
    choices = judge_token_ids(tokenizer)
    backend = HFBackend(lm, tokenizer, logprobs_mode="sampled")
    requests = requests_at(tokenizer, TAU, choices)
    rows = []
    for request, result in zip(requests, backend.generate(requests)):
        completion = result.completions[0]
        assert completion.token_ids and len(completion.logprobs) == len(completion.token_ids)
        rows.append((result.prompt_token_ids, completion.token_ids, completion.logprobs,
                     bool(request.allowed_token_ids)))
    return rows


def test_sampled_logprobs_are_those_of_the_tempered_distribution(lm, tokenizer, sampled_rows):
    choices = judge_token_ids(tokenizer)
    gap = 0.0
    for prompt, tokens, logprobs, constrained in sampled_rows:
        logits = next_logits(lm, prompt, tokens)
        options = {"choices": choices} if constrained else {}
        assert logprobs == pytest.approx(at(logits, tokens, TAU, **options), abs=ATOL)
        gap = max(gap, max(abs(a - b) for a, b in zip(logprobs, at(logits, tokens, 1.0, **options))))
    assert gap > 1e-2  # the raw log-probs would not pass


def right_padded(rows, pad: int) -> dict[str, torch.Tensor]:
    """A trainer batch of ``rows`` (prompt + completion, right-padded): input_ids and
    attention_mask ``[B, T]``, target_mask and choice_mask ``[B, T−1]`` and the sampler's
    log-probs ``[B, T−1]``."""
    b, width = len(rows), max(len(p) + len(t) for p, t, _, _ in rows)
    batch = {"input_ids": torch.full((b, width), pad), "attention_mask": torch.zeros(b, width, dtype=torch.long),
             "target_mask": torch.zeros(b, width - 1, dtype=torch.long),
             "choice_mask": torch.zeros(b, width - 1, dtype=torch.long), "sampler": torch.zeros(b, width - 1)}
    for i, (prompt, tokens, logprobs, constrained) in enumerate(rows):
        n, m = len(prompt), len(tokens)
        batch["input_ids"][i, :n + m] = torch.tensor(prompt + tokens)
        batch["attention_mask"][i, :n + m] = 1
        batch["target_mask"][i, n - 1:n + m - 1] = 1
        batch["choice_mask"][i, n - 1:n + m - 1] = int(constrained)
        batch["sampler"][i, n - 1:n + m - 1] = torch.tensor(logprobs)
    return batch


def test_trainer_at_the_rollout_temperature_reproduces_the_sampler(lm, tokenizer, sampled_rows):
    choices = judge_token_ids(tokenizer)
    batch = right_padded(sampled_rows, tokenizer.pad_token_id)
    mask, choice = batch["target_mask"].bool(), batch["choice_mask"].bool()
    assert choice.any() and (mask & ~choice).any()
    with torch.no_grad():
        logp, entropy = sequence_logprobs(lm, batch["input_ids"], batch["attention_mask"], chunk=7,
                                          target_mask=batch["target_mask"], with_entropy=True,
                                          choice_mask=batch["choice_mask"], choice_ids=torch.tensor(choices),
                                          temperature=TAU)
        plain, _ = sequence_logprobs(lm, batch["input_ids"], batch["attention_mask"], target_mask=batch["target_mask"],
                                     choice_mask=batch["choice_mask"], choice_ids=torch.tensor(choices))
    assert torch.allclose(logp[mask], batch["sampler"][mask], atol=ATOL)
    assert (plain - batch["sampler"])[mask].abs().max() > 1e-2  # τ = 1 would not reproduce them
    # The entropy is that of softmax(z / τ), over the choices at the verdicts.
    for i, (prompt, tokens, _, constrained) in enumerate(sampled_rows):
        z = next_logits(lm, prompt, tokens) / TAU
        if constrained:
            z = z[:, list(choices)]
        expected = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)
        n = len(prompt)
        assert torch.allclose(entropy[i, n - 1:n - 1 + len(tokens)], expected, atol=ATOL)


def test_temperature_one_gives_the_raw_logprobs(lm, tokenizer):
    choices = judge_token_ids(tokenizer)
    requests = requests_at(tokenizer, 1.0, choices)
    raw = HFBackend(lm, tokenizer).generate(requests)
    sampled = HFBackend(lm, tokenizer, logprobs_mode="sampled").generate(requests)
    for a, b in zip(raw, sampled):
        assert a.completions[0].token_ids == b.completions[0].token_ids
        assert a.completions[0].logprobs == pytest.approx(b.completions[0].logprobs, abs=1e-6)


def test_greedy_rows_keep_the_raw_logprob(lm, tokenizer):
    """Greedy rows (a verdict among the choices included) next to sampled ones: the raw π, which a
    greedy evaluation reads π(yes) from; "processed" would give 0.0."""
    choices = judge_token_ids(tokenizer)
    prompts = prompt_ids(tokenizer)
    requests = [GenerationRequest(prompts[0], max_tokens=6),
                GenerationRequest(prompts[1], max_tokens=6, temperature=TAU, seed=1),
                GenerationRequest(prompts[2], max_tokens=1, allowed_token_ids=choices)]
    results = HFBackend(lm, tokenizer, logprobs_mode="sampled").generate(requests)
    for request, result in zip(requests, results):
        tokens, logprobs = result.completions[0].token_ids, result.completions[0].logprobs
        logits = next_logits(lm, result.prompt_token_ids, tokens)
        options = {"choices": choices} if request.allowed_token_ids else {}
        expected = at(logits, tokens, request.temperature or 1.0, **options)
        assert logprobs == pytest.approx(expected, abs=ATOL)
        if request.temperature == 0:
            assert all(v < -1e-3 for v in logprobs)  # not the processed mode's 0.0


def test_eos_logprobs_follow_the_sampled_mode(lm, tokenizer):
    eos = tokenizer.eos_token_id
    backend = HFBackend(lm, tokenizer, logprobs_mode="sampled")
    prompt = prompt_ids(tokenizer)[0]
    generator = TurnGenerator(backend)  # the session path: logits from the kept cache
    completion = generator.generate([GenerationRequest(prompt, max_tokens=4, temperature=TAU, seed=2)], [0])[0]
    ids = prompt + completion.completions[0].token_ids
    logits = next_logits(lm, ids, [eos])
    for temperature in (TAU, 0.0):
        expected = at(logits, [eos], temperature or 1.0)
        assert eos_logprobs(backend, [ids], eos, temperature) == pytest.approx(expected, abs=ATOL)
        assert generator.eos_logprobs([ids], [0], eos, temperature, 0, 1.0) == pytest.approx(expected, abs=ATOL)
    assert abs(at(logits, [eos], TAU)[0] - at(logits, [eos])[0]) > 1e-2


def cfg_at(tmp_path, **overrides) -> PPOConfig:
    values = dict(output_dir=str(tmp_path), temperature=TAU, lora=LoraSettings(r=4, alpha=8), export=False)
    values.update(overrides)
    return with_values(PPOConfig, dotted_keys(values))


@pytest.mark.parametrize("lora", [False, True])
def test_rollout_engine_records_mu_and_the_models_score_at_its_temperature(tokenizer, tmp_path, lora):
    """The HF rollout engine (live model, or the merged LoRA copy) records μ's log-probs; the actor
    and the reference that ``wrap_models`` builds reproduce them (LoRA starts at B = 0)."""
    cfg = cfg_at(tmp_path, lora=LoraSettings(enabled=lora, r=4, alpha=8))
    models = wrap_models(tiny_llama(tokenizer, init=0.3), tokenizer, cfg.model, cfg.algorithm, cfg.rollout)
    assert models.actor.temperature == TAU
    backend = build_rollout_backend(cfg.rollout, cfg.model, models.actor, tokenizer, accelerator=None, seed=0)
    assert backend.logprobs_mode == "sampled" and isinstance(backend, MergedLoraHFBackend) == lora
    choices = judge_token_ids(tokenizer)
    requests = requests_at(tokenizer, TAU, choices)
    rows = [(r.prompt_token_ids, r.completions[0].token_ids, r.completions[0].logprobs, bool(q.allowed_token_ids))
            for q, r in zip(requests, backend.generate(requests))]
    batch = right_padded(rows, tokenizer.pad_token_id)
    mask = batch["target_mask"].bool()
    with torch.no_grad():
        actor, _ = models.actor(batch["input_ids"], batch["attention_mask"], batch["target_mask"],
                                choice_mask=batch["choice_mask"], choice_ids=torch.tensor(choices))
        reference = models.reference_logprobs(batch["input_ids"], batch["attention_mask"], batch["target_mask"],
                                              choice_mask=batch["choice_mask"], choice_ids=torch.tensor(choices))
    assert torch.allclose(actor[mask], batch["sampler"][mask], atol=ATOL)
    assert torch.allclose(reference[mask], batch["sampler"][mask], atol=ATOL)


def test_rollout_engine_at_temperature_one_matches_the_raw_backend(lm, tokenizer, tmp_path):
    cfg = cfg_at(tmp_path, temperature=1.0, lora=LoraSettings(enabled=False))
    backend = build_rollout_backend(cfg.rollout, cfg.model, PolicyModel(lm), tokenizer, accelerator=None, seed=0)
    requests = requests_at(tokenizer, 1.0, judge_token_ids(tokenizer))
    for a, b in zip(HFBackend(lm, tokenizer).generate(requests), backend.generate(requests)):
        assert a.completions[0].token_ids == b.completions[0].token_ids
        assert a.completions[0].logprobs == pytest.approx(b.completions[0].logprobs, abs=1e-6)
    assert backend.logprobs_mode == "sampled"


@pytest.mark.parametrize("overrides, message", [
    (dict(temperature=0.0), "temperature must be > 0"),
    (dict(temperature=-0.5), "temperature must be > 0"),
    (dict(top_p=0.0), "top_p must be in"),
    (dict(top_p=1.5), "top_p must be in"),
    (dict(top_p=0.9, old_logprobs="sampler"), "old_logprobs: recompute"),
    (dict(rollout_engine="vllm", temperature=0.7, tis="token"), "rollout_engine vllm records raw"),
    (dict(rollout_engine="vllm", top_p=0.9, tis="sequence"), "rollout_engine vllm records raw"),
    (dict(rollout_engine="vllm", temperature=0.7, old_logprobs="sampler"), "rollout_engine vllm records raw"),
])
def test_config_refuses_logprobs_that_are_not_pi_old(overrides, message):
    with pytest.raises(ConfigError, match=message):
        with_values(PPOConfig, dotted_keys(overrides))


def test_config_accepts_the_consistent_neighbours_of_what_it_refuses():
    """Each accepted setting next to the refused one that differs from it by one field."""
    cases = [  # (accepted, the field that makes it refused)
        (dict(temperature=0.7, old_logprobs="sampler"), dict(top_p=0.9)),  # HF: μ = softmax(z / τ) = π_old
        (dict(top_p=0.9, tis="token"), dict(tis="none", old_logprobs="sampler")),  # recompute: w corrects the nucleus
        (dict(rollout_engine="vllm", temperature=0.7), dict(tis="token")),  # vLLM's values unused
        (dict(rollout_engine="vllm", tis="token"), dict(temperature=0.7)),  # τ = 1, top_p = 1: raw is μ
    ]
    for accepted, change in cases:
        with_values(PPOConfig, dotted_keys(accepted))
        with pytest.raises(ConfigError):
            with_values(PPOConfig, dotted_keys({**accepted, **change}))
