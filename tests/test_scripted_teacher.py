"""The scripted SFT teacher reads: it queries the question or titles it was shown, answers by a
reader rule over what it opened, writes expands in the env's form, and every env it plays in
counts observation caps in the policy's tokens. Word-overlap toy retriever of conftest."""
from __future__ import annotations

import dataclasses

import pytest

from envs.config import EnvConfig
from envs.protocol import ExpandAction, SearchAction, parse_action
from envs.search_env import TRUNCATION_MARK
from envs.types import QAExample
from tests.tiny_models import tiny_tokenizer
from training.teachers import trajectories
from training.teachers.scripted_teacher import (
    UNKNOWN_ANSWER,
    OpenedPassage,
    ScriptedTeacherConfig,
    collect_scripted,
    first_title_reader,
    information_passages,
    overlap_title_reader,
    quoted_query,
    snapshot_candidates,
)

FUJI = QAExample("qf", "Which mountain is highest in Japan?", ("Mount Fuji",), positive_ids=("p1",))


def actions(record):
    return [parse_action(s["text"]) for s in record["segments"] if s["role"] == "model"]


def shown_titles_before(record, turn):
    """Titles of every snapshot candidate shown before model turn ``turn``."""
    searches = record["summary"]["searches"]
    n_before = sum(isinstance(a, SearchAction) for a in actions(record)[:turn])
    return {title for search in searches[:n_before] for title in search["titles"]}


def test_parsing_what_the_env_showed():
    snapshot = "<snapshot>\n[1] Paris: Paris is the capital ...\n[2] Euro: The euro is ...\n</snapshot>"
    shown = snapshot_candidates(snapshot, ["Paris", "Euro"], title_chars=3)
    assert [(c.number, c.title, c.line) for c in shown] == [(1, "Par", "Paris: Paris is the capital ..."),
                                                           (2, "Eur", "Euro: The euro is ...")]
    information = ("<information>\n[3] Seine\nThe Seine is a river.\n\n[1] Paris: already read above.\n\n"
                   "[5] Spree\nThe Spree flows" + TRUNCATION_MARK + "\n</information>")
    titles = ["Paris", "France", "Seine", "Berlin", "Spree"]
    passages = information_passages(information, [3, 1, 5], titles)
    assert [(p.number, p.title) for p in passages] == [(3, "Seine"), (1, "Paris"), (5, "Spree")]
    assert passages[0].text == "The Seine is a river." and passages[1].text == ""
    assert passages[2].text.startswith("The Spree flows")
    # A passage cut off entirely by the observation cap was not read.
    assert [p.number for p in information_passages("<information>\n[3] Seine\nThe Se\n</information>",
                                                    [3, 1], titles)] == [3]


def test_overlap_title_reader_answers_with_the_passage_closest_to_the_question():
    paris = OpenedPassage(1, "Paris", "Paris is the capital of France on the Seine.")
    spree = OpenedPassage(2, "Spree", "The Spree is a river that flows through Berlin.")
    question = "Which river flows through Berlin?"
    assert overlap_title_reader(question, [[paris, spree]]) == "Spree"  # first_title would say Paris
    assert overlap_title_reader(question, [[spree], [paris]]) == "Paris"  # the last reading only
    assert overlap_title_reader("Who?", [[paris, spree]]) == "Paris"  # no overlap anywhere: the first
    assert overlap_title_reader(question, [[]]) == UNKNOWN_ANSWER
    assert ScriptedTeacherConfig(reader="overlap_title").reader == "overlap_title"


def test_first_title_reader_reads_the_last_information_with_passages():
    paris, spree = OpenedPassage(1, "Paris", "..."), OpenedPassage(2, "Spree", "...")
    assert first_title_reader("q", [[paris], [spree, paris]]) == "Spree"
    assert first_title_reader("q", [[paris], []]) == "Paris"  # the last expand opened nothing
    assert first_title_reader("q", []) == first_title_reader("q", [[]]) == UNKNOWN_ANSWER
    with pytest.raises(ValueError, match="reader"):
        ScriptedTeacherConfig(reader="gold")
    with pytest.raises(ValueError, match="expand"):
        ScriptedTeacherConfig(expand="oracle")


