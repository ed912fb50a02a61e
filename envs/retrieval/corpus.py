"""One passage store over three file formats, addressable by row without loading the texts.

Supported formats (row ``i`` is the ``i``-th passage line of the file, which is FAISS row ``i``):

- ``"flashrag"``: JSONL ``{"id", "contents": "title\\ntext"}`` (FlashRAG, wiki18_100w). Without a
  newline in ``contents`` the title is ``""``; one pair of surrounding double quotes is stripped
  from the title, as wiki18_100w stores them.
- ``"jsonl"``: JSONL ``{"id", "title", "text"}``.
- ``"tsv"``: DPR TSV ``id<TAB>text<TAB>title`` after a header line naming the three columns.

The file is scanned once: every line is validated, passage ids are checked to be unique (a
repeated id raises :class:`CorpusFormatError` naming both lines, since ids name passages in
positives, predictions and the server's ``/passages``), and each line's byte offset goes into a
numpy int64 array, cached on disk under ``cache_dir("corpus-offsets")`` and keyed by the corpus fingerprint
and the file's stat signature (inode, size, mtime, ctime), so reloading a 21M-passage file is instant
while any write to the file (even one the sampled fingerprint misses) makes the next load scan and
validate it again. A passage is read and parsed only when asked for.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from envs.atomic import atomic_write
from envs.paths import cache_dir
from envs.types import Passage

FORMATS = ("flashrag", "jsonl", "tsv")
TSV_COLUMNS = ("id", "text", "title")
_SAMPLE_BYTES = 1 << 16  # bytes per fingerprint chunk
_SAMPLE_CHUNKS = 10  # start, end and 8 evenly spaced middle chunks
_OFFSETS_VERSION = "v3"  # bump when the offsets layout or the scan's checks change (v2: unique ids, v3: stat key)
_KEPT_SCANS = 3  # cached scans kept per corpus content (copies of one file have their own stat signature)


class CorpusFormatError(ValueError):
    """A corpus line cannot be parsed; the message names the file and the 1-based line."""


def fingerprint_file(path: str | os.PathLike) -> str:
    """Stable hex digest of a file's content, cheap even for a 13 GB corpus.

    sha256 over the file size and fixed-size chunks sampled at the start, the end and evenly
    spaced points in between; small files are hashed whole. The path and mtime are not used,
    so two copies of one file share a fingerprint.
    """
    size = os.path.getsize(path)
    digest = hashlib.sha256(f"seeds-rl-corpus:{size}:".encode())
    with open(path, "rb") as handle:
        if size <= _SAMPLE_BYTES * _SAMPLE_CHUNKS:
            digest.update(handle.read())
        else:
            last = size - _SAMPLE_BYTES
            for k in range(_SAMPLE_CHUNKS):
                handle.seek(last * k // (_SAMPLE_CHUNKS - 1))
                digest.update(handle.read(_SAMPLE_BYTES))
    return digest.hexdigest()


def stat_signature(path: str | os.PathLike) -> str:
    """A short digest of the file's device, inode, size, mtime and ctime: it changes whenever the
    file is written (ctime moves even when an editor puts the old mtime back)."""
    st = os.stat(path)
    fields = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return hashlib.sha256(":".join(map(str, fields)).encode()).hexdigest()[:16]


def detect_format(path: str | os.PathLike) -> str:
    """Guess the format from the extension and, for JSON lines, the keys of the first record."""
    path = Path(path)
    if path.suffix.lower() in (".tsv", ".tab"):
        return "tsv"
    with open(path, "rb") as handle:
        first = handle.readline().decode("utf-8", errors="replace").strip()
    if not first.startswith("{"):
        if "\t" in first:
            return "tsv"
        raise CorpusFormatError(f"{path}: line 1: cannot tell the corpus format; pass fmt= explicitly")
    try:
        record = json.loads(first)
    except json.JSONDecodeError as err:
        raise CorpusFormatError(f"{path}: line 1: bad JSON ({err.msg})") from None
    return "flashrag" if isinstance(record, dict) and "contents" in record else "jsonl"


def _as_id(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError('"id" must be a string or an integer')
    return str(value)


def _require_str(record: dict, key: str) -> str:
    if key not in record:
        raise ValueError(f'missing field "{key}"')
    if not isinstance(record[key], str):
        raise ValueError(f'field "{key}" must be a string')
    return record[key]


def _load_object(text: str) -> dict:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"bad JSON ({err.msg})") from None
    if not isinstance(record, dict):
        raise ValueError("expected a JSON object")
    if "id" not in record:
        raise ValueError('missing field "id"')
    return record


def _split_contents(contents: str) -> tuple[str, str]:
    """FlashRAG ``contents`` -> (title, text); the title loses one pair of surrounding quotes."""
    title, newline, text = contents.partition("\n")
    if not newline:
        return "", contents
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, text


def _parse_tsv_header(line: str) -> tuple[int, int, int]:
    """Column positions of id, text and title named by the DPR header line."""
    names = [name.strip().lower() for name in next(csv.reader([line], delimiter="\t"))]
    if sorted(names) != sorted(TSV_COLUMNS):
        raise ValueError(f"header must name the columns id, text, title (got {names})")
    id_column, text_column, title_column = (names.index(column) for column in TSV_COLUMNS)
    return id_column, text_column, title_column


def parse_line(fmt: str, line: str, columns: tuple[int, int, int] = (0, 1, 2)) -> tuple[str, str, str]:
    """Parse one passage line (without its newline) into ``(id, title, text)``.

    Raises ValueError with the reason if the line is malformed.
    """
    if not line.strip():
        raise ValueError("blank line")
    if fmt == "flashrag":
        record = _load_object(line)
        title, text = _split_contents(_require_str(record, "contents"))
        return _as_id(record["id"]), title, text
    if fmt == "jsonl":
        record = _load_object(line)
        return _as_id(record["id"]), _require_str(record, "title"), _require_str(record, "text")
    if fmt == "tsv":
        fields = next(csv.reader([line], delimiter="\t"))
        if len(fields) != 3:
            raise ValueError(f"expected 3 tab-separated columns, got {len(fields)}")
        return fields[columns[0]], fields[columns[2]], fields[columns[1]]
    raise ValueError(f"unknown corpus format {fmt!r}; expected one of {FORMATS}")


def _strip_newline(raw: bytes) -> bytes:
    if raw.endswith(b"\n"):
        raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
    return raw


class Corpus:
    """Passages of one corpus file, read by row on demand.

    Attributes: ``path`` (the file), ``fmt`` (its format). Rows follow file order.
    """

    def __init__(self, path: str | os.PathLike, fmt: str = "auto", use_cache: bool = True):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"corpus file not found: {self.path}")
        self.fmt = detect_format(self.path) if fmt == "auto" else fmt
        if self.fmt not in FORMATS:
            raise ValueError(f"unknown corpus format {fmt!r}; expected 'auto' or one of {FORMATS}")
        self._fingerprint: str | None = None
        self._fd: int | None = None
        self._rows_by_id: dict[str, int] | None = None
        self._columns = (0, 1, 2)
        self._first_line = 1  # 1-based file line of row 0
        if self.fmt == "tsv":
            self._read_tsv_header()
        self._offsets = self._load_offsets() if use_cache else self._scan()

    # ----- building -----------------------------------------------------------------------
    def _read_tsv_header(self) -> None:
        with open(self.path, "rb") as handle:
            header = _strip_newline(handle.readline()).decode("utf-8", errors="replace")
        try:
            self._columns = _parse_tsv_header(header)
        except ValueError as err:
            raise CorpusFormatError(f"{self.path}: line 1: {err}") from None
        self._first_line = 2

    def _load_offsets(self) -> np.ndarray:
        """The row offsets from the cache when this very file was scanned (validated) before, else
        from a scan. The cache is keyed by the sampled fingerprint AND the file's stat signature
        (:func:`stat_signature`), so an edit the sampled fingerprint misses (same size, a changed
        id between the sampled chunks) is scanned and validated again."""
        prefix = f"{self.fingerprint()}-{self.fmt}-{_OFFSETS_VERSION}"
        folder = cache_dir("corpus-offsets")
        cached = folder / f"{prefix}-{stat_signature(self.path)}.npy"
        if cached.exists():
            offsets = np.load(cached, mmap_mode="r")
            if offsets.ndim == 1 and len(offsets) >= 1 and int(offsets[-1]) == os.path.getsize(self.path):
                return offsets
        offsets = self._scan()
        with atomic_write(cached, "wb") as handle:
            np.save(handle, offsets)
        stale = sorted(folder.glob(f"{prefix}-*.npy"), key=lambda p: p.stat().st_mtime, reverse=True)
        for path in stale[_KEPT_SCANS:]:  # older scans of this content (copies, edits, touches)
            path.unlink(missing_ok=True)
        return offsets

    def _scan(self) -> np.ndarray:
        """Validate every line and the uniqueness of the ids; return n+1 offsets (row starts, then
        the end of the last line)."""
        starts, id_hashes = array("q"), array("q")
        line_no = 0
        with open(self.path, "rb") as handle:
            pos = 0
            if self.fmt == "tsv":
                pos = len(handle.readline())
                line_no = 1
            for raw in handle:
                line_no += 1
                starts.append(pos)
                pos += len(raw)
                try:
                    text = _strip_newline(raw).decode("utf-8")
                    id_hashes.append(hash(parse_line(self.fmt, text, self._columns)[0]))
                except UnicodeDecodeError:
                    raise CorpusFormatError(f"{self.path}: line {line_no}: not valid UTF-8") from None
                except ValueError as err:
                    raise CorpusFormatError(f"{self.path}: line {line_no}: {err}") from None
        starts.append(pos)
        offsets = np.frombuffer(starts, dtype=np.int64).copy()
        self._check_unique_ids(np.frombuffer(id_hashes, dtype=np.int64), offsets)
        return offsets

    def _check_unique_ids(self, id_hashes: np.ndarray, offsets: np.ndarray) -> None:
        """Raise :class:`CorpusFormatError` naming the first line whose passage id an earlier line has.

        ``id_hashes``: ``(n,)`` int64, the in-process ``hash`` of each row's id (8 bytes a row rather
        than a set of 21M strings); ``offsets``: ``(n + 1,)`` row starts. Only rows whose hash
        repeats are read again and their ids compared exactly.
        """
        ordered = np.sort(id_hashes)
        repeated = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])
        if len(repeated) == 0:
            return
        first_line: dict[str, int] = {}
        with open(self.path, "rb") as handle:
            for row in np.flatnonzero(np.isin(id_hashes, repeated)).tolist():
                handle.seek(int(offsets[row]))
                raw = handle.read(int(offsets[row + 1] - offsets[row]))
                pid = parse_line(self.fmt, _strip_newline(raw).decode("utf-8"), self._columns)[0]
                line = row + self._first_line
                if pid in first_line:
                    raise CorpusFormatError(
                        f"{self.path}: line {line}: duplicate passage id {pid!r} (first on line {first_line[pid]}); "
                        "ids name passages in positives, predictions and /passages, so each must be unique"
                    )
                first_line[pid] = line

    # ----- identity -----------------------------------------------------------------------
    def fingerprint(self) -> str:
        """Content fingerprint of the corpus file (see :func:`fingerprint_file`)."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint_file(self.path)
        return self._fingerprint

    # ----- access -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._offsets) - 1

    def _file(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        return self._fd

    def _passage(self, row: int, raw: bytes) -> Passage:
        try:
            pid, title, text = parse_line(self.fmt, _strip_newline(raw).decode("utf-8"), self._columns)
        except (ValueError, UnicodeDecodeError) as err:
            line = row + self._first_line
            raise CorpusFormatError(f"{self.path}: line {line}: {err} (file changed since it was scanned?)") from None
        return Passage(row=row, id=pid, title=title, text=text)

    def _check_row(self, row: int) -> int:
        row = int(row)
        if row < 0:
            row += len(self)
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} out of range for a corpus of {len(self)} passages")
        return row

    def __getitem__(self, row: int) -> Passage:
        row = self._check_row(row)
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        return self._passage(row, os.pread(self._file(), end - start, start))

    def get_many(self, rows: Sequence[int]) -> list[Passage]:
        """Passages for ``rows``, in the order given (repeats allowed)."""
        return [self[row] for row in rows]

    def iter_batches(self, batch_size: int, start_row: int = 0) -> Iterator[tuple[int, list[Passage]]]:
        """Yield ``(first_row, passages)`` for consecutive batches, reading each batch in one go."""
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        for first in range(start_row, len(self), batch_size):
            last = min(first + batch_size, len(self))
            start, end = int(self._offsets[first]), int(self._offsets[last])
            block = os.pread(self._file(), end - start, start)
            cuts = self._offsets[first : last + 1] - start
            yield first, [self._passage(first + k, block[cuts[k] : cuts[k + 1]]) for k in range(last - first)]

    def __iter__(self) -> Iterator[Passage]:
        for _, batch in self.iter_batches(4096):
            yield from batch

    def row_of(self, passage_id: str) -> int:
        """Row of a passage id (ids are unique: the scan checks). Builds an id->row map on first use."""
        if self._rows_by_id is None:
            rows: dict[str, int] = {}
            for passage in self:
                rows.setdefault(passage.id, passage.row)
            self._rows_by_id = rows
        try:
            return self._rows_by_id[str(passage_id)]
        except KeyError:
            raise KeyError(f"passage id {passage_id!r} not in corpus {self.path}") from None

    # ----- housekeeping -------------------------------------------------------------------
    def close(self) -> None:
        """Close the file descriptor (it reopens on the next read)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fd"] = None  # descriptors do not cross process boundaries
        state["_rows_by_id"] = None
        return state

    def __repr__(self) -> str:
        return f"Corpus(path={str(self.path)!r}, fmt={self.fmt!r}, passages={len(self)})"


def load_corpus(path: str | os.PathLike, fmt: str = "auto") -> Corpus:
    """Open a corpus file (``fmt``: "auto", "flashrag", "jsonl" or "tsv")."""
    return Corpus(path, fmt=fmt)
