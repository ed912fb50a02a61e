"""How greedy decoding opens from the verdicts judged alone (``evaluation.verdict_cut``): ``level`` keeps
each verdict as drawn (π(yes) > 0.5), ``snapshot_mean`` opens the candidates whose π(yes) lies above their
snapshot's mean, in the trainer's greedy rollouts and in ``inference.evaluate``'s SEEDS-R1 alike."""
from __future__ import annotations

import functools
import math
import zlib

import pytest
from test_rollout import script_lm, tokenizer  # noqa: F401 (fixtures)
from test_rollout_eval_parity import QUESTIONS, evaluate, files  # noqa: F401 (fixture)

from envs.config import EnvConfig
from envs.data import load_qa
from envs.protocol import JUDGE_WORDS, cut_verdicts, judge_token_ids
from envs.retrieval.defaults import open_retriever
from envs.typed_config import ConfigError, from_dict, read_recipe
from envs.vector_env import SearchVectorEnv
from inference.backends.hf import HFBackend
from methods.llm import Completion, GenerationResult
from methods.seeds import SeedsR1, recut_words
from training.config import PPOConfig
from training.rollouts.rollout import RolloutConfig, collect_rollouts

ALONE = dict(expand_form="judge", judge_context="alone", max_actions=4, max_searches=1, shuffle_candidates=True)


def test_snapshot_mean_opens_above_the_snapshots_mean_and_level_keeps_what_was_drawn():
    probs, drawn = [0.9, 0.6, 0.7, 0.55, 0.95], [True] * 5  # all above 0.5: the level opens every one
    assert cut_verdicts(probs, drawn, "level") == drawn
    assert cut_verdicts(probs, drawn, "snapshot_mean") == [True, False, False, False, True]  # mean 0.74
    low = [0.2, 0.4, 0.1, 0.3]  # all below 0.5: the ranking still opens the two best
    assert cut_verdicts(low, [False] * 4, "snapshot_mean") == [False, True, False, True]
    # candidates it cannot tell apart (or one alone) keep the verdicts drawn
    assert cut_verdicts([0.5, 0.5 + 1e-8], [True, False], "snapshot_mean") == [True, False]
    assert cut_verdicts([0.3], [False], "snapshot_mean") == [False]
    assert cut_verdicts([], [], "snapshot_mean") == []
    with pytest.raises(ValueError, match="unknown verdict cut"):
        cut_verdicts(probs, drawn, "top_one")
    with pytest.raises(ValueError, match="5 π"):
        cut_verdicts(probs, drawn[:2], "snapshot_mean")


def prompt_yes_prob(prompt: list[int]) -> float:
    """A π(yes) in (0.5, 0.95] that differs between candidates (a digest of the verdict's context)."""
    return 0.5 + 0.45 * ((zlib.crc32(bytes(str(prompt), "utf8")) % 1000) + 1) / 1000


class GradedVerdicts(HFBackend):
    """The scripted model, except that every constrained one-token verdict says yes with π(yes) from
    :func:`prompt_yes_prob` (so greedy decoding under the level opens everything shown)."""

    def generate(self, requests):
        results = super().generate(requests)
        yes = judge_token_ids(self.tokenizer)[0]
        out = []
        for request, result in zip(requests, results):
            if request.max_tokens == 1 and request.allowed_token_ids:
                p = prompt_yes_prob(list(request.prompt))
                result = GenerationResult([Completion(JUDGE_WORDS[0], [yes], [math.log(p)], "length")])
            out.append(result)
        return out


def greedy_alone_rollouts(model, tokenizer, retriever, examples, cut):  # noqa: F811
    env_config = EnvConfig(**ALONE)
    venv = SearchVectorEnv(retriever, num_envs=4, config=env_config, tokenizer=tokenizer)
    config = RolloutConfig(max_turn_tokens=8, max_context_tokens=2048, temperature=0.0, seed=3, verdict_cut=cut,
                           reuse_kv_cache=False)  # every call through GradedVerdicts.generate
    prompt = functools.partial(SeedsR1.prompt, env=env_config)
    return collect_rollouts(GradedVerdicts(model, tokenizer), venv, examples, config, prompt)


