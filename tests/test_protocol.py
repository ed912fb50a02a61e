import pytest

from envs.protocol import (
    AnswerAction,
    ExpandAction,
    InvalidAction,
    SearchAction,
    format_expand,
    parse_action,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<search>capital of France</search>", SearchAction("capital of France")),
        ("  I should look this up.\n<search>\n capital   of\nFrance </search>", SearchAction("capital of France")),
        ("<think>hmm</think><SEARCH>x</SEARCH>", SearchAction("x")),
        ("<expand>2, 5</expand>", ExpandAction((2, 5))),
        ("<expand> 1 3  4 </expand>", ExpandAction((1, 3, 4))),
        ("<expand>[2], [2], 3</expand>", ExpandAction((2, 3))),
        ("<expand>none</expand>", ExpandAction(())),
        ("<expand> None </expand>", ExpandAction(())),
        ("<answer> Paris </answer>", AnswerAction("Paris")),
        ("<answer>a</answer> trailing <search>b</search>", AnswerAction("a")),
    ],
)
def test_valid_actions(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize(
    "text, reason_part",
    [
        ("", "no <search>"),
        ("just some words", "no <search>"),
        ("<search>unfinished", "never closed"),
        ("<search>   </search>", "empty <search>"),
        ("<answer></answer>", "empty <answer>"),
        ("<expand></expand>", "empty <expand>"),
        ("<expand>two</expand>", "not a candidate number"),
        ("<expand>1, -2</expand>", "not a candidate number"),
        ("<search>a</answer>", "never closed"),
        ("<<<>>></search>", "no <search>"),
    ],
)
def test_invalid_actions_have_reasons(text, reason_part):
    action = parse_action(text)
    assert isinstance(action, InvalidAction)
    assert reason_part in action.reason
    assert action.raw == text


def test_format_expand_round_trips():
    assert parse_action(format_expand([3, 1])) == ExpandAction((3, 1))
    assert parse_action(format_expand([])) == ExpandAction(())


def test_judgement_form_parses_to_the_yes_candidates():
    assert parse_action("<expand>[1] no [2] yes [3] YES</expand>") == ExpandAction((2, 3), judged=(1, 2, 3))
    assert parse_action("<expand>1: no, 2: no</expand>") == ExpandAction((), judged=(1, 2))
    assert isinstance(parse_action("<expand>[1] yes [1] no</expand>"), InvalidAction)
    assert parse_action("<expand>no</expand>") == ExpandAction(())  # the word alone is still "none"


def test_format_expand_judgement_form_round_trips():
    text = format_expand([3, 1], n_candidates=4, form="judge")
    assert text == "<expand>[1] yes [2] no [3] yes [4] no</expand>"
    assert parse_action(text) == ExpandAction((1, 3), judged=(1, 2, 3, 4))
    with pytest.raises(ValueError):
        format_expand([5], n_candidates=4, form="judge")


def test_judge_chunks_interleave_the_snapshot():
    from envs.protocol import judge_chunks, judgement_action, snapshot_candidates

    obs = "<snapshot>\n[1] Paris: capital of France\n[2] Seine: a river\nin France\n</snapshot>"
    assert snapshot_candidates(obs) == ["Paris: capital of France", "Seine: a river\nin France"]
    chunks, closing = judge_chunks(obs)
    assert chunks == ["\n<snapshot>\n[1] Paris: capital of France\nRead [1]?",
                      "\n[2] Seine: a river\nin France\nRead [2]?"]
    assert closing == "\n</snapshot>\n"
    assert judge_chunks("<information>\nNo passages expanded.\n</information>") == ([], "")
    assert parse_action(judgement_action([" yes", " no"])) == ExpandAction((1,), judged=(1, 2))
    bad = parse_action(judgement_action([" yes", " maybe"]))
    assert isinstance(bad, InvalidAction) and "yes or no" in bad.reason
