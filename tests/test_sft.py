"""SFT warm start: teacher trajectories, the E.2 acceptance filter, the token layout, one TRL run.

Tiny models only (a random two-layer Llama, hidden 64, on a BPE tokenizer trained here), the
word-overlap retriever of conftest; everything runs on two CPU cores in seconds.
"""
from __future__ import annotations

import json
from itertools import pairwise

import pytest
import torch
from fake_llm import FakeLLM
from tiny_models import bpe_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from envs.config import EnvConfig
from envs.protocol import CLOSING_TAGS, ExpandAction, parse_action
from envs.types import QAExample
from envs.vector_env import SearchVectorEnv
from methods.llm import Completion, GenerationResult, LLMBackend
from methods.prompts import r1
from tests.conftest import PASSAGES
from training import sft
from training.rollouts.rollout import RolloutConfig, collect_rollouts
from training.sft_config import DevSettings, SFTModelSettings, SFTRunSettings, SFTTrainSettings
from training.teachers import scripted_teacher, trajectories

TAGS = ["<think>", "</think>", "<search>", "</search>", "<expand>", "</expand>", "<answer>", "</answer>"]


# ------------------------------------------------------------------------------ tiny model

@pytest.fixture(scope="module")
def tokenizer():
    text = ([r1.SEEDS_R1] + [f"{title}: {body}" for _, title, body in PASSAGES]
            + list(scripted_teacher.THINK_TEXTS.values()))
    return bpe_tokenizer(text, 700, added=TAGS, clean_up_tokenization_spaces=False)


def tiny_llama(tokenizer) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


class ReplayBackend(LLMBackend):
    """Returns fixed texts as completions (tokenised without special tokens), one per call per row."""

    name = "replay"

    def __init__(self, model, tokenizer, texts: list[str]):
        self.model, self.tokenizer, self.texts = model, tokenizer, list(texts)
        self.device, self.pad_id, self.max_batch_size = torch.device("cpu"), tokenizer.pad_token_id, 8

    def generate(self, requests):
        results = []
        for request in requests:
            text = self.texts.pop(0)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            stop = next(s for s in request.stop if text.endswith(s))
            results.append(GenerationResult([Completion(text, ids, [-1.0] * len(ids), "stop", stop)]))
        return results


# ------------------------------------------------------------------------------ teachers

def model_actions(record):
    return [parse_action(s["text"]) for s in record["segments"] if s["role"] == "model"]


def collect(examples, retriever, expand="random", **options):
    settings = scripted_teacher.ScriptedTeacherConfig(expand=expand, **options)
    return scripted_teacher.collect_scripted(examples, retriever, EnvConfig(), settings, num_envs=4, seed=0)


def test_scripted_teacher_positives_mode_opens_positives_and_reads_its_answer(retriever, examples):
    records = collect(examples, retriever, expand="positives")
    assert [r["id"] for r in records] == [e.id for e in examples]
    for record, example in zip(records, examples):
        roles = [s["role"] for s in record["segments"]]
        assert roles[0] == "prompt" and roles[-1] == "model"
        assert all(a != b for a, b in pairwise(roles[1:]))  # model / observation alternate
        assert record["segments"][0]["text"] == trajectories.seeds_r1_prompt(example.question)
        assert all(s["text"].startswith("<think>") for s in record["segments"] if s["role"] == "model")
        assert record["text"] == trajectories.trajectory_text(record["segments"])
        summary = record["summary"]
        assert summary["n_invalid"] == 0 and summary["negatives_opened"] == 0  # no extra expansions
        for search in summary["searches"]:  # gold-guided expansion: exactly the labelled positives
            assert sorted(search["expanded"]) == [i + 1 for i, p in enumerate(search["positive"]) if p][:5]
        # The answer is read, not given: the title of the first passage it opened.
        first = summary["searches"][-1]
        assert summary["answer"] == first["titles"][first["expanded"][0] - 1]
    assert records[0]["teacher"] == "scripted:positives:first_title"
    assert records[0]["summary"]["positives_opened"] == 2  # q0: p0 and p1 labelled
    assert (records[0]["summary"]["answer"], records[0]["reason"]) == ("Paris", "correct")


