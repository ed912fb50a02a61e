"""The learning test (the CartPole of this trainer): the real SFT and PPO entry points, a tiny
random Llama and a synthetic corpus where the right candidate is learnable must end clearly above
where they started and above chance.

The world: every search shows five boxes; exactly one holds something (the positive) and it is
shown first, the four others are empty. The policy judges each box in the interleaved judgement
form (``expand_form: judge``: a box's preview, then ONE verdict token). The warm start imitates
the scripted teacher, which opens two RANDOM boxes: it teaches the protocol (copy the question into
the query, one verdict per box, copy a title into the answer) but not which box to open, so its
greedy policy opens none. The reward counts only what was opened (+1 for the positive, −0.25 for
each empty box: opening all and opening none both score 0; −0.1 per invalid action, which keeps
the greedy policy on the protocol: without it one seed in five drifted into invalid actions that
sampling forgave), so only PPO's per-token credit assignment can raise it: to 1.0 when it learns
"yes" after candidate [1] and "no" after the others. Seeds 0–4 all pass (seed 2 at precision 0.62).

Why the right box is recognisable by its number and not by its contents: a 2-layer random model did
not learn to tell "It holds the amber." from "It is empty." through PPO within 40 updates (both open
rates moved together); whether the main job learns content on SmolLM2 is measured in
docs/training.md ("What has been learnt"). The trainer runs as the main job does: constrained
verdicts (two-way log-probs) and a group baseline (``advantage: grpo``, no critic). Broken trainers
fail this test (checked by hand, docs/training.md "Learning check and learning test"): a flipped
advantage sign, a zeroed loss mask, or a skipped optimizer step.

The same world with each box judged in a context of its own (``judge_context: alone``: the box's
title and text, then the question; no number) is learnt by CONTENT: the verdicts are rows of their
own in the batch, taking their episode's advantage. Its warm start shows the teacher's expand
without training it; its greedy policy opened every box (precision 0.2, chance) in the runs measured.

Where an empty box costs 0.75, stopping raises the reward (−2 → 0): the run must still meet the box world's
selection profile (recall kept, precision up), so a trainer that learns to stop opening fails it (checked by
hand with the verdicts' price of opening overcharged: reward −2 → 0, recall 1 → 0; docs/training.md). It holds
with the verdicts' own credit centred and exact: exact, the reward's break-even (0.75 / 1.75 = 0.43, above the
base rate 0.2) says "open less" to boxes the policy cannot yet tell apart, and the trainer still learnt the full box.
"""
from __future__ import annotations

import json

import pytest

from scripts.box_world import ALONE_ENV, build, ppo_config, warm_start
from training.evaluation.answer_sources import ANSWER_SHARE_KEYS
from training.evaluation.selection_profile import SelectionTargets, selection_misses


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return build(tmp_path_factory.mktemp("learning"))


def test_ppo_learns_which_box_to_open(setup):
    from training.ppo import train

    sft_dir = warm_start(setup)
    result = train(ppo_config(setup, sft_dir), retriever=setup["retriever"], examples=setup["train"],
                   eval_examples=setup["held_out"])
    precision, reward = result["comparison"]["precision"], result["comparison"]["reward"]
    print("learning test:", result["comparison"])
    assert precision["after"] >= precision["before"] + 0.5  # far above where PPO started (opens none)
    assert precision["after"] >= 0.6  # and far above chance (one box of five: 0.2)
    assert reward["after"] >= 0.5 and reward["lo"] > 0  # the gain's paired bootstrap interval excludes 0
    # the reward's parts, compared like it: here the answer weighs 0, so selection + format is all of it
    parts = result["comparison"]["selection"]["diff"] + result["comparison"]["format"]["diff"]
    assert parts == pytest.approx(reward["diff"]) and result["comparison"]["selection"]["diff"] > 0.5


@pytest.fixture(scope="module")
def alone_warm_start(setup):
    return warm_start(setup, ALONE_ENV, name="sft-alone")


