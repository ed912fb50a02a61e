"""A scripted (model-free) policy: search the question, expand the top candidates, answer.

It answers with the title of the first passage it read, which is the right answer for the
embedded default's "which article is this" questions and a fair floor elsewhere. Used by the
episode demo and the env benchmark; it exercises the whole protocol without an LLM.
"""
from __future__ import annotations

import re

from envs.protocol import format_answer, format_expand, format_search

_FIRST_PASSAGE_TITLE = re.compile(r"<information>\n\[\d+\] ([^\n]*)\n")


class SearchExpandAnswerPolicy:
    """One episode's policy state; call :meth:`act` with each new observation."""

    def __init__(self, question: str, n_expand: int = 2, admission: str = "preview"):
        self.question = question
        self.n_expand = n_expand
        self.admission = admission
        self.turn = 0

    def act(self, observation: str) -> str:
        self.turn += 1
        if self.turn == 1:
            return format_search(self.question)
        if self.turn == 2 and self.admission == "preview" and observation.startswith("<snapshot>"):
            shown = len(re.findall(r"^\[\d+\] ", observation, flags=re.MULTILINE))
            return format_expand(list(range(1, min(self.n_expand, shown) + 1)))
        match = _FIRST_PASSAGE_TITLE.search(observation)
        return format_answer(match.group(1) if match else "unknown")


def run_scripted_episodes(venv, examples, n_expand: int = 2, seed: int = 0) -> list[dict]:
    """Run one scripted episode per example through a batched env, ``venv.num_envs`` at a time.

    Returns the env's end-of-episode summaries (``info["episode"]``) in example order, each
    with a ``transcript`` of ``{"action", "observation"}`` turns added.
    """
    summaries: list[dict] = []
    admission = venv.config.admission
    for start in range(0, len(examples), venv.num_envs):
        batch = list(examples[start : start + venv.num_envs])
        if len(batch) < venv.num_envs:  # a short last batch runs in the first slots only
            batch += [batch[-1]] * (venv.num_envs - len(batch))
        observations, _ = venv.reset(seed=seed + start, examples=batch)
        policies = [SearchExpandAnswerPolicy(ex.question, n_expand, admission) for ex in batch]
        done = [False] * len(batch)
        results: list[dict | None] = [None] * len(batch)
        transcripts: list[list[dict]] = [[] for _ in batch]
        while not all(done):
            actions = [None if done[i] else policies[i].act(observations[i]) for i in range(len(batch))]
            observations, _, terminated, truncated, infos = venv.step(actions)
            for i, info in enumerate(infos):
                if done[i]:
                    continue
                transcripts[i].append({"action": actions[i], "observation": observations[i]})
                if terminated[i] or truncated[i]:
                    done[i], results[i] = True, {**info["episode"], "transcript": transcripts[i]}
        summaries.extend(r for r in results[: len(examples) - start] if r is not None)  # all set: all done
    return summaries
