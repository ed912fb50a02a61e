"""Multi-turn SEEDS-R1 rollouts, token-in/token-out, for the PPO trainer.

One :class:`Episode` (defined in :mod:`training.rollouts.rollout_episode`) is one flat token list with parallel arrays:

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
makes ONE generation call for all live episodes (token-id prompts, stop strings =
:data:`envs.protocol.CLOSING_TAGS`) and ONE ``venv.step`` (so at most one retrieval call). On an
HF backend the call goes through a :class:`~training.rollouts.rollout_generation.TurnGenerator` that keeps
each episode's KV cache across turns (``reuse_kv_cache``, default on: only the tokens added since
the last turn are run; the completions are those ``backend.generate`` gives, up to float noise);
other backends get ``backend.generate`` every turn (vLLM reuses the prompt by prefix caching). The
action given to the env is the completion's text (which ends exactly at the stop string; the
last token may carry a few characters past it, see :mod:`inference.backends.hf`; those tokens
are kept as sampled). A completion that ran out of tokens (``length``) or ended with the model's
EOS still goes to the env, which records an invalid action; such an EOS is not in
``token_ids`` (the backend contract drops it) and the episode goes on. When the env accepts an
answer (``terminated``) and the completion ended with ``</answer>``, the tokenizer's EOS id is
appended as a model token with its log-prob under the sampler (:func:`eos_logprobs`: from the
kept KV cache, one forward pass on the HF model, or ``prompt_logprobs`` on the vLLM engine).
With ``record_states_after: d`` (the trainer's frozen depth) and the KV session, the hidden states
after the model's first ``d`` decoder layers are kept for every token the rollout ran, and each
episode and verdict row carries its own (``frozen_states``, :mod:`training.rollouts.rollout_states`).

Forced answer (``force_answer``, default off, the same setting and default as
:class:`methods.seeds.SeedsR1`, with the same pieces from :mod:`methods.agent_loop`): when an
episode has one action left (two while a snapshot waits for an expand: ``<expand>none</expand>``
is then stepped in the env for it, and that text and the observation appended), ``<answer>`` is
appended as prompt tokens (loss mask 0, the turn it opens) and the model fills the answer (stop
at ``</answer>``, at most 32 tokens whatever ``max_turn_tokens`` is, as in evaluation; the context
check before it counts those 32 and an EOS); the env gets ``<answer>`` + the cleaned text. An
empty cleaned answer ends the episode unanswered (``"empty_answer"``), as evaluation does.

Ends (``Episode.finish_reason``): ``"answer"`` (the env terminated on an answer),
``"action_limit"`` (the env truncated: too many actions; its last observation is not appended),
``"context_limit"`` (the next turn would not fit: ``len(token_ids) + max_turn_tokens + 1 >
max_context_tokens``, checked before every turn with the pending observation counted; that
observation is then not appended, as the model never reads it), ``"empty_answer"`` (a forced
answer with nothing in it), ``"error"`` (the backend returned an error completion).
``Episode.reward`` is the env's total (terminal reward plus format penalties,
``info["episode"]["reward"]["total"]``); for ``context_limit``, ``empty_answer`` and ``error``
episodes the env's current summary is used, so the reward is the terminal reward the env would
give if it truncated there.
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from envs.config import EnvConfig
from envs.protocol import CLOSING_TAGS, format_answer, format_expand, judge_token_ids
from envs.rewards import RewardConfig
from envs.types import QAExample
from envs.vector_env import SearchVectorEnv
from inference.backends.hf_session import session_supported
from methods.agent_loop import (
    FORCE_ANSWER_DEFAULT,
    FORCED_ANSWER_MAX_TOKENS,
    FORCED_ANSWER_OPENING,
    FORCED_ANSWER_STOP,
    FORCED_EXPAND_TEXT,
    forced_answer_text,
    must_force_answer,
)
from methods.llm import GenerationRequest, LLMBackend
from methods.seeds import SeedsR1
from training.rollouts.rollout_episode import FINISH_REASONS, Episode, rollout_stats
from training.rollouts.rollout_generation import TurnGenerator, end_episode, eos_logprobs, request_seed
from training.rollouts.rollout_judge import (
    VerdictRow,
    check_verdict_cut,
    judge_snapshots,
    judging_rows,
    record_judgement,
    verdict_reward_gaps,
)
from training.rollouts.rollout_states import FrozenStateRecorder

if TYPE_CHECKING:
    from inference.backends.hf import HFBackend

__all__ = ["FINISH_REASONS", "Episode", "RolloutConfig", "collect_rollouts", "eos_logprobs", "rollout_stats"]

ANSWER_TAG = "</answer>"


@dataclass
class RolloutConfig:
    max_turn_tokens: int = 256  # generation cap per turn
    max_context_tokens: int = 4096  # whole episode cap (prompt + turns + observations + EOS)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    samples_per_question: int = 1  # n: episodes per question, sharing a group_id (GRPO)
    seed: int | None = None  # env reset seeds and per-request generation seeds
    force_answer: bool = FORCE_ANSWER_DEFAULT  # one action left: "<answer>" written for the model (SeedsR1's setting)
    reuse_kv_cache: bool = True  # HF backends: keep each episode's KV cache across turns (rollout_generation.py)
    constrain_verdicts: bool = True  # judgement form: each verdict is sampled among the yes/no tokens only
    # greedy (temperature 0) verdicts judged alone: how a snapshot's π(yes) become opens (envs.protocol.cut_verdicts)
    verdict_cut: str = "level"
    record_states_after: int = 0  # HF session: keep the states after this many decoder layers (0: none)

    def __post_init__(self) -> None:
        if self.max_turn_tokens < 1 or self.samples_per_question < 1:
            raise ValueError("max_turn_tokens and samples_per_question must be at least 1")
        if self.max_context_tokens <= self.max_turn_tokens:
            raise ValueError("max_context_tokens must exceed max_turn_tokens")
        check_verdict_cut(self.verdict_cut, self.temperature, self.constrain_verdicts)


def default_prompt_fn(env: EnvConfig) -> Callable[[str], str]:
    """The SEEDS-R1 prompt stating ``env``'s limits (the env the rollouts run in)."""
    return functools.partial(SeedsR1.prompt, env=env)


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
    choices: list[int] = field(default_factory=list)  # Episode.choice_mask
    pending_verdicts: list[tuple[int, bool]] = field(default_factory=list)  # (token position, opened) being judged
    judgements: list[tuple[int, list[tuple[int, bool]]]] = field(default_factory=list)  # (search index, verdicts)
    verdict_rows: list[VerdictRow] = field(default_factory=list)  # Episode.verdict_rows
    frozen_states: Any = None  # Episode.frozen_states, taken when the episode ends
    states_taken: bool = False

    def append(self, ids: list[int], mask: int, logprobs: list[float], choice: bool = False) -> None:
        """Tokens of the current turn: model tokens (``mask`` 1) or text it was given (0);
        ``choice``: a model token picked among constrained choices (a verdict)."""
        self.ids += ids
        self.mask += [mask] * len(ids)
        self.logprobs += logprobs
        self.turns += [self.turn] * len(ids)
        self.choices += [int(choice)] * len(ids)