def test_follow_up_query_is_a_title_it_was_shown(retriever):
    """Positives mode opens p1 (France), which says nothing of the question: the teacher searches
    the shown title whose snapshot line shares most with the question (Mount Fuji), never the gold."""
    (record,) = collect_scripted([FUJI], retriever, EnvConfig(), ScriptedTeacherConfig(expand="positives"))
    turns = actions(record)
    queries = [(i, a.query) for i, a in enumerate(turns) if isinstance(a, SearchAction)]
    assert queries[0] == (0, FUJI.question) and queries[1][1] == "Mount Fuji"
    for turn, query in queries[1:]:
        assert query in shown_titles_before(record, turn)
    assert "search for Mount Fuji instead" in record["segments"][5]["text"]
    assert record["ended_with_answer"] and record["summary"]["n_invalid"] == 0
    assert turns[-1].answer == "France"  # the first title of the last reading (read again, "already read above")
    assert (record["accepted"], record["reason"]) == (True, "gold_observed")  # Mount Fuji was in a snapshot
    # No search again when the rest of the episode would not fit the action budget.
    (short,) = collect_scripted([FUJI], retriever, EnvConfig(max_actions=4), ScriptedTeacherConfig(expand="positives"))
    assert sum(isinstance(a, SearchAction) for a in actions(short)) == 1 and short["ended_with_answer"]
    no_follow_up = ScriptedTeacherConfig("positives", second_search=False)
    (single,) = collect_scripted([FUJI], retriever, EnvConfig(), no_follow_up)
    assert sum(isinstance(a, SearchAction) for a in actions(single)) == 1


def test_on_topic_reading_is_answered_without_searching_again(retriever, examples):
    for record in collect_scripted(examples, retriever, EnvConfig(), num_envs=2):
        turns = actions(record)
        assert [type(a) for a in turns] == [SearchAction, ExpandAction, type(turns[-1])]
        assert turns[0].query == record["question"]


def test_quoted_query_keeps_the_clues_and_drops_the_template_and_masks():
    question = ('Which subject is described as "Genus of hominins" and has a summary that begins: '
                '"___ is a genus of great ape that ___ emerged."?')
    assert quoted_query(question) == "Genus of hominins; is a genus of great ape that emerged."
    assert quoted_query("Which mountain is highest in Japan?") == "Which mountain is highest in Japan?"
    assert quoted_query('Who wrote "___"?') == 'Who wrote "___"?'  # nothing left of the clue: the question


def test_the_first_query_follows_the_query_rule(retriever, examples):
    quoted = [dataclasses.replace(e, question=f'Which one is "{e.question}" here?') for e in examples]
    settings = ScriptedTeacherConfig(query="quoted", second_search=False)
    for record in collect_scripted(quoted, retriever, EnvConfig(), settings, num_envs=2):
        assert actions(record)[0].query == quoted_query(record["question"]) != record["question"]
    with pytest.raises(ValueError, match="teacher query"):
        ScriptedTeacherConfig(query="gold")


def test_judge_form_expands_and_prompt(retriever, examples):
    config = EnvConfig(expand_form="judge")
    records = collect_scripted(examples, retriever, config, num_envs=4, seed=3)
    for record in records:
        assert record["summary"]["n_invalid"] == 0 and record["accepted"]
        assert record["segments"][0]["text"] == trajectories.seeds_r1_prompt(record["question"], config)
        assert "judge each candidate" in record["segments"][0]["text"]
        expand = next(s["text"] for s in record["segments"] if s["role"] == "model" and "<expand>" in s["text"])
        body = expand.split("<expand>")[1].split("</expand>")[0]
        n = len(record["summary"]["searches"][0]["ids"])
        assert body.split() == [w for i in range(1, n + 1) for w in
                                (f"[{i}]", "yes" if i in record["summary"]["searches"][0]["expanded"] else "no")]
    assert trajectories.seeds_r1_prompt("q?") == trajectories.seeds_r1_prompt("q?", EnvConfig())
    assert "judge" not in trajectories.seeds_r1_prompt("q?")


def test_open_rate_opens_each_candidate_with_its_probability(retriever, examples):
    """``open_rate``: every candidate is a coin of its own (so a snapshot may open none or all),
    at the rate asked; 0 opens nothing, 1 everything; outside [0, 1] is refused."""
    config = EnvConfig(expand_form="judge", max_expand=5)

    def opened(rate: float, seed: int) -> tuple[int, int]:
        settings = ScriptedTeacherConfig(open_rate=rate, second_search=False)
        many = [dataclasses.replace(e, id=f"{e.id}-{k}") for k in range(8) for e in examples]
        searches = [r["summary"]["searches"][0] for r in
                    collect_scripted(many, retriever, config, settings, num_envs=4, seed=seed)]
        return sum(len(s["expanded"]) for s in searches), sum(len(s["ids"]) for s in searches)

    assert opened(0.0, 0)[0] == 0
    assert opened(1.0, 0)[0] == opened(1.0, 0)[1]
    half = [opened(0.5, seed) for seed in (0, 1)]
    assert all(0.3 < k / n < 0.7 for k, n in half) and half[0] != half[1]
    with pytest.raises(ValueError, match="open_rate"):
        ScriptedTeacherConfig(open_rate=1.5)


