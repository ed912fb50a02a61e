"""The learning test (the CartPole of this trainer): the real SFT and PPO entry points, a tiny
random Llama and a synthetic corpus where the right candidate is learnable must end clearly above
where they started and above chance.

The world: every search shows five boxes; exactly one holds something (the positive) and it is
shown first, the four others are empty. The policy judges each box in the interleaved judgement
form (``expand_form: judge``: a box's preview, then ONE verdict token). The warm start imitates
the scripted teacher, which opens two RANDOM boxes: it teaches the protocol (copy the question into
the query, one verdict per box, copy a title into the answer) but not which box to open, so its
greedy policy opens none. The reward counts only what was opened (+1 for the positive, −0.25 for
each empty box: opening all and opening none both score 0; −0.1 per invalid action, which keeps
the greedy policy on the protocol: without it one seed in five drifted into invalid actions that
sampling forgave), so only PPO's per-token credit assignment can raise it: to 1.0 when it learns
"yes" after candidate [1] and "no" after the others. Seeds 0–4 all pass (seed 2 at precision 0.62).

Why the right box is recognisable by its number and not by its contents: a 2-layer random model
did not learn to tell "It holds the amber." from "It is empty." through PPO within 40 updates
(both open rates moved together); whether the main job learns content on SmolLM2 is measured in the
README ("Training SEEDS-R1"). The trainer runs as the main job does: constrained verdicts (two-way
log-probs) and a group baseline (``advantage: grpo``, no critic). Broken trainers fail this test
(checked by hand, README): a flipped advantage sign, a zeroed loss mask, or a skipped optimizer step.
"""
from __future__ import annotations

import dataclasses
import random
import re

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from envs.protocol import JUDGE_QUESTION, JUDGE_WORDS
from envs.types import Hit, Passage, QAExample
from methods.prompts import r1
from tests.tiny_models import tiny_llama
from training.config import LoraSettings, PPOConfig
from training.sft import run as run_sft
from training.sft_config import WarmStartConfig

KEYS = ["amber", "basil", "cedar", "delta", "ember", "flint", "grove", "heron"]
TAGS = ["<search>", "</search>", "<expand>", "</expand>", "<answer>", "</answer>", "<snapshot>", "</snapshot>",
        "<information>", "</information>"]
ENV = {"max_actions": 3, "max_searches": 1, "expand_form": "judge", "shuffle_candidates": False, "top_k": 5,
       "max_expand": 5, "preview": {"max_tokens": 12}, "max_obs_tokens": 200,
       "reward": {"answer_weight": 0.0, "format_penalty": 0.1, "positive_opened_bonus": 1.0, "negative_opened_penalty": 0.25,
                  "missed_positive_penalty": 0.0}}


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


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.manual_seed(0)
    passages, questions = world()
    tok = box_tokenizer(passages, questions)
    folder = tmp_path_factory.mktemp("learning")
    base = folder / "base"
    tiny_llama(tok, init=0.02).save_pretrained(base)
    tok.save_pretrained(base)
    return {"passages": passages, "train": questions[:96], "held_out": questions[96:], "tok": tok, "base": base,
            "folder": folder, "retriever": BoxRetriever(passages)}


def warm_start(setup) -> str:
    config = WarmStartConfig(model=str(setup["base"]), dtype="float32", device="cpu",
                             output_dir=str(setup["folder"] / "sft"), env=dict(ENV), teacher_think=False,
                             teacher_random_expand=2, teacher_second_search=False, epochs=30,
                             learning_rate=3e-3, batch_size=16, warmup_ratio=0.0, dev_eval=False, dev_fraction=0.0,
                             max_length=1024, num_envs=16)
    result = run_sft(config, retriever=setup["retriever"], examples=setup["train"], tokenizer=setup["tok"])
    return result["model_dir"]


def ppo_config(setup, sft_dir: str, **overrides) -> PPOConfig:
    values = dict(model=sft_dir, sft_checkpoint=sft_dir, dtype="float32", env_config=None, env=dict(ENV),
                  lora=LoraSettings(enabled=False), questions_per_update=4, samples_per_question=8, num_envs=32,
                  rollout_batch_size=32, max_turn_tokens=16, max_context_tokens=512, updates=20, ppo_epochs=4,
                  mini_batches=1, micro_batch_size=32, lr_actor=1e-3, advantage="grpo",
                  entropy_coef=0.0, kl_coef=0.0, eval_questions=24, output_dir=str(setup["folder"] / "ppo"),
                  export=False, save_every=1000, log_samples=0, old_logprobs="recompute", seed=0)
    values.update(overrides)
    return PPOConfig(**values)


def test_ppo_learns_which_box_to_open(setup):
    from training.ppo import train

    sft_dir = warm_start(setup)
    result = train(ppo_config(setup, sft_dir), retriever=setup["retriever"], examples=setup["train"],
                   eval_examples=setup["held_out"])
    precision, reward = result["comparison"]["precision"], result["comparison"]["reward"]
    print("learning test:", result["comparison"])
    assert precision["after"] >= precision["before"] + 0.5  # far above where PPO started (opens none)
    assert precision["after"] >= 0.6  # and far above chance (one box of five: 0.2)
    assert reward["after"] >= 0.5 and reward["lo"] > 0  # the gain's paired bootstrap interval excludes 0
