"""Where caches live. ``SEEDS_RL_CACHE`` overrides the default ``~/.cache/seeds-rl``."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """Return (and create) a folder under the seeds-rl cache."""
    root = Path(os.environ.get("SEEDS_RL_CACHE", Path.home() / ".cache" / "seeds-rl")).expanduser()
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