def test_scripted_teacher_never_uses_the_gold(retriever):
    """The old teacher searched a positive title / the gold and answered the gold; this one
    searches the question, answers what it opened, and E.2 rejects the episode."""
    example = QAExample("qx", "What is the capital of France?", ("Danube",), positive_titles=("Danube",))
    for expand in ("random", "positives"):
        (record,) = collect([example], retriever, expand=expand)
        actions = model_actions(record)
        queries = [a.query for a in actions if hasattr(a, "query")]
        assert queries[0] == example.question and "Danube" not in queries
        assert actions[-1].answer != "Danube" and "Danube" not in record["text"].split("Question:")[-1]
        assert (record["accepted"], record["reason"]) == (False, "wrong_answer")
    (opened_nothing,) = collect([example], retriever, expand="random", random_expand=0, second_search=False)
    assert model_actions(opened_nothing)[-1].answer == scripted_teacher.UNKNOWN_ANSWER


def test_scripted_teacher_random_mode_opens_non_positives(retriever, examples):
    records = collect(examples * 3, retriever, random_expand=2)
    opened = [s for r in records for s in r["summary"]["searches"]]
    assert all(len(s["expanded"]) == 2 for s in opened)
    assert sum(r["summary"]["negatives_opened"] for r in records) > 0
    for record in records:  # every answer is the first title of the last reading
        last = record["summary"]["searches"][-1]
        assert record["summary"]["answer"] == last["titles"][last["expanded"][0] - 1]
        assert record["reason"] == ("correct" if record["summary"]["metrics"]["em"] == 1.0 else "gold_observed")
    assert {r["reason"] for r in records} == {"correct", "gold_observed"}  # random reading is not always right
    # Random choices, seeded per example: the same call gives the same trajectories.
    again = collect(examples * 3, retriever)
    assert [r["text"] for r in again] == [r["text"] for r in records]


def test_method_teacher_converts_traces(retriever, examples):
    def respond(prompt: str) -> str:
        if prompt.rstrip().endswith("</information>"):
            return "<think>found it</think><answer>Paris</answer>"
        if prompt.rstrip().endswith("</snapshot>"):
            return "<expand>1, 2</expand>"
        return "<think>search</think><search>capital of France</search>"

    unknown = QAExample("qz", "Which mountain is the tallest in Africa?", ("Kilimanjaro",))
    records = trajectories.collect_with_method([examples[0], unknown], retriever, "seeds-react", FakeLLM(respond))
    first, second = records
    assert first["teacher"] == "method:seeds-react" and first["accepted"] and first["reason"] == "correct"
    assert [s["role"] for s in first["segments"]] == ["prompt", "model", "observation", "model", "observation",
                                                      "model"]
    assert first["segments"][0]["text"] == trajectories.seeds_r1_prompt(examples[0].question)
    assert first["segments"][1]["text"] == "<think>search</think><search>capital of France</search>"
    assert first["segments"][2]["text"].startswith("<snapshot>")
    assert first["summary"]["searches"][0]["ids"].__len__() == 5  # SEEDS-R1 K, not seeds-react's 10
    assert not second["accepted"] and second["reason"] == "wrong_answer"  # gold never observed
    with pytest.raises(ValueError, match="not the SEEDS-R1 protocol"):
        trajectories.method_teacher("react")


# ------------------------------------------------------------------------------ acceptance

def test_acceptance_filter(retriever, examples):
    france = examples[0]
    def play(actions, ex=france):
        return trajectories.play_actions(ex, actions, retriever)

    good = play(["<search>capital France</search>", "<expand>1</expand>", "<answer>Paris</answer>"])
    assert (good["accepted"], good["reason"]) == (True, "correct")
    invalid = play(["I think", "<search>capital France</search>", "<expand>1</expand>", "<answer>Paris</answer>"])
    assert (invalid["accepted"], invalid["reason"]) == (False, "invalid_action")
    unanswered = play(["<search>capital France</search>", "<expand>1</expand>"])
    assert (unanswered["accepted"], unanswered["reason"]) == (False, "no_answer")
    # Wrong answer, gold never observed (the Spree question, only Japanese passages shown) ...
    spree = examples[1]
    blind = play(["<search>Tokyo Japan</search>", "<expand>1</expand>", "<answer>Seine</answer>"], spree)
    assert (blind["accepted"], blind["reason"]) == (False, "wrong_answer")
    # ... and wrong but the gold answer was in an observation: accepted (E.2).
    seen = play(["<search>river Berlin</search>", "<expand>1</expand>", "<answer>Seine</answer>"], spree)
    assert "Spree" in seen["text"] and (seen["accepted"], seen["reason"]) == (True, "gold_observed")
    # An expand must follow every search; a record edited to skip it is rejected.
    skipped = dict(good, segments=[s for s in good["segments"] if "<expand>" not in s["text"]])
    assert trajectories.acceptance(skipped) == (False, "search_without_expand")
    # With the env's require_expand off, the env allows it, the filter does not.
    loose = trajectories.play_actions(france, ["<search>capital France</search>", "<answer>Paris</answer>"], retriever,
                             EnvConfig(require_expand=False))
    assert loose["summary"]["n_invalid"] == 0 and loose["reason"] == "search_without_expand"


