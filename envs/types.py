"""Plain records shared by every part of the environment.

They hold strings and numbers only, so they are cheap to create per hit, safe to
serialise as JSON and free of any model or index state.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Passage:
    """One corpus passage. ``row`` is its position in the corpus file (= FAISS row)."""

    row: int
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Hit:
    """One retrieval result: a passage plus its score and 1-based rank for its query."""

    row: int
    id: str
    title: str
    text: str
    score: float
    rank: int

    @classmethod
    def from_passage(cls, passage: Passage, score: float, rank: int) -> Hit:
        return cls(passage.row, passage.id, passage.title, passage.text, float(score), int(rank))


@dataclass(frozen=True)
class QAExample:
    """One question with its gold answers and, where the dataset has them, labelled positives.

    ``positive_ids`` are corpus passage ids and ``positive_titles`` are article titles
    (HotpotQA supporting facts); either marks a passage as a positive for the selection
    reward. ``contexts`` are the example's own paragraphs (``{"title", "text"}``), if any.
    """

    id: str
    question: str
    golden_answers: tuple[str, ...]
    positive_ids: tuple[str, ...] = ()
    positive_titles: tuple[str, ...] = ()
    contexts: tuple[dict, ...] = ()
    metadata: dict = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict:
        """FlashRAG JSONL row (``id, question, golden_answers, metadata``) plus our optional fields."""
        row = {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "metadata": dict(self.metadata),
        }
        if self.positive_ids:
            row["positive_ids"] = list(self.positive_ids)
        if self.positive_titles:
            row["supporting_titles"] = list(self.positive_titles)
        if self.contexts:
            row["contexts"] = [dict(c) for c in self.contexts]
        return row