def collect_rollouts(backend: LLMBackend, venv: SearchVectorEnv, examples: Sequence[QAExample],
                     config: RolloutConfig | None = None,
                     prompt_fn: Callable[[str], str] | None = None, progress: str | None = None) -> list[Episode]:
    """Run ``len(examples) * n`` episodes (n = ``samples_per_question``), ``venv.num_envs`` at a time.

    Episodes come back in order: the n samples of ``examples[0]`` (``group_id`` 0), then of
    ``examples[1]`` (``group_id`` 1), ... ``group_id`` is unique within one call only.
    ``progress``: a description for a tqdm bar counting finished episodes (None: no bar).
    ``venv`` should count observation caps in the policy's tokens (``SearchVectorEnv(...,
    tokenizer=backend.tokenizer)``, as evaluation does); a warning says when it does not.
    """
    config = config or RolloutConfig()
    prompt_fn = prompt_fn or default_prompt_fn(venv.config)
    tokenizer = backend.tokenizer
    if tokenizer is None:
        raise ValueError("token-in/token-out rollouts need a backend with a local tokenizer")
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise ValueError("the tokenizer has no EOS token")
    if any(env.counter.tokenizer is None for env in venv.envs):
        warnings.warn("the rollout env counts observation caps in whitespace words, evaluation in policy tokens: "
                      "build SearchVectorEnv(..., tokenizer=backend.tokenizer)", stacklevel=2)
    verdict_ids: tuple[int, ...] = ()
    if config.constrain_verdicts and venv.config.judge_form.judged:
        verdict_ids = judge_token_ids(tokenizer)
    jobs = [(g, ex) for g, ex in enumerate(examples) for _ in range(config.samples_per_question)]
    episodes: list[Episode] = []
    recorder = state_recorder(backend, config)
    from tqdm import tqdm

    with tqdm(total=len(jobs), desc=progress, unit="episode", leave=False, disable=progress is None) as bar, \
            (recorder.capturing() if recorder is not None else contextlib.nullcontext()):
        for start in range(0, len(jobs), venv.num_envs):
            chunk = jobs[start:start + venv.num_envs]
            generator = TurnGenerator(backend, config.reuse_kv_cache, recorder)
            batch = _Batch(generator, venv, config, tokenizer, eos_id, verdict_ids)
            episodes.extend(batch.run(chunk, start, prompt_fn, bar))
    return episodes