def test_train_dev_split_is_deterministic():
    records = [{"id": f"q{i}", "k": k} for i in range(20) for k in range(2)]
    train, dev = trajectories.split_train_dev(records, 0.1, seed=3)
    assert len({r["id"] for r in dev}) == 2 and len(train) + len(dev) == 40
    assert not {r["id"] for r in train} & {r["id"] for r in dev}  # a question's records stay together
    assert trajectories.split_train_dev(records, 0.1, seed=3) == (train, dev)
    assert trajectories.split_train_dev(list(reversed(records)), 0.1, seed=3)[1] == list(reversed(dev))
    assert {r["id"] for r in trajectories.split_train_dev(records, 0.1, seed=4)[1]} != {r["id"] for r in dev}


# ------------------------------------------------------------------------------ token layout

def test_layout_matches_rollout(tokenizer, retriever, examples):
    model = tiny_llama(tokenizer).eval()
    records = collect(examples[:2], retriever)
    for record, example in zip(records, examples):
        texts = [s["text"] for s in record["segments"] if s["role"] == "model"]
        backend = ReplayBackend(model, tokenizer, texts)
        venv = SearchVectorEnv(retriever, num_envs=1, config=EnvConfig())
        (episode,) = collect_rollouts(backend, venv, [example], RolloutConfig(temperature=0.0))
        assert episode.finish_reason == "answer"
        layout = trajectories.tokenize_trajectory(record, tokenizer)
        assert layout["input_ids"] == episode.token_ids
        assert layout["loss_mask"] == episode.loss_mask
        # Closing tags and the final EOS are trained; observations and the prompt are not.
        ids, mask = layout["input_ids"], layout["loss_mask"]
        assert ids[-1] == tokenizer.eos_token_id and mask[-1] == 1
        closing = {tokenizer.convert_tokens_to_ids(t) for t in CLOSING_TAGS}
        assert all(mask[t] == 1 for t, i in enumerate(ids) if i in closing and t >= episode.prompt_length)
        observed = tokenizer.decode([i for i, m in zip(ids[episode.prompt_length:], mask[episode.prompt_length:])
                                     if m == 0])
        assert "<snapshot>" in observed and "<information>" in observed and "<search>" not in observed
        # The episode read back as a record gives the same layout.
        back = trajectories.trajectory_from_episode(episode, tokenizer, example)
        assert back["accepted"] and trajectories.tokenize_trajectory(back, tokenizer) == layout
        rows = trajectories.sft_rows([record], tokenizer)
        assert rows[0]["labels"] == [i if m else -100 for i, m in zip(ids, mask)]
    assert trajectories.sft_rows(records, tokenizer, max_length=10) == []  # too long: dropped, never cut


# ------------------------------------------------------------------------------ training

def test_sft_steps_lower_loss_and_dev_eval_keeps_best(tokenizer, retriever, examples, tmp_path):
    records = collect(examples, retriever)
    train, dev = records[:2], records[2:]
    config = sft.WarmStartConfig(
        model=SFTModelSettings(device="cpu"), run=SFTRunSettings(output_dir=str(tmp_path / "sft")),
        train=SFTTrainSettings(epochs=4, learning_rate=3e-3, batch_size=4, logging_steps=1, warmup_ratio=0.0),
        dev=DevSettings(max_turn_tokens=6, batch_size=2))
    model = tiny_llama(tokenizer)
    rows = trajectories.sft_rows(train * 2, tokenizer)
    trainer = sft.build_trainer(rows, config, model, tokenizer)
    # TRL keeps our labels: loss only on model tokens.
    assert trainer.train_dataset[0]["labels"] == rows[0]["labels"]
    assert trainer.train_dataset[0]["input_ids"] == rows[0]["input_ids"]
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 4 and losses == sorted(losses, reverse=True) and losses[-1] < losses[0] - 0.5

    two_epochs = dataclass_replace(config, train=dataclass_replace(config.train, epochs=2))
    summary = sft.train_sft(train * 2, dev, two_epochs, model=tiny_llama(tokenizer),
                            tokenizer=tokenizer, retriever=retriever)
    assert [h["epoch"] for h in summary["history"]] == [0, 1.0, 2.0]
    assert summary["best_epoch"] in (1.0, 2.0) and summary["dev_questions"] == 2
    saved = LlamaForCausalLM.from_pretrained(summary["model_dir"])
    assert saved.config.hidden_size == 64
    assert json.loads((tmp_path / "sft" / "sft_summary.json").read_text())["model_dir"] == summary["model_dir"]


