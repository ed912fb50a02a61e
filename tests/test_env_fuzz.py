"""Random action strings never raise, and the env's counters stay consistent."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs.config import EnvConfig
from envs.search_env import SearchEnv

fragments = st.sampled_from(
    ["<search>", "</search>", "<expand>", "</expand>", "<answer>", "</answer>", "none", "1", "2", ",", " 7 ",
     "France", "capital", "\n", "<think>", "]", "-3", "999999999999"]
)
action_text = st.one_of(st.text(max_size=40), st.lists(fragments, max_size=8).map("".join))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(action_text, min_size=1, max_size=14), admission=st.sampled_from(["preview", "prefix"]))
def test_random_actions_never_raise(retriever, examples, actions, admission):
    env = SearchEnv(retriever, examples, EnvConfig(admission=admission, distractor_rate=0.3))
    env.reset(seed=0)
    total = 0.0
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        assert isinstance(obs, str) and env.observation_space.contains(obs)
        ep = env.episode
        assert ep.n_actions <= env.config.max_actions
        assert ep.n_searches <= env.config.max_searches
        assert ep.n_invalid <= ep.n_actions and ep.n_searches <= ep.n_actions
        counts = ep.counts()
        assert counts["positives_opened"] + counts["negatives_opened"] == counts["docs_read"]
        assert counts["positives_opened"] <= counts["positives_shown"]
        if terminated or truncated:
            summary = info["episode"]
            assert summary["reward"]["total"] == __import__("pytest").approx(total)
            assert terminated != truncated
            break
