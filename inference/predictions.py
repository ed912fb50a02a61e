"""``predictions.jsonl``: one line per question, appended as questions finish.

A killed run leaves at most one partial last line; :func:`load_predictions` cuts it off, so the
resumed run re-does that question and never writes any question twice.
"""
from __future__ import annotations

import json
import os
from pathlib import Path


class PredictionsFileError(ValueError):
    pass


def load_predictions(path: str | os.PathLike, repair: bool = True) -> list[dict]:
    """Complete records of ``path`` (none if missing).

    A torn final line (a run killed mid-write) is skipped, and with ``repair`` cut from the file
    so that appending can continue.
    """
    path = Path(path)
    if not path.exists():
        return []
    records: list[dict] = []
    good_end = 0
    with open(path, "rb") as handle:
        data = handle.read()
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, start=1):
        is_last = number == len(lines)
        if is_last and raw == b"":
            break
        try:
            record = json.loads(raw)
            if not isinstance(record, dict) or "id" not in record:
                raise ValueError("not a prediction record")
        except ValueError as err:
            if is_last:
                break  # a line torn by a kill: drop it, the question runs again
            raise PredictionsFileError(f"{path}: line {number} is not a prediction record ({err})") from err
        if is_last:  # parsed but never got its newline: rewrite it whole below
            break
        records.append(record)
        good_end += len(raw) + 1
    if repair and good_end != len(data):
        with open(path, "r+b") as handle:
            handle.truncate(good_end)
    return records


class PredictionWriter:
    """Appends records durably (flush + fsync per line) and refuses duplicate ids."""

    def __init__(self, path: str | os.PathLike, done_ids: set[str] | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.ids = set(done_ids or ())
        self._handle = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        if record["id"] in self.ids:
            raise PredictionsFileError(f"question {record['id']!r} is already in {self.path}")
        self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self.ids.add(record["id"])

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> PredictionWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