def test_greedy_rollouts_open_what_the_cut_says(script_lm, tokenizer, retriever, examples):  # noqa: F811
    yes, no = judge_token_ids(tokenizer)
    level = greedy_alone_rollouts(script_lm, tokenizer, retriever, examples, "level")
    ranked = greedy_alone_rollouts(script_lm, tokenizer, retriever, examples, "snapshot_mean")
    fewer = 0
    for by_level, by_rank in zip(level, ranked):
        shown = len(by_level.info["searches"][0]["positive"])
        assert shown > 1 and by_level.info["searches"][0]["expanded"] == list(range(1, shown + 1))
        probs = [prompt_yes_prob(row.token_ids[:-1]) for row in by_rank.verdict_rows]
        above = [i for i, p in enumerate(probs, start=1) if p > sum(probs) / len(probs)]
        assert by_rank.info["searches"][0]["expanded"] == above and 0 < len(above) < shown
        assert by_rank.info["docs_read"] == len(above)
        for i, (row, p) in enumerate(zip(by_rank.verdict_rows, probs), start=1):
            # each row's token and log-prob are the verdict the cut made, its π(yes) kept
            assert row.token_ids[-1] == (yes if i in above else no)
            assert math.exp(row.logprob) == pytest.approx(p if i in above else 1.0 - p)
        fewer += len(above) < by_level.info["docs_read"]
    assert fewer == len(ranked)


def test_a_cut_other_than_the_level_needs_greedy_constrained_verdicts_judged_alone(
        script_lm, tokenizer, retriever, examples):  # noqa: F811
    with pytest.raises(ValueError, match="temperature 0"):
        RolloutConfig(temperature=1.0, verdict_cut="snapshot_mean")
    with pytest.raises(ValueError, match="temperature 0"):
        RolloutConfig(temperature=0.0, constrain_verdicts=False, verdict_cut="snapshot_mean")
    with pytest.raises(ValueError, match="verdict_cut"):
        RolloutConfig(temperature=0.0, verdict_cut="median")
    with pytest.raises(ConfigError, match="verdict_cut"):
        from_dict(PPOConfig, {"evaluation": {"verdict_cut": "median"}})
    with pytest.raises(ConfigError, match="constrain_verdicts"):
        from_dict(PPOConfig, {"evaluation": {"verdict_cut": "snapshot_mean"},
                              "rollout": {"constrain_verdicts": False}})
    stream = EnvConfig(**{**ALONE, "judge_context": "stream"})
    venv = SearchVectorEnv(retriever, num_envs=2, config=stream, tokenizer=tokenizer)
    config = RolloutConfig(max_turn_tokens=8, max_context_tokens=2048, temperature=0.0, verdict_cut="snapshot_mean")
    with pytest.raises(ValueError, match="judge_context: alone"):
        collect_rollouts(HFBackend(script_lm, tokenizer), venv, examples[:2], config,
                         functools.partial(SeedsR1.prompt, env=stream))
    with pytest.raises(ValueError, match="verdict_cut"):
        SeedsR1(verdict_cut="median")


def test_evaluations_seeds_r1_cuts_as_the_trainer_does(tokenizer):  # noqa: F811
    yes, no = judge_token_ids(tokenizer)
    probs = [0.9, 0.6, 0.7, 0.55, 0.95]
    completions = [Completion(JUDGE_WORDS[0], [yes], [math.log(p)], "length") for p in probs[:4]]
    completions.append(Completion(JUDGE_WORDS[1], [no], [math.log(1 - probs[4])], "length"))  # drawn no, π(yes) .95
    words = recut_words(completions, (yes, no), "snapshot_mean")
    assert words == [JUDGE_WORDS[0], JUDGE_WORDS[1], JUDGE_WORDS[1], JUDGE_WORDS[1], JUDGE_WORDS[0]]
    assert recut_words(completions, (yes, no), "level") == [c.text for c in completions]
    with pytest.raises(ValueError, match="constrained one-token"):
        recut_words([Completion(" yes", [], [], "length")], (yes, no), "snapshot_mean")


def test_evaluation_and_rollouts_open_the_same_under_the_cut(files, script_lm, tokenizer, monkeypatch):  # noqa: F811
    env = {"max_actions": 4, "expand_form": "judge", "judge_context": "alone", "max_obs_tokens": 1200}  # all 5 shown
    options = {"max_tokens": 12, "verdict_cut": "snapshot_mean"}
    evaluated = {r["id"]: r for r in evaluate(files, GradedVerdicts(script_lm, tokenizer), monkeypatch, options, env)}
    env_config = EnvConfig.from_dict({**read_recipe(files / "env.yaml"), **env})
    venv = SearchVectorEnv(open_retriever(str(files / "index")), num_envs=len(QUESTIONS), config=env_config,
                           tokenizer=tokenizer)
    config = RolloutConfig(max_turn_tokens=12, temperature=0.0, seed=0, verdict_cut="snapshot_mean",
                           reuse_kv_cache=False)
    episodes = collect_rollouts(GradedVerdicts(script_lm, tokenizer), venv, load_qa(str(files / "qa.jsonl")), config,
                                functools.partial(SeedsR1.prompt, env=env_config))
    for episode in episodes:
        record = evaluated[episode.example_id]
        shown = len(record["searches"][0]["positive"])
        assert record["searches"] == episode.info["searches"] and record["docs_read"] == episode.info["docs_read"]
        assert 0 < len(record["searches"][0]["expanded"]) < shown  # the level would open all of them
