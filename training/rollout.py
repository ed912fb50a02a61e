"""Multi-turn SEEDS-R1 rollouts, token-in/token-out, for the PPO trainer.

One :class:`Episode` is one flat token list with parallel arrays:

- ``loss_mask``: 1 on model-generated tokens (each turn's completion, closing tag included,
  and the EOS after an accepted ``</answer>``), 0 on the prompt and on observations;
- ``sampler_logprobs``: the backend's log-prob of each model token (``0.0`` elsewhere);
- ``turn_ids``: ``-1`` on the prompt, then ``t`` on turn ``t``'s model tokens and on the
  observation that follows them.

The sequence is never re-rendered from text: the prompt is tokenised once
(``add_special_tokens=True``, like :class:`methods.transcript.TokenTranscript`), each turn's
completion ids are appended as the backend returned them, and each observation is tokenised once
as ``"\\n" + observation + "\\n"`` (``add_special_tokens=False``). A checkpoint trained on these
episodes is evaluated by ``methods.seeds.SeedsR1`` on exactly the same token layout.

Turn loop (:func:`collect_rollouts`): episodes run in batches of ``venv.num_envs``; every turn
makes ONE ``backend.generate`` call for all live episodes (token-id prompts, stop strings =
:data:`envs.protocol.CLOSING_TAGS`) and ONE ``venv.step`` (so at most one retrieval call). The
action given to the env is the completion's text (which ends exactly at the stop string; the
last token may carry a few characters past it, see :mod:`inference.backends.hf`; those tokens
are kept as sampled). A completion that ran out of tokens (``length``) or ended with the model's
EOS still goes to the env, which records an invalid action; such an EOS is not in
``token_ids`` (the backend contract drops it) and the episode goes on. When the env accepts an
answer (``terminated``) and the completion ended with ``</answer>``, the tokenizer's EOS id is
appended as a model token with its log-prob under the sampler (:func:`eos_logprobs`: one
forward pass on the HF model, or ``prompt_logprobs`` on the vLLM engine).

Ends (``Episode.finish_reason``): ``"answer"`` (the env terminated on an answer),
``"action_limit"`` (the env truncated: too many actions; its last observation is not appended),
``"context_limit"`` (the next turn would not fit: ``len(token_ids) + max_turn_tokens + 1 >
max_context_tokens``, checked before every turn with the pending observation counted; that
observation is then not appended, as the model never reads it), ``"error"`` (the backend returned an error completion). ``Episode.reward`` is
the env's total (terminal reward plus format penalties, ``info["episode"]["reward"]["total"]``);
for ``context_limit`` and ``error`` episodes the env's current summary is used, so the reward
is the terminal reward the env would give if it truncated there.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from envs.protocol import CLOSING_TAGS
from envs.types import QAExample
from envs.vector_env import SearchVectorEnv
from inference.backends.base import GenerationRequest, LLMBackend

ANSWER_TAG = "</answer>"
FINISH_REASONS = ("answer", "action_limit", "context_limit", "error")


@dataclass
class Episode:
    token_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]
    turn_ids: list[int]
    prompt_length: int
    example_id: str
    group_id: int
    reward: float = 0.0
    info: dict = field(default_factory=dict)
    finish_reason: str = ""
    text: str = ""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        n = len(self.token_ids)
        assert len(self.loss_mask) == n and len(self.sampler_logprobs) == n and len(self.turn_ids) == n, (
            f"parallel arrays differ: {n} ids, {len(self.loss_mask)} mask, {len(self.sampler_logprobs)} logprobs, "
            f"{len(self.turn_ids)} turn ids")
        assert 0 <= self.prompt_length <= n

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def num_turns(self) -> int:
        return max(self.turn_ids, default=-1) + 1


@dataclass
class RolloutConfig:
    max_turn_tokens: int = 256  # generation cap per turn
    max_context_tokens: int = 4096  # whole episode cap (prompt + turns + observations + EOS)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    samples_per_question: int = 1  # n: episodes per question, sharing a group_id (GRPO)
    seed: int | None = None  # env reset seeds and per-request generation seeds

    def __post_init__(self) -> None:
        if self.max_turn_tokens < 1 or self.samples_per_question < 1:
            raise ValueError("max_turn_tokens and samples_per_question must be at least 1")
        if self.max_context_tokens <= self.max_turn_tokens:
            raise ValueError("max_context_tokens must exceed max_turn_tokens")


def default_prompt_fn() -> Callable[[str], str]:
    from methods.seeds import SeedsR1

    return SeedsR1().prompt


# ------------------------------------------------------------------------------ EOS log-probs

def eos_logprobs(backend: LLMBackend, sequences: list[list[int]], eos_id: int, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0) -> list[float]:
    """Log-prob of ``eos_id`` right after each sequence, as the backend reports sampled tokens.

    HF (a backend with a torch ``model``): one batched, left-padded forward pass, last position
    only; ``logprobs_mode="raw"`` gives ``log_softmax(logits)[eos]``, ``"processed"`` applies
    temperature / top-k / top-p like the sampler (``0.0`` when greedy, ``-inf`` if EOS is cut).
    vLLM (a backend with an ``llm`` engine): the sequence plus EOS is submitted with
    ``prompt_logprobs=0`` and ``max_tokens=1``; the last prompt position's entry is EOS's
    log-prob. vLLM computes prompt log-probs from the raw logits, so this matches the default
    ``raw_logprobs`` mode, not ``processed_logprobs``.
    """
    if not sequences:
        return []
    if getattr(backend, "llm", None) is not None and hasattr(backend, "_vllm"):
        return _vllm_eos_logprobs(backend, sequences, eos_id)
    if getattr(backend, "model", None) is not None:
        processed = getattr(backend, "logprobs_mode", "raw") == "processed"
        return _hf_eos_logprobs(backend, sequences, eos_id, (temperature, top_k, top_p) if processed else None)
    raise NotImplementedError(f"EOS log-probs need a local model (hf) or engine (vllm), not {backend.name!r}")


def _hf_eos_logprobs(backend: Any, sequences: list[list[int]], eos_id: int,
                     processed: tuple[float, int, float] | None) -> list[float]:
    import inspect

    import torch

    model = backend.model
    device = getattr(backend, "device", None) or next(model.parameters()).device
    pad = getattr(backend, "pad_id", 0)
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    keep_last = "logits_to_keep" in inspect.signature(base.forward).parameters
    batch_size = max(1, int(getattr(backend, "max_batch_size", 8)))
    out: list[float] = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for first in range(0, len(sequences), batch_size):
                chunk = sequences[first:first + batch_size]
                width = max(len(s) for s in chunk)
                ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for i, seq in enumerate(chunk):
                    ids[i, width - len(seq):] = torch.tensor(seq)
                    mask[i, width - len(seq):] = 1
                ids, mask = ids.to(device), mask.to(device)
                position = (mask.cumsum(-1) - 1).clamp(min=0)
                options = {"logits_to_keep": 1} if keep_last else {}
                logits = model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=False,
                               **options).logits[:, -1, :].float()  # [b, V]
                out.extend(_eos_from_logits(logits, eos_id, processed))
    finally:
        model.train(was_training)
    return out


def _eos_from_logits(logits: Any, eos_id: int, processed: tuple[float, int, float] | None) -> list[float]:
    """``logits``: ``[b, V]`` float32 → EOS log-prob per row (raw, or under the sampling filters)."""
    if processed is None:
        return (logits[:, eos_id] - logits.logsumexp(-1)).tolist()
    temperature, top_k, top_p = processed
    if temperature == 0:
        return [0.0] * logits.shape[0]  # the backend's convention for greedy rows
    scores = logits / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        values, index = scores.sort(dim=-1, descending=True)
        probs = values.softmax(-1)
        drop = probs.cumsum(-1) - probs >= top_p
        scores = scores.scatter(1, index, values.masked_fill(drop, float("-inf")))
    return scores.log_softmax(-1)[:, eos_id].tolist()


def _vllm_eos_logprobs(backend: Any, sequences: list[list[int]], eos_id: int) -> list[float]:
    vllm = backend._vllm
    tokens_prompt = getattr(vllm.inputs, "TokensPrompt", dict)
    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    outputs = backend.llm.generate([tokens_prompt(prompt_token_ids=list(s) + [eos_id]) for s in sequences], params,
                                   use_tqdm=False)
    values = []
    for output in outputs:
        entry = output.prompt_logprobs[-1][eos_id]
        values.append(float(getattr(entry, "logprob", entry)))
    return values


# ------------------------------------------------------------------------------ rollouts

@dataclass
class _Slot:
    """One live episode in a batch."""

    index: int  # global episode number in this call
    example: QAExample
    group_id: int
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    turns: list[int]
    prompt_length: int
    turn: int = 0
    done: bool = False
    finish_reason: str = ""
    info: dict = field(default_factory=dict)


def _request_seed(seed: int | None, episode: int, turn: int) -> int | None:
    if seed is None:
        return None
    return (seed * 1_000_003 + episode * 10_007 + turn) % (2**31 - 1)


def collect_rollouts(backend: LLMBackend, venv: SearchVectorEnv, examples: Sequence[QAExample],
                     config: RolloutConfig | None = None,
                     prompt_fn: Callable[[str], str] | None = None, progress: str | None = None) -> list[Episode]:
    """Run ``len(examples) * n`` episodes (n = ``samples_per_question``), ``venv.num_envs`` at a time.

    Episodes come back in order: the n samples of ``examples[0]`` (``group_id`` 0), then of
    ``examples[1]`` (``group_id`` 1), ... ``group_id`` is unique within one call only.
    ``progress``: a description for a tqdm bar counting finished episodes (None: no bar).
    """
    config = config or RolloutConfig()
    prompt_fn = prompt_fn or default_prompt_fn()
    tokenizer = backend.tokenizer
    if tokenizer is None:
        raise ValueError("token-in/token-out rollouts need a backend with a local tokenizer")
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise ValueError("the tokenizer has no EOS token")
    jobs = [(g, ex) for g, ex in enumerate(examples) for _ in range(config.samples_per_question)]
    episodes: list[Episode] = []
    from tqdm import tqdm

    with tqdm(total=len(jobs), desc=progress, unit="episode", leave=False, disable=progress is None) as bar:
        for start in range(0, len(jobs), venv.num_envs):
            chunk = jobs[start:start + venv.num_envs]
            episodes.extend(_run_batch(backend, venv, chunk, start, config, prompt_fn, tokenizer, eos_id, bar))
    return episodes


def _run_batch(backend: LLMBackend, venv: SearchVectorEnv, chunk: list[tuple[int, QAExample]], offset: int,
               config: RolloutConfig, prompt_fn: Callable[[str], str], tokenizer: Any, eos_id: int,
               bar: Any = None) -> list[Episode]:
    # Slots past the chunk (last batch) replay its first example and never act.
    reset_examples = [ex for _, ex in chunk] + [chunk[0][1]] * (venv.num_envs - len(chunk))
    seed = None if config.seed is None else config.seed + offset
    venv.reset(seed=seed, examples=reset_examples)
    slots = []
    for k, (group, example) in enumerate(chunk):
        ids = list(tokenizer(prompt_fn(example.question), add_special_tokens=True)["input_ids"])
        n = len(ids)
        slots.append(_Slot(offset + k, example, group, ids, [0] * n, [0.0] * n, [-1] * n, n))
    reserve = config.max_turn_tokens + 1  # one turn plus a possible EOS
    for k, slot in enumerate(slots):
        if len(slot.ids) + reserve > config.max_context_tokens:
            _end(venv, slot, k, reason="context_limit")
    while True:
        live = [k for k, s in enumerate(slots) if not s.done]
        if bar is not None:
            bar.update(offset + len(slots) - len(live) - bar.n)
        if not live:
            break
        requests = [GenerationRequest(list(slots[k].ids), stop=CLOSING_TAGS, max_tokens=config.max_turn_tokens,
                                      temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                                      seed=_request_seed(config.seed, slots[k].index, slots[k].turn))
                    for k in live]
        results = backend.generate(requests)
        actions: list[str | None] = [None] * venv.num_envs
        completions = {}
        for k, result in zip(live, results):
            completion = result.completions[0]
            slot = slots[k]
            if completion.finish_reason == "error":
                _end(venv, slot, k, reason="error")
                slot.info["error"] = completion.error
                continue
            assert len(completion.token_ids) == len(completion.logprobs)
            slot.ids += completion.token_ids
            slot.mask += [1] * len(completion.token_ids)
            slot.logprobs += [float(x) for x in completion.logprobs]
            slot.turns += [slot.turn] * len(completion.token_ids)
            actions[k] = completion.text
            completions[k] = completion
        if not completions:
            continue
        observations, _, terminated, truncated, infos = venv.step(actions)
        answered = []
        for k, completion in completions.items():
            slot = slots[k]
            if terminated[k]:
                slot.done, slot.finish_reason, slot.info = True, "answer", infos[k]["episode"]
                if completion.finish_reason == "stop" and completion.stop_string == ANSWER_TAG:
                    answered.append(k)
                continue
            if truncated[k]:
                slot.done, slot.finish_reason, slot.info = True, "action_limit", infos[k]["episode"]
                continue
            obs_ids = list(tokenizer("\n" + observations[k] + "\n", add_special_tokens=False)["input_ids"])
            if len(slot.ids) + len(obs_ids) + reserve > config.max_context_tokens:
                _end(venv, slot, k, reason="context_limit")
                continue
            slot.ids += obs_ids
            slot.mask += [0] * len(obs_ids)
            slot.logprobs += [0.0] * len(obs_ids)
            slot.turns += [slot.turn] * len(obs_ids)
            slot.turn += 1
        if answered:
            values = eos_logprobs(backend, [slots[k].ids for k in answered], eos_id, config.temperature,
                                  config.top_k, config.top_p)
            for k, value in zip(answered, values):
                slot = slots[k]
                slot.ids.append(eos_id)
                slot.mask.append(1)
                slot.logprobs.append(float(value))
                slot.turns.append(slot.turn)
    return [_episode(slot, tokenizer) for slot in slots]


def _end(venv: SearchVectorEnv, slot: _Slot, k: int, reason: str) -> None:
    """End an episode the env did not end: its reward is the env's summary as it stands."""
    slot.done, slot.finish_reason = True, reason
    slot.info = venv.envs[k].summary()


