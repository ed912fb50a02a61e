"""The judgement form with ``judge_context: alone``: each candidate is judged in a short context of
its own (the candidate, then the question), the episode's stream shows the snapshot and the expand
those verdicts make, and the trainer scores each verdict as a row of its own that takes its
episode's advantage (plus its candidate's own term with ``verdict_credit``)."""
from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import pytest
import torch
from test_rollout import script_lm, tokenizer  # noqa: F401 (fixtures)

from envs.config import EnvConfig
from envs.protocol import (
    ALONE_FORM,
    JUDGE_ALONE,
    JUDGE_WORDS,
    LIST_FORM,
    STREAM_FORM,
    judge_alone_prompts,
    judge_token_ids,
    snapshot_candidates,
)
from envs.rewards import verdict_reward_gap
from envs.vector_env import SearchVectorEnv
from inference.backends.hf import HFBackend
from methods.seeds import SeedsR1
from training.evaluation.policy_eval import roc_auc, verdict_ranking, verdict_scores
from training.ppo_loop.ppo_batch import episodes_to_batch, owners_advantages, pad_rows
from training.rollouts.rollout import RolloutConfig, collect_rollouts
from training.rollouts.rollout_judge import VerdictRow
from training.sft_config import SFTTrainSettings, WarmStartConfig
from training.teachers.trajectories import alone_verdict_rows, sft_rows, tokenize_trajectory, trajectory_from_episode

SNAPSHOT = "<snapshot>\n[1] Paris: capital of France\n[2] Seine: a river\n</snapshot>"


def test_the_judge_form_is_one_object_chosen_from_the_two_settings():
    from methods.seeds import SNAPSHOT_JUDGES, judge_alone_snapshot, judge_snapshot

    forms = {(f.name, f.judged, f.alone, f.in_stream) for f in (LIST_FORM, STREAM_FORM, ALONE_FORM)}
    assert forms == {("list", False, False, False), ("stream", True, False, True), ("alone", True, True, False)}
    assert EnvConfig().judge_form is LIST_FORM and EnvConfig(expand_form="judge").judge_form is STREAM_FORM
    assert EnvConfig(expand_form="judge", judge_context="alone").judge_form is ALONE_FORM
    # evaluation picks its snapshot judge by the form, once per question
    assert SNAPSHOT_JUDGES == {"list": None, "stream": judge_snapshot, "alone": judge_alone_snapshot}


def test_judge_context_is_checked():
    assert EnvConfig().judge_context == "stream"
    assert EnvConfig(expand_form="judge", judge_context="alone").judge_context == "alone"
    with pytest.raises(ValueError, match="judge_context"):
        EnvConfig(expand_form="judge", judge_context="elsewhere")
    with pytest.raises(ValueError, match="expand_form: judge"):
        EnvConfig(judge_context="alone")  # the list form judges nothing


def test_alone_prompts_put_the_question_after_each_candidate():
    prompts = judge_alone_prompts(" capital of France? ", SNAPSHOT)
    assert prompts == [JUDGE_ALONE.format(candidate="Paris: capital of France", question="capital of France?"),
                       JUDGE_ALONE.format(candidate="Seine: a river", question="capital of France?")]
    assert prompts[1].startswith("Seine: a river\nQuestion: capital of France?\n")
    assert judge_alone_prompts("q", "<information>\n[1] x\n</information>") == []


