"""SFT collection: stop at ``target_accepted`` (scripted and method teachers), the acceptance rate
printed and stored, the policy's tokenizer in every env, the paper's recipes (the SFT warm start,
and the 7B PPO recipe refusing to start without its SFT checkpoint). Toy retriever, tiny tokenizer."""
from __future__ import annotations

import dataclasses
import json

import pytest
from fake_llm import FakeLLM

from envs.search_env import TRUNCATION_MARK
from envs.types import QAExample
from tests.tiny_models import tiny_tokenizer
from training import sft
from training.config import ConfigError, PPOConfig, load_config, with_values
from training.sft_config import (
    SFTDataSettings,
    SFTModelSettings,
    SFTRunSettings,
    TeacherSettings,
    WarmStartConfig,
)
from training.teachers import trajectories
from training.teachers.scripted_teacher import collect_scripted
from training.warm_start.sft_collect import acceptance_stats, collect_until_accepted

FRANCE = "What is the capital of France?"


def mixed_questions() -> list[QAExample]:
    """Accepted (gold Paris is shown) and rejected (gold never shown) questions, interleaved."""
    golds = ["Paris", "Kilimanjaro", "Kilimanjaro", "Paris", "Paris", "Kilimanjaro", "Paris", "Kilimanjaro"]
    return [QAExample(f"m{i}", FRANCE, (gold,)) for i, gold in enumerate(golds)]


def scripted_config(tmp_path, env: dict | None = None, **teacher) -> WarmStartConfig:
    """The scripted teacher (or ``kind="method"``) with ``teacher`` settings, two env slots."""
    return WarmStartConfig(model=SFTModelSettings(name="tiny"), env=env or {},
                           teacher=TeacherSettings(**{"num_envs": 2, **teacher}),
                           run=SFTRunSettings(output_dir=str(tmp_path / "sft")))


def test_collection_stops_at_target_accepted(retriever, tmp_path):
    questions = mixed_questions()
    records, progress = collect_until_accepted(scripted_config(tmp_path, target_accepted=3), questions, retriever)
    # Chunks of num_envs=2: [m0 m1] 1 accepted, [m2 m3] 2, [m4 m5] 3 -> stop; m5 came after the target.
    assert [r["id"] for r in records] == ["m0", "m1", "m2", "m3", "m4"]
    assert [r["accepted"] for r in records] == [True, False, False, True, True]
    assert progress == {"questions_available": 8, "questions_used": 6, "target_accepted": 3, "target_reached": True,
                        "dropped_after_target": 1}
    # Chunking changes nothing: the same episodes as one pass over all questions.
    whole = collect_scripted(questions, retriever, num_envs=2, seed=0)
    assert [r["text"] for r in records] == [r["text"] for r in whole[:5]]
    assert acceptance_stats(records)["acceptance_rate"] == pytest.approx(3 / 5)


def test_collection_runs_out_of_questions_with_a_message(retriever, tmp_path, capsys):
    records, progress = collect_until_accepted(scripted_config(tmp_path, target_accepted=10), mixed_questions(),
                                               retriever)
    assert len(records) == 8 and progress["questions_used"] == 8 and not progress["target_reached"]
    assert "target_accepted=10 not reached" in capsys.readouterr().out
    everything, progress = collect_until_accepted(scripted_config(tmp_path), mixed_questions(), retriever)
    assert len(everything) == 8 and progress["target_reached"] and progress["target_accepted"] is None


def test_teacher_samples_collect_several_episodes_per_question(retriever, tmp_path):
    """``teacher_samples``: each question's episodes come together, and stopping at the target
    keeps the one-pass episodes; only the scripted teacher has it."""
    questions = mixed_questions()
    config = scripted_config(tmp_path, samples=3, target_accepted=4, open_rate=0.5)
    records, progress = collect_until_accepted(config, questions, retriever)
    whole = collect_scripted(questions, retriever, config.env_config(), config.scripted_teacher(), num_envs=2,
                             samples=3)
    assert [r["id"] for r in whole] == [q.id for q in questions for _ in range(3)]
    assert [r["text"] for r in records] == [r["text"] for r in whole[:len(records)]]
    assert sum(r["accepted"] for r in records) == 4 and records[-1]["accepted"]
    assert progress["questions_used"] == 4  # chunks of 2 questions: m0 m1 give 3 accepted, m2 m3 the 4th
    with pytest.raises(ValueError, match="teacher.samples"):
        scripted_config(tmp_path, samples=0)
    with pytest.raises(ValueError, match="teacher.samples"):
        TeacherSettings(kind="method", llm="openai:m", samples=2)


def test_run_logs_and_stores_the_acceptance_rate_and_uses_the_policy_tokenizer(retriever, tmp_path, capsys,
                                                                              monkeypatch):
    tokenizer = tiny_tokenizer()
    loaded = []
    monkeypatch.setattr(sft, "load_policy_tokenizer", lambda config: loaded.append(config.model.name) or tokenizer)
    config = scripted_config(tmp_path, target_accepted=3, env={"max_obs_tokens": 45}, second_search=False)
    result = sft.run(config, collect_only=True, retriever=retriever, examples=mixed_questions())
    assert loaded == ["tiny"]  # no tokenizer given: the policy's (config.model.name) is loaded for the env
    stats = json.loads((tmp_path / "sft" / "acceptance.json").read_text())
    assert stats["acceptance_rate"] == pytest.approx(0.6) and stats["accepted"] == 3 and stats["trajectories"] == 5
    assert stats["reasons"] == {"correct": 2, "gold_observed": 1, "wrong_answer": 2}
    assert stats["target_reached"] and stats["train"] + stats["dev"] == 3 and result["acceptance_rate"] == 0.6
    assert "[sft] E.2 acceptance: 3 of 5 trajectories accepted (rate 0.600" in capsys.readouterr().out
    lines = (tmp_path / "sft" / "trajectories.jsonl").read_text().splitlines()
    information = [s["text"] for s in json.loads(lines[0])["segments"] if s["text"].startswith("<information>")]
    assert TRUNCATION_MARK in information[0]  # 45 policy tokens, not 45 words


