"""QA loaders: FlashRAG JSONL, HotpotQA JSON, the contexts corpus, hub mapping and the writer."""
from __future__ import annotations

import json
import warnings

import pytest

from envs import data as data_module
from envs.data import (
    DataFormatError,
    contexts_corpus,
    load_flashrag_jsonl,
    load_hotpot_json,
    load_qa,
    write_flashrag_jsonl,
)
from envs.retrieval.corpus import load_corpus
from envs.types import QAExample

FLASHRAG_ROWS = [
    {"id": "q0", "question": "Who wrote Hamlet?", "golden_answers": ["William Shakespeare", "Shakespeare"],
     "metadata": {"source": "toy"}},
    {"id": "q1", "question": "Capital of France?", "golden_answers": "Paris", "dataset": "toy",
     "supporting_titles": ["Paris", "France"], "positive_ids": ["p0"],
     "contexts": [{"title": "Paris", "text": "Paris is the capital of France."},
                  {"title": "France", "text": "A country."}]},
]

HOTPOT = [
    {"_id": "h0", "question": "Which is older, A or B?", "answer": "A", "type": "comparison", "level": "easy",
     "supporting_facts": [["A", 0], ["B", 1], ["A", 1]],
     "context": [["A", ["A was founded in 1900.", " It is old."]], ["B", ["B began in 1950.", " It is newer."]],
                 ["C", ["C is unrelated."]]]},
    {"_id": "h1", "question": "Where was B founded?", "answer": "Berlin",
     "supporting_facts": [["B", 0]],
     "context": [["B", ["B began in 1950.", " It is newer."]], ["D", ["D is in Berlin."]]]},
]


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_flashrag_jsonl_fields(tmp_path):
    examples = load_flashrag_jsonl(write_jsonl(tmp_path / "qa.jsonl", FLASHRAG_ROWS))
    first, second = examples
    assert first.golden_answers == ("William Shakespeare", "Shakespeare")
    assert first.metadata == {"source": "toy"}
    assert second.golden_answers == ("Paris",)  # a string answer is wrapped
    assert second.positive_titles == ("Paris", "France")
    assert second.positive_ids == ("p0",)
    assert second.contexts[0] == {"title": "Paris", "text": "Paris is the capital of France."}
    assert second.metadata == {"dataset": "toy"}  # unknown top-level keys are kept


def test_load_qa_limit_and_blank_lines(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [FLASHRAG_ROWS[0], "", FLASHRAG_ROWS[1]])
    assert [e.id for e in load_qa(path)] == ["q0", "q1"]
    assert [e.id for e in load_qa(str(path), limit=1)] == ["q0"]


@pytest.mark.parametrize("bad,reason", [
    ('{"id": "x", "question": "Q?", ', "bad JSON"),
    ('{"id": "x", "golden_answers": ["a"]}', "question"),
    ('{"id": "x", "question": "Q?"}', "answers"),
    ('{"id": "x", "question": "Q?", "golden_answers": []}', "answer"),
    ('{"id": "x", "question": "Q?", "golden_answers": ["a"], "contexts": [{"title": "t"}]}', "text"),
])
def test_malformed_flashrag_line_names_file_and_line(tmp_path, bad, reason):
    path = write_jsonl(tmp_path / "broken.jsonl", [FLASHRAG_ROWS[0], FLASHRAG_ROWS[1], bad])
    with pytest.raises(DataFormatError) as err:
        load_flashrag_jsonl(path)
    assert "broken.jsonl: line 3:" in str(err.value)
    assert reason in str(err.value)


def test_hotpot_json(tmp_path):
    path = tmp_path / "hotpot_dev.json"
    path.write_text(json.dumps(HOTPOT), encoding="utf-8")
    examples = load_qa(path)
    assert [e.id for e in examples] == ["h0", "h1"]
    first = examples[0]
    assert first.golden_answers == ("A",)
    assert first.positive_titles == ("A", "B")  # deduplicated, in order
    assert first.contexts[0] == {"title": "A", "text": "A was founded in 1900. It is old."}
    assert first.metadata == {"type": "comparison", "level": "easy"}
    assert load_hotpot_json(path, limit=1)[0].id == "h0"


def test_hotpot_missing_answer_names_item(tmp_path):
    path = tmp_path / "h.json"
    path.write_text(json.dumps([HOTPOT[0], {"_id": "x", "question": "Q?", "context": []}]), encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"h.json: item 1: missing answers"):
        load_hotpot_json(path)


def test_contexts_corpus_deduplicates_with_stable_ids(tmp_path):
    path = tmp_path / "h.json"
    path.write_text(json.dumps(HOTPOT), encoding="utf-8")
    examples = load_hotpot_json(path)
    out = tmp_path / "hotpot_ctx.jsonl"
    assert contexts_corpus(examples, out) == 4  # A, B, C, D; B appears twice
    corpus = load_corpus(out)
    assert [(p.id, p.title) for p in corpus] == [
        ("hotpot_ctx_p0", "A"), ("hotpot_ctx_p1", "B"), ("hotpot_ctx_p2", "C"), ("hotpot_ctx_p3", "D")]
    first_bytes = out.read_bytes()
    contexts_corpus(examples, out)
    assert out.read_bytes() == first_bytes


