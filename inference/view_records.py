"""Run records as the run viewer's page reads them (:mod:`inference.view`): one entry per
question of an evaluation run (a ``predictions.jsonl`` record) or per training sample (a line of
``samples.jsonl``), with its turns in order and each search's candidates as rows.

A search's candidate row: ``[number, rank, score, title, id, positive, distractor,
answer_bearing, expanded]`` (number = the 1-based position the policy saw). Texts longer than
``max_chars`` are cut with a visible mark. A field a record lacks (written before it existed, or
an errored question) is left out or empty; nothing fails on an old run.
"""
from __future__ import annotations

from collections.abc import Mapping

from envs.report import episode_reward

COUNT_KEYS = ("n_searches", "n_actions", "n_invalid", "docs_read", "docs_shown", "positives_shown",
              "positives_opened", "negatives_opened", "positives_missed", "doc_tokens", "llm_calls",
              "llm_prompt_tokens", "llm_completion_tokens", "latency_s")
LIMIT_REASONS = ("env_limit", "action_limit")  # evaluation's and the trainer's name for the env's action limit


def clip(text, max_chars: int) -> str:
    """``text`` as a string, cut at ``max_chars`` with a mark saying how much was left out."""
    text = text if isinstance(text, str) else ("" if text is None else str(text))
    if max_chars and len(text) > max_chars:
        return text[:max_chars] + f"\n[… {len(text) - max_chars} more characters not shown]"
    return text


def _list(value) -> list:
    return value if isinstance(value, list) else []


def _mapping(value) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def candidate_rows(search: Mapping) -> list[list]:
    """The candidates of one search record (``envs.episode.SearchRecord.to_dict``) as rows."""
    ids = _list(search.get("ids"))
    expanded = {i for i in _list(search.get("expanded")) if isinstance(i, int)}
    columns = [_list(search.get(key)) for key in ("ranks", "scores", "titles")]
    flags = [_list(search.get(key)) for key in ("positive", "distractor", "answer_bearing")]
    rows = []
    for i, doc_id in enumerate(ids):
        rank, score, title = (column[i] if i < len(column) else None for column in columns)
        marks = [bool(column[i]) if i < len(column) else False for column in flags]
        rows.append([i + 1, rank, score, clip(title, 300), clip(doc_id, 200), *marks, (i + 1) in expanded])
    return rows


def search_entries(searches) -> list[dict]:
    return [{"query": clip(s.get("query"), 2000), "candidates": candidate_rows(s),
             "expanded": [i for i in _list(s.get("expanded")) if isinstance(i, int)],
             "doc_tokens": s.get("doc_tokens")} for s in _list(searches) if isinstance(s, Mapping)]


def evaluation_turns(trace, max_chars: int, prompts: bool) -> list[dict]:
    """The trace as turns: each env step with the LLM calls since the previous step; ``search``
    is the index of the search record a search or expand step concerns (searches are recorded
    in step order, so the k-th valid search step is search k)."""
    turns, calls, searches = [], [], 0
    for event in _list(trace):
        if not isinstance(event, Mapping):
            continue
        kind = event.get("type")
        if kind == "llm":
            call = {"tag": clip(event.get("tag"), 100), "output": clip(event.get("output"), max_chars),
                    "finish": event.get("finish_reason"), "error": event.get("error")}
            if prompts:
                call["prompt"] = clip(event.get("prompt"), max_chars)
            calls.append(call)
        elif kind == "env":
            step = {"kind": event.get("kind"), "action": clip(event.get("action"), max_chars),
                    "observation": clip(event.get("observation"), max_chars), "llm": calls}
            if event.get("kind") == "search":
                step["search"], searches = searches, searches + 1
            elif event.get("kind") == "expand" and searches:
                step["search"] = searches - 1
            if event.get("invalid_reason"):
                step["reason"] = clip(event.get("invalid_reason"), 2000)
            turns.append(step)
            calls = []
        else:  # retrieve, note, error, end: shown as events between the steps
            detail = {k: v for k, v in event.items() if k != "type"}
            turns.append({"kind": kind or "event", "event": clip(_plain(detail), max_chars), "llm": calls})
            calls = []
    if calls:
        turns.append({"kind": "llm", "llm": calls})
    return turns


def _plain(detail: Mapping) -> str:
    return "; ".join(f"{key}: {value}" for key, value in detail.items())


def _counts(record: Mapping) -> dict:
    return {key: record[key] for key in COUNT_KEYS if isinstance(record.get(key), (int, float))}


def _flags(metrics: Mapping, finish, n_invalid) -> dict:
    wrong = float(metrics.get("em") or 0.0) < 1.0 if "em" in metrics else None  # None: not scored (old sample)
    return {"wrong": wrong, "invalid": bool(n_invalid),
            "limit": finish in LIMIT_REASONS}


def evaluation_question(record: Mapping, max_chars: int, prompts: bool = False) -> dict:
    """One ``predictions.jsonl`` record for the page."""
    metrics = _mapping(record.get("metrics"))
    breakdown = record.get("reward_breakdown")
    return {
        "id": str(record.get("id")), "question": clip(record.get("question"), max_chars),
        "golds": [clip(g, 500) for g in _list(record.get("golden_answers"))],
        "answer": None if record.get("prediction") is None else clip(record.get("prediction"), max_chars),
        "finish": str(record.get("finish_reason", "")), "metrics": dict(metrics),
        "reward": episode_reward(record), "reward_parts": breakdown if isinstance(breakdown, Mapping) else None,
        "counts": _counts(record), "flags": _flags(metrics, record.get("finish_reason"), record.get("n_invalid")),
        "searches": search_entries(record.get("searches")),
        "rounds": _list(record.get("search_rounds")), "method_stats": record.get("method_stats") or {},
        "turns": evaluation_turns(record.get("trace"), max_chars, prompts),
    }


def training_sample(sample: Mapping, max_chars: int) -> dict:
    """One ``samples.jsonl`` line for the page; an old line (update, question id, reward, finish,
    text) shows its text as the one turn."""
    episode = _mapping(sample.get("episode"))
    metrics = _mapping(episode.get("metrics"))
    reward = episode.get("reward")
    turns = [[[str(source), clip(text, max_chars)] for source, text in turn if isinstance(source, str)]
             for turn in _list(sample.get("turns")) if isinstance(turn, list)]
    if not turns:
        turns = [[["model", clip(sample.get("text"), max_chars)]]]
    finish = str(sample.get("finish", ""))
    return {
        "id": f"{sample.get('update')}:{sample.get('question')}", "update": sample.get("update"),
        "question": clip(episode.get("question") or sample.get("question"), max_chars),
        "golds": [clip(g, 500) for g in _list(episode.get("golden_answers"))],
        "answer": None if episode.get("answer") is None else clip(episode.get("answer"), max_chars),
        "finish": finish, "metrics": dict(metrics),
        "reward": float(sample.get("reward", 0.0) or 0.0),
        "reward_parts": reward if isinstance(reward, Mapping) else None,
        "counts": _counts(episode), "flags": _flags(metrics, finish, episode.get("n_invalid")),
        "searches": search_entries(episode.get("searches")), "transcript": turns,
    }
