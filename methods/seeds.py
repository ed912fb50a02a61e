"""SEEDS methods: preview-guided evidence admission (search → snapshot → expand a subset).

- ``seeds-react``: ReAct whose every search shows previews of K candidates; the model opens
  any subset (0..K) and only the opened passages enter its context.
- ``seeds-o1``: Search-o1 with the same admission step; only opened passages reach the
  reason-in-documents reader (the "max-information" variant: select inclusively, up to K).
- ``seeds-r1``: the SEEDS-R1 protocol for trained checkpoints, token-in/token-out exactly as
  the trainer builds episodes.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import ClassVar

from envs.config import EnvConfig
from envs.protocol import (
    JUDGE_WORDS,
    VERDICT_CUTS,
    cut_verdicts,
    judge_alone_prompts,
    judge_chunks,
    judge_token_ids,
    judgement_action,
    yes_prob,
)
from methods.agent_loop import FORCE_ANSWER_DEFAULT, FORCED_ANSWER_MAX_TOKENS, run_agent_turns
from methods.base import Method, paper_limits, register
from methods.baselines import reason_in_documents
from methods.context import QuestionContext, StepOutcome
from methods.guidance import ANSWER_CHARS, QUERY_CHARS
from methods.parsing import last_tag
from methods.prompts import demos, r1, react
from methods.prompts import o1 as o1_prompts
from methods.transcript import ChatTranscript, TokenTranscript

PREVIEW_PROTOCOL = {"admission": "preview", "require_expand": True}  # search -> snapshot -> expand


def limits_text(env: EnvConfig) -> dict[str, int]:
    """The env limits a SEEDS prompt states (``{k}``, ``{max_expand}``, ``{max_searches}``)."""
    return {"k": env.candidates_per_search, "max_expand": env.max_expand, "max_searches": env.max_searches}


@register("seeds-react")
@dataclass
class SeedsReAct(Method):
    # K=10 from SEEDS (§4, §A.3); 4 searches / 12 actions are our caps: the SEEDS text we have states none
    # for SEEDS-ReAct, so --method.budget paper keeps them
    paper_env: ClassVar[dict] = paper_limits(k=10, max_expand=10, max_searches=4, max_actions=12)
    action_tags = ("search", "expand", "answer")
    max_tokens: int = 256
    example: bool = True  # show one worked example of the format first
    forced_answer_tokens: int = FORCED_ANSWER_MAX_TOKENS
    answer_chars: int = ANSWER_CHARS  # guided actions: an answer is one line of at most this many characters
    query_chars: int = QUERY_CHARS  # guided actions: a query is one line of at most this many characters

    def fixed_env(self) -> dict:
        return dict(PREVIEW_PROTOCOL)

    async def run(self, ctx: QuestionContext) -> None:
        prompt = react.SEEDS_REACT.format(**limits_text(ctx.env.config), question=ctx.question)
        prompt = demos.with_example(prompt, demos.PREVIEW) if self.example else prompt
        await run_agent_turns(ctx, ChatTranscript(prompt), max_tokens=self.max_tokens,
                              forced_answer_tokens=self.forced_answer_tokens, answer_chars=self.answer_chars,
                              query_chars=self.query_chars)


@register("seeds-o1")
@dataclass
class SeedsO1(Method):
    # K=10 from SEEDS; 5 searches / 14 actions are our caps, not a paper's: --method.budget paper gives Search-o1's
    # code's (SEEDS-o1 builds on it, SEEDS §F.1): 10 searches on multi-hop sets, 5 on NQ/TriviaQA, and its
    # 15 turns plus one expand per search (methods.budgets.PAPER_LIMITS)
    paper_env: ClassVar[dict] = paper_limits(k=10, max_expand=10, max_searches=5, max_actions=14)
    action_tags = ("search", "expand", "answer")
    max_tokens: int = 512
    example: bool = True  # show one worked example of the format first
    reader_max_tokens: int = 256
    forced_answer_tokens: int = FORCED_ANSWER_MAX_TOKENS
    answer_chars: int = ANSWER_CHARS  # guided actions: an answer is one line of at most this many characters
    query_chars: int = QUERY_CHARS  # guided actions: a query is one line of at most this many characters

    def fixed_env(self) -> dict:
        return {**PREVIEW_PROTOCOL, "duplicate_query": "allow"}

    async def run(self, ctx: QuestionContext) -> None:
        prompt = o1_prompts.SEEDS_REASONER.format(**limits_text(ctx.env.config), question=ctx.question)
        prompt = demos.with_example(prompt, demos.REASONING_PREVIEW) if self.example else prompt
        transcript = ChatTranscript(prompt)
        last_query = {"text": ctx.question}

        async def admit_then_read(outcome: StepOutcome, model_text: str) -> str | None:
            if outcome.observation.startswith("<snapshot>"):
                last_query["text"] = last_tag(model_text, "search") or ctx.question
                return None  # the model sees the previews and chooses what to expand
            if not outcome.valid or not outcome.shown:
                return None  # an error message, "No passages expanded." or passages already read
            # The reader gets the opened passages as the env showed them (what doc_tokens counted).
            return await reason_in_documents(ctx, transcript.text, last_query["text"], outcome.shown,
                                             self.reader_max_tokens)

        await run_agent_turns(ctx, transcript, max_tokens=self.max_tokens, on_observation=admit_then_read,
                              forced_answer_tokens=self.forced_answer_tokens, answer_chars=self.answer_chars,
                              query_chars=self.query_chars)


@register("seeds-r1")
@dataclass
class SeedsR1(Method):
    """SEEDS-R1 protocol (paper appendix E/F.3): K=5, expand 0-5, 4 searches, 10 actions, 1,200
    observation tokens; the limits, the expand form and ``judge_question`` come from the env.

    ``force_answer``: with one action left, write ``<answer>`` for the model and answer with what
    it fills in (:mod:`methods.agent_loop`). Training rollouts have the same setting with the same
    default (:class:`training.rollouts.rollout.RolloutConfig`); evaluate a checkpoint as it was trained.
    Completions reach the env as the trainer's rollouts give them (no thinking handling).
    """

    handles_thinking: ClassVar[bool] = False

    paper_env: ClassVar[dict] = paper_limits(k=5, max_expand=5, max_searches=4, max_actions=10)
    max_tokens: int = 512
    force_answer: bool = FORCE_ANSWER_DEFAULT
    constrain_verdicts: bool = True  # judge form with a local tokenizer: verdicts among the yes/no tokens only
    # verdicts judged alone: how a snapshot's pi(yes) become opens (envs.protocol.cut_verdicts; as the trainer's
    # evaluation.verdict_cut): "level" the verdicts as drawn, "snapshot_mean" those above the snapshot's mean
    verdict_cut: str = "level"

    def __post_init__(self) -> None:
        if self.verdict_cut not in VERDICT_CUTS:
            raise ValueError(f"verdict_cut must be one of {', '.join(VERDICT_CUTS)}, not {self.verdict_cut!r}")

    def fixed_env(self) -> dict:
        return dict(PREVIEW_PROTOCOL)

    @staticmethod
    def prompt(question: str, env: EnvConfig) -> str:
        """The SEEDS-R1 prompt for ``question`` in ``env`` (its limits; the judgement form's wording)."""
        template = r1.SEEDS_R1_JUDGE if env.judge_form.judged else r1.SEEDS_R1
        return template.format(**limits_text(env), question=question)

    async def run(self, ctx: QuestionContext) -> None:
        env = ctx.env.config
        transcript = TokenTranscript(self.prompt(ctx.question, env), ctx.tokenizer)
        judge_with = SNAPSHOT_JUDGES[env.judge_form.name]  # chosen once: None in the list form

        async def judge(outcome: StepOutcome, model_text: str) -> str | None:
            if judge_with is None:
                return None
            if judge_with is judge_alone_snapshot:
                return await judge_alone_snapshot(ctx, transcript, outcome.observation, self.constrain_verdicts,
                                                  self.verdict_cut)
            if self.verdict_cut != "level":
                raise ValueError(f"verdict_cut {self.verdict_cut!r} cuts verdicts judged alone (env "
                                 "judge_context: alone)")
            return await judge_with(ctx, transcript, outcome.observation, self.constrain_verdicts)

        await run_agent_turns(ctx, transcript, max_tokens=self.max_tokens, force_answer=self.force_answer,
                              on_observation=judge)


async def judge_snapshot(ctx: QuestionContext, transcript: TokenTranscript, observation: str,
                         constrain: bool = True) -> str | None:
    """The judgement form in evaluation, token for token as :mod:`training.rollouts.rollout_judge` lays it
    out in training: each candidate and its question, then ONE verdict token from the model (with
    ``constrain`` and a local tokenizer: among the yes/no tokens only, as rollouts draw it); then
    the expand those verdicts make. Returns the expand's observation (None: not a snapshot to judge)."""
    chunks, closing = judge_chunks(observation)
    if not chunks:
        return None
    allowed = judge_token_ids(ctx.tokenizer) if constrain and ctx.tokenizer is not None else ()
    words = []
    for chunk in chunks:
        transcript.add_text(chunk)
        result = await ctx.generate(transcript.prompt(), stop=(), max_tokens=1, tag="verdict",
                                    allowed_token_ids=allowed)
        completion = result.completions[0]
        if completion.finish_reason == "error":
            await ctx.give_up("llm_error")
            return ""
        transcript.add_model(completion)
        words.append(completion.text)
    transcript.add_text(closing)
    outcome = await ctx.step(judgement_action(words))
    return outcome.observation


async def judge_alone_snapshot(ctx: QuestionContext, transcript: TokenTranscript, observation: str,
                               constrain: bool = True, verdict_cut: str = "level") -> str | None:
    """The judgement form with ``judge_context: alone`` in evaluation, as
    :func:`training.rollouts.rollout_judge.judge_alone` lays it out in training: the snapshot is appended to
    the transcript, each candidate is judged in its own context (:func:`envs.protocol.judge_alone_prompts`,
    ONE verdict token each, the calls concurrent), and the expand those verdicts make is appended as
    text the model did not write; ``verdict_cut`` other than ``level`` re-decides the verdicts from their
    π(yes) (:func:`envs.protocol.cut_verdicts`; it needs them constrained to yes/no). Returns the expand's
    observation (None: not a snapshot to judge)."""
    contexts = judge_alone_prompts(ctx.question, observation)
    if not contexts:
        return None
    transcript.add_observation(observation)
    allowed = judge_token_ids(ctx.tokenizer) if constrain and ctx.tokenizer is not None else ()
    prompts = [ctx.tokenizer(text, add_special_tokens=True)["input_ids"] if ctx.tokenizer is not None else text
               for text in contexts]
    results = await asyncio.gather(*(ctx.generate(prompt, stop=(), max_tokens=1, tag="verdict",
                                                  allowed_token_ids=allowed) for prompt in prompts))
    completions = [result.completions[0] for result in results]
    if any(c.finish_reason == "error" for c in completions):
        await ctx.give_up("llm_error")
        return ""
    words = [c.text for c in completions]
    if verdict_cut != "level":
        words = recut_words(completions, allowed, verdict_cut)
    action = judgement_action(words)
    transcript.add_text(action)
    outcome = await ctx.step(action)
    return outcome.observation


def recut_words(completions: list, choice_ids: tuple[int, ...], cut: str) -> list[str]:
    """The verdict words of one snapshot's constrained one-token ``completions`` (each over ``choice_ids``:
    yes, no) re-decided by :func:`envs.protocol.cut_verdicts` from their π(yes)."""
    if len(choice_ids) != 2 or any(len(c.token_ids) != 1 or not c.logprobs for c in completions):
        raise ValueError(f"verdict_cut {cut!r} needs constrained one-token verdicts with their log-probs "
                         "(constrain_verdicts and a local tokenizer)")
    yes_id = choice_ids[0]
    drawn = [c.token_ids[0] == yes_id for c in completions]
    yes_probs = [yes_prob(c.logprobs[0], is_yes) for c, is_yes in zip(completions, drawn)]
    return [JUDGE_WORDS[0] if is_open else JUDGE_WORDS[1] for is_open in cut_verdicts(yes_probs, drawn, cut)]


# the evaluation's judge of a snapshot, by the env's judge form (envs.protocol.JudgeForm): none in the list form
# (the policy writes its <expand>), the stream's verdicts, or each candidate judged alone
SNAPSHOT_JUDGES = {"list": None, "stream": judge_snapshot, "alone": judge_alone_snapshot}
