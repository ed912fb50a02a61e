import numpy as np
import pytest

from envs.config import EnvConfig
from envs.search_env import SearchEnv
from envs.vector_env import SearchVectorEnv

SCRIPTS = [
    ["<search>capital of France</search>", "<expand>1, 3</expand>", "<answer>Paris</answer>"],
    ["<search>river Berlin</search>", "<expand>none</expand>", "<search>Spree</search>", "<expand>2</expand>",
     "<answer>Spree</answer>"],
    ["garbage", "<expand>1</expand>", "<search>Japan capital</search>", "<expand>1</expand>", "<answer>Kyoto</answer>"],
    ["<search>Vienna river</search>", "<search>again</search>", "<expand>9</expand>", "<expand>1,2</expand>",
     "<answer>Danube</answer>"],
]


def run_single(retriever, examples, config):
    results = []
    for i, (example, script) in enumerate(zip(examples, SCRIPTS)):
        env = SearchEnv(retriever, None, config)
        env.reset(seed=100 + i, options={"example": example})
        steps = [env.step(a) for a in script]
        results.append(steps)
    return results


@pytest.mark.parametrize("distractor_rate", [0.0, 0.5])
def test_vector_env_equals_single_envs(retriever, examples, distractor_rate):
    config = EnvConfig(distractor_rate=distractor_rate)
    expected = run_single(retriever, examples, config)
    retriever.calls.clear()
    venv = SearchVectorEnv(retriever, num_envs=4, config=config)
    obs, _ = venv.reset(seed=100, examples=examples)
    assert obs == [e.question for e in examples]
    got = [[] for _ in examples]
    done = [False] * 4
    for t in range(max(map(len, SCRIPTS))):
        actions = [None if done[i] or t >= len(SCRIPTS[i]) else SCRIPTS[i][t] for i in range(4)]
        calls_before = len(retriever.calls)
        observations, rewards, terminated, truncated, infos = venv.step(actions)
        n_searches = sum(1 for info in infos if info["action"] == "search")
        # every search of the step went through one retrieval call
        assert len(retriever.calls) - calls_before == (1 if n_searches else 0)
        if n_searches:
            assert len(retriever.calls[-1]) == n_searches
        for i in range(4):
            if actions[i] is not None:
                got[i].append((observations[i], rewards[i], terminated[i], truncated[i], infos[i]))
                done[i] = terminated[i] or truncated[i]
    for single, batched in zip(expected, got):
        assert len(single) == len(batched)
        for (o1, r1, t1, u1, i1), (o2, r2, t2, u2, i2) in zip(single, batched):
            assert o1 == o2 and r1 == pytest.approx(r2) and t1 == t2 and u1 == u2 and i1 == i2


def test_vector_env_validates_lengths(retriever, examples):
    venv = SearchVectorEnv(retriever, num_envs=2, dataset=examples, config=EnvConfig())
    venv.reset(seed=0)
    with pytest.raises(ValueError):
        venv.step(["<answer>x</answer>"])
    with pytest.raises(ValueError):
        venv.reset(examples=examples)
    obs, rewards, terminated, truncated, infos = venv.step([None, "<answer>x</answer>"])
    assert obs[0] == "" and terminated.tolist() == [True, True] and infos[0]["action"] == "skipped"
    assert isinstance(rewards, np.ndarray)
