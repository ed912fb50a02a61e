import pytest

from envs.metrics import (
    answer_bearing,
    answer_scores,
    cover_em,
    exact_match,
    f1_score,
    normalize_answer,
    normalize_seek,
    substring_match,
)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  a   cat, an apple ", "cat apple"),
        ("Theatre", "theatre"),  # article only removed as a whole word
        ("U.S.A.", "usa"),
        ("rock-'n'-roll", "rocknroll"),
        ("“Quoted”", "“quoted”"),  # SQuAD strips ASCII punctuation only
        ("", ""),
    ],
)
def test_normalize_answer_matches_squad(raw, expected):
    assert normalize_answer(raw) == expected


def test_exact_match_best_over_golds():
    assert exact_match("the Paris", ["London", "paris."]) == 1.0
    assert exact_match("Paris France", ["Paris"]) == 0.0
    assert exact_match("Paris", "Paris") == 1.0


def test_f1_values():
    assert f1_score("Paris France", ["Paris"]) == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert f1_score("nothing", ["Paris"]) == 0.0
    assert f1_score("the big red dog", ["big dog", "red"]) == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))


def test_f1_hotpot_yes_no_rule():
    # "no" vs gold "no way": token overlap but HotpotQA scores 0 when a yes/no side differs.
    assert f1_score("no", ["no way"]) > 0
    assert f1_score("no", ["no way"], hotpot_yes_no=True) == 0.0
    assert f1_score("yes", ["yes"], hotpot_yes_no=True) == 1.0
    assert f1_score("Yes.", ["no"], hotpot_yes_no=True) == 0.0


def test_cover_em_needs_every_gold_token():
    assert cover_em("It was Barack Obama in 2008", ["Barack Obama"]) == 1.0
    assert cover_em("Obama", ["Barack Obama"]) == 0.0
    assert cover_em("the cannot", ["no"]) == 0.0  # token level, unlike substring match
    assert cover_em("anything", [""]) == 0.0


def test_substring_match_is_character_level():
    assert substring_match("I cannot say", ["no"]) == 1.0
    assert substring_match("Paris, France", ["paris"]) == 1.0
    assert substring_match("Lyon", ["Paris"]) == 0.0


def test_answer_bearing_ignores_diacritics_and_word_fragments():
    assert answer_bearing("Born in São Paulo, Brazil.", ["Sao Paulo"])
    assert not answer_bearing("Cannot be known.", ["no"])
    assert answer_bearing("The answer is no.", ["No"])


def test_answer_scores_missing_prediction_is_zero():
    assert answer_scores(None, ["x"]) == {"em": 0.0, "f1": 0.0, "f1_hotpot": 0.0, "cover_em": 0.0, "acc": 0.0}
    assert answer_scores("x", ["x"])["em"] == 1.0


def test_cover_em_seek_normalization_turns_punctuation_into_spaces():
    assert normalize_seek("U.S.A. (The) 1,000-Dollar bill!") == "u s 1 000 dollar bill"  # a lone "a": an article
    assert normalize_answer("U.S.A. (The) 1,000-Dollar bill!") == "usa 1000dollar bill"
    assert cover_em("the Notre Dame cathedral", ["Notre-Dame"]) == 0.0  # squad: "notredame"
    assert cover_em("the Notre Dame cathedral", ["Notre-Dame"], normalization="seek") == 1.0
    assert cover_em("It is Notre-Dame.", ["notredame"]) == 1.0
    assert cover_em("It is Notre-Dame.", ["notredame"], normalization="seek") == 0.0
    assert cover_em("Paris, France!", ["Paris"], normalization="seek") == cover_em("Paris, France!", ["Paris"]) == 1.0
    with pytest.raises(ValueError, match="normalization"):
        cover_em("a", ["a"], normalization="lenient")
