"""The embedded default retriever: MiniLM over the Wikipedia-summaries corpus, built once, cached.

The first call embeds the default corpus (12,372 passages) into ``cache_dir("indexes", ...)``,
after a one-line notice of what it is doing and how long it should take (timed on a sample of
the corpus): with MiniLM on a two-core CPU, about 1.7 minutes in bfloat16 (chosen where the
CPU computes it natively, see :func:`envs.retrieval.encoders.resolve_dtype`), about 4 in
float32. Later calls, in any process, load it in seconds. The folder name carries the encoder,
its precision, the index type and the corpus fingerprint, so a changed corpus or precision gets
a fresh index instead of a mismatched one. Concurrent first calls are safe: the build holds a
file lock and the second caller reuses the first one's result.
"""
from __future__ import annotations

import hashlib
import re
import sys
import time
from pathlib import Path

import numpy as np

from envs.paths import cache_dir
from envs.retrieval.corpus import load_corpus
from envs.retrieval.default_corpus import default_corpus_path
from envs.retrieval.encoders import canonical_encoder_name, load_encoder
from envs.retrieval.index import META_FILE, DenseIndex, build_index
from envs.retrieval.remote import RemoteRetriever
from envs.retrieval.retriever import Retriever
from envs.retrieval.web import open_web_retriever


def _slug(text: str, limit: int = 40) -> str:
    """File-name-safe form of ``text``; long or altered names get a short hash suffix."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_").lower()
    if len(slug) > limit or slug != text.lower():
        slug = f"{slug[:limit]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return slug


DEFAULT_ENCODE_ROWS = 1024  # passages per encode call; sentence-transformers sorts each call by length


def default_index_dir(corpus, index_type: str = "Flat", encoder: str = "minilm", dtype: str | None = None) -> Path:
    """Cache folder of the index for ``corpus`` with this encoder, precision and index type.

    ``dtype`` is the encoder's resolved precision (``encoder.settings["dtype"]``); float32 and None
    (an encoder without one, e.g. ``hash``) add nothing to the name, so float32 folders keep the
    name they had before the precision was part of it.
    """
    precision = [_slug(dtype)] if dtype and dtype != "float32" else []
    parts = [_slug(canonical_encoder_name(encoder)), *precision, _slug(index_type), corpus.fingerprint()[:12]]
    return cache_dir("indexes", "-".join(parts))


def estimate_embed_seconds(corpus, encoder, sample: int = 256, warm_up: int = 32) -> float:
    """Seconds ``encoder`` should take to embed all of ``corpus``: ``sample`` evenly spaced passages
    are timed in one call, after a warm-up call on ``warm_up`` of them, and the time scaled to the
    corpus size. (MiniLM, bf16, 2 cores: 2-3 s spent, 1.6 min estimated for 89 s of embedding;
    a 64-passage sample after an 8-passage warm-up said 166 s.)"""
    rows = np.unique(np.linspace(0, len(corpus) - 1, min(sample, len(corpus))).astype(int))
    passages = corpus.get_many(rows.tolist())
    encoder.encode_passages(passages[:warm_up], show_progress=False)
    started = time.perf_counter()
    encoder.encode_passages(passages, show_progress=False)
    return (time.perf_counter() - started) * len(corpus) / len(passages)


def build_notice(corpus, encoder, index_dir: Path, seconds: float) -> str:
    """The one line printed before the default index is built."""
    device = getattr(getattr(encoder, "model", None), "device", "cpu")
    precision = encoder.settings.get("dtype")
    how = f" ({precision} on {device})" if precision else ""
    took = f"about {seconds / 60:.1f} min" if seconds >= 90 else f"about {seconds:.0f} s"
    return (f"seeds-rl: first use of this index: embedding the default corpus ({len(corpus):,} passages) with "
            f"{encoder.name}{how} into {index_dir}, {took} on this machine; later runs load it in seconds")


def default_retriever(index_type: str = "Flat", encoder: str = "minilm", device: str = "auto",
                      cache_size: int = 4096, show_progress: bool = True, dtype: str = "auto") -> Retriever:
    """Retriever over the default corpus, building and caching its index on first use.

    ``encoder`` and ``index_type`` take the names :func:`envs.retrieval.encoders.load_encoder` and
    :func:`envs.retrieval.index.build_index` accept; ``device`` as in :meth:`DenseIndex.load`;
    ``dtype`` is the encoder precision (``"auto"``: :func:`envs.retrieval.encoders.resolve_dtype`),
    used for the passages and the queries alike. With ``show_progress``, a build is announced by
    :func:`build_notice` and shown by a progress bar.
    """
    corpus = load_corpus(default_corpus_path())
    model = load_encoder(encoder, device=None if device == "auto" else device, show_progress=show_progress,
                         dtype=dtype)
    index_dir = default_index_dir(corpus, index_type, encoder, model.settings.get("dtype"))
    if show_progress and not (index_dir / META_FILE).exists():
        seconds = estimate_embed_seconds(corpus, model)
        print(build_notice(corpus, model, index_dir, seconds), file=sys.stderr, flush=True)
    build_index(corpus, model, index_dir, index_type=index_type, batch_size=DEFAULT_ENCODE_ROWS,
                show_progress=show_progress)
    index = DenseIndex.load(index_dir, corpus=corpus, device=device)
    return Retriever(corpus, model, index, cache_size=cache_size)


def open_retriever(spec: str | None, corpus=None, device: str = "auto"):
    """The one way to open a retriever from a spec string (command lines, configs).

    ``None`` or ``"default"``: :func:`default_retriever`; ``"http://..."`` / ``"https://..."``: a
    :class:`envs.retrieval.remote.RemoteRetriever` of that server (``python -m envs.retrieval.server``);
    ``"web:..."``: live web search, :class:`envs.retrieval.web.WebRetriever` (e.g.
    ``web:searxng:http://127.0.0.1:8888``, ``web:serper``); anything else: an index folder,
    :meth:`Retriever.from_dir` with ``corpus`` (None: the path in its meta.json).
    """
    if spec is None or str(spec) == "default":
        return default_retriever(device=device)
    if str(spec).startswith("web:"):
        if corpus is not None:
            raise ValueError(f"a corpus ({corpus}) cannot be given with web search ({spec}): "
                             "the pages found are the corpus")
        return open_web_retriever(str(spec))
    if str(spec).startswith(("http://", "https://")):
        if corpus is not None:
            raise ValueError(f"a corpus ({corpus}) cannot be given with a retrieval server ({spec}): "
                             "the server serves its own")
        return RemoteRetriever(str(spec))
    return Retriever.from_dir(spec, corpus=corpus, device=device)


def open_run_retriever(server: str | None, index: str | None, corpus=None, device: str = "auto"):
    """A run's retriever from its config (PPO, SFT, evaluation): the retrieval server at ``server``
    (a URL) when one is given, else ``index`` (a folder, a URL, or None/"default") over ``corpus``."""
    if server:
        return open_retriever(server, device=device)
    return open_retriever(index, corpus=corpus, device=device)
