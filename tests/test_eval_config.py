"""The evaluation config: one typed tree read as training reads its own, old flags and recipes mapped once."""
import dataclasses

import pytest

from envs.typed_config import ConfigError
from inference import evaluate as ev
from inference.eval_config import EvalConfig, load_eval_config, split_actions, upgrade_old_argv

NEW = ["--method.name", "seeds-react", "--method.options.max_tokens", "128", "--method.budget", "paper",
       "--method.greedy", "--model.name", "hf:fake", "--model.options.max_batch_size", "4", "--model.thinking", "off",
       "--model.guided_actions", "false", "--data.path", "qa.jsonl", "--data.limit", "5", "--data.index", "idx",
       "--data.retriever", "http://127.0.0.1:9", "--env_config", "configs/env/seeds_r1.yaml",
       "--env.max_actions", "6", "--env.reward.format_penalty", "0.2", "--run.output_dir", "runs/x",
       "--run.seed", "3", "--run.concurrency", "2", "--run.overwrite", "--run.report_to", "wandb", "--run.shard", "0/2",
       "--method.max_llm_calls", "9"]
OLD = ["--method", "seeds-react", "--method-option", "max_tokens=128", "--budget", "paper", "--greedy",
       "--llm", "hf:fake", "--llm-option", "max_batch_size=4", "--thinking", "off", "--no-guided-actions",
       "--data", "qa.jsonl", "--limit", "5", "--index", "idx", "--retriever", "http://127.0.0.1:9",
       "--env-config", "configs/env/seeds_r1.yaml", "--env", "max_actions=6", "--env.reward.format_penalty", "0.2",
       "--out=runs/x", "--seed", "3", "--concurrency", "2", "--overwrite", "--wandb", "--shard", "0/2",
       "--max-llm-calls", "9"]


def test_old_flags_give_the_same_config_as_sections(capsys):
    new = load_eval_config(NEW)
    assert (new.method.options, new.model.options, new.env) == (
        {"max_tokens": 128}, {"max_batch_size": 4}, {"max_actions": 6, "reward": {"format_penalty": 0.2}})
    assert (new.model.thinking, new.model.guided_actions, new.run.report_to, new.run.seed) == ("off", False, "wandb", 3)
    assert load_eval_config(OLD) == new
    assert "deprecated: old evaluation flags" in capsys.readouterr().err
    assert load_eval_config(["--method.name", "x"]) == EvalConfig(method=dataclasses.replace(EvalConfig().method,
                                                                                            name="x"))


def test_old_recipe_keys_give_the_same_config_as_sections(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("method: react\nmethod_option: ['k=3', 'max_tokens=64']\ndata: qa.jsonl\nindex: idx\nllm: hf:fake\n"
                   "env: ['max_obs_tokens=800', 'preview.max_tokens=40']\nout: runs/x\nthinking: off\nwandb: true\n")
    new = tmp_path / "new.yaml"
    new.write_text("method: {name: react, options: {k: 3, max_tokens: 64}}\ndata: {path: qa.jsonl, index: idx}\n"
                   "model: {name: 'hf:fake', thinking: 'off'}\nenv: {max_obs_tokens: 800, preview: {max_tokens: 40}}\n"
                   "run: {output_dir: runs/x, report_to: wandb}\n")
    assert load_eval_config(["--config", str(old)]) == load_eval_config(["--config", str(new)])
    # the command line over the recipe, whichever form either is in
    assert load_eval_config(["--config", str(old), "--env.max_obs_tokens", "900"]).env["max_obs_tokens"] == 900
    assert load_eval_config(["--config", str(new), "--env", "max_obs_tokens=900"]).env["max_obs_tokens"] == 900


def test_later_settings_win_whichever_form():
    assert load_eval_config(["--env", "max_actions=6", "--env.max_actions", "7"]).env == {"max_actions": 7}
    assert load_eval_config(["--env.max_actions", "7", "--env", "max_actions=6"]).env == {"max_actions": 6}
    assert upgrade_old_argv(["--env", "k="]) == ["--env.k="]  # an empty value stays this flag's, not the next's


@pytest.mark.parametrize("argv, message", [
    (["--method.nam", "x"], "method.nam"), (["--run.report_to", "tensorboard"], "report_to"),
    (["--model.thinking", "maybe"], "thinking"), (["--method.budget", "huge"], "budget"),
    (["--env", "max_actions"], "key=value"), (["--data.limit", "many"], "integer"), (["--limit"], "expects a value")])
def test_bad_settings_are_refused_with_the_reason(argv, message):
    with pytest.raises(ConfigError, match=message):
        load_eval_config(argv)
    with pytest.raises(SystemExit, match=message):
        ev.resolve_args(["--method.name", "x", "--run.output_dir", "o", *argv])


def test_actions_are_taken_out_before_the_config():
    actions, rest = split_actions(["--compare", "a", "b", "--run.output_dir", "o", "--merge"])
    assert (actions.compare, actions.merge, rest) == (["a", "b"], True, ["--run.output_dir", "o"])
    with pytest.raises(ConfigError, match="one or more"):
        split_actions(["--compare", "--merge"])
    with pytest.raises(SystemExit, match="required"):
        ev.main(["--method.name", "vanilla-rag"])  # no run folder
    with pytest.raises(SystemExit, match="--merge needs"):
        ev.main(["--merge"])
