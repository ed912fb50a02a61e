"""Corpus store: three formats, row access, validation errors, fingerprint and offsets cache."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from envs.retrieval import corpus as corpus_module
from envs.retrieval.corpus import CorpusFormatError, fingerprint_file, load_corpus
from envs.types import Passage

ROWS = [
    ("doc-1", "Paris", "Paris is the capital of France."),
    ("doc-2", "", "A passage without a title."),
    ("7", "Tab\u00e9 Quote", 'Text with "quotes", commas, and unicode \u00e9.'),
    ("doc-4", "Berlin", "Berlin is the capital of Germany."),
]


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDS_RL_CACHE", str(tmp_path / "cache"))


def write_lines(path, lines, trailing_newline=True):
    path.write_text("\n".join(lines) + ("\n" if trailing_newline else ""), encoding="utf-8")
    return path


def flashrag_lines(rows=ROWS):
    # wiki18_100w stores titles in double quotes; a title-less passage has no newline.
    return [json.dumps({"id": pid, "contents": f'"{title}"\n{text}' if title else text}) for pid, title, text in rows]


def jsonl_lines(rows=ROWS):
    return [json.dumps({"id": pid, "title": title, "text": text}) for pid, title, text in rows]


def tsv_lines(rows=ROWS):
    def quote(field):
        return '"' + field.replace('"', '""') + '"' if '"' in field else field
    return ["id\ttext\ttitle"] + [f"{pid}\t{quote(text)}\t{title}" for pid, title, text in rows]


MAKERS = {"flashrag": (flashrag_lines, ".jsonl"), "jsonl": (jsonl_lines, ".jsonl"), "tsv": (tsv_lines, ".tsv")}


@pytest.mark.parametrize("fmt", sorted(MAKERS))
def test_round_trip_and_row_order(tmp_path, fmt):
    make, ext = MAKERS[fmt]
    corpus = load_corpus(write_lines(tmp_path / f"c{ext}", make()))
    assert corpus.fmt == fmt
    assert len(corpus) == len(ROWS)
    for row, (pid, title, text) in enumerate(ROWS):
        assert corpus[row] == Passage(row=row, id=pid, title=title, text=text)
    assert corpus[-1].id == "doc-4"
    assert [p.row for p in corpus] == list(range(len(ROWS)))


@pytest.mark.parametrize("fmt", sorted(MAKERS))
def test_explicit_format_and_no_trailing_newline(tmp_path, fmt):
    make, _ = MAKERS[fmt]
    corpus = load_corpus(write_lines(tmp_path / "corpus.txt", make(), trailing_newline=False), fmt=fmt)
    assert [p.text for p in corpus] == [text for _, _, text in ROWS]


def test_flashrag_keeps_inner_quotes_and_text_newlines(tmp_path):
    line = json.dumps({"id": "x", "contents": '"The "Best" Title"\nline one\nline two'})
    corpus = load_corpus(write_lines(tmp_path / "c.jsonl", [line]))
    assert corpus[0].title == 'The "Best" Title'
    assert corpus[0].text == "line one\nline two"


def test_tsv_header_can_reorder_columns(tmp_path):
    path = write_lines(tmp_path / "c.tsv", ["id\ttitle\ttext", "a\tT\tbody text"])
    assert load_corpus(path)[0] == Passage(0, "a", "T", "body text")


def test_get_many_iter_batches_and_row_of(tmp_path):
    corpus = load_corpus(write_lines(tmp_path / "c.jsonl", jsonl_lines()))
    assert [p.id for p in corpus.get_many([3, 0, 3])] == ["doc-4", "doc-1", "doc-4"]
    batches = list(corpus.iter_batches(3))
    assert [(start, [p.row for p in batch]) for start, batch in batches] == [(0, [0, 1, 2]), (3, [3])]
    assert [p.id for _, b in corpus.iter_batches(2, start_row=1) for p in b] == ["doc-2", "7", "doc-4"]
    assert corpus.row_of("7") == 2 and corpus.row_of("doc-4") == 3
    with pytest.raises(KeyError):
        corpus.row_of("missing")
    with pytest.raises(IndexError):
        corpus[len(ROWS)]


BAD_CASES = [
    ("jsonl", ".jsonl", 2, '{"id": "b", "title": "T", "text": '),  # bad JSON
    ("jsonl", ".jsonl", 2, '{"id": "b", "title": "T"}'),  # missing text
    ("jsonl", ".jsonl", 2, '{"title": "T", "text": "x"}'),  # missing id
    ("jsonl", ".jsonl", 2, ""),  # blank line in the middle
    ("flashrag", ".jsonl", 2, '{"id": "b", "text": "no contents"}'),
    ("flashrag", ".jsonl", 2, '["not", "an", "object"]'),
    ("tsv", ".tsv", 3, "b\tonly two columns"),  # line 1 is the header
    ("tsv", ".tsv", 3, "b\ttext\ttitle\textra"),
]


@pytest.mark.parametrize("fmt,ext,line_no,bad", BAD_CASES)
def test_malformed_line_names_file_and_line(tmp_path, fmt, ext, line_no, bad):
    make, _ = MAKERS[fmt]
    lines = make()
    lines.insert(line_no - 1, bad)
    path = write_lines(tmp_path / f"broken{ext}", lines)
    with pytest.raises(CorpusFormatError) as err:
        load_corpus(path, fmt=fmt)
    assert "broken" + ext in str(err.value)
    assert f"line {line_no}:" in str(err.value)


def test_trailing_blank_line_is_an_error_but_final_newline_is_not(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(jsonl_lines()) + "\n\n", encoding="utf-8")
    with pytest.raises(CorpusFormatError, match=f"line {len(ROWS) + 1}:"):
        load_corpus(path)


def test_bad_tsv_header(tmp_path):
    path = write_lines(tmp_path / "c.tsv", ["a\tb\tc", "1\ttext\ttitle"])
    with pytest.raises(CorpusFormatError, match="c.tsv: line 1:"):
        load_corpus(path)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_corpus(tmp_path / "nope.jsonl")


def test_fingerprint_stable_across_copies_and_sensitive_to_content(tmp_path):
    original = write_lines(tmp_path / "a.jsonl", jsonl_lines())
    copy = tmp_path / "sub" / "b.jsonl"
    copy.parent.mkdir()
    shutil.copyfile(original, copy)
    assert load_corpus(original).fingerprint() == load_corpus(copy).fingerprint()
    changed = write_lines(tmp_path / "c.jsonl", jsonl_lines(ROWS[:-1] + [("doc-4", "Berlin", "Changed.")]))
    assert load_corpus(changed).fingerprint() != load_corpus(original).fingerprint()


def test_fingerprint_of_large_file_samples_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_module, "_SAMPLE_BYTES", 16)
    data = bytearray(b"x" * 10_000)
    path = tmp_path / "big.bin"
    path.write_bytes(bytes(data))
    before = fingerprint_file(path)
    data[-1:] = b"y"  # the end chunk is always sampled
    path.write_bytes(bytes(data))
    assert fingerprint_file(path) != before
    assert len(before) == 64 and int(before, 16) >= 0


def test_offsets_cache_is_written_and_reused(tmp_path, monkeypatch):
    path = write_lines(tmp_path / "c.jsonl", jsonl_lines())
    first = load_corpus(path)
    cached = list((tmp_path / "cache" / "corpus-offsets").glob("*.npy"))
    assert len(cached) == 1 and cached[0].name.startswith(first.fingerprint())
    assert np.load(cached[0])[-1] == path.stat().st_size

    def no_scan(self):
        raise AssertionError("offsets should come from the cache")

    monkeypatch.setattr(corpus_module.Corpus, "_scan", no_scan)
    second = load_corpus(path)
    assert [p.id for p in second] == [p.id for p in first]
    assert not list((tmp_path / "cache" / "corpus-offsets").glob("*.tmp"))


def test_corpus_pickles_without_its_file_descriptor(tmp_path):
    import pickle

    corpus = load_corpus(write_lines(tmp_path / "c.jsonl", jsonl_lines()))
    assert corpus[0].id == "doc-1"
    clone = pickle.loads(pickle.dumps(corpus))
    assert clone[3] == corpus[3]


# ----- unique passage ids -----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(MAKERS))
def test_a_repeated_id_is_an_error_naming_both_lines(tmp_path, fmt):
    make, ext = MAKERS[fmt]
    rows = [*ROWS, ("doc-5", "Rome", "Rome is the capital of Italy."), ("doc-2", "Again", "Same id as row 1.")]
    with pytest.raises(CorpusFormatError) as err:
        load_corpus(write_lines(tmp_path / f"dup{ext}", make(rows)), fmt=fmt)
    header = 1 if fmt == "tsv" else 0  # the TSV header is line 1, so every passage line moves down one
    message = str(err.value)
    assert f"dup{ext}: line {6 + header}:" in message and f"first on line {2 + header}" in message
    assert "'doc-2'" in message


def test_an_integer_id_and_its_string_are_the_same_id(tmp_path):
    lines = [json.dumps({"id": 7, "title": "a", "text": "x"}), json.dumps({"id": "7", "title": "b", "text": "y"})]
    with pytest.raises(CorpusFormatError, match="line 2: duplicate passage id '7' \\(first on line 1\\)"):
        load_corpus(write_lines(tmp_path / "ints.jsonl", lines))


def test_colliding_id_hashes_are_compared_exactly(tmp_path, monkeypatch):
    """Distinct ids whose hashes collide (forced here) are not duplicates; the exact re-check decides."""
    monkeypatch.setattr(corpus_module, "hash", lambda _text: 42, raising=False)
    corpus = load_corpus(write_lines(tmp_path / "c.jsonl", jsonl_lines()))
    assert [p.id for p in corpus] == [pid for pid, _, _ in ROWS]
    with pytest.raises(CorpusFormatError, match="line 5: duplicate passage id 'doc-1' \\(first on line 1\\)"):
        load_corpus(write_lines(tmp_path / "d.jsonl", jsonl_lines([*ROWS, ROWS[0]])))


def test_offsets_cached_before_the_id_check_are_not_trusted(tmp_path):
    """A duplicate written before ids were checked (offsets cache v1) is still found."""
    path = write_lines(tmp_path / "old.jsonl", jsonl_lines([*ROWS, ROWS[0]]))
    stale = corpus_module.cache_dir("corpus-offsets") / f"{fingerprint_file(path)}-jsonl-v1.npy"
    np.save(stale, np.arange(len(ROWS) + 2, dtype=np.int64))
    with pytest.raises(CorpusFormatError, match="duplicate passage id 'doc-1'"):
        load_corpus(path)


def test_a_same_size_edit_the_sampled_fingerprint_misses_is_validated_again(tmp_path):
    """20,000 passages (over 640 KB, so the fingerprint samples): one id between the sampled chunks
    becomes a copy of another, same length, same file size: the next load scans and refuses it."""
    rows = [(f"p{k:05d}", f"Title {k}", f"Passage number {k} of the sampled corpus.") for k in range(20_000)]
    path = write_lines(tmp_path / "big.jsonl", jsonl_lines(rows))
    assert len(load_corpus(path)) == 20_000
    data = path.read_bytes()
    size, chunk, chunks = len(data), corpus_module._SAMPLE_BYTES, corpus_module._SAMPLE_CHUNKS
    assert size > chunk * chunks
    sampled = [(size - chunk) * k // (chunks - 1) for k in range(chunks)]
    gap = (sampled[4] + chunk + sampled[5]) // 2  # a byte no sampled chunk reads
    line = data.count(b"\n", 0, gap) + 1
    target = f"p{line - 1:05d}".encode()
    assert data.count(target) == 1 and not any(s <= data.index(target) < s + chunk for s in sampled)
    before = fingerprint_file(path)
    path.write_bytes(data.replace(target, b"p00001"))
    assert path.stat().st_size == size and fingerprint_file(path) == before  # the fingerprint cannot tell
    with pytest.raises(CorpusFormatError, match=f"line {line}: duplicate passage id 'p00001' \\(first on line 2\\)"):
        load_corpus(path)