def test_model_token_loss_equals_causal_lm_loss(tokenizer):
    import torch

    torch.manual_seed(0)
    model = tiny_llama(tokenizer)
    ids = torch.randint(3, 100, (2, 12))
    attention = torch.ones_like(ids)
    attention[1, 9:] = 0  # right padding in row 1
    labels = ids.clone()
    labels[:, :4] = -100  # prompt
    labels[0, 7:9] = -100  # an observation
    labels[1, 9:] = -100
    nll, count = sft.model_token_nll(model, ids, attention, labels, chunk=3)
    reference = model(input_ids=ids, attention_mask=attention, labels=labels).loss  # HF mean over labelled tokens
    assert int(count) == int((labels[:, 1:] != -100).sum())
    assert torch.allclose(nll / count, reference, atol=1e-5)
    labels_changed = labels.clone()
    labels_changed[0, 5] = -100
    other, _ = sft.model_token_nll(model, ids, attention, labels_changed)
    assert not torch.allclose(other, nll)  # the mask matters


def test_turn_weights_give_each_turn_one_unit():
    import torch

    from training.warm_start.sft_trainer import turn_weights

    targets = torch.tensor([[0, 1, 1, 1, 1, 0, 0, 1, 0],  # a 4-token turn, an observation, a 1-token turn
                            [1, 1, 0, 1, 1, 1, 0, 0, 0]]).bool()  # a turn at position 0, then a 3-token turn
    weights = turn_weights(targets)
    expected = torch.tensor([[0, .25, .25, .25, .25, 0, 0, 1, 0],
                             [.5, .5, 0, 1 / 3, 1 / 3, 1 / 3, 0, 0, 0]])
    assert torch.allclose(weights, expected)
    assert float(weights.sum()) == 4.0  # four turns


def test_turn_mean_loss_weighs_a_short_answer_like_a_long_query(tokenizer):
    import torch

    torch.manual_seed(0)
    model = tiny_llama(tokenizer)
    ids = torch.randint(3, 100, (1, 14))
    attention = torch.ones_like(ids)
    labels = torch.full_like(ids, -100)
    labels[0, 2:10] = ids[0, 2:10]  # a long "query" turn (8 labels)
    labels[0, 12:14] = ids[0, 12:14]  # a short "answer" turn (2 labels)
    nll, turns = sft.model_token_nll(model, ids, attention, labels, loss_agg="turn_mean")
    tokens_nll, count = sft.model_token_nll(model, ids, attention, labels)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    token_nll = -logp.gather(1, ids[0, 1:, None])[:, 0]  # (T-1,) nll of token t+1
    query, answer = token_nll[1:9].mean(), token_nll[11:13].mean()
    assert float(turns) == 2.0 and int(count) == 10
    assert torch.allclose(nll / turns, (query + answer) / 2, atol=1e-5)
    assert torch.allclose(tokens_nll / count, token_nll[1:9].sum() / 10 + token_nll[11:13].sum() / 10, atol=1e-5)
    with pytest.raises(ValueError, match="loss_agg"):
        SFTTrainSettings(loss_agg="sequence_mean")


def dataclass_replace(config, **changes):
    import dataclasses

    return dataclasses.replace(config, **changes)