def _episode(slot: _Slot, tokenizer: Any) -> Episode:
    reward = float(slot.info.get("reward", {}).get("total", 0.0))
    info = dict(slot.info)
    return Episode(token_ids=slot.ids, loss_mask=slot.mask, sampler_logprobs=slot.logprobs, turn_ids=slot.turns,
                   prompt_length=slot.prompt_length, example_id=slot.example.id, group_id=slot.group_id,
                   reward=reward, info=info, finish_reason=slot.finish_reason,
                   text=tokenizer.decode(slot.ids, skip_special_tokens=False))


# ------------------------------------------------------------------------------ statistics

def rollout_stats(episodes: Sequence[Episode]) -> dict[str, float]:
    """Batch metrics for logging (means per episode unless said otherwise).

    ``selection_precision``, ``open_rate_positive`` and ``open_rate_negative`` are pooled over the
    batch (opened positives / opened docs; opened / shown positives; opened / shown negatives).
    """
    n = len(episodes)
    if n == 0:
        return {"episodes": 0}

    def total(key: str) -> float:
        return float(sum(e.info.get(key, 0) for e in episodes))

    def ratio(a: float, b: float) -> float:
        return a / b if b else 0.0

    positives_shown, docs_shown = total("positives_shown"), total("docs_shown")
    negatives_shown = docs_shown - positives_shown
    stats = {
        "episodes": n,
        "reward_mean": sum(e.reward for e in episodes) / n,
        "reward_std": math.sqrt(sum((e.reward - sum(x.reward for x in episodes) / n) ** 2 for e in episodes) / n),
        "em": sum(e.info.get("metrics", {}).get("em", 0.0) for e in episodes) / n,
        "f1": sum(e.info.get("metrics", {}).get("f1", 0.0) for e in episodes) / n,
        "selection_precision": ratio(total("positives_opened"), total("docs_read")),
        "open_rate_positive": ratio(total("positives_opened"), positives_shown),
        "open_rate_negative": ratio(total("negatives_opened"), negatives_shown),
        "docs_read_per_question": total("docs_read") / n,
        "searches_per_question": total("n_searches") / n,
        "actions_per_question": total("n_actions") / n,
        "invalid_per_question": total("n_invalid") / n,
        "model_tokens_mean": sum(e.num_model_tokens for e in episodes) / n,
        "episode_tokens_mean": sum(len(e.token_ids) for e in episodes) / n,
    }
    reasons = Counter(e.finish_reason for e in episodes)
    for reason in FINISH_REASONS:
        stats[f"finish/{reason}"] = reasons.get(reason, 0) / n
    return stats
