"""Synthetic vectors and exact ground truth for scripts/bench_index.py.

``GeneratorConfig`` and ``Mixture`` describe the seeded mixture of Gaussian clusters the base rows
and queries are drawn from; ``generate`` writes the base rows to a float32 .npy file chunk by
chunk, ``make_queries`` draws the queries, ``RowReader`` reads the file back without mmap, and
``exact_top_k`` finds each query's true top-k by a chunked matmul.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from envs.atomic import write_json_atomic

K = 10
CHUNK_ROWS = 65_536


@dataclass(frozen=True)
class GeneratorConfig:
    """A fixed mixture distribution; ``n`` rows or queries are i.i.d. draws from it.

    Variances (before L2 normalisation): cluster centres 1.0 in total over the latent axes
    (power-law spectrum), spread inside a cluster ``within``, isotropic noise over all ``dim``
    axes ``noise``, and a shared mean of squared norm ``mean_sq`` (4.67 gives random pairs a
    cosine near 0.7).
    """

    dim: int = 768
    seed: int = 0
    clusters: int = 4000
    latent_dim: int = 64
    spectrum_decay: float = 0.5  # latent axis j has std (j+1)**-decay before scaling
    within: float = 0.6
    noise: float = 0.4
    mean_sq: float = 4.67


class Mixture:
    """Parameters drawn once from ``config.seed``; ``sample(n, rng)`` draws rows."""

    def __init__(self, config: GeneratorConfig):
        self.config = c = config
        rng = np.random.default_rng([c.seed, 0])
        r = min(c.latent_dim, c.dim)
        basis, _ = np.linalg.qr(rng.standard_normal((c.dim, r)))
        self.basis = basis.T.astype(np.float32)  # (r, dim), orthonormal rows
        spectrum = (1.0 + np.arange(r)) ** -c.spectrum_decay
        spectrum /= np.sqrt((spectrum**2).sum())  # total centre variance 1
        self.centres = (rng.standard_normal((c.clusters, r)) * spectrum).astype(np.float32)
        stretch = np.exp(0.5 * rng.standard_normal((c.clusters, r)))  # per-cluster anisotropy
        stretch /= np.sqrt(((stretch * spectrum) ** 2).sum(axis=1, keepdims=True))
        self.spreads = (np.sqrt(c.within) * stretch * spectrum).astype(np.float32)  # (clusters, r)
        sizes = np.exp(rng.standard_normal(c.clusters))  # log-normal cluster sizes
        self.weights = sizes / sizes.sum()
        mean = rng.standard_normal(c.dim)
        self.mean = (np.sqrt(c.mean_sq) * mean / np.linalg.norm(mean)).astype(np.float32)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, dim) float32, L2-normalised rows."""
        c = self.config
        cluster = rng.choice(c.clusters, size=n, p=self.weights)
        latent = self.centres[cluster] + self.spreads[cluster] * rng.standard_normal(
            (n, self.basis.shape[0]), dtype=np.float32)
        x = latent @ self.basis
        x += rng.standard_normal((n, c.dim), dtype=np.float32) * np.float32(math.sqrt(c.noise / c.dim))
        x += self.mean
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x


def generate(path: Path, n: int, config: GeneratorConfig) -> bool:
    """Write ``n`` rows to ``path`` (.npy, float32) chunk by chunk; chunk i is drawn from its own
    seeded stream, so the file depends only on (config, n). Returns False when a file made from
    the same (config, n) is already there and was reused."""
    stamp = path.with_suffix(".json")
    wanted = {**asdict(config), "n": n, "chunk_rows": CHUNK_ROWS}
    if path.exists() and stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return False
    stamp.unlink(missing_ok=True)
    mixture = Mixture(config)
    with open(path, "wb") as handle:
        np.lib.format.write_array_header_1_0(
            handle, {"descr": "<f4", "fortran_order": False, "shape": (n, config.dim)})
        for chunk, start in enumerate(range(0, n, CHUNK_ROWS)):
            rng = np.random.default_rng([config.seed, 1, chunk])
            mixture.sample(min(CHUNK_ROWS, n - start), rng).tofile(handle)
    write_json_atomic(wanted, stamp)
    return True


def make_queries(n_queries: int, config: GeneratorConfig) -> np.ndarray:
    """Fresh draws from the mixture (a stream the base rows never use)."""
    return Mixture(config).sample(n_queries, np.random.default_rng([config.seed, 2]))


class RowReader:
    """Rows of a float32 .npy file read with plain file reads (not mmap), so reading the file
    during a build adds nothing to the process's RSS beyond the arrays it returns."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read_header(handle)
            self.offset = handle.tell()
        if dtype != np.float32 or len(shape) != 2:
            raise ValueError(f"{path}: expected a 2-d float32 array, got {dtype} {shape}")
        self.n, self.dim = shape

    def rows(self, start: int, stop: int) -> np.ndarray:
        count = (stop - start) * self.dim
        block = np.fromfile(self.path, dtype=np.float32, count=count, offset=self.offset + start * self.dim * 4)
        return block.reshape(stop - start, self.dim)

    def chunks(self, stop: int | None = None, size: int = CHUNK_ROWS):
        stop = self.n if stop is None else stop
        for start in range(0, stop, size):
            yield start, self.rows(start, min(start + size, stop))

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The given sorted rows, gathered in one pass over the file."""
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        done = 0
        for start, block in self.chunks():
            picked = rows[(rows >= start) & (rows < start + len(block))]
            out[done:done + len(picked)] = block[picked - start]
            done += len(picked)
        return out


def exact_top_k(reader: RowReader, queries: np.ndarray, k: int, stop: int | None = None) -> np.ndarray:
    """(q, k) int64 rows with the highest inner product among rows [0, stop), best first."""
    best_scores = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    best_rows = np.zeros((len(queries), 0), dtype=np.int64)
    for start, block in reader.chunks(stop):
        scores = queries @ block.T  # (q, chunk)
        kk = min(k, scores.shape[1])
        top = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
        best_scores = np.concatenate([best_scores, np.take_along_axis(scores, top, 1)], axis=1)
        best_rows = np.concatenate([best_rows, top + start], axis=1)
        keep = np.argsort(-best_scores, axis=1, kind="stable")[:, :k]
        best_scores = np.take_along_axis(best_scores, keep, 1)
        best_rows = np.take_along_axis(best_rows, keep, 1)
    return best_rows