def test_samples_read_one_question_through_different_openings(retriever, examples):
    """``samples``: consecutive episodes per question on coins of their own; each answers with the
    first title IT opened, so one question gets different openings; a collection in chunks
    (``offset``) gives the same episodes as one pass."""
    config = EnvConfig(expand_form="judge", max_expand=5)
    settings = ScriptedTeacherConfig(open_rate=0.5, second_search=False, think=False)
    records = collect_scripted(examples, retriever, config, settings, num_envs=3, seed=2, samples=6)
    assert [r["id"] for r in records] == [e.id for e in examples for _ in range(6)]
    for record in records:
        search = record["summary"]["searches"][0]
        first = [search["titles"][n - 1] for n in search["expanded"]][:1]
        assert record["summary"]["answer"] == (first[0] if first else "unknown")
    openings = {q: {tuple(r["summary"]["searches"][0]["expanded"]) for r in records if r["id"] == q}
                for q in {e.id for e in examples}}
    assert all(len(sets) > 1 for sets in openings.values())
    chunked = collect_scripted(examples[:2], retriever, config, settings, num_envs=3, seed=2, samples=6) + \
        collect_scripted(examples[2:], retriever, config, settings, num_envs=3, seed=2, samples=6, offset=2)
    assert [r["segments"] for r in chunked] == [r["segments"] for r in records]
    with pytest.raises(ValueError, match="samples"):
        collect_scripted(examples, retriever, config, settings, samples=0)


def test_observation_caps_count_the_policy_tokens(retriever, examples):
    """Envs built for SFT count the cap in the given tokenizer's tokens: a 45-token cap cuts every
    information observation (two passages: 31-38 words, 51-63 tiny-BPE tokens), while a
    word-counting env lets them through whole."""
    tokenizer = tiny_tokenizer()
    config = EnvConfig(max_obs_tokens=45)
    settings = ScriptedTeacherConfig(random_expand=2, second_search=False)
    with_tokens = collect_scripted(examples, retriever, config, settings, num_envs=2, tokenizer=tokenizer)
    in_words = collect_scripted(examples, retriever, config, settings, num_envs=2)
    for tokens_record, words_record in zip(with_tokens, in_words):
        observations = [s["text"] for s in tokens_record["segments"] if s["role"] == "observation"]
        assert all(len(tokenizer(o, add_special_tokens=False)["input_ids"]) <= config.max_obs_tokens + 2
                   for o in observations)
        assert TRUNCATION_MARK in observations[-1]
        assert TRUNCATION_MARK not in [s["text"] for s in words_record["segments"] if s["role"] == "observation"][-1]
    replayed = trajectories.play_actions(examples[0], [a["text"] for a in with_tokens[0]["segments"]
                                                       if a["role"] == "model"], retriever, config, tokenizer=tokenizer)
    assert replayed["text"] == with_tokens[0]["text"]  # play_actions caps in the same tokens


def opened_positive_and_negative(records):
    """(positives opened, positives shown, negatives opened, negatives shown) over every search of ``records``."""
    counts = [0, 0, 0, 0]
    for record in records:
        for search in record["summary"]["searches"]:
            opened_flags = [i + 1 in search["expanded"] for i in range(len(search["ids"]))]
            for shown, opened in zip(search["positive"], opened_flags):
                counts[0 if shown else 2] += opened
                counts[1 if shown else 3] += 1
    return counts


def test_labels_mode_opens_by_label_with_its_two_rates(retriever, examples):
    """The noisy label-informed teacher: rate 1 for positives and 0 for negatives opens exactly the
    positives shown; the reverse opens exactly the negatives; any rate outside [0, 1] is refused."""
    def play(positive, negative):
        settings = ScriptedTeacherConfig(expand="labels", positive_open_rate=positive, negative_open_rate=negative,
                                         second_search=False)
        records = collect_scripted(examples, retriever, EnvConfig(max_expand=10), settings, num_envs=2)
        return opened_positive_and_negative(records)
    pos_opened, pos_shown, neg_opened, neg_shown = play(1.0, 0.0)
    assert pos_shown > 0 and neg_shown > 0
    assert (pos_opened, neg_opened) == (pos_shown, 0)
    assert play(0.0, 1.0) == [0, pos_shown, neg_shown, neg_shown]
    for bad in ({"positive_open_rate": 1.5}, {"negative_open_rate": -0.1}):
        with pytest.raises(ValueError, match="open_rate"):
            ScriptedTeacherConfig(expand="labels", **bad)