def test_write_then_read_round_trip(tmp_path):
    examples = load_flashrag_jsonl(write_jsonl(tmp_path / "qa.jsonl", FLASHRAG_ROWS))
    out = write_flashrag_jsonl(examples, tmp_path / "out" / "qa.jsonl")
    assert load_flashrag_jsonl(out) == examples
    assert [p.name for p in out.parent.iterdir()] == ["qa.jsonl"]  # no temp file left


def test_hub_rows_are_mapped(monkeypatch):
    rows = [
        {"id": "n0", "question": "who?", "answer": ["Ann"]},
        {"question": "what?", "answers": {"text": ["X", "Y"], "answer_start": [0, 3]}},
        {"id": "hp", "question": "which?", "answer": "B", "supporting_facts": {"title": ["B"], "sent_id": [0]},
         "context": {"title": ["B"], "sentences": [["B is.", " Yes."]]}},
    ]

    class FakeDataset(list):
        def select(self, indices):
            return FakeDataset(self[i] for i in indices)

    calls = []

    def fake_load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return FakeDataset(rows)

    import datasets
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    examples = load_qa("org/some_qa:cfg", split="validation")
    assert calls == [("org/some_qa", "cfg", "validation")]
    assert examples[0] == QAExample("n0", "who?", ("Ann",))
    assert examples[1].id == "validation_1" and examples[1].golden_answers == ("X", "Y")
    assert examples[2].positive_titles == ("B",) and examples[2].contexts == ({"title": "B", "text": "B is. Yes."},)
    assert len(load_qa("org/some_qa", limit=2)) == 2


def test_hub_failure_is_a_clear_error(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match="could not load 'someone/qa'.*no network"):
        load_qa("someone/qa")


def test_missing_local_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.jsonl"):
        load_qa(tmp_path / "absent.jsonl")


def test_generate_default_questions_is_reexported():
    assert data_module.generate_default_questions.__module__ == "envs.default_questions"


FLASHRAG_HOTPOT_ROWS = [  # FlashRAG's hotpotqa layout: the supporting facts sit under metadata
    {"id": "f0", "question": "Which band did the founder of X join?", "golden_answers": ["Y"],
     "metadata": {"type": "bridge", "supporting_facts": {"title": ["X", "Bridge Person"], "sent_id": [0, 2]}}},
    {"id": "f1", "question": "Where is Z?", "golden_answers": ["Q"],
     "metadata": {"supporting_facts": [["Z", 0], ["Z", 1], ["W", 0]]}},
    {"id": "f2", "question": "Who?", "golden_answers": ["R"], "metadata": {"supporting_titles": ["R"]},
     "supporting_titles": ["Top wins"]},
    {"id": "f3", "question": "Which id?", "golden_answers": ["S"], "metadata": {"positive_ids": ["p7"]}},
]


def test_positives_are_read_from_metadata_too(tmp_path):
    path = write_jsonl(tmp_path / "hotpot_flashrag.jsonl", FLASHRAG_HOTPOT_ROWS)
    examples = {e.id: e for e in load_qa(path)}
    assert examples["f0"].positive_titles == ("X", "Bridge Person")  # the bridge document is a positive
    assert examples["f1"].positive_titles == ("Z", "W")
    assert examples["f2"].positive_titles == ("Top wins",)  # the top level comes first
    assert examples["f3"].positive_ids == ("p7",) and examples["f3"].positive_titles == ()
    assert examples["f0"].metadata["type"] == "bridge"  # metadata is kept as it was


def test_malformed_supporting_facts_name_the_line(tmp_path):
    rows = [{"id": "b", "question": "q?", "golden_answers": ["a"], "metadata": {"supporting_facts": [3, 4]}}]
    with pytest.raises(DataFormatError, match="line 1: .*supporting_facts"):
        load_qa(write_jsonl(tmp_path / "bad.jsonl", rows))


def test_proxy_positives_warn_once_per_dataset(tmp_path, monkeypatch):
    monkeypatch.setattr(data_module, "_WARNED_PROXY", set())
    bare = write_jsonl(tmp_path / "bare.jsonl", [FLASHRAG_ROWS[0]])
    with pytest.warns(data_module.ProxyPositivesWarning, match="all 1 questions have no labelled positives .* proxy"):
        load_qa(bare)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second load of the same dataset in the run stays quiet
        load_qa(bare)
        load_qa(write_jsonl(tmp_path / "labelled.jsonl", FLASHRAG_HOTPOT_ROWS))  # every question labelled
    mixed = write_jsonl(tmp_path / "mixed.jsonl", FLASHRAG_ROWS)
    with pytest.warns(data_module.ProxyPositivesWarning, match="1 of the 2 questions have no labelled"):
        load_qa(mixed)
