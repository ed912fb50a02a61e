"""SearchEnv: a text-in, text-out ``gymnasium.Env`` for search agents (see docs/environment.md).

One step is one policy action. ``step`` is split into :meth:`SearchEnv.prepare` (parse and
validate; says which query, if any, needs retrieval) and :meth:`SearchEnv.complete` (apply
the retrieved hits), so :class:`envs.vector_env.SearchVectorEnv` can batch the retrieval of
many episodes into one call while running exactly this logic.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.config import EnvConfig
from envs.episode import EpisodeState, SearchRecord
from envs.metrics import normalize_answer
from envs.previews import make_preview
from envs.protocol import (
    SNAPSHOT_QUESTION,
    Action,
    AnswerAction,
    ExpandAction,
    InvalidAction,
    SearchAction,
    format_information,
    format_invalid,
    format_passage,
    format_snapshot,
    parse_action,
    snapshot_candidates,
    snapshot_lines,
)
from envs.tokens import TokenCounter
from envs.types import Hit, Passage, QAExample

log = logging.getLogger(__name__)
MAX_OBSERVATION_CHARS = 200_000
MAX_ACTION_CHARS = 50_000
TRUNCATION_MARK = "\n[truncated: observation limit reached]"


class SearchBackend(Protocol):
    """What the env needs from a retriever (``envs.retrieval.retriever.Retriever`` satisfies it).

    A retriever that reads pages (the live web, :class:`envs.retrieval.web.WebRetriever`) also has
    ``open_pages(hits) -> list[opened | None]``: the text of each candidate being opened (an object
    with ``text``, ``page``: a page was read for it, ``error``: why it could not be; None: the hit's
    own text is whole), and ``pages_fetched_by_search(query, k) -> int``: the pages a search read
    itself. The env counts both per episode (``pages_fetched``, ``page_failures`` in its summary).
    """

    corpus: Any  # len(corpus) and corpus[row] -> Passage, for distractor injection

    def search(self, queries: list[str], k: int) -> list[list[Hit]]: ...


class UnicodeText(spaces.Text):
    """``spaces.Text`` that contains any string up to ``max_length``.

    Gymnasium's Text space checks every character against a fixed charset, but queries,
    passages and model output are arbitrary Unicode. Sampling still draws from the printable
    charset, so random actions remain valid strings.
    """

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


@dataclass(frozen=True)
class PendingStep:
    """A parsed, validated action; ``query`` is set when it needs a retrieval."""

    action: Action
    query: str | None = None


class SearchEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(
        self,
        retriever: SearchBackend,
        dataset: Sequence[QAExample] | None = None,
        config: EnvConfig | None = None,
        tokenizer: Any | None = None,
    ):
        self.retriever = retriever
        self.dataset = list(dataset) if dataset is not None else None
        self.config = config or EnvConfig()
        self.counter = TokenCounter(tokenizer)
        # Tokens left for an observation's body once its tags and a truncation mark are paid for.
        overhead = self.counter.count(format_information(TRUNCATION_MARK))
        self._body_budget = max(1, self.config.max_obs_tokens - overhead)
        self.observation_space = UnicodeText(max_length=MAX_OBSERVATION_CHARS, min_length=0)
        self.action_space = UnicodeText(max_length=MAX_ACTION_CHARS, min_length=0)
        self.episode: EpisodeState | None = None
        self._order: np.ndarray | None = None
        self._cursor = 0

    # -- gymnasium API -------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        example = (options or {}).get("example")
        if example is None:
            example = self._next_example(reseeded=seed is not None)
        if not isinstance(example, QAExample):
            raise TypeError(f"options['example'] must be a QAExample, not {type(example).__name__}")
        self.episode = EpisodeState(example)
        if self._reads_pages:
            self.episode.pages_fetched, self.episode.page_failures = 0, 0
        return example.question, {"example_id": example.id, "question": example.question}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        pending = self.prepare(action)
        hits = None
        if pending.query is not None:
            hits = self.retriever.search([pending.query], self.config.candidates_per_search)[0]
        return self.complete(pending, hits)

    # -- the two halves of a step --------------------------------------------------------------

    def prepare(self, action_text: str) -> PendingStep:
        """Parse ``action_text`` and check it against the protocol state and the limits."""
        episode = self._require_episode()
        if not isinstance(action_text, str):
            return PendingStep(InvalidAction(f"action must be text, got {type(action_text).__name__}",
                                             repr(action_text)))
        action = parse_action(action_text)
        reason = self._violation(action, episode)
        if reason is not None:
            return PendingStep(InvalidAction(reason, action_text))
        if isinstance(action, SearchAction):
            return PendingStep(action, query=action.query)
        return PendingStep(action)

    def complete(self, pending: PendingStep, hits: list[Hit] | None) -> tuple[str, float, bool, bool, dict]:
        """Apply a prepared action (with its retrieval results) and advance the episode."""
        episode = self._require_episode()
        cfg = self.config
        episode.n_actions += 1
        action, reward, terminated = pending.action, 0.0, False
        if isinstance(action, InvalidAction):
            episode.n_invalid += 1
            episode.format_penalty += cfg.reward.format_penalty
            reward -= cfg.reward.format_penalty
            observation = format_invalid(action.reason)
        elif isinstance(action, SearchAction):
            observation = self._search(episode, action.query, hits or [])
        elif isinstance(action, ExpandAction):
            observation = self._expand(episode, action.ids)
        else:
            episode.answer = action.answer
            observation, terminated = "", True
        truncated = not terminated and episode.n_actions >= cfg.max_actions
        info: dict[str, Any] = {"action": _action_kind(action)}
        if isinstance(action, InvalidAction):
            info["invalid_reason"] = action.reason
        elif isinstance(action, (SearchAction, ExpandAction)) and episode.latest is not None:
            info["search"] = episode.latest.to_dict()  # candidates, positives, what was expanded
        if terminated or truncated:
            episode.done = True
            reward += episode.reward_breakdown(cfg.reward)["terminal"]
            info["episode"] = episode.summary(cfg.reward)
        info.update(n_searches=episode.n_searches, n_actions=episode.n_actions, n_invalid=episode.n_invalid)
        return observation, float(reward), terminated, truncated, info

    # -- internals -----------------------------------------------------------------------------

    def _violation(self, action: Action, episode: EpisodeState) -> str | None:
        """Why ``action`` is not allowed now, or None."""
        cfg = self.config
        if isinstance(action, InvalidAction):
            return action.reason
        pending_expand = cfg.admission == "preview" and cfg.require_expand and episode.awaiting_expand
        if isinstance(action, SearchAction):
            if pending_expand:
                return "expand the latest snapshot first (candidate numbers or none)"
            if episode.n_searches >= cfg.max_searches:
                return f"search limit of {cfg.max_searches} reached; expand or answer"
            if cfg.duplicate_query == "penalize" and normalize_answer(action.query) in episode.seen_queries:
                return "this query was already searched; write a different query"
            return None
        if isinstance(action, ExpandAction):
            if cfg.admission == "prefix":
                return "expand is not available: search results are shown in full"
            if episode.latest is None:
                return "nothing to expand: search first"
            if not episode.awaiting_expand:
                return "the latest snapshot was already expanded; search again or answer"
            if len(action.ids) > cfg.max_expand:
                return f"at most {cfg.max_expand} candidates may be expanded at once"
            n = len(episode.latest.hits)
            if cfg.judge_form.judged:
                return self._judgement_violation(action, episode.latest)
            bad = [i for i in action.ids if not 1 <= i <= n]
            if bad:
                return f"candidate number(s) {bad} not in the snapshot (valid: 1..{n})"
            return None
        if pending_expand:
            return "expand the latest snapshot first (candidate numbers or none)"
        return None

    @staticmethod
    def _judgement_violation(action: ExpandAction, record) -> str | None:
        """The judgement form: every candidate the snapshot showed judged in order (those past the
        observation cap are not opened), or ``none`` (every candidate no); None when allowed."""
        if action.judged is None and not action.ids:
            return None
        m = record.visible if record.visible is not None else len(record.hits)
        if action.judged != tuple(range(1, m + 1)):
            return (f"judge every candidate in order, [1] to [{m}], each with yes or no "
                    f"(for example <expand>{' '.join(f'[{i}] no' for i in range(1, m + 1))}</expand>)")
        return None

    @property
    def _reads_pages(self) -> bool:
        return self._page_opener() is not None

    def _page_opener(self) -> Callable[[list[Hit]], list[Any]] | None:
        """The retriever's optional ``open_pages`` (see :class:`SearchBackend`), or None."""
        open_pages = getattr(self.retriever, "open_pages", None)
        return open_pages if callable(open_pages) else None

    def _search(self, episode: EpisodeState, query: str, hits: list[Hit]) -> str:
        cfg = self.config
        hits, distractor = self._inject_distractors(hits)
        hits, distractor = self._shuffle(hits, distractor)
        record = episode.add_search(query, hits, distractor)
        counted = getattr(self.retriever, "pages_fetched_by_search", None)
        if episode.pages_fetched is not None and callable(counted):
            episode.pages_fetched += counted(query, cfg.candidates_per_search)
        if cfg.admission == "prefix":
            return self._information(record, range(1, len(hits) + 1))
        if not hits:
            return format_snapshot("No results.")
        episode.awaiting_expand = True
        previews = [make_preview(h.title, h.text, query, cfg.preview, self.counter) for h in hits]
        body = self._capped(snapshot_lines(previews))
        if cfg.judge_form.judged and cfg.judge_question:  # restated beside every preview by judge_chunks
            body = f"{SNAPSHOT_QUESTION}{' '.join(episode.example.question.split())}\n{body}"
        observation = format_snapshot(body)
        if body.endswith(TRUNCATION_MARK):
            record.visible = len(snapshot_candidates(observation))
        return observation

    def _expand(self, episode: EpisodeState, ids: tuple[int, ...]) -> str:
        record = episode.latest
        episode.awaiting_expand = False
        if not ids:
            return format_information("No passages expanded.")
        assert record is not None, "_violation refuses an expand before any search"
        return self._information(record, ids)

    def _information(self, record: SearchRecord, numbers) -> str:
        """Full text of the given candidates; a passage read earlier in the episode is not repeated.

        ``record.shown`` keeps, per candidate opened here, the passage text the observation showed
        (cut where the cap cut it; for a passage read earlier, the text it was shown with then), so
        a method that hands passages to a reader hands what the env counted in ``doc_tokens``."""
        episode = self._require_episode_any()
        parts: list[str] = []
        text_spans: dict[int, tuple[int, int]] = {}
        start = 0
        fresh = [number for number in numbers if episode.open(record, number)]
        texts = dict(zip(fresh, self._opened_texts([record.hits[number - 1] for number in fresh])))
        for number in numbers:
            hit = record.hits[number - 1]
            text = texts.pop(number, None)  # a number given twice is read once
            part = (format_passage(number, hit.title, text) if text is not None
                    else f"[{number}] {hit.title}: already read above.")
            if text is not None:
                text_spans[number] = (start + len(part) - len(text), start + len(part))
            parts.append(part)
            start += len(part) + 2  # the "\n\n" between passages
        full = "\n\n".join(parts) if parts else "No results."
        body, cut = self.counter.truncate(full, self._body_budget)
        shown_chars = self.counter.kept_chars(full, self._body_budget) if cut else len(full)
        for number in numbers:
            row = record.hits[number - 1].row
            if number in text_spans:
                begin, end = text_spans[number]
                episode.passage_text[row] = full[begin:min(end, shown_chars)] if begin < shown_chars else ""
            record.shown[number] = episode.passage_text.get(row, "")
        record.doc_tokens += self.counter.count(body)
        return format_information(body + TRUNCATION_MARK if cut else body)

    def _opened_texts(self, hits: list[Hit]) -> list[str]:
        """The text each opened candidate shows: its own, or what the retriever reads for it (a live
        web page, fetched now; :class:`SearchBackend`), counting the pages read and those that failed."""
        open_pages = self._page_opener()
        if not hits or open_pages is None:
            return [hit.text for hit in hits]
        episode = self._require_episode()
        texts = []
        for hit, opened in zip(hits, open_pages(hits)):
            if opened is None:
                texts.append(hit.text)
                continue
            episode.pages_fetched = (episode.pages_fetched or 0) + int(opened.page)
            episode.page_failures = (episode.page_failures or 0) + int(opened.error is not None)
            texts.append(opened.text)
        return texts

    def opening(self, pending: PendingStep, hits: list[Hit] | None = None) -> list[Hit]:
        """The candidates a prepared step will open, for a batched read of their pages
        (:func:`prefetch_opened_pages`): an expand's, or with prefix admission a search's ``hits``
        (unless distractors may replace some of them); ``[]`` for any other step."""
        latest = self.episode.latest if self.episode is not None else None
        if isinstance(pending.action, ExpandAction) and latest is not None:
            return [latest.hits[number - 1] for number in pending.action.ids]
        prefix = self.config.admission == "prefix" and self.config.distractor_rate <= 0
        return list(hits or []) if prefix and isinstance(pending.action, SearchAction) else []

    def _capped(self, body: str) -> str:
        """``body`` cut so that it and the truncation mark fit the observation token limit."""
        body, cut = self.counter.truncate(body, self._body_budget)
        return body + TRUNCATION_MARK if cut else body

    def _shuffle(self, hits: list[Hit], distractor: list[bool]) -> tuple[list[Hit], list[bool]]:
        """The candidates in a random order (``shuffle_candidates``; seeded by ``reset(seed=...)``).

        Each hit keeps its retrieval ``rank``, so analyses still see the retriever's order; only
        the candidate numbers shown to the policy change.
        """
        if not self.config.shuffle_candidates or len(hits) < 2:
            return hits, distractor
        order = self.np_random.permutation(len(hits))
        return [hits[i] for i in order], [distractor[i] for i in order]

    def _inject_distractors(self, hits: list[Hit]) -> tuple[list[Hit], list[bool]]:
        """Replace each candidate by a random passage with probability ``distractor_rate`` (seeded)."""
        rate = self.config.distractor_rate
        flags = [False] * len(hits)
        if rate <= 0 or not hits:
            return hits, flags
        corpus = self.retriever.corpus
        taken = {h.row for h in hits}
        out = list(hits)
        for i, hit in enumerate(hits):
            if self.np_random.random() >= rate or len(taken) >= len(corpus):
                continue
            row = int(self.np_random.integers(len(corpus)))
            while row in taken:
                row = int(self.np_random.integers(len(corpus)))
            taken.add(row)
            passage: Passage = corpus[row]
            out[i] = Hit.from_passage(passage, score=hit.score, rank=hit.rank)
            flags[i] = True
        return out, flags

    def _next_example(self, reseeded: bool) -> QAExample:
        if not self.dataset:
            raise ValueError("reset() needs options={'example': QAExample} when the env has no dataset")
        if self._order is None or reseeded or self._cursor >= len(self._order):
            self._order = self.np_random.permutation(len(self.dataset))
            self._cursor = 0
        example = self.dataset[int(self._order[self._cursor])]
        self._cursor += 1
        return example

    def _require_episode(self) -> EpisodeState:
        if self.episode is None or self.episode.done:
            raise RuntimeError("the episode is over (or never started): call reset() first")
        return self.episode

    def summary(self) -> dict:
        """The current episode's evaluation record (also given in ``info['episode']`` at the end)."""
        return self._require_episode_any().summary(self.config.reward)

    def _require_episode_any(self) -> EpisodeState:
        if self.episode is None:
            raise RuntimeError("no episode: call reset() first")
        return self.episode


def prefetch_opened_pages(retriever: SearchBackend,
                          steps: Sequence[tuple[SearchEnv, PendingStep | None, list[Hit] | None]]) -> None:
    """Before a batch of prepared steps (each with its retrieved hits, if any) completes: a retriever
    that reads a page when its candidate is opened (the live web's snippet previews,
    ``prefetch_pages``) reads the pages the batch opens (:meth:`SearchEnv.opening`), across episodes,
    in one parallel call; each step then finds them ready and counts them itself. Nothing happens
    for any other retriever. A failure here is only logged: each step's own read meets it again and
    its episode records it."""
    prefetch = getattr(retriever, "prefetch_pages", None)
    if not callable(prefetch):
        return
    hits = [hit for env, step, found in steps if step is not None for hit in env.opening(step, found)]
    if hits:
        try:
            prefetch(hits)
        except Exception as err:  # noqa: BLE001 (the steps' own reads report it)
            log.warning("page prefetch failed: %s: %s", type(err).__name__, err)


def _action_kind(action: Action) -> str:
    return {SearchAction: "search", ExpandAction: "expand", AnswerAction: "answer"}.get(type(action), "invalid")
