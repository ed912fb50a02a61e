"""A synthetic search world where the right candidate is learnable: the learning test's world
(``tests/test_learning.py``), the yardstick of ``scripts/compare_estimators.py`` and the world of
``scripts/gpu_check.py``. Not part of the package: scripts and tests import it as ``scripts.box_world``.

Every search shows five boxes; the first holds something (the positive), the four others are empty.
The policy judges each box in the judgement form (``expand_form: judge``; :data:`ALONE_ENV`: each box
judged in a context of its own, ``judge_context: alone``). The reward counts only what
was opened (+1 for the full box, −0.25 per empty one, −0.1 per invalid action), so opening all and
opening none both score 0 and only credit assignment can raise it. The policy is a tiny random Llama
(2 layers, width 64) over a tokenizer trained here, warm-started by the scripted teacher that opens
two RANDOM boxes (it teaches the protocol, not which box).
"""
from __future__ import annotations

import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from envs.protocol import JUDGE_QUESTION, JUDGE_WORDS, STREAM_FORM
from envs.types import Hit, Passage, QAExample
from methods.prompts import r1
from training.config import LoraSettings, PPOConfig, with_values
from training.sft import run as run_sft
from training.sft_config import (
    DevSettings,
    SFTModelSettings,
    SFTRunSettings,
    SFTTrainSettings,
    TeacherSettings,
    WarmStartConfig,
)
from training.teachers.trajectories import sft_rows
from training.warm_start.sft_collect import collect

KEYS = ["amber", "basil", "cedar", "delta", "ember", "flint", "grove", "heron"]
TAGS = ["<search>", "</search>", "<expand>", "</expand>", "<answer>", "</answer>", "<snapshot>", "</snapshot>",
        "<information>", "</information>"]
ENV = {"max_actions": 3, "max_searches": 1, "expand_form": "judge", "shuffle_candidates": False,
       "candidates_per_search": 5, "max_expand": 5, "preview": {"max_tokens": 12}, "max_obs_tokens": 200,
       "reward": {"answer_weight": 0.0, "format_penalty": 0.1, "positive_opened_bonus": 1.0,
                  "negative_opened_penalty": 0.25, "missed_positive_penalty": 0.0}}
ALONE_ENV = {**ENV, "judge_context": "alone"}  # a box's verdict sees its title and text, not its number


def world(n_questions: int = 120, seed: int = 0) -> tuple[list[Passage], list[QAExample]]:
    """Boxes ``0..n−1`` each hold a key (box t: ``KEYS[t % len(KEYS)]``); as many boxes again are
    empty. Question t ("Ticket t: which box holds the <key>?") is answered by every box that holds
    something (all of them are its positives); the ticket only makes the questions distinct, so the
    held-out questions are new ones."""
    passages = [Passage(t, f"b{t}", f"Box {t}", f"It holds the {KEYS[t % len(KEYS)]}.") for t in range(n_questions)]
    empty = [Passage(t, f"b{t}", f"Box {t}", "It is empty.") for t in range(n_questions, 2 * n_questions)]
    order = random.Random(seed).sample(range(n_questions), n_questions)
    questions = [QAExample(f"q{t}", f"Which box is full? {t}",
                           tuple(p.title for p in passages), positive_ids=tuple(p.id for p in passages))
                 for t in order]
    return passages + empty, questions


class BoxRetriever:
    """Five boxes for any query: first one that holds something, then four empty ones, drawn with a
    generator seeded by the query (so whatever query the policy wrote, box [1] is the positive)."""

    def __init__(self, passages: list[Passage]):
        self.corpus = passages
        self.holders = [p for p in passages if p.text != "It is empty."]
        self.empty = [p for p in passages if p.text == "It is empty."]

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        out = []
        for query in queries:
            rng = random.Random(query)
            chosen = [rng.choice(self.holders)] + rng.sample(self.empty, k - 1)
            out.append([Hit.from_passage(p, 1.0 / (r + 1), r + 1) for r, p in enumerate(chosen)])
        return out


def box_tokenizer(passages: list[Passage], questions: list[QAExample]) -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<pad>", "<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = [r1.SEEDS_R1_JUDGE] + [f"[{p.row % 5 + 1}] {p.title}: {p.text}" for p in passages[::2]]
    text += [q.question for q in questions] + [JUDGE_QUESTION.format(number=i) for i in range(1, 6)]
    bpe.train_from_iterator(text * 20, trainer)
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  clean_up_tokenization_spaces=False)
    tok.add_tokens(TAGS + list(JUDGE_WORDS) + [f" {k}" for k in KEYS])
    return tok


