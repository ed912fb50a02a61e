import pytest

from methods.parsing import clean_answer, extract_answer, first_int, last_tag


@pytest.mark.parametrize("text, expected", [
    ("<think>hmm</think><answer> Paris </answer>", ("Paris", "tag")),
    ("so the final answer is \\boxed{42}", ("42", "boxed")),
    ("Berlin is big. So the answer is: Spree.", ("Spree", "so-the-answer-is")),
    ("Answer: \"Tokyo\".\nmore text", ("Tokyo", "line")),
    ("<search>x</search>", ("", "none")),
    ("", ("", "none")),
    ("<answer>unfinished tag", ("unfinished tag", "tag")),
])
def test_extract_answer_forms(text, expected):
    assert extract_answer(text) == expected


def test_clean_answer_strips_tags_and_prefixes():
    assert clean_answer("<answer>") == ""
    assert clean_answer("  final answer:  the Seine. ") == "the Seine"
    assert clean_answer("U.S.A...") == "U.S.A..."


def test_tag_and_int_helpers():
    assert last_tag("<read>1</read> then <read> 3 </read>", "read") == "3"
    assert last_tag("nothing", "read") is None
    assert first_int("read 12 of them") == 12 and first_int("none") is None
