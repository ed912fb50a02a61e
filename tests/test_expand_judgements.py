"""``EnvConfig.expand_form = "judge"``: one yes/no per candidate opens the yes ones."""
import pytest

from envs.config import EnvConfig
from envs.search_env import SearchEnv
from methods.seeds import SeedsR1

QUERY = "<search>capital of France Paris river</search>"


def test_judgements_open_the_yes_candidates(retriever, examples):
    env = SearchEnv(retriever, examples, EnvConfig(expand_form="judge"))
    env.reset(seed=0, options={"example": examples[0]})
    env.step(QUERY)
    ids = [h.id for h in env.episode.latest.hits]
    yes = ids.index("p0") + 1
    verdicts = " ".join(f"[{i}] {'yes' if i == yes else 'no'}" for i in range(1, len(ids) + 1))
    obs, _, _, _, info = env.step(f"<expand>{verdicts}</expand>")
    assert info["action"] == "expand" and info["search"]["expanded_ids"] == ["p0"]
    assert obs.startswith(f"<information>\n[{yes}] Paris")


@pytest.mark.parametrize("action", ["<expand>1, 2</expand>", "<expand>[1] yes [2] no</expand>",
                                    "<expand>[2] no [1] no [3] no [4] no [5] no</expand>"])
def test_incomplete_or_list_expand_is_invalid_in_judge_form(retriever, examples, action):
    env = SearchEnv(retriever, examples, EnvConfig(expand_form="judge"))
    env.reset(seed=0, options={"example": examples[0]})
    env.step(QUERY)
    obs, reward, _, _, info = env.step(action)
    assert info["action"] == "invalid" and "judge every candidate" in info["invalid_reason"]
    assert reward == pytest.approx(-EnvConfig().reward.format_penalty)
    assert env.episode.awaiting_expand  # the snapshot can still be judged


def test_list_form_env_accepts_judgements(retriever, examples):
    env = SearchEnv(retriever, examples, EnvConfig())
    env.reset(seed=0, options={"example": examples[0]})
    env.step(QUERY)
    _, _, _, _, info = env.step("<expand>[1] yes [2] no</expand>")
    assert info["action"] == "expand" and len(info["search"]["expanded_ids"]) == 1


def test_seeds_r1_judge_prompt_and_env():
    method = SeedsR1(expand_form="judge")
    assert "[1] no [2] yes" in method.prompt("Who?") and method.env_config(EnvConfig()).expand_form == "judge"
    assert "<expand> 1, 3 </expand>" in SeedsR1().prompt("Who?")
    with pytest.raises(ValueError):
        EnvConfig(expand_form="vote")
