"""The embedded default retriever: MiniLM over the Wikipedia-summaries corpus, built once, cached.

The first call embeds the default corpus (about 12k passages; roughly four minutes with MiniLM
on a two-core CPU) into ``cache_dir("indexes", ...)``; later calls, in any process, load it in
seconds. The folder name carries the encoder, the index type and the corpus fingerprint, so a
changed corpus gets a fresh index instead of a mismatched one. Concurrent first calls are safe:
the build holds a file lock and the second caller reuses the first one's result.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from envs.paths import cache_dir
from envs.retrieval.corpus import load_corpus
from envs.retrieval.default_corpus import default_corpus_path
from envs.retrieval.encoders import canonical_encoder_name, load_encoder
from envs.retrieval.index import DenseIndex, build_index
from envs.retrieval.remote import RemoteRetriever
from envs.retrieval.retriever import Retriever
from envs.retrieval.web import open_web_retriever


def _slug(text: str, limit: int = 40) -> str:
    """File-name-safe form of ``text``; long or altered names get a short hash suffix."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_").lower()
    if len(slug) > limit or slug != text.lower():
        slug = f"{slug[:limit]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return slug


def default_index_dir(corpus, index_type: str = "Flat", encoder: str = "minilm") -> Path:
    """Cache folder of the index for ``corpus`` with this encoder and index type."""
    name = f"{_slug(canonical_encoder_name(encoder))}-{_slug(index_type)}-{corpus.fingerprint()[:12]}"
    return cache_dir("indexes", name)


def default_retriever(index_type: str = "Flat", encoder: str = "minilm", device: str = "auto",
                      cache_size: int = 4096, show_progress: bool = True) -> Retriever:
    """Retriever over the default corpus, building and caching its index on first use.

    ``encoder`` and ``index_type`` take the names :func:`envs.retrieval.encoders.load_encoder` and
    :func:`envs.retrieval.index.build_index` accept; ``device`` as in :meth:`DenseIndex.load`.
    """
    corpus = load_corpus(default_corpus_path())
    model = load_encoder(encoder, device=None if device == "auto" else device, show_progress=show_progress)
    index_dir = default_index_dir(corpus, index_type, encoder)
    build_index(corpus, model, index_dir, index_type=index_type, show_progress=show_progress)
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
