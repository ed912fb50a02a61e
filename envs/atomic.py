"""Atomic file writes: write a temp file beside the target, fsync, then rename it into place.

A reader (or a resumed job) therefore sees either the old file or the complete new one, never
a half-written file.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temp file for writing; on a clean exit it replaces ``path``, on an error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; caches and results are meant to be readable
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(text: str, path: str | os.PathLike) -> Path:
    with atomic_write(path) as handle:
        handle.write(text)
    return Path(path)


def write_json_atomic(data: dict, path: str | os.PathLike) -> Path:
    with atomic_write(path) as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
    return Path(path)


def write_jsonl_atomic(records: Iterable[dict], path: str | os.PathLike) -> Path:
    """One JSON object per line (UTF-8, not ASCII-escaped)."""
    with atomic_write(path) as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return Path(path)
