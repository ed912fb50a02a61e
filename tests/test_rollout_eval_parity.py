"""Training rollouts and ``inference.evaluate --method.name seeds-r1`` play the same episodes.

The same greedy policy (the tiny random Llama, and the scripted one of ``test_rollout``), the
same questions and the same index go once through :func:`training.rollouts.rollout.collect_rollouts` and
once through the evaluation runner's command line (its backend swapped for the tiny model). Both
count observation caps in the policy's tokens (a 40-token cap that bites), both force an answer
one action before the limit or neither (``force_answer``), and they must agree on every token,
every env action and observation, and the env's summary.
"""
from __future__ import annotations

import functools
import json

import pytest
from conftest import PASSAGES
from test_rollout import random_lm, script_lm, tokenizer  # noqa: F401 (fixtures)

from envs.config import EnvConfig
from envs.data import load_qa
from envs.retrieval.corpus import load_corpus
from envs.retrieval.defaults import open_retriever
from envs.retrieval.encoders import load_encoder
from envs.retrieval.index import build_index
from envs.typed_config import read_recipe
from envs.vector_env import SearchVectorEnv
from inference import evaluate as ev
from inference.backends.hf import HFBackend
from inference.predictions import load_predictions
from methods.seeds import SeedsR1
from training.rollouts.rollout import RolloutConfig, collect_rollouts

QUESTIONS = [
    {"id": "a", "question": "What is the capital of France?", "golden_answers": ["Paris"]},
    {"id": "b", "question": "Which river flows through Vienna?", "golden_answers": ["Danube"]},
    {"id": "c", "question": "What is the capital of Japan?", "golden_answers": ["Tokyo"]},
]
MAX_OBS_TOKENS = 40
FINISH = {"answered": "answer", "env_limit": "action_limit", "empty_answer": "empty_answer"}


