"""Prompts of every method, written in our own words, and the shared passage formatter."""
from __future__ import annotations

from envs.types import Hit


def format_docs(hits: list[Hit], max_chars: int | None = None) -> str:
    """``Doc i (Title: …) text`` blocks, the reference format of most RAG baselines."""
    blocks = []
    for i, hit in enumerate(hits, 1):
        text = hit.text if max_chars is None else hit.text[:max_chars]
        blocks.append(f"Doc {i} (Title: {hit.title}) {text}")
    return "\n".join(blocks) if blocks else "(no passages)"
