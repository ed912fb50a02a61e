import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envs.config import EnvConfig
from envs.previews import PreviewConfig
from envs.rewards import RewardConfig
from envs.search_env import SearchEnv
from envs.types import QAExample

REWARD = RewardConfig(positive_opened_bonus=0.3, negative_opened_penalty=0.2, missed_positive_penalty=0.1,
                      format_penalty=0.5)


def make_env(retriever, examples, **overrides):
    return SearchEnv(retriever, examples, EnvConfig(reward=REWARD, **overrides))


def test_reset_with_example_and_with_dataset(retriever, examples):
    env = make_env(retriever, examples)
    obs, info = env.reset(options={"example": examples[2]})
    assert obs == examples[2].question and info["example_id"] == "q2"
    order_a = [env.reset(seed=7)[1]["example_id"]] + [env.reset()[1]["example_id"] for _ in range(3)]
    order_b = [env.reset(seed=7)[1]["example_id"]] + [env.reset()[1]["example_id"] for _ in range(3)]
    assert order_a == order_b and sorted(order_a) == ["q0", "q1", "q2", "q3"]
    with pytest.raises(ValueError):
        SearchEnv(retriever).reset()


def test_preview_episode_and_reward_arithmetic(retriever, examples):
    env = make_env(retriever, examples)
    env.reset(options={"example": examples[0]})  # positives p0 (Paris) and p1 (France)
    obs, reward, term, trunc, info = env.step("<search>capital of France Paris</search>")
    assert obs.startswith("<snapshot>") and obs.endswith("</snapshot>")
    lines = obs.splitlines()[1:-1]
    assert len(lines) == 5 and lines[0].startswith("[1] ") and reward == 0.0 and not term
    shown = env.episode.latest.hits
    numbers = {h.id: i for i, h in enumerate(shown, 1)}
    assert {"p0", "p1"} <= numbers.keys()
    negative = next(i for h, i in numbers.items() if h not in ("p0", "p1"))
    obs, reward, term, trunc, info = env.step(f"<expand>{numbers['p0']}, {negative}</expand>")
    assert obs.startswith("<information>") and "Paris is the capital" in obs
    assert reward == 0.0
    obs, reward, term, trunc, info = env.step("<answer>Paris</answer>")
    assert term and not trunc
    # EM 1 + 0.3 * one positive - 0.2 * one negative; p1 missed but the answer is right: no penalty.
    assert reward == pytest.approx(1.0 + 0.3 - 0.2)
    ep = info["episode"]
    assert ep["metrics"]["em"] == 1.0
    assert (ep["positives_opened"], ep["negatives_opened"], ep["positives_missed"], ep["docs_read"]) == (1, 1, 1, 2)
    assert ep["precision"] == 0.5
    assert ep["searches"][0]["expanded_ids"] == ["p0", shown[negative - 1].id]
    assert ep["doc_tokens"] > 0


def test_wrong_answer_pays_for_missed_positives(retriever, examples):
    env = make_env(retriever, examples)
    env.reset(options={"example": examples[0]})
    env.step("<search>capital of France Paris</search>")
    env.step("<expand>none</expand>")
    obs, reward, term, _, info = env.step("<answer>Lyon</answer>")
    # two visible positives, none opened, wrong answer: -0.1 * 2
    assert reward == pytest.approx(-0.2)
    assert info["episode"]["reward"]["total"] == pytest.approx(-0.2)


def test_f1_answer_metric(retriever, examples):
    config = EnvConfig(reward=RewardConfig(answer_metric="f1", missed_positive_penalty=0.0))
    env = SearchEnv(retriever, examples, config)
    env.reset(options={"example": QAExample("x", "q", ("River Spree",))})
    _, reward, *_ = env.step("<answer>Spree</answer>")
    assert reward == pytest.approx(2 * 1 * 0.5 / 1.5)