def test_sft_shows_the_expand_of_verdicts_judged_alone_without_training_it():
    from tests.tiny_models import tiny_tokenizer

    tok = tiny_tokenizer()
    expand = "<expand>[1] yes [2] no</expand>"
    record = {"segments": [
        {"role": "prompt", "text": "Question: capital?"}, {"role": "model", "text": "<search>capital</search>"},
        {"role": "observation", "text": SNAPSHOT}, {"role": "model", "text": expand},
        {"role": "observation", "text": "<information>\n[1] Paris\nParis is the capital.\n</information>"},
        {"role": "model", "text": "<answer>Paris</answer>"}], "accepted": True}
    alone = tokenize_trajectory(record, tok, ALONE_FORM)
    listed = tokenize_trajectory(record, tok, LIST_FORM)
    assert alone["input_ids"] == listed["input_ids"]  # the snapshot as an observation, then the expand's text
    expand_ids = tok(expand, add_special_tokens=False)["input_ids"]
    start = next(i for i in range(len(alone["input_ids"])) if alone["input_ids"][i:i + len(expand_ids)] == expand_ids)
    assert not any(alone["loss_mask"][start:start + len(expand_ids)])  # shown, not imitated
    assert all(listed["loss_mask"][start:start + len(expand_ids)])
    assert sum(alone["loss_mask"]) == sum(listed["loss_mask"]) - len(expand_ids)


def alone_rollouts(model, tokenizer, retriever, examples, seed=5, temperature=1.0):  # noqa: F811
    env_config = EnvConfig(expand_form="judge", judge_context="alone", max_actions=4, max_searches=1,
                           shuffle_candidates=True)
    venv = SearchVectorEnv(retriever, num_envs=4, config=env_config, tokenizer=tokenizer)
    config = RolloutConfig(max_turn_tokens=8, max_context_tokens=2048, samples_per_question=4, seed=seed,
                           temperature=temperature)
    prompt = functools.partial(SeedsR1.prompt, env=env_config)
    return collect_rollouts(HFBackend(model, tokenizer), venv, examples[:3], config, prompt), venv


def test_rollout_keeps_each_verdict_as_a_row_with_its_gap(script_lm, tokenizer, retriever, examples):  # noqa: F811
    episodes, venv = alone_rollouts(script_lm, tokenizer, retriever, examples)
    yes, no = judge_token_ids(tokenizer)
    kinds = set()
    for episode in episodes:
        search = episode.info["searches"][0]
        correct = episode.info["metrics"]["em"] == 1.0
        assert episode.choice_mask == [] and episode.choice_reward_gap == []  # no verdict in the stream
        assert len(episode.verdict_rows) == len(search["positive"]) > 0
        text = tokenizer.decode(episode.token_ids)
        shown = snapshot_candidates("<snapshot>" + text.split("<snapshot>", 1)[1].split("</snapshot>", 1)[0]
                                    + "</snapshot>")
        for number, (row, positive) in enumerate(zip(episode.verdict_rows, search["positive"]), start=1):
            assert row.token_ids[-1] in (yes, no) and row.logprob <= 0.0
            context = tokenizer.decode(row.token_ids[:-1], skip_special_tokens=True)
            assert context.startswith(shown[number - 1][:20])  # the candidate first, then the question
            opened = row.token_ids[-1] == yes
            assert opened == (number in search["expanded"])
            assert row.reward_gap == pytest.approx(verdict_reward_gap(opened, positive, correct, venv.config.reward))
            assert row.positive == positive
            kinds.add((opened, positive))
        expand = "<expand>" + " ".join(f"[{i}] {'yes' if r.token_ids[-1] == yes else 'no'}"
                                       for i, r in enumerate(episode.verdict_rows, start=1)) + "</expand>"
        assert expand in text  # the verdicts' expand, in the episode's stream
    assert len(kinds) >= 2


def test_the_expand_of_alone_verdicts_is_not_a_model_token(script_lm, tokenizer, retriever, examples):  # noqa: F811
    episodes, _ = alone_rollouts(script_lm, tokenizer, retriever, examples)
    for episode in episodes:
        model_text = tokenizer.decode([t for t, m in zip(episode.token_ids, episode.loss_mask) if m])
        assert "<expand>" not in model_text and "<search>" in model_text


