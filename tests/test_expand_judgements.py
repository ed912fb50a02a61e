"""``EnvConfig.expand_form = "judge"``: one yes/no per candidate opens the yes ones."""
import pytest

from envs.config import EnvConfig
from envs.protocol import STREAM_FORM, snapshot_candidates
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


def test_none_judges_every_candidate_no(retriever, examples):
    """``<expand>none</expand>`` (the forced expand before a forced answer) in the judgement form:
    every candidate no, a valid action that opens nothing."""
    env = SearchEnv(retriever, examples, EnvConfig(expand_form="judge"))
    env.reset(seed=0, options={"example": examples[0]})
    env.step(QUERY)
    _, _, _, _, info = env.step("<expand>none</expand>")
    assert info["action"] == "expand" and info["search"]["expanded_ids"] == [] and env.episode.n_invalid == 0
    assert not env.episode.awaiting_expand


def test_a_snapshot_cut_by_the_cap_is_judged_by_the_candidates_it_shows(retriever, examples):
    """Past max_obs_tokens the last candidates are not shown: the policy judges the ones it saw
    (the rest are not opened), and a judgement of candidates it never saw is refused."""
    config = EnvConfig(expand_form="judge", max_obs_tokens=40)
    env = SearchEnv(retriever, examples, config)
    env.reset(seed=0, options={"example": examples[0]})
    observation, *_ = env.step(QUERY)
    shown = len(snapshot_candidates(observation))
    assert observation.rstrip().endswith("[truncated: observation limit reached]\n</snapshot>")
    assert 1 <= shown < len(env.episode.latest.hits) == env.config.candidates_per_search
    every = " ".join(f"[{i}] no" for i in range(1, env.config.candidates_per_search + 1))
    _, _, _, _, info = env.step(f"<expand>{every}</expand>")
    assert info["action"] == "invalid" and f"[1] to [{shown}]" in info["invalid_reason"]
    seen = " ".join(f"[{i}] {'yes' if i == 1 else 'no'}" for i in range(1, shown + 1))
    _, _, _, _, info = env.step(f"<expand>{seen}</expand>")
    assert info["action"] == "expand" and info["search"]["expanded_ids"] == [env.episode.latest.hits[0].id]


def test_list_form_env_accepts_judgements(retriever, examples):
    env = SearchEnv(retriever, examples, EnvConfig())
    env.reset(seed=0, options={"example": examples[0]})
    env.step(QUERY)
    _, _, _, _, info = env.step("<expand>[1] yes [2] no</expand>")
    assert info["action"] == "expand" and len(info["search"]["expanded_ids"]) == 1


def test_seeds_r1_judge_prompt_and_env():
    judged = SeedsR1().env_config({"expand_form": "judge"})
    assert "[1] no [2] yes" in SeedsR1.prompt("Who?", judged) and judged.expand_form == "judge"
    assert "<expand> 1, 3 </expand>" in SeedsR1.prompt("Who?", EnvConfig())
    with pytest.raises(ValueError):
        EnvConfig(expand_form="vote")


def test_judge_question_restates_the_question_beside_every_preview(retriever, examples):
    """EnvConfig.judge_question: the snapshot carries the question, and every verdict question asks
    whether that candidate helps answer it; the candidates and the expand are unchanged."""
    from envs.protocol import judge_chunks, snapshot_candidates, snapshot_question

    plain = SearchEnv(retriever, examples, EnvConfig(expand_form="judge"))
    plain.reset(seed=0, options={"example": examples[0]})
    plain_obs = plain.step(QUERY)[0]
    env = SearchEnv(retriever, examples, EnvConfig(expand_form="judge", judge_question=True))
    env.reset(seed=0, options={"example": examples[0]})
    obs = env.step(QUERY)[0]
    assert obs.startswith("<snapshot>\nQuestion: What is the capital of France?\n[1] ")
    assert snapshot_question(obs) == "What is the capital of France?" and snapshot_question(plain_obs) is None
    assert snapshot_candidates(obs) == snapshot_candidates(plain_obs)
    chunks, closing = judge_chunks(obs)
    assert [c.rsplit("\n", 1)[-1] for c in chunks] == [
        f"Does [{i}] help answer: What is the capital of France?" for i in range(1, len(chunks) + 1)]
    assert chunks[0].startswith("\n<snapshot>\n[1] ") and closing == "\n</snapshot>\n"
    assert [c.rsplit("\n", 1)[-1] for c in judge_chunks(plain_obs)[0]][0] == "Read [1]?"
    assert SeedsR1().env_config({"expand_form": "judge", "judge_question": True}).judge_question


def test_sft_can_show_the_teachers_verdicts_without_training_them():
    from tests.tiny_models import tiny_tokenizer
    from training.teachers.trajectories import tokenize_trajectory

    tok = tiny_tokenizer()
    snapshot = "<snapshot>\n[1] Paris: capital of France\n[2] Seine: a river\n</snapshot>"
    record = {"segments": [
        {"role": "prompt", "text": "Question: capital?"}, {"role": "model", "text": "<search>capital</search>"},
        {"role": "observation", "text": snapshot}, {"role": "model", "text": "<expand>[1] yes [2] no</expand>"},
        {"role": "observation", "text": "<information>\n[1] Paris\nParis is the capital.\n</information>"},
        {"role": "model", "text": "<answer>Paris</answer>"}], "accepted": True}
    trained = tokenize_trajectory(record, tok, STREAM_FORM)
    shown = tokenize_trajectory(record, tok, STREAM_FORM, train_verdicts=False)
    assert trained["input_ids"] == shown["input_ids"]
    yes, no = (tok(w, add_special_tokens=False)["input_ids"][0] for w in (" yes", " no"))
    verdicts = [i for i, t in enumerate(trained["input_ids"]) if t in (yes, no) and trained["loss_mask"][i]]
    assert len(verdicts) == 2 and all(shown["loss_mask"][i] == 0 for i in verdicts)
    assert sum(shown["loss_mask"]) == sum(trained["loss_mask"]) - 2  # everything else is still trained
