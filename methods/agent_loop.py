"""The generate → act → observe loop shared by the tag-protocol agents.

The model writes until it closes an action tag (``</search>``, ``</expand>``, ``</answer>``,
or a method's own tag); the action goes to the env; the observation (or what a method makes
of it) is appended to the transcript; repeat until the env ends the episode. The env's action
limit guarantees the loop ends. When only one action is left, the loop opens ``<answer>`` for
the model so the episode ends with its best answer instead of a truncation (``force_answer``).
"""
from __future__ import annotations

from typing import Awaitable, Callable

from envs.protocol import CLOSING_TAGS
from methods.context import QuestionContext, StepOutcome
from methods.parsing import clean_answer

ObservationHook = Callable[[StepOutcome, str], Awaitable[str | None]]


async def forced_answer(ctx: QuestionContext, transcript, max_tokens: int = 32) -> None:
    """Open ``<answer>`` in the transcript, let the model fill it, and answer with that."""
    ctx.note("forced_answer")
    transcript.add_text("<answer>")
    result = await ctx.generate(transcript.prompt(), stop=("</answer>",), max_tokens=max_tokens, tag="forced_answer")
    completion = result.completions[0]
    if completion.finish_reason == "error":
        await ctx.give_up("llm_error")
        return
    transcript.add_model(completion)
    await ctx.answer(clean_answer(completion.text.replace("</answer>", "")))


async def run_agent_turns(
    ctx: QuestionContext,
    transcript,
    *,
    max_tokens: int = 256,
    extra_stops: tuple[str, ...] = (),
    translate: Callable[[str], str] | None = None,
    on_observation: ObservationHook | None = None,
    force_answer: bool = True,
) -> None:
    """Run turns until the episode ends.

    ``translate`` rewrites the model's text into an env action (e.g. dyn-k's ``<read>n</read>``);
    ``on_observation(outcome, model_text)`` may replace what is appended after an action
    (e.g. Search-o1's condensed ``<result>``); returning None appends the env observation.
    """
    stops = CLOSING_TAGS + tuple(extra_stops)
    limit = ctx.env.config.max_actions
    while not ctx.done:
        episode = ctx.env.episode
        if force_answer and episode.n_actions >= limit - (2 if episode.awaiting_expand else 1):
            if episode.awaiting_expand:  # the protocol wants an expand before the answer
                outcome = await ctx.expand([])
                transcript.add_text("<expand>none</expand>")
                transcript.add_observation(outcome.observation)
            await forced_answer(ctx, transcript)
            return
        result = await ctx.generate(transcript.prompt(), stop=stops, max_tokens=max_tokens, tag="turn")
        completion = result.completions[0]
        if completion.finish_reason == "error":
            await ctx.give_up("llm_error")
            return
        transcript.add_model(completion)
        action = translate(completion.text) if translate else completion.text
        outcome = await ctx.step(action)
        if outcome.done:
            return
        replacement = await on_observation(outcome, completion.text) if on_observation else None
        transcript.add_observation(outcome.observation if replacement is None else replacement)