def test_an_episode_judged_alone_reads_back_as_a_record_with_its_expand(script_lm, tokenizer, retriever,  # noqa: F811
                                                                         examples):
    """trajectory_from_episode: the expand the verdicts made becomes the record's model action (so the
    acceptance rule sees a search followed by an expand), and the record lays out as the episode."""
    episodes, _ = alone_rollouts(script_lm, tokenizer, retriever, examples)
    by_id = {e.id: e for e in examples}
    for episode in episodes:
        record = trajectory_from_episode(episode, tokenizer, by_id[episode.example_id])
        actions = [s["text"] for s in record["segments"] if s["role"] == "model"]
        assert any(a.startswith("<search>") for a in actions) and any(a.startswith("<expand>[1]") for a in actions)
        assert record["reason"] != "search_without_expand"
        layout = tokenize_trajectory(record, tokenizer, ALONE_FORM)
        assert layout["input_ids"] == episode.token_ids and layout["loss_mask"] == episode.loss_mask


def test_sft_verdict_rows_judged_alone_are_the_rollouts_verdict_rows(script_lm, tokenizer, retriever,  # noqa: F811
                                                                   examples):
    """With ``train_verdicts`` SFT trains each verdict in the very context a rollout judges it in
    (the record read back from an episode gives that episode's verdict rows, token for token), the
    verdict token the only label; without it, no verdict rows."""
    episodes, _ = alone_rollouts(script_lm, tokenizer, retriever, examples)
    by_id = {e.id: e for e in examples}
    for episode in episodes:
        record = trajectory_from_episode(episode, tokenizer, by_id[episode.example_id])
        rows = alone_verdict_rows(record, tokenizer)
        assert [r["input_ids"] for r in rows] == [v.token_ids for v in episode.verdict_rows]
        assert all(r["labels"][:-1] == [-100] * (len(r["labels"]) - 1) and r["labels"][-1] == r["input_ids"][-1]
                   for r in rows)
        trained = sft_rows([record], tokenizer, form=ALONE_FORM)
        shown = sft_rows([record], tokenizer, form=ALONE_FORM, train_verdicts=False)
        assert trained[1:] == rows and len(shown) == 1 and trained[0] == shown[0]
        assert sft_rows([record], tokenizer, form=STREAM_FORM,
                        train_verdicts=True)[1:] == []  # the stream form trains its verdicts in the episode row
        # verdict_labels "both": each context twice, once with each verdict word, whatever the teacher chose
        both = sft_rows([record], tokenizer, form=ALONE_FORM, verdict_labels="both")[1:]
        words = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in JUDGE_WORDS]
        assert len(both) == 2 * len(rows)
        for k, row in enumerate(rows):
            context = row["input_ids"][:-1]
            assert [r["input_ids"] for r in both[2 * k:2 * k + 2]] == [context + w for w in words]
            assert all(r["labels"] == [-100] * len(context) + w for r, w in zip(both[2 * k:2 * k + 2], words))
    with pytest.raises(ValueError, match="labels must be one of"):
        alone_verdict_rows(record, tokenizer, "coin")


def test_verdict_rows_join_the_batch_and_take_their_episodes_advantage(script_lm, tokenizer, retriever,  # noqa: F811
                                                                        examples):
    episodes, _ = alone_rollouts(script_lm, tokenizer, retriever, examples)
    batch = episodes_to_batch(episodes, tokenizer.pad_token_id, "cpu")
    E, V = len(episodes), sum(len(e.verdict_rows) for e in episodes)
    assert batch["input_ids"].shape[0] == E + V
    owner = batch["owner"]
    assert owner[:E].eq(-1).all() and owner[E:].tolist() == [i for i, e in enumerate(episodes) for _ in e.verdict_rows]
    mask = batch["model_mask"]
    assert mask[E:].sum(-1).eq(1).all() and batch["choice_mask"][E:].eq(mask[E:]).all()
    assert torch.equal(batch["reward"][E:], batch["reward"][owner[E:]])
    row = episodes[0].verdict_rows[0]
    last = len(row.token_ids) - 2  # the position that predicts the verdict
    assert batch["sampler_logp"][E, last] == pytest.approx(row.logprob)
    assert batch["choice_reward_gap"][E, last] == pytest.approx(row.reward_gap)
    # an outcome estimator's per-episode advantage, copied onto each of its verdicts
    per_episode = torch.arange(1.0, E + 1.0)
    advantages = owners_advantages(pad_rows(per_episode[:, None] * mask[:E], E + V), mask, owner)
    assert torch.equal(advantages[:E], per_episode[:, None] * mask[:E])
    assert torch.allclose(advantages[E:].sum(-1), per_episode[owner[E:]])
    assert torch.equal(advantages[E:] != 0, mask[E:].bool())
    # verdict_episode_credit: the episode's share scaled; 0 leaves the verdicts to their own term
    half = owners_advantages(pad_rows(per_episode[:, None] * mask[:E], E + V), mask, owner, 0.5)
    assert torch.allclose(half[E:], 0.5 * advantages[E:]) and torch.equal(half[:E], advantages[:E])
    none = owners_advantages(pad_rows(per_episode[:, None] * mask[:E], E + V), mask, owner, 0.0)
    assert none[E:].eq(0).all() and torch.equal(none[:E], advantages[:E])