def test_lora_merge_and_warm_start_entry(tokenizer, retriever, tmp_path):
    base = tmp_path / "tiny"
    tiny_llama(tokenizer).save_pretrained(base)
    tokenizer.save_pretrained(base)
    examples = [QAExample(f"w{i}", q, (a,)) for i, (q, a) in enumerate(
        [("What is the capital of France?", "Paris"), ("Which river flows through Berlin?", "Spree"),
         ("What is the capital of Japan?", "Tokyo"), ("Which river flows through Vienna?", "Danube")])]
    from training.config import PPOConfig, with_values

    ppo_cfg = with_values(PPOConfig,
                          {"model.name": str(base), "run.output_dir": str(tmp_path / "ppo"), "run.seed": 0,
                           "env": {"max_searches": 2},
                           "warm_start": {"lora": {"r": 4, "alpha": 8},
                                          "train": {"epochs": 1, "batch_size": 2, "learning_rate": 1e-3},
                                          "dev": {"enabled": True, "limit": 1, "max_turn_tokens": 8}}})
    # warm_start collects on default questions; here the run is pointed at the four examples above.
    original = sft.load_examples
    sft.load_examples = lambda config: examples
    try:
        path = sft.warm_start(ppo_cfg, retriever=retriever)
    finally:
        sft.load_examples = original
    out = tmp_path / "ppo" / "sft"
    assert path == str(out / "model") and (out / "adapter" / "adapter_config.json").is_file()
    merged = LlamaForCausalLM.from_pretrained(path)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    resolved = sft.WarmStartConfig.from_yaml(out / "config.yaml")
    assert resolved.teacher.expand == "random" and resolved.model.lora.enabled and resolved.train.epochs == 1
    assert resolved.model.lora.r == 4 and resolved.env["max_searches"] == 2
    assert resolved.env["candidates_per_search"] == 5
    stats = json.loads((out / "acceptance.json").read_text())
    assert stats["accepted"] == 4 and stats["train"] + stats["dev"] == 4


def test_cli_config_and_collect_only(tokenizer, retriever, examples, tmp_path, monkeypatch):
    recipe = tmp_path / "sft.yaml"
    recipe.write_text("model: {name: tiny}\ntrain: {epochs: 5}\nteacher: {expand: random}\n")
    config, args = sft.resolve_config(["--config", str(recipe), "--train.epochs", "2", "--model.lora.enabled", "true",
                                       "--run.output-dir", str(tmp_path / "out"), "--collect-only", "--env.top_k", "3"])
    assert (config.model.name, config.train.epochs, config.model.lora.enabled, config.teacher.expand) == (
        "tiny", 2, True, "random")
    assert args.collect_only and config.run.output_dir == str(tmp_path / "out") and config.env == {"top_k": 3}
    config = dataclass_replace(config, env={})
    for bad in (["--no_such_field", "1"], ["--train.epochs", "two"], ["--teacher.kind", "oracle"]):
        with pytest.raises(SystemExit):
            sft.resolve_config(bad)
    result = sft.run(config, collect_only=True, retriever=retriever, examples=examples, tokenizer=tokenizer)
    assert result["accepted"] == 4
    lines = (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == [e.id for e in examples]
    assert sft.WarmStartConfig.from_yaml(tmp_path / "out" / "config.yaml") == config
    assert sft.WarmStartConfig.from_yaml("configs/sft/default.yaml").teacher.kind == "scripted"
    # Training from the file re-judges every record with the filter.
    record = json.loads(lines[0])
    assert trajectories.acceptance(record) == (record["accepted"], record["reason"])
    assert isinstance(parse_action(record["segments"][3]["text"]), ExpandAction)


def test_group_by_length_batches_rows_of_similar_length(tokenizer):
    """``group_by_length``: short rows (verdicts judged alone) are batched with short rows rather than
    padded to a whole episode's length (transformers' sampler sorts within mega-batches of
    min(rows // (4 · batch), 50) batches); every row is still seen once per epoch."""
    rows = []
    for k in range(48):  # one long row, then three short ones, as SFT lays out an episode and its verdicts
        rows += [{"input_ids": [5 + k] * 60, "labels": [5 + k] * 60}] if k % 4 == 0 else []
        rows += [{"input_ids": [100 + k] * 6, "labels": [-100] * 5 + [100 + k]}]

    def padded_cells(group_by_length: bool) -> tuple[int, list[int]]:
        config = sft.WarmStartConfig(model=SFTModelSettings(device="cpu"), run=SFTRunSettings(output_dir="unused"),
                                     train=SFTTrainSettings(batch_size=4, group_by_length=group_by_length))
        loader = sft.build_trainer(rows, config, tiny_llama(tokenizer), tokenizer).get_train_dataloader()
        batches = [batch["input_ids"] for batch in loader]
        return sum(b.numel() for b in batches), sorted(int(b[i, (b[i] != 0).nonzero().max()]) for b in batches
                                                       for i in range(len(b)))

    grouped, seen = padded_cells(True)
    shuffled, seen_shuffled = padded_cells(False)
    assert grouped < 0.7 * shuffled
    assert seen == seen_shuffled == sorted(r["input_ids"][-1] for r in rows)