def test_positive_titles_and_answer_proxy(retriever, examples):
    env = make_env(retriever, examples)
    env.reset(options={"example": examples[2]})  # positive title "Tokyo"
    env.step("<search>capital of Japan</search>")
    record = env.episode.latest
    assert [h.id for h, p in zip(record.hits, record.positive) if p] == ["p6"]
    env.reset(options={"example": examples[1]})  # no labels: proxy "Spree" in text
    env.step("<search>river Berlin</search>")
    record = env.episode.latest
    assert {h.id for h, p in zip(record.hits, record.positive) if p} == {"p3", "p5"}


def test_format_penalty_and_invalid_actions_never_raise(retriever, examples):
    env = make_env(retriever, examples)
    env.reset(options={"example": examples[0]})
    for bad in ["hello", "<expand>1</expand>", "<search></search>", 123]:
        obs, reward, term, trunc, info = env.step(bad)
        assert obs.startswith("<information>\nInvalid action:") and reward == -0.5 and not term
        assert info["action"] == "invalid"
    env.step("<search>France</search>")
    for bad, why in [
        ("<search>Paris</search>", "expand the latest snapshot first"),
        ("<answer>Paris</answer>", "expand the latest snapshot first"),
        ("<expand>9</expand>", "not in the snapshot"),
        ("<expand>1 2 3 4 5 6</expand>", "at most 5"),
    ]:
        obs, reward, *_ , info = env.step(bad)
        assert why in info["invalid_reason"] and why in obs
    assert env.episode.n_invalid == 8 and env.episode.n_actions == 9


def test_expand_rules_repeat_and_duplicate_query(retriever, examples):
    env = make_env(retriever, examples, max_actions=20)
    env.reset(options={"example": examples[0]})
    env.step("<search>France</search>")
    env.step("<expand>1</expand>")
    _, _, *_, info = env.step("<expand>2</expand>")
    assert "already expanded" in info["invalid_reason"]
    _, _, *_, info = env.step("<search> france </search>")
    assert "already searched" in info["invalid_reason"]
    env.step("<search>France euro currency</search>")
    first_id = env.episode.searches[0].hits[0].id
    repeat = next(i for i, h in enumerate(env.episode.latest.hits, 1) if h.id == first_id)
    obs, *_ = env.step(f"<expand>{repeat}</expand>")
    assert "already read above" in obs
    assert env.episode.counts()["docs_read"] == 1


def test_duplicate_queries_allowed_when_configured(retriever, examples):
    env = make_env(retriever, examples, duplicate_query="allow", require_expand=False)
    env.reset(options={"example": examples[0]})
    env.step("<search>France</search>")
    _, _, *_, info = env.step("<search>France</search>")
    assert info["action"] == "search" and info["n_searches"] == 2


def test_limits_searches_and_actions(retriever, examples):
    env = make_env(retriever, examples, max_searches=2, max_actions=6)
    env.reset(options={"example": examples[3]})
    for q in ["Danube", "Vienna"]:
        env.step(f"<search>{q}</search>")
        env.step("<expand>none</expand>")
    obs, reward, term, trunc, info = env.step("<search>Austria</search>")
    assert "search limit of 2" in info["invalid_reason"]
    obs, reward, term, trunc, info = env.step("<expand>1</expand>")
    assert trunc and not term
    assert info["episode"]["answer"] is None and info["episode"]["n_actions"] == 6
    # terminal part: no answer, one visible unopened positive (Danube proxy) -> -0.1, plus this step's -0.5
    assert reward == pytest.approx(-0.5 - 0.1 * info["episode"]["positives_missed"])
    with pytest.raises(RuntimeError):
        env.step("<answer>x</answer>")


def test_prefix_mode_returns_full_passages(retriever, examples):
    env = make_env(retriever, examples, admission="prefix", candidates_per_search=3)
    env.reset(options={"example": examples[0]})
    obs, *_, info = env.step("<search>capital of France Paris</search>")
    assert obs.startswith("<information>") and obs.count("\n[") == 3 and obs.startswith("<information>\n[1]")
    assert env.episode.counts()["docs_read"] == 3
    _, _, *_, info = env.step("<expand>1</expand>")
    assert "not available" in info["invalid_reason"]
    _, reward, term, *_ = env.step("<answer>Paris</answer>")
    assert term and reward == pytest.approx(1.0 + 0.3 * 2 - 0.2 * 1)