def test_a_critic_is_refused_with_verdicts_judged_alone():
    from envs.config import EnvConfig as Env
    from training.config import AlgorithmSettings
    from training.ppo_loop.ppo_setup import check_judge_context

    alone = Env(expand_form="judge", judge_context="alone")
    with pytest.raises(ValueError, match="critic-free"):
        check_judge_context(AlgorithmSettings(advantage="gae"), alone)
    check_judge_context(AlgorithmSettings(advantage="grpo"), alone)
    check_judge_context(AlgorithmSettings(advantage="gae"), Env(expand_form="judge"))


def test_verdict_ranking_reads_pi_yes_off_either_choice():
    """π(yes) is the chosen token's probability when it said yes and its complement when it said no;
    a verdict the env did not count (label unknown) is left out; AUC ranks π(yes) by the labels."""
    yes, no = 7, 9
    rows = [VerdictRow([1, yes], math.log(0.8), positive=True), VerdictRow([1, no], math.log(0.6), positive=False),
            VerdictRow([1, no], math.log(0.9), positive=True), VerdictRow([1, yes], math.log(0.5), positive=None)]
    pairs = verdict_scores([SimpleNamespace(verdict_rows=rows)], yes)
    assert [y for y, _ in pairs] == [True, False, True]
    assert [p for _, p in pairs] == pytest.approx([0.8, 0.4, 0.1])
    ranking = verdict_ranking(pairs)
    assert ranking["verdicts"] == 3 and ranking["verdict_auc"] == pytest.approx(0.5)
    assert ranking["yes_prob_positive"] == pytest.approx(0.45) and ranking["yes_prob_negative"] == pytest.approx(0.4)
    assert roc_auc([True, False, False], [0.9, 0.1, 0.5]) == 1.0 and math.isnan(roc_auc([True], [0.3]))


def test_greedy_verdicts_keep_their_pi_yes(script_lm, tokenizer, retriever, examples):  # noqa: F811
    """Greedy episodes judged alone still carry each verdict's probability: the greedy choice is yes
    exactly where π(yes) >= 0.5, so the evaluation can report the ranking next to what greedy opened."""
    episodes, _ = alone_rollouts(script_lm, tokenizer, retriever, examples, temperature=0.0)
    yes, _ = judge_token_ids(tokenizer)
    pairs = verdict_scores(episodes, yes)
    rows = [r for e in episodes for r in e.verdict_rows]
    assert len(pairs) == len(rows) > 0
    for row, (positive, p_yes) in zip(rows, pairs):
        assert 0.0 <= p_yes <= 1.0 and positive == row.positive
        assert p_yes >= 0.5 - 1e-6 if row.token_ids[-1] == yes else p_yes <= 0.5 + 1e-6


def test_the_warm_start_checks_its_verdict_labels():
    assert WarmStartConfig().train.verdict_labels == "teacher"
    assert WarmStartConfig.from_dict({"train": {"verdict_labels": "both"}}).train.verdict_labels == "both"
    with pytest.raises(ValueError, match="verdict_labels must be one of"):
        SFTTrainSettings(verdict_labels="coin")