# the verdicts' credit: their episode's advantage only, or also their own candidate's term, exact (the
# main job's: the reward's break-even sets how many are opened) or with the price of opening taken out
# (verdict_credit_centred: it holds how many are opened, moves which)
CREDITS = {"episode": {}, "exact": {"algorithm.verdict_credit": 2.0},
           "centred": {"algorithm.verdict_credit": 2.0, "algorithm.verdict_credit_centred": True}}


@pytest.mark.parametrize("credit", sorted(CREDITS))
def test_ppo_learns_which_box_to_open_judging_each_alone(setup, alone_warm_start, credit):
    from training.ppo import train

    out = setup["folder"] / f"ppo-alone-{credit}"
    result = train(ppo_config(setup, alone_warm_start, {"env": dict(ALONE_ENV), "run.output_dir": str(out),
                                                         **CREDITS[credit]}),
                   retriever=setup["retriever"], examples=setup["train"], eval_examples=setup["held_out"])
    precision, reward = result["comparison"]["precision"], result["comparison"]["reward"]
    print(f"learning test (alone, {credit} credit):", result["comparison"])
    assert precision["after"] >= precision["before"] + 0.5  # far above where PPO started
    assert precision["after"] >= 0.8  # and far above chance (one box of five: 0.2)
    assert reward["after"] >= 0.5 and reward["lo"] > 0  # the gain's paired bootstrap interval excludes 0
    # where the answers came from (training.studies.reader_study), kept in eval.json for both evaluations
    evaluation = json.loads((out / "eval.json").read_text())
    for side in ("before", "after"):
        shares = [evaluation[side][key] for key in ANSWER_SHARE_KEYS]
        assert all(0 <= share <= 1 for share in shares) and sum(shares) == pytest.approx(1.0)


# The box world's selection profile: the one full box of five opened (recall kept), little else opened. Its answers
# weigh nothing in the reward, so EM and copies are not targets here.
BOX_TARGETS = SelectionTargets(min_recall=0.9, max_recall_drop=0.1, min_precision_gain=0.5, docs_read=(0.8, 1.5),
                               min_em_diff_lo=-1.0, max_copy=1.0)
# an empty box costs 0.75: the warm start's greedy policy (it opens all five) scores 1 - 4 * 0.75 = -2, opening
# nothing scores 0 and opening the full box alone 1, so a trainer that only learns to stop opening raises the
# reward by 2 (its interval far above 0) and must still fail here
STOP_PAYS_ENV = {**ALONE_ENV, "reward": {**ALONE_ENV["reward"], "negative_opened_penalty": 0.75}}
STOP_PAYS_SEEDS = (0, 1)


@pytest.mark.parametrize("credit", ["exact", "centred"])
def test_a_policy_that_stops_opening_fails_even_where_stopping_raises_the_reward(setup, alone_warm_start, credit):
    from training.ppo import train

    # Two seeds, the second run only where the first misses: the 2-layer random model's 20 updates are
    # chaotic enough that fp32 rounding on another CPU (Intel AMX against AMD EPYC) sent seed 0's greedy
    # policy off the protocol (answers missing, 0.4 documents read) with its verdicts learnt (AUC 1.0).
    # A trainer that learns to stop opening misses at every seed, so it still fails.
    for seed in STOP_PAYS_SEEDS:
        out = setup["folder"] / f"ppo-stop-pays-{credit}-s{seed}"
        result = train(ppo_config(setup, alone_warm_start, {"env": dict(STOP_PAYS_ENV), "run.output_dir": str(out),
                                                             "run.seed": seed, **CREDITS[credit]}),
                       retriever=setup["retriever"], examples=setup["train"], eval_examples=setup["held_out"])
        comparison = result["comparison"]
        print(f"learning test (stopping pays, {credit} credit, seed {seed}):", comparison)
        stopped = {**comparison, "recall": {**comparison["recall"], "after": 0.0},
                   "docs": {**comparison["docs"], "after": 0.0}}
        assert selection_misses(stopped, BOX_TARGETS)  # the same comparison with nothing opened after PPO fails
        assert comparison["reward"]["lo"] > 0
        if not selection_misses(comparison, BOX_TARGETS):
            break
    assert selection_misses(comparison, BOX_TARGETS) == []  # the trainer chose the full box and kept opening it
