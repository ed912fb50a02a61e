"""SEEK's parsers of free model text (outlines, queries, evidence, verdicts, revisions) and its
sketch's revision rule, as pure functions: tolerant of the forms small models write."""
from methods.seek import Sketch
from methods.seek_parsing import (
    Revision,
    clean_evidence,
    grounded,
    parse_gists,
    parse_numbered_queries,
    parse_query,
    parse_sketch_revision,
    parse_verdict,
)


def test_parse_gists_is_tolerant():
    assert parse_gists("Here is my plan:\n1. Alpha\n2) Beta\nStep 3: Gamma\n- Delta\n1. alpha") == [
        "Alpha", "Beta", "Gamma", "Delta"]
    pager_style = "# Page\n## Who founded it\n<TO BE FILLED>\n## When\n<TO BE FILLED>"
    assert parse_gists(pager_style) == ["Who founded it", "When"]
    assert parse_gists("1. **Founder** [to be filled]\n   Evidence: [to be filled]") == ["Founder"]
    assert parse_gists("**1. Who:** the founder\n**Topic 2:** when") == ["Who: the founder", "when"]
    assert parse_gists("no list at all") == []


def test_parse_query_and_numbered_queries():
    assert parse_query("Reasoning: need the river.\nQuery: \"Seine river\"\nmore") == "Seine river"
    assert parse_query("<search>capital of France</search>") == "capital of France"
    assert parse_query("capital of France") == "capital of France"
    assert parse_query("Reasoning: only thinking") == ""
    assert parse_numbered_queries("1. a b\n3. Query: c d") == {1: "a b", 3: "c d"}
    assert parse_numbered_queries("first query\nsecond query") == {1: "first query", 2: "second query"}


def test_clean_evidence_and_verdicts():
    assert clean_evidence("Evidence: Paris is the capital.", ["Capital"]) == "Paris is the capital."
    assert clean_evidence("1. Capital\n   Evidence: [to be filled]", ["Capital"]) == ""
    assert parse_verdict("Yes, enough.") is True and parse_verdict("Not yet") is False
    assert parse_verdict("No.") is False and parse_verdict("maybe") is None


def test_parse_sketch_revision():
    text = ("Here is the revised outline:\n"
            "1. **Founder**\n   Evidence: Ann founded it.\n"
            "2. Year - Evidence: [to be filled]\n"
            "3. Place\n"
            "- Evidence: in Oslo\n"
            "4. founder\n   Evidence: duplicate\n")
    assert [(r.gist, r.evidence, r.stated) for r in parse_sketch_revision(text)] == [
        ("Founder", "Ann founded it.", True), ("Year", None, True), ("Place", "in Oslo", True)]
    assert parse_sketch_revision("keep") == [] and parse_sketch_revision("1. Only a topic")[0].stated is False


def test_grounded_evidence():
    source = "Paris is the capital of France. The Seine flows through Paris."
    assert grounded("The capital of France is Paris.", source)
    assert grounded("Paris.", source) and grounded("", source)
    assert not grounded("Lyon is the capital of Germany since 1999.", source)


def test_sketch_revision_keeps_evidence_by_gist():
    sketch = Sketch.from_gists(["A topic", "B topic"])
    sketch.slots[0].evidence = "found A"
    revised, edits = sketch.revised([Revision("b topic"), Revision("a topic!"), Revision("C topic")])
    assert [s.evidence for s in revised.slots] == [None, "found A", None] and revised.next_empty() == 0
    assert "1. b topic\n   Evidence: [to be filled]" in revised.render() and edits == []
