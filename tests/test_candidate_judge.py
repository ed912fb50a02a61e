"""Per-candidate yes/no judgements (training/candidate_judge.py) on a tiny random Llama (CPU, fast)."""
from __future__ import annotations

import math

import pytest
import torch
from tiny_models import tiny_llama, tiny_tokenizer

from envs.config import EnvConfig
from envs.search_env import SearchEnv
from training.candidate_judge import (
    JudgePrompts,
    SplitDecoder,
    action_logprobs,
    expand_action,
    judge_logits,
    parse_snapshot,
    two_way_entropy,
)

CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
QUESTION = "What is the capital of France?"
PREVIEWS = ["Paris: Paris is the capital and largest city of France.", "Berlin: Berlin is the capital of Germany.",
            "Seine: The Seine is a river in northern France that flows through Paris into the English Channel."]


@pytest.fixture(scope="module")
def tokenizer():
    tok = tiny_tokenizer()
    tok.add_tokens(["yes", "no"])
    return tok


@pytest.fixture(scope="module")
def lm(tokenizer):
    return tiny_llama(tokenizer, seed=3)


def test_parse_snapshot_reads_the_env_observation(retriever, examples):
    env = SearchEnv(retriever, examples, EnvConfig(shuffle_candidates=True))
    env.reset(seed=1, options={"example": examples[0]})
    obs, *_ = env.step("<search>capital of France</search>")
    previews = parse_snapshot(obs)
    assert len(previews) == 5
    assert [p.split(":")[0] for p in previews] == [h.title for h in env.episode.latest.hits]
    two_lines = "<snapshot>\n[1] A: first line\nsecond line [3] not a number\n[2] B: text\n</snapshot>"
    assert parse_snapshot(two_lines) == ["A: first line\nsecond line [3] not a number", "B: text"]
    assert parse_snapshot("<snapshot>\nNo results.\n</snapshot>") == []


def test_expand_action_lists_the_yes_candidates():
    assert expand_action([False, True, False, True]) == "<expand>2, 4</expand>"
    assert expand_action([False, False]) == "<expand>none</expand>"
    assert expand_action([]) == "<expand>none</expand>"


@pytest.mark.parametrize("chat", [False, True])
def test_prompt_pieces_rebuild_the_rendered_prompt(tokenizer, chat):
    tok = tokenizer
    if chat:
        tok = tiny_tokenizer()
        tok.add_tokens(["yes", "no"])
        tok.chat_template = CHAT
    prompts = JudgePrompts(tok)
    assert prompts.chat is chat
    for preview in PREVIEWS:
        ids = prompts.prefix_ids(QUESTION) + prompts.candidate_ids(QUESTION, preview)
        text = tok.decode(ids, skip_special_tokens=False)
        assert text.replace("<s>", "").replace(" ", "") == prompts._render(QUESTION, preview).replace(" ", "")
        assert QUESTION in text and preview in text
    assert prompts.answer_ids() == (tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no"))
    bare = tiny_tokenizer()
    with pytest.raises(ValueError, match="one"):
        JudgePrompts(bare).answer_ids()  # "yes" is several BPE pieces there


def _full_logits(lm, prefix, cands, answer_ids):
    rows = [lm(torch.tensor([prefix + c])).logits[0, -1, list(answer_ids)] for c in cands]
    return torch.stack(rows)


@pytest.mark.parametrize("split", [0, 1, 2])
def test_split_decoder_matches_the_full_forward(lm, tokenizer, split):
    prompts = JudgePrompts(tokenizer)
    answer_ids = prompts.answer_ids()
    prefix = prompts.prefix_ids(QUESTION)
    cands = [prompts.candidate_ids(QUESTION, p) for p in PREVIEWS]
    assert len({len(c) for c in cands}) > 1  # padding is exercised
    decoder = SplitDecoder(lm, split)
    h_prefix, h_cands = decoder.bottom(prefix, cands)
    assert h_prefix.shape == (len(prefix), 64) and [h.shape[0] for h in h_cands] == [len(c) for c in cands]
    with torch.no_grad():
        logits, final = judge_logits(decoder, [(h_prefix, h_cands), (h_prefix, h_cands[:1])], answer_ids)
        full = _full_logits(lm, prefix, cands, answer_ids)
    assert logits.shape == (4, 2) and final.shape == (4, 64)
    torch.testing.assert_close(logits[:3], full, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[3], full[0], atol=1e-4, rtol=1e-4)
    vocab = decoder.vocab_logits(final)
    torch.testing.assert_close(vocab[:, list(answer_ids)], logits, atol=1e-5, rtol=1e-5)
    assert all(isinstance(layer, torch.nn.Module) and type(layer).__name__ != "_PassThrough" for layer in lm.model.layers)


def test_split_decoder_gradients_match_the_full_forward(lm, tokenizer):
    """The top layers' gradients through the cached prefix equal those of the plain forward pass."""
    prompts = JudgePrompts(tokenizer)
    answer_ids = prompts.answer_ids()
    prefix = prompts.prefix_ids(QUESTION)
    cands = [prompts.candidate_ids(QUESTION, p) for p in PREVIEWS]
    top_params = list(lm.model.layers[1].parameters())
    weights = torch.tensor([[1.0, -2.0], [0.5, 3.0], [-1.0, 1.0]])

    def grads(loss):
        for p in top_params:
            p.grad = None
        loss.backward()
        return [p.grad.clone() for p in top_params]

    lm.requires_grad_(True)
    decoder = SplitDecoder(lm, 1)
    h_prefix, h_cands = decoder.bottom(prefix, cands)
    logits, _ = judge_logits(decoder, [(h_prefix, h_cands)], answer_ids)
    split_grads = grads((logits * weights).sum())
    full_grads = grads((_full_logits(lm, prefix, cands, answer_ids) * weights).sum())
    lm.requires_grad_(False)
    for a, b in zip(split_grads, full_grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    assert any(g.abs().sum() > 0 for g in split_grads)


def test_two_way_logprobs_and_entropy():
    logits = torch.tensor([[2.0, 0.0], [0.0, 0.0], [-1.0, 3.0]])
    opened = torch.tensor([True, False, False])
    p_yes = 1 / (1 + math.exp(-2.0))
    expected = torch.tensor([math.log(p_yes), math.log(0.5), math.log(1 / (1 + math.exp(-4.0)))])
    torch.testing.assert_close(action_logprobs(logits, opened), expected)
    entropy = two_way_entropy(logits)
    torch.testing.assert_close(entropy[1], torch.tensor(math.log(2.0)))
    h0 = -(p_yes * math.log(p_yes) + (1 - p_yes) * math.log(1 - p_yes))
    torch.testing.assert_close(entropy[0], torch.tensor(h0))