def respond(prompt: str) -> str:
    if prompt.rstrip().endswith("</information>"):
        return "<think>found it</think><answer>Paris</answer>"
    if prompt.rstrip().endswith("</snapshot>"):
        return "<expand>1, 2</expand>"
    return "<think>search</think><search>capital of France</search>"


def test_method_teacher_stops_at_target_and_caps_in_policy_tokens(retriever, tmp_path):
    questions = [QAExample("x0", FRANCE, ("Kilimanjaro",)), QAExample("x1", FRANCE, ("Paris",)),
                 QAExample("x2", FRANCE, ("Paris",))]
    config = scripted_config(tmp_path, kind="method", llm="fake:unused", concurrency=1,
                             target_accepted=1, env={"max_obs_tokens": 45})
    llm = FakeLLM(respond)
    records, progress = collect_until_accepted(config, questions, retriever, tokenizer=tiny_tokenizer(), llm=llm)
    assert [(r["id"], r["reason"]) for r in records] == [("x0", "wrong_answer"), ("x1", "correct")]
    assert progress["questions_used"] == 2 and progress["target_reached"]
    information = [s["text"] for s in records[1]["segments"] if s["text"].startswith("<information>")]
    assert TRUNCATION_MARK in information[0]  # the FakeLLM has no tokenizer: the cap counted the policy's
    whole_pass = dataclasses.replace(config, teacher=dataclasses.replace(config.teacher, target_accepted=None))
    words, _ = collect_until_accepted(whole_pass, questions[1:2], retriever,
                                      llm=FakeLLM(respond))
    assert TRUNCATION_MARK not in [s["text"] for s in words[0]["segments"] if s["text"].startswith("<information>")][0]


def test_paper_warm_start_recipe():
    with pytest.raises(ValueError, match="teacher.llm"):
        WarmStartConfig.from_yaml("configs/sft/seeds_r1_paper.yaml")
    with pytest.raises(SystemExit, match="teacher.llm"):
        sft.resolve_config(["--config", "configs/sft/seeds_r1_paper.yaml"])
    config, _ = sft.resolve_config(["--config", "configs/sft/seeds_r1_paper.yaml", "--teacher.llm", "vllm:/m/teacher"])
    teacher = config.teacher
    assert (teacher.kind, teacher.method, teacher.llm) == ("method", "seeds-react", "vllm:/m/teacher")
    assert teacher.target_accepted == 1000 and config.dev.fraction == 0.1 and config.dev.enabled
    assert config.data.num_questions is None and config.dev.limit is None and not config.model.lora.enabled
    accepted = [{"id": f"q{i}", "accepted": True} for i in range(1000)]
    train, dev = trajectories.split_train_dev(accepted, config.dev.fraction, config.run.seed)
    assert (len(train), len(dev)) == (900, 100)
    assert TeacherSettings(kind="method", trajectories="t.jsonl").llm is None  # training from a file
    with pytest.raises(ValueError, match="target_accepted"):
        TeacherSettings(target_accepted=0)
    with pytest.raises(ValueError, match="num_questions"):
        SFTDataSettings(num_questions=None)
    default = WarmStartConfig.from_yaml("configs/sft/default.yaml")
    assert (default.teacher.expand, default.teacher.reader) == ("random", "first_title")


def test_paper_ppo_recipe_requires_the_sft_checkpoint():
    recipe = ["--config", "configs/ppo/seeds_r1_qwen2.5_7b.yaml"]
    with pytest.raises(ConfigError, match="configs/sft/seeds_r1_paper.yaml"):
        load_config(PPOConfig, recipe)
    cfg = load_config(PPOConfig, recipe + ["--sft_checkpoint", "runs/sft-seeds-r1-paper/model"])
    assert cfg.warm_start.require_checkpoint and cfg.model.sft_checkpoint == "runs/sft-seeds-r1-paper/model"
    assert not cfg.warm_start.enabled
    assert not PPOConfig().warm_start.require_checkpoint  # the CPU default still warm-starts itself
    with pytest.raises(ConfigError, match="require_checkpoint"):
        with_values(PPOConfig, {"warm_start.require_checkpoint": True})


def test_flat_lora_keys_of_old_recipes_read_into_the_lora_section():
    with pytest.warns(DeprecationWarning, match="lora"):
        config = WarmStartConfig.from_dict({"lora": True, "lora_r": 8, "lora_top_layers": 2})
    lora = config.model.lora
    assert (lora.enabled, lora.r, lora.top_layers) == (True, 8, 2)
    assert lora.target_modules == "all-linear"  # the warm start's own default stays


def test_warm_start_recipes_load_through_the_one_loader(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("model: {name: tiny, lora: {enabled: true, r: 4}}\ntrain: {epochs: 2}\n")
    variant = tmp_path / "variant.yaml"
    variant.write_text("base: base.yaml\ntrain: {epochs: 1}\n")
    config = WarmStartConfig.from_yaml(variant)
    lora = config.model.lora
    assert (config.model.name, config.train.epochs, lora.enabled, lora.r) == ("tiny", 1, True, 4)
    with pytest.raises(ValueError, match="no_such_key"):
        WarmStartConfig.from_dict({"no_such_key": 1})
