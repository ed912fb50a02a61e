"""The generate → act → observe loop shared by the tag-protocol agents.

The model writes until it closes an action tag (``</search>``, ``</expand>``, ``</answer>``,
or a method's own tag); the action goes to the env; the observation (or what a method makes
of it) is appended to the transcript; repeat until the env ends the episode. The env's action
limit guarantees the loop ends.

Forced answer (``force_answer``): when only one action is left (two while the protocol waits for
an expand: ``<expand>none</expand>`` is then sent first and its observation appended), the loop
writes ``<answer>`` into the transcript for the model, lets it fill the answer (stop at
``</answer>``, at most :data:`FORCED_ANSWER_MAX_TOKENS` tokens) and answers with the cleaned text
(:func:`forced_answer_text`; an empty one ends the episode unanswered), so the episode ends with
its best answer instead of a truncation. Prompted methods force by default. SEEDS-R1 follows its
one setting, ``force_answer`` (default :data:`FORCE_ANSWER_DEFAULT`), which training rollouts
(:class:`training.rollouts.rollout.RolloutConfig`) honour in exactly this way, with these same pieces.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable

from envs.episode import EpisodeState
from envs.protocol import CLOSING_TAGS
from methods.context import QuestionContext, StepOutcome
from methods.guidance import ANSWER_CHARS, QUERY_CHARS, turn_regex
from methods.parsing import clean_answer

ObservationHook = Callable[[StepOutcome, str], Awaitable[str | None]]

FORCE_ANSWER_DEFAULT = False  # SEEDS-R1 (evaluation and training rollouts): no forced answer unless asked
FORCED_EXPAND_TEXT = "<expand>none</expand>"  # written for the model when a forced answer must close a snapshot
FORCED_ANSWER_OPENING = "<answer>"  # written for the model; it fills the answer
FORCED_ANSWER_STOP = "</answer>"
FORCED_ANSWER_MAX_TOKENS = 32


def must_force_answer(episode: EpisodeState, max_actions: int) -> bool:
    """Whether the next action must be a forced answer: one action left (two while an expand is due)."""
    return episode.n_actions >= max_actions - (2 if episode.awaiting_expand else 1)


def forced_answer_text(completion_text: str) -> str:
    """The answer given to the env for a forced answer's completion (``""``: none)."""
    return " ".join(clean_answer(completion_text.replace(FORCED_ANSWER_STOP, "")).split())


async def forced_answer(ctx: QuestionContext, transcript, max_tokens: int = FORCED_ANSWER_MAX_TOKENS) -> None:
    """Open ``<answer>`` in the transcript, let the model fill it, and answer with that."""
    ctx.note("forced_answer")
    transcript.add_text(FORCED_ANSWER_OPENING)
    result = await ctx.generate(transcript.prompt(), stop=(FORCED_ANSWER_STOP,), max_tokens=max_tokens,
                                tag="forced_answer")
    completion = result.completions[0]
    if completion.finish_reason == "error":
        await ctx.give_up("llm_error")
        return
    transcript.add_model(completion)
    await ctx.answer(forced_answer_text(completion.text))


def guide(ctx: QuestionContext, max_tokens: int, answer_chars: int, query_chars: int) -> str | None:
    """The guided-actions expression of the next turn (None when the run is not guided)."""
    if not ctx.action_tags:
        return None
    return turn_regex(ctx.action_tags, ctx.episode, ctx.env.config, max_tokens=max_tokens,
                      answer_chars=answer_chars, query_chars=query_chars)


async def run_agent_turns(
    ctx: QuestionContext,
    transcript,
    *,
    max_tokens: int = 256,
    extra_stops: tuple[str, ...] = (),
    translate: Callable[[str], str] | None = None,
    on_observation: ObservationHook | None = None,
    force_answer: bool = True,
    forced_answer_tokens: int = FORCED_ANSWER_MAX_TOKENS,
    answer_chars: int = ANSWER_CHARS,
    query_chars: int = QUERY_CHARS,
) -> None:
    """Run turns until the episode ends.

    With guided actions (``ctx.action_tags``), each turn's request carries the expression of the
    actions the env accepts now (:func:`methods.guidance.turn_regex`), answers at most
    ``answer_chars`` and queries at most ``query_chars`` characters, the whole turn within ``max_tokens``.
    ``translate`` rewrites the model's text into an env action (e.g. dyn-k's ``<read>n</read>``);
    ``on_observation(outcome, model_text)`` may replace what is appended after an action
    (e.g. Search-o1's condensed ``<result>``); returning None appends the env observation.
    ``max_tokens`` caps each turn, ``forced_answer_tokens`` the forced answer.
    """
    stops = CLOSING_TAGS + tuple(extra_stops)
    limit = ctx.env.config.max_actions
    while not ctx.done:
        episode = ctx.episode
        if force_answer and must_force_answer(episode, limit):
            if episode.awaiting_expand:  # the protocol wants an expand before the answer
                outcome = await ctx.expand([])
                transcript.add_text(FORCED_EXPAND_TEXT)
                if outcome.done:
                    return
                transcript.add_observation(outcome.observation)
            await forced_answer(ctx, transcript, forced_answer_tokens)
            return
        result = await ctx.generate(transcript.prompt(), stop=stops, max_tokens=max_tokens, tag="turn",
                                    regex=guide(ctx, max_tokens, answer_chars, query_chars))
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