def test_observation_cap_marks_truncation(retriever, examples):
    env = make_env(retriever, examples, max_obs_tokens=30)
    env.reset(options={"example": examples[0]})
    env.step("<search>France</search>")
    obs, *_ = env.step("<expand>1, 2, 3</expand>")
    assert "[truncated: observation limit reached]" in obs
    assert len(obs.split()) == 30  # body, tags and marker fit the cap exactly
    assert env.episode.doc_tokens == 30 - len(
        "<information> [truncated: observation limit reached] </information>".split())


def test_preview_caps_in_snapshot(retriever, examples):
    env = make_env(retriever, examples, preview=PreviewConfig(title_chars=3, window_chars=20, max_tokens=4))
    env.reset(options={"example": examples[0]})
    obs, *_ = env.step("<search>France</search>")
    for line in obs.splitlines()[1:-1]:
        number, preview = line.split(" ", 1)
        assert len(preview.split()) <= 5  # 4 tokens + " ..." marker
        assert len(preview.split(":")[0]) <= 3


def test_distractor_injection_rate_and_seeding(retriever, examples):
    config = EnvConfig(distractor_rate=0.4, candidates_per_search=5, max_searches=50, max_actions=200,
                       require_expand=False, duplicate_query="allow")
    env = SearchEnv(retriever, examples, config)
    env.reset(seed=3, options={"example": examples[0]})
    flags = []
    for _ in range(40):
        env.step("<search>capital of France</search>")
        flags += env.episode.latest.distractor
        assert len({h.row for h in env.episode.latest.hits}) == 5
    assert 0.25 < np.mean(flags) < 0.55
    env2 = SearchEnv(retriever, examples, config)
    env2.reset(seed=3, options={"example": examples[0]})
    flags2 = []
    for _ in range(40):
        env2.step("<search>capital of France</search>")
        flags2 += env2.episode.latest.distractor
    assert flags == flags2
    clean = SearchEnv(retriever, examples, EnvConfig())
    clean.reset(seed=0, options={"example": examples[0]})
    clean.step("<search>capital of France</search>")
    assert not any(clean.episode.latest.distractor)


def test_gymnasium_env_checker(retriever, examples):
    check_env(make_env(retriever, examples), skip_render_check=True)


def test_env_config_from_yaml(tmp_path):
    from pathlib import Path

    config = EnvConfig.from_yaml(Path(__file__).parents[1] / "configs" / "env" / "seeds_r1.yaml")
    assert config == EnvConfig()  # the recipe restates the defaults
    bad = tmp_path / "bad.yaml"
    bad.write_text("admission: preview\ntop_kk: 3\n")
    with pytest.raises(ValueError, match="top_kk"):
        EnvConfig.from_yaml(bad)
    with pytest.raises(ValueError, match="admission"):
        EnvConfig.from_dict({"admission": "all"})
    with pytest.raises(FileNotFoundError):
        EnvConfig.from_yaml(tmp_path / "missing.yaml")


def test_registered_with_gymnasium_and_step_info(retriever, examples):
    import gymnasium as gym

    env = gym.make("seeds_rl/Search-v0", retriever=retriever, dataset=examples)
    env.reset(seed=0)
    _, _, _, _, info = env.step("<search>capital of France</search>")
    assert info["search"]["query"] == "capital of France" and len(info["search"]["ids"]) == 5
    _, _, _, _, info = env.step("<expand>2</expand>")
    assert info["search"]["expanded"] == [2] and info["search"]["doc_tokens"] > 0


def test_old_top_k_key_is_read_as_candidates_per_search(tmp_path):
    recipe = tmp_path / "env.yaml"
    recipe.write_text("admission: prefix\ntop_k: 3\n")
    with pytest.warns(DeprecationWarning, match="candidates_per_search"):
        config = EnvConfig.from_yaml(recipe)
    assert config.candidates_per_search == 3 and not hasattr(config, "top_k")