def state_recorder(backend: LLMBackend, config: RolloutConfig) -> FrozenStateRecorder | None:
    """A recorder of the states after ``record_states_after`` layers, where the backend runs a
    local model through the KV session (else None: the trainer computes the states itself)."""
    if not config.record_states_after or not config.reuse_kv_cache or not session_supported(backend):
        return None
    return FrozenStateRecorder(cast("HFBackend", backend).model, config.record_states_after)  # session_supported


@dataclass
class _Batch:
    """One batch of episodes, one per env slot (the slot number is the episode's key)."""

    generator: TurnGenerator
    venv: SearchVectorEnv
    config: RolloutConfig
    tokenizer: Any
    eos_id: int
    verdict_ids: tuple[int, ...] = ()  # constrained verdict choices (empty: verdicts sampled freely)

    @property
    def reserve(self) -> int:
        return self.config.max_turn_tokens + 1  # one turn plus a possible EOS

    def run(self, chunk: list[tuple[int, QAExample]], offset: int, prompt_fn: Callable[[str], str],
            bar: Any = None) -> list[Episode]:
        venv, config = self.venv, self.config
        # Slots past the chunk (last batch) replay its first example and never act.
        reset_examples = [ex for _, ex in chunk] + [chunk[0][1]] * (venv.num_envs - len(chunk))
        venv.reset(seed=None if config.seed is None else config.seed + offset, examples=reset_examples)
        slots = []
        for k, (group, example) in enumerate(chunk):
            ids = list(self.tokenizer(prompt_fn(example.question), add_special_tokens=True)["input_ids"])
            slots.append(_Slot(offset + k, example, group, ids, [0] * len(ids), [0.0] * len(ids), [-1] * len(ids),
                               len(ids), choices=[0] * len(ids)))
            if len(ids) + self.reserve > config.max_context_tokens:
                end_episode(venv, slots[k], k, reason="context_limit")
        while True:
            for k, s in enumerate(slots):
                if s.done and not s.states_taken:  # before release forgets them
                    s.frozen_states, s.states_taken = self.generator.frozen_states(k, len(s.ids)), True
            self.generator.release([k for k, s in enumerate(slots) if s.done])
            live = [k for k, s in enumerate(slots) if not s.done]
            if bar is not None:
                bar.update(offset + len(slots) - len(live) - bar.n)
            if not live:
                return [_episode(slot, self.tokenizer, venv.config.reward) for slot in slots]
            forced = self.open_forced_answers(slots, live) if config.force_answer else set()
            live = [k for k in live if not slots[k].done]
            if live:
                self.turn(slots, live, forced)

    def turn(self, slots: list[_Slot], live: list[int], forced: set[int]) -> None:
        """One generation call for the live episodes, one env step, observations appended."""
        requests = [self.request(slots[k], forced=k in forced) for k in live]
        actions: list[str | None] = [None] * self.venv.num_envs
        completions = {}
        for k, result in zip(live, self.generator.generate(requests, live)):
            completion, slot = result.completions[0], slots[k]
            if completion.finish_reason == "error":
                end_episode(self.venv, slot, k, reason="error")
                slot.info["error"] = completion.error
                continue
            assert len(completion.token_ids) == len(completion.logprobs)
            slot.append(completion.token_ids, 1, [float(x) for x in completion.logprobs])
            actions[k] = completion.text
            if k in forced:
                answer = forced_answer_text(completion.text)
                if not answer:  # nothing to answer with: ends unanswered, as in evaluation
                    end_episode(self.venv, slot, k, reason="empty_answer")
                    continue
                actions[k] = format_answer(answer)
            completions[k] = completion
        if not completions:
            return
        observations, _, terminated, truncated, infos = self.venv.step(actions)
        answered = []
        open_rows = []
        for k, completion in completions.items():
            if self.close_if_ended(slots[k], terminated[k], truncated[k], infos[k]):
                if terminated[k] and completion.finish_reason == "stop" and completion.stop_string == ANSWER_TAG:
                    answered.append(k)
                continue
            open_rows.append(k)
        form = self.venv.config.judge_form
        judging = judging_rows(observations, open_rows) if form.judged else {}
        for k in open_rows:  # judged alone, the snapshot is shown as it is (its verdicts are made elsewhere)
            if (form.alone or k not in judging) and self.append_prompt_text(slots[k], k,
                                                                             [f"\n{observations[k]}\n"]):
                slots[k].turn += 1
        if answered:
            self.append_eos(slots, answered)
        if judging:
            self.judge(slots, judging)

    def judge(self, slots: list[_Slot], judging: dict[int, str]) -> None:
        """Snapshots in the judgement form: verdicts (:mod:`training.rollouts.rollout_judge`), then the expand
        step they make and its observation; the judgement is a turn of its own."""
        judging = {k: obs for k, obs in judging.items() if not slots[k].done}
        if self.venv.config.judge_form.in_stream:
            for k in judging:
                slots[k].turn += 1
        expands = judge_snapshots(self, slots, judging)
        if not expands:
            return
        actions: list[str | None] = [None] * self.venv.num_envs
        for k, action in expands.items():
            actions[k] = action
        observations, _, terminated, truncated, infos = self.venv.step(actions)
        for k in expands:
            record_judgement(slots[k], infos[k])
            if not self.close_if_ended(slots[k], terminated[k], truncated[k], infos[k]):
                if self.append_prompt_text(slots[k], k, [f"\n{observations[k]}\n"]):
                    slots[k].turn += 1

    def request(self, slot: _Slot, forced: bool) -> GenerationRequest:
        config = self.config
        stop, max_tokens = CLOSING_TAGS, config.max_turn_tokens
        if forced:
            stop, max_tokens = (FORCED_ANSWER_STOP,), FORCED_ANSWER_MAX_TOKENS
        return GenerationRequest(list(slot.ids), stop=stop, max_tokens=max_tokens, temperature=config.temperature,
                                 top_p=config.top_p, top_k=config.top_k,
                                 seed=request_seed(config.seed, slot.index, slot.turn))

    def open_forced_answers(self, slots: list[_Slot], live: list[int]) -> set[int]:
        """Episodes with one action left get ``<answer>`` as prompt tokens (after a forced
        ``<expand>none</expand>`` step where a snapshot waits for an expand), exactly as
        :func:`methods.agent_loop.run_agent_turns` does; returns those still live."""
        limit = self.venv.config.max_actions
        states = [(k, self.venv.envs[k].episode) for k in live]  # a live slot's episode is never None
        due = [(k, state) for k, state in states if state is not None and must_force_answer(state, limit)]
        expanding = [k for k, state in due if state.awaiting_expand]
        prefixes: dict[int, list[str]] = {k: [] for k, _ in due}
        if expanding:
            actions: list[str | None] = [None] * self.venv.num_envs
            for k in expanding:
                actions[k] = format_expand([])
            observations, _, terminated, truncated, infos = self.venv.step(actions)
            for k in expanding:
                if self.close_if_ended(slots[k], terminated[k], truncated[k], infos[k]):
                    del prefixes[k]
                    continue
                prefixes[k] += [FORCED_EXPAND_TEXT, f"\n{observations[k]}\n"]
        for k, texts in prefixes.items():
            self.append_prompt_text(slots[k], k, texts + [FORCED_ANSWER_OPENING], room=FORCED_ANSWER_MAX_TOKENS + 1)
        return {k for k in prefixes if not slots[k].done}

    def append_prompt_text(self, slot: _Slot, k: int, texts: list[str], room: int | None = None) -> bool:
        """Append text the model did not write (each piece tokenised on its own, loss mask 0);
        an episode whose next turn (``room`` tokens, default a turn and an EOS) would then not fit
        ends (``context_limit``) without it."""
        ids = [t for text in texts for t in self.tokenizer(text, add_special_tokens=False)["input_ids"]]
        if len(slot.ids) + len(ids) + (room or self.reserve) > self.config.max_context_tokens:
            end_episode(self.venv, slot, k, reason="context_limit")
            return False
        slot.append(ids, 0, [0.0] * len(ids))
        return True

    def close_if_ended(self, slot: _Slot, terminated: bool, truncated: bool, info: dict) -> bool:
        """Record the env's end of an episode (an answer, or the action limit)."""
        if terminated or truncated:
            slot.done, slot.finish_reason, slot.info = True, "answer" if terminated else "action_limit", info["episode"]
        return slot.done

    def append_eos(self, slots: list[_Slot], answered: list[int]) -> None:
        """EOS after each accepted ``</answer>``, a model token with the sampler's log-prob."""
        config = self.config
        values = self.generator.eos_logprobs([slots[k].ids for k in answered], answered, self.eos_id,
                                             config.temperature, config.top_k, config.top_p)
        for k, value in zip(answered, values):
            slots[k].append([self.eos_id], 1, [float(value)])


def _episode(slot: _Slot, tokenizer: Any, reward_config: RewardConfig) -> Episode:
    reward = float(slot.info.get("reward", {}).get("total", 0.0))
    info = dict(slot.info)
    return Episode(token_ids=slot.ids, loss_mask=slot.mask, sampler_logprobs=slot.logprobs, turn_ids=slot.turns,
                   prompt_length=slot.prompt_length, example_id=slot.example.id, group_id=slot.group_id,
                   reward=reward, info=info, finish_reason=slot.finish_reason,
                   text=tokenizer.decode(slot.ids, skip_special_tokens=False),
                   choice_mask=slot.choices if any(slot.choices) else [],
                   choice_reward_gap=verdict_reward_gaps(slot, len(slot.ids), reward_config),
                   verdict_rows=slot.verdict_rows, frozen_states=slot.frozen_states)
