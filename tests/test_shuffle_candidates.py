"""``EnvConfig.shuffle_candidates``: snapshots in a seeded random order, bookkeeping kept right."""
import re

import pytest

from envs.config import EnvConfig
from envs.search_env import SearchEnv
from envs.vector_env import SearchVectorEnv

QUERY = "<search>capital of France Paris river</search>"


def _shown(env: SearchEnv, seed: int, example) -> tuple[list[str], str]:
    env.reset(seed=seed, options={"example": example})
    obs, *_ = env.step(QUERY)
    return [h.id for h in env.episode.latest.hits], obs


def test_default_keeps_rank_order(retriever, examples):
    assert EnvConfig().shuffle_candidates is False
    env = SearchEnv(retriever, examples)
    ids, _ = _shown(env, 0, examples[0])
    ranked = [h.id for h in retriever.search([QUERY[8:-9]], 5)[0]]
    assert ids == ranked
    assert [h.rank for h in env.episode.latest.hits] == [1, 2, 3, 4, 5]


def test_shuffled_order_is_seeded_and_varies(retriever, examples):
    config = EnvConfig(shuffle_candidates=True)
    ranked = [h.id for h in retriever.search([QUERY[8:-9]], 5)[0]]
    orders = {}
    for seed in range(20):
        ids, _ = _shown(SearchEnv(retriever, examples, config), seed, examples[0])
        again, _ = _shown(SearchEnv(retriever, examples, config), seed, examples[0])
        assert ids == again  # same seed, same order
        assert sorted(ids) == sorted(ranked)  # same candidates
        orders[seed] = tuple(ids)
    assert len(set(orders.values())) > 5  # different seeds, different orders
    assert sum(o[0] == ranked[0] for o in orders.values()) < 15  # the top hit is not always shown first


def test_shuffled_snapshot_and_expand_agree(retriever, examples):
    env = SearchEnv(retriever, examples, EnvConfig(shuffle_candidates=True))
    for seed in range(10):
        ids, obs = _shown(env, seed, examples[0])
        hits = env.episode.latest.hits
        lines = obs.splitlines()[1:-1]
        for number, (line, hit) in enumerate(zip(lines, hits), start=1):
            assert line.startswith(f"[{number}] {hit.title}: ")
        record = env.episode.latest
        assert record.positive == [h in ("p0", "p1") for h in ids]  # labels follow the shown order
        assert sorted(h.rank for h in hits) == [1, 2, 3, 4, 5]  # retrieval ranks are kept
        number = ids.index("p0") + 1
        obs, _, _, _, info = env.step(f"<expand>{number}</expand>")
        assert re.search(rf"\[{number}\] Paris\nParis is the capital", obs)
        assert info["search"]["expanded_ids"] == ["p0"]
        assert info["search"]["expanded_ranks"] == [hits[number - 1].rank]
        _, reward, term, _, info = env.step("<answer>Paris</answer>")
        assert term and info["episode"]["positives_opened"] == 1 and info["episode"]["docs_read"] == 1
        assert reward == pytest.approx(1.0 + EnvConfig().reward.positive_opened_bonus)


def test_vector_env_shuffles_like_single_envs(retriever, examples):
    config = EnvConfig(shuffle_candidates=True)
    venv = SearchVectorEnv(retriever, 3, examples, config)
    venv.reset(seed=[4, 5, 6], examples=[examples[0]] * 3)
    venv.step([QUERY] * 3)
    batched = [[h.id for h in env.episode.latest.hits] for env in venv.envs]
    single = [_shown(SearchEnv(retriever, examples, config), seed, examples[0])[0] for seed in (4, 5, 6)]
    assert batched == single