def random_llama(tokenizer, init: float = 0.3, seed: int = 0, context: int = 4096) -> LlamaForCausalLM:
    """A 2-layer, 64-wide Llama over ``tokenizer``, randomly initialised with ``seed``."""
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context, initializer_range=init,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def build(folder: str | Path) -> dict:
    """The world, its tokenizer and the random base policy saved under ``folder/base``."""
    torch.manual_seed(0)
    passages, questions = world()
    tok = box_tokenizer(passages, questions)
    folder = Path(folder)
    base = folder / "base"
    random_llama(tok, init=0.02).save_pretrained(base)
    tok.save_pretrained(base)
    return {"passages": passages, "train": questions[:96], "held_out": questions[96:], "tok": tok, "base": base,
            "folder": folder, "retriever": BoxRetriever(passages)}


def warm_start_config(setup, env: dict | None = None, name: str = "sft") -> WarmStartConfig:
    """The scripted teacher opening two random boxes; 30 epochs (TRL) on the training questions.
    Judged alone, its verdicts are shown, not trained (``train_verdicts`` off: no verdict rows)."""
    env = dict(env or ENV)
    return WarmStartConfig(
        model=SFTModelSettings(name=str(setup["base"]), dtype="float32", device="cpu"), env=env,
        teacher=TeacherSettings(think=False, random_expand=2, second_search=False, num_envs=16),
        train=SFTTrainSettings(train_verdicts=env.get("judge_context", "stream") != "alone", epochs=30,
                               learning_rate=3e-3, batch_size=16, warmup_ratio=0.0, max_length=1024),
        dev=DevSettings(enabled=False, fraction=0.0), run=SFTRunSettings(output_dir=str(setup["folder"] / name)))


def warm_start(setup, env: dict | None = None, name: str = "sft") -> str:
    """The SFT warm start of the learning test (``training.sft.run``) in ``env`` (default
    :data:`ENV`) under ``folder/name``; returns the model folder."""
    result = run_sft(warm_start_config(setup, env, name), retriever=setup["retriever"], examples=setup["train"],
                     tokenizer=setup["tok"])
    return result["model_dir"]


def protocol_policy(setup, device: str | torch.device, dtype: torch.dtype, steps: int = 60,
                    batch_size: int = 16) -> LlamaForCausalLM:
    """A random policy taught the protocol by a few plain supervised steps on the scripted
    teacher's episodes, without TRL (for machines that lack it, e.g. ``scripts/gpu_check.py``):
    it searches, judges and answers, so its rewards differ between samples."""
    config = warm_start_config(setup)
    records = collect(config, setup["train"], setup["retriever"], tokenizer=setup["tok"])
    rows = sft_rows(records, setup["tok"], max_length=config.train.max_length, form=STREAM_FORM)
    model = random_llama(setup["tok"], init=0.02).to(device=device, dtype=dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.learning_rate)
    pad = setup["tok"].pad_token_id
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        picked = [rows[i] for i in torch.randint(len(rows), (batch_size,), generator=generator).tolist()]
        width = max(len(r["input_ids"]) for r in picked)
        ids = torch.tensor([r["input_ids"] + [pad] * (width - len(r["input_ids"])) for r in picked], device=device)
        labels = torch.tensor([r["labels"] + [-100] * (width - len(r["labels"])) for r in picked], device=device)
        loss = model(input_ids=ids, attention_mask=(labels != -100) | (ids != pad), labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model.eval()


def ppo_config(setup, sft_dir: str, overrides: dict | None = None) -> PPOConfig:
    """The box world's PPO config; ``overrides``: ``{"section.field": value}`` on top."""
    values = {"model.name": sft_dir, "model.sft_checkpoint": sft_dir, "model.dtype": "float32",
              "model.lora": LoraSettings(enabled=False), "env_config": None, "env": dict(ENV),
              "rollout.questions_per_update": 4, "rollout.samples_per_question": 8, "rollout.num_envs": 32,
              "rollout.rollout_batch_size": 32, "rollout.max_turn_tokens": 16, "rollout.max_context_tokens": 512,
              "optim.updates": 20, "optim.ppo_epochs": 4, "optim.mini_batches": 1, "optim.micro_batch_size": 32,
              "optim.lr_actor": 1e-3, "algorithm.advantage": "grpo", "algorithm.entropy_coef": 0.0,
              "algorithm.kl_coef": 0.0, "algorithm.old_logprobs": "recompute", "evaluation.eval_questions": 24,
              "run.output_dir": str(setup["folder"] / "ppo"), "run.export": False, "run.save_every": 1000,
              "run.log_samples": 0, "run.seed": 0}
    return with_values(PPOConfig, {**values, **(overrides or {})})
