"""SEEDS methods: preview-guided evidence admission (search → snapshot → expand a subset).

- ``seeds-react``: ReAct whose every search shows previews of K candidates; the model opens
  any subset (0..K) and only the opened passages enter its context.
- ``seeds-o1``: Search-o1 with the same admission step; only opened passages reach the
  reason-in-documents reader (the "max-information" variant: select inclusively, up to K).
- ``seeds-r1``: the SEEDS-R1 protocol for trained checkpoints, token-in/token-out exactly as
  the trainer builds episodes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from envs.config import EnvConfig
from envs.protocol import judge_chunks, judge_token_ids, judgement_action
from methods.agent_loop import FORCE_ANSWER_DEFAULT, run_agent_turns
from methods.base import Method, register
from methods.baselines import reason_in_documents
from methods.context import QuestionContext, StepOutcome
from methods.parsing import last_tag
from methods.prompts import demos, r1, react
from methods.prompts import o1 as o1_prompts
from methods.transcript import ChatTranscript, TokenTranscript


def _preview_env(base: EnvConfig, k: int, max_expand: int, max_searches: int, max_actions: int) -> EnvConfig:
    return dataclasses.replace(base, admission="preview", candidates_per_search=k, max_expand=max_expand,
                               max_searches=max_searches, max_actions=max_actions, require_expand=True)


@register("seeds-react")
@dataclass
class SeedsReAct(Method):
    action_tags = ("search", "expand", "answer")
    k: int = 10
    max_expand: int = 10
    max_searches: int = 4
    max_actions: int = 12
    max_tokens: int = 256
    example: bool = True  # show one worked example of the format first

    def env_config(self, base: EnvConfig) -> EnvConfig:
        return _preview_env(base, self.k, self.max_expand, self.max_searches, self.max_actions)

    async def run(self, ctx: QuestionContext) -> None:
        prompt = react.SEEDS_REACT.format(k=self.k, max_expand=self.max_expand, max_searches=self.max_searches,
                                          question=ctx.question)
        prompt = demos.with_example(prompt, demos.PREVIEW) if self.example else prompt
        await run_agent_turns(ctx, ChatTranscript(prompt), max_tokens=self.max_tokens)


@register("seeds-o1")
@dataclass
class SeedsO1(Method):
    action_tags = ("search", "expand", "answer")
    k: int = 10
    max_expand: int = 10
    max_searches: int = 5
    max_actions: int = 14
    max_tokens: int = 512
    example: bool = True  # show one worked example of the format first
    reader_max_tokens: int = 256

    def env_config(self, base: EnvConfig) -> EnvConfig:
        config = _preview_env(base, self.k, self.max_expand, self.max_searches, self.max_actions)
        return dataclasses.replace(config, duplicate_query="allow")

    async def run(self, ctx: QuestionContext) -> None:
        prompt = o1_prompts.SEEDS_REASONER.format(k=self.k, max_expand=self.max_expand,
                                                  max_searches=self.max_searches, question=ctx.question)
        prompt = demos.with_example(prompt, demos.REASONING_PREVIEW) if self.example else prompt
        transcript = ChatTranscript(prompt)
        last_query = {"text": ctx.question}

        async def admit_then_read(outcome: StepOutcome, model_text: str) -> str | None:
            if outcome.observation.startswith("<snapshot>"):
                last_query["text"] = last_tag(model_text, "search") or ctx.question
                return None  # the model sees the previews and chooses what to expand
            if not outcome.valid or not outcome.expanded:
                return None  # an error message, or "No passages expanded."
            opened = [outcome.hits[i - 1] for i in outcome.expanded]
            return await reason_in_documents(ctx, transcript.text, last_query["text"], opened, self.reader_max_tokens)

        await run_agent_turns(ctx, transcript, max_tokens=self.max_tokens, on_observation=admit_then_read)


@register("seeds-r1")
@dataclass
class SeedsR1(Method):
    """SEEDS-R1 protocol (paper appendix E/F.3): K=5, expand 0-5, 4 searches, 10 actions.

    ``force_answer``: with one action left, write ``<answer>`` for the model and answer with what
    it fills in (:mod:`methods.agent_loop`). Training rollouts have the same setting with the same
    default (:class:`training.rollout.RolloutConfig`); evaluate a checkpoint as it was trained.
    """

    k: int = 5
    max_expand: int = 5
    max_searches: int = 4
    max_actions: int = 10
    max_tokens: int = 512
    force_answer: bool = FORCE_ANSWER_DEFAULT
    expand_form: str = "list"  # "judge": one yes/no per candidate (EnvConfig.expand_form), as trained
    constrain_verdicts: bool = True  # judge form with a local tokenizer: verdicts among the yes/no tokens only
    judge_question: bool = False  # judge form: each verdict question restates the question (EnvConfig.judge_question)

    @classmethod
    def for_env(cls, env: EnvConfig, **options) -> SeedsR1:
        """SEEDS-R1 with the limits and the judgement form of the env it runs in (training, evaluation)."""
        return cls(k=env.candidates_per_search, max_expand=env.max_expand, max_searches=env.max_searches,
                   max_actions=env.max_actions, expand_form=env.expand_form, judge_question=env.judge_question,
                   **options)

    def env_config(self, base: EnvConfig) -> EnvConfig:
        config = _preview_env(base, self.k, self.max_expand, self.max_searches, self.max_actions)
        return dataclasses.replace(config, expand_form=self.expand_form, judge_question=self.judge_question)

    def prompt(self, question: str) -> str:
        template = r1.SEEDS_R1_JUDGE if self.expand_form == "judge" else r1.SEEDS_R1
        return template.format(k=self.k, max_expand=self.max_expand, max_searches=self.max_searches,
                                  question=question)

    async def run(self, ctx: QuestionContext) -> None:
        transcript = TokenTranscript(self.prompt(ctx.question), ctx.tokenizer)

        async def judge(outcome: StepOutcome, model_text: str) -> str | None:
            if self.expand_form != "judge":
                return None
            return await judge_snapshot(ctx, transcript, outcome.observation, self.constrain_verdicts)

        await run_agent_turns(ctx, transcript, max_tokens=self.max_tokens, force_answer=self.force_answer,
                              on_observation=judge)


async def judge_snapshot(ctx: QuestionContext, transcript: TokenTranscript, observation: str,
                         constrain: bool = True) -> str | None:
    """The judgement form in evaluation, token for token as :mod:`training.rollout_judge` lays it
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
