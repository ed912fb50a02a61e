"""Book-keeping of one episode: what was searched, shown, opened, and what it scored.

Kept apart from :mod:`envs.search_env` so the env's ``step`` reads as protocol logic and this
module as accounting. Everything here is plain data that serialises to JSON for evaluation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from envs.metrics import answer_bearing, answer_scores, normalize_answer
from envs.rewards import RewardConfig, answer_reward, is_positive, selection_reward
from envs.types import Hit, QAExample


@dataclass
class SearchRecord:
    """One search: the query, the candidates shown (rank order) and what was opened from them."""

    query: str
    hits: list[Hit]
    positive: list[bool]
    distractor: list[bool]
    answer_bearing: list[bool]  # the SEEDS proxy, kept beside labelled positives for analyses
    expanded: list[int] = field(default_factory=list)  # 1-based candidate numbers opened
    doc_tokens: int = 0
    # candidate number -> the passage text an observation showed (cut where the observation cap cut it)
    shown: dict[int, str] = field(default_factory=dict)
    # candidates whose line the snapshot showed when the observation cap cut it (the judgement form
    # judges these); None: all of them
    visible: int | None = None

    def to_dict(self) -> dict:
        return {
            "query": self.query,
            "ids": [h.id for h in self.hits],
            "rows": [h.row for h in self.hits],
            "titles": [h.title for h in self.hits],
            "ranks": [h.rank for h in self.hits],
            "scores": [h.score for h in self.hits],
            "positive": list(self.positive),
            "distractor": list(self.distractor),
            "answer_bearing": list(self.answer_bearing),
            "expanded": list(self.expanded),
            "expanded_ids": [self.hits[i - 1].id for i in self.expanded],
            "expanded_ranks": [self.hits[i - 1].rank for i in self.expanded],
            "doc_tokens": self.doc_tokens,
        }


@dataclass
class EpisodeState:
    """What the env knows of the episode in progress (searches, opened and shown candidates, the
    answer); its :meth:`summary` is the end-of-episode summary. A rolled-out episode with its
    tokens is :class:`training.rollouts.rollout.Episode`."""
    example: QAExample
    searches: list[SearchRecord] = field(default_factory=list)
    n_actions: int = 0
    n_invalid: int = 0
    format_penalty: float = 0.0
    answer: str | None = None
    awaiting_expand: bool = False  # the latest snapshot has not been expanded yet
    seen_queries: set[str] = field(default_factory=set)
    opened_rows: dict[int, bool] = field(default_factory=dict)  # row -> is positive
    shown_rows: dict[int, bool] = field(default_factory=dict)  # row -> is positive
    # row -> the passage text as an observation first showed it (cut where the observation cap cut it)
    passage_text: dict[int, str] = field(default_factory=dict)
    # pages read for this question (live web: fetched on opening, or at search time with
    # previews=page; a page served by the run's cache counts too) and how many of them could not be
    # read; None when the retriever reads no pages (a corpus)
    pages_fetched: int | None = None
    page_failures: int | None = None
    done: bool = False

    @property
    def n_searches(self) -> int:
        return len(self.searches)

    @property
    def latest(self) -> SearchRecord | None:
        return self.searches[-1] if self.searches else None

    @property
    def doc_tokens(self) -> int:
        return sum(s.doc_tokens for s in self.searches)

    def add_search(self, query: str, hits: list[Hit], distractor: list[bool]) -> SearchRecord:
        positive = [is_positive(h, self.example) for h in hits]
        bearing = [answer_bearing(h.text, self.example.golden_answers) for h in hits]
        record = SearchRecord(query, hits, positive, distractor, bearing)
        self.searches.append(record)
        self.seen_queries.add(normalize_answer(query))
        for hit, pos in zip(hits, positive):
            self.shown_rows[hit.row] = pos
        return record

    def open(self, record: SearchRecord, number: int) -> bool:
        """Mark candidate ``number`` of ``record`` opened; False if its passage was already read."""
        record.expanded.append(number)
        hit = record.hits[number - 1]
        if hit.row in self.opened_rows:
            return False
        self.opened_rows[hit.row] = record.positive[number - 1]
        return True

    def counts(self) -> dict[str, int]:
        positives_opened = sum(self.opened_rows.values())
        positives_shown = sum(self.shown_rows.values())
        return {
            "positives_shown": positives_shown,
            "positives_opened": positives_opened,
            "negatives_opened": len(self.opened_rows) - positives_opened,
            "positives_missed": positives_shown - positives_opened,
            "docs_read": len(self.opened_rows),
            "docs_shown": len(self.shown_rows),
        }

    def reward_breakdown(self, config: RewardConfig) -> dict[str, float]:
        """Terminal reward parts; the format penalty is paid per step, reported here for the total."""
        counts = self.counts()
        scores = answer_scores(self.answer, self.example.golden_answers)
        correct = scores["em"] == 1.0
        answer = answer_reward(self.answer, self.example.golden_answers, config)
        selection = selection_reward(
            counts["positives_opened"], counts["negatives_opened"], counts["positives_missed"], correct, config
        )
        return {
            "answer": answer,
            "selection": selection,
            "format": -self.format_penalty,
            "terminal": answer + selection,
            "total": answer + selection - self.format_penalty,
        }

    def summary(self, config: RewardConfig) -> dict:
        """Everything evaluation needs about the episode so far."""
        counts = self.counts()
        opened = counts["docs_read"]
        return {
            "example_id": self.example.id,
            "question": self.example.question,
            "golden_answers": list(self.example.golden_answers),
            "answer": self.answer,
            "metrics": answer_scores(self.answer, self.example.golden_answers),
            "n_searches": self.n_searches,
            "n_actions": self.n_actions,
            "n_invalid": self.n_invalid,
            "doc_tokens": self.doc_tokens,
            **counts,
            "precision": counts["positives_opened"] / opened if opened else 0.0,
            "reward": self.reward_breakdown(config),
            "searches": [s.to_dict() for s in self.searches],
            **({} if self.pages_fetched is None
               else {"pages_fetched": self.pages_fetched, "page_failures": self.page_failures or 0}),
        }