class RecordingBackend(HFBackend):
    """The HF backend, keeping every request and its completion (evaluation's side)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[list[int], list[int]]] = []

    def generate(self, requests):
        results = super().generate(requests)
        self.calls += [(list(r.prompt), list(res.completions[0].token_ids)) for r, res in zip(requests, results)]
        return results


class RecordingEnv(SearchVectorEnv):
    """The batched env, keeping each slot's (action, observation) pairs (the rollout's side)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps: dict[int, list[tuple[str, str]]] = {i: [] for i in range(self.num_envs)}

    def step(self, actions):
        out = super().step(actions)
        for i, action in enumerate(actions):
            if action is not None:
                self.steps[i].append((action, out[0][i]))
        return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "title": t, "text": x}) + "\n" for i, t, x in PASSAGES))
    build_index(load_corpus(corpus), load_encoder("hash"), root / "index", show_progress=False)
    (root / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (root / "env.yaml").write_text(f"max_obs_tokens: {MAX_OBS_TOKENS}\n")
    return root


def evaluate(files, backend, monkeypatch, options: dict, env: dict) -> list[dict]:
    """``python -m inference.evaluate --method.name seeds-r1 ...`` with ``backend`` as the LLM."""
    monkeypatch.setattr("inference.evaluate.load_backend", lambda spec, **kw: backend)
    out = files / "run"
    argv = ["--method.name", "seeds-r1", "--data.path", str(files / "qa.jsonl"), "--data.index", str(files / "index"),
            "--env_config", str(files / "env.yaml"), "--model.name", "hf:tiny", "--run.output_dir", str(out),
            "--run.overwrite", "true"]
    for key, value in options.items():
        argv += [f"--method.options.{key}={value}"]
    for key, value in env.items():
        argv += [f"--env.{key}={value}"]
    assert ev.main(argv) == 0
    return load_predictions(out / "predictions.jsonl")


def rollout(files, backend, tokenizer, method: SeedsR1, env: dict) -> tuple[list, RecordingEnv]:
    """The same questions through ``collect_rollouts``, the env built as the trainer should build it."""
    env_config = EnvConfig.from_dict({**read_recipe(files / "env.yaml"), **env})
    venv = RecordingEnv(open_retriever(str(files / "index")), num_envs=len(QUESTIONS), config=env_config,
                        tokenizer=tokenizer)
    config = RolloutConfig(max_turn_tokens=method.max_tokens, temperature=0.0, seed=0,
                           force_answer=method.force_answer)
    episodes = collect_rollouts(backend, venv, load_qa(str(files / "qa.jsonl")), config,
                                functools.partial(method.prompt, env=env_config))
    return episodes, venv


@pytest.mark.parametrize("policy, force_answer, max_actions, expand_form", [
    ("random", False, 3, "list"), ("random", True, 3, "list"), ("script", False, 3, "list"),
    ("script", True, 3, "list"), ("script", True, 2, "list"), ("script", False, 4, "judge"),
    ("random", False, 4, "judge"), ("script", False, 4, "judge-alone"), ("random", True, 4, "judge-alone"),
    ("script", True, 3, "judge-alone"),  # verdicts judged alone, then the forced answer
])
def test_rollouts_and_evaluation_play_the_same_episodes(files, tokenizer, random_lm, script_lm,  # noqa: F811
                                                       monkeypatch, policy, force_answer, max_actions, expand_form):
    model = random_lm if policy == "random" else script_lm
    options = {"max_tokens": 12, "force_answer": force_answer}
    env = {"max_actions": max_actions, "expand_form": expand_form.split("-")[0]}
    if expand_form == "judge-alone":  # each candidate judged in a context of its own
        env["judge_context"] = "alone"
    recorder = RecordingBackend(model, tokenizer)
    evaluated = {r["id"]: r for r in evaluate(files, recorder, monkeypatch, options, env)}
    episodes, venv = rollout(files, HFBackend(model, tokenizer), tokenizer, SeedsR1(**options), env)
    observations = []
    for slot, episode in enumerate(episodes):
        record = evaluated[episode.example_id]
        # Same tokens: evaluation's last prompt for this question plus its completion is the
        # rollout's episode (which adds EOS after an accepted </answer>).
        prompt = episode.token_ids[:episode.prompt_length]
        last_prompt, completion = max((c for c in recorder.calls if c[0][:len(prompt)] == prompt),
                                      key=lambda c: len(c[0]))
        ids = episode.token_ids[:-1] if episode.token_ids[-1] == tokenizer.eos_token_id else episode.token_ids
        forced_expand_ended = force_answer and record["trace"][-1].get("action") == "<expand>none</expand>"
        if forced_expand_ended:  # the env ended on the forced expand: no model call after the snapshot
            assert ids[:len(last_prompt + completion)] == last_prompt + completion
            assert not any(episode.loss_mask[len(last_prompt + completion):])
        else:
            assert ids == last_prompt + completion
        # Same env actions and observations.
        steps = [(e["action"], e["observation"]) for e in record["trace"] if e["type"] == "env"]
        assert venv.steps[slot] == steps
        observations += [o for _, o in steps]
        # Same summary.
        info = episode.info
        assert FINISH[record["finish_reason"]] == episode.finish_reason
        assert (record["prediction"], record["metrics"], record["reward"]) == (
            info["answer"], info["metrics"], info["reward"]["total"])
        for key in ("n_searches", "n_invalid", "docs_read", "doc_tokens", "searches"):
            assert record[key] == info[key], key
        forced = any(e["type"] == "note" and e["kind"] == "forced_answer" for e in record["trace"])
        assert forced == (force_answer and episode.finish_reason != "action_limit")
        # Verdicts judged alone: the same contexts and verdict tokens as evaluation's verdict calls.
        alone_calls = [c for c in recorder.calls if c[0][:len(prompt)] != prompt]
        for row in episode.verdict_rows:
            assert (row.token_ids[:-1], row.token_ids[-1:]) in alone_calls
    if policy == "script":  # snapshots longer than the cap: cut in policy tokens on both sides
        assert any("[truncated: observation limit reached]" in o for o in observations)
    if expand_form == "judge-alone":  # no verdict in the stream; each one a row with its own context
        assert not any("\nRead [1]?" in tokenizer.decode(e.token_ids) for e in episodes)
    if expand_form == "judge-alone" and policy == "script":
        rows = [row for e in episodes for row in e.verdict_rows]
        if force_answer:  # judged, then answered under force, on both sides
            assert all(e.verdict_rows and e.info["n_actions"] == max_actions for e in episodes)
        assert rows and all(tokenizer.decode(r.token_ids[:-1]).endswith("the question? Answer:") for r in rows)
        assert {tokenizer.decode(r.token_ids[-1:]) for r in rows} <= {" yes", " no"}
        assert all(a.startswith("<expand>[1] ") for slot in venv.steps.values() for a, _ in slot
                   if a.startswith("<expand>"))
    if expand_form == "judge" and policy == "script":  # snapshots judged: one verdict token per candidate
        judged = [e for e in episodes if "\nRead [1]?" in tokenizer.decode(e.token_ids)]
        assert judged and all(a.startswith("<expand>[1] ") for slot in venv.steps.values() for a, _ in slot
                              if a.startswith("<expand>"))


def test_forced_answer_tokens_in_a_rollout(script_lm, tokenizer, retriever, examples):  # noqa: F811
    """With one action left after the search, the rollout steps ``<expand>none</expand>`` and
    writes ``<answer>``, both as prompt tokens; the model fills in the answer and its EOS."""
    env = SeedsR1().env_config({"max_actions": 3})
    venv = SearchVectorEnv(retriever, num_envs=1, config=env, tokenizer=tokenizer)
    config = RolloutConfig(max_turn_tokens=8, temperature=0.0, force_answer=True)
    (episode,) = collect_rollouts(HFBackend(script_lm, tokenizer), venv, examples[:1], config)
    assert episode.finish_reason == "answer" and episode.info["answer"] == "Paris"
    assert episode.info["n_actions"] == 3 and episode.info["reward"]["total"] == episode.reward
    turn = [t for t, turn_id in enumerate(episode.turn_ids) if turn_id == 1]  # the forced turn
    text = tokenizer.decode([episode.token_ids[t] for t in turn if not episode.loss_mask[t]])
    assert text.startswith("<expand>none</expand>\n<information>") and text.endswith("</information>\n<answer>")
    model = [episode.token_ids[t] for t in turn if episode.loss_mask[t]]
    assert tokenizer.decode(model) == " Paris</answer></s>" and model[-1] == tokenizer.eos_token_id
    assert [episode.loss_mask[t] for t in turn] == sorted(episode.loss_mask[t] for t in turn)  # prompt, then model
    # Without forcing (the default) the same policy opens candidate 1 and answers by itself.
    unforced_env = SearchVectorEnv(retriever, num_envs=1, config=env, tokenizer=tokenizer)
    (plain,) = collect_rollouts(HFBackend(script_lm, tokenizer), unforced_env, examples[:1],
                                RolloutConfig(max_turn_tokens=8, temperature=0.0))
    assert plain.finish_reason == "answer" and plain.num_turns == 3 and plain.info["docs_read"] == 1
    assert RolloutConfig().force_answer is SeedsR1().force_answer is False  # one default


def test_rollout_env_without_the_policy_tokenizer_warns(script_lm, tokenizer, retriever, examples):  # noqa: F811
    venv = SearchVectorEnv(retriever, num_envs=1)
    with pytest.warns(UserWarning, match="tokenizer=backend.tokenizer"):
        collect_rollouts(HFBackend(script_lm, tokenizer), venv, examples[:1], RolloutConfig(max_turn_tokens=8))
