"""Tiny models for fast CPU tests: a byte-level BPE tokenizer trained on the SEEDS-R1 prompt and
the toy corpus (protocol tags as single tokens), a 2-layer, 64-wide random Llama over it, and a
3-layer random Gemma 3 whose first two layers attend through a short sliding window."""
from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from methods.prompts import r1
from scripts.box_world import random_llama
from tests.conftest import PASSAGES

STATES = ["?\n", "</snapshot>\n", "</information>\n"]
TAGS = ["<search>", "</search>", "<expand>", "</expand>", "<answer>", "</answer>"]
WORDS = [" capital", " France", " 1", " Paris", " yes", " no"]  # " yes"/" no": the verdict tokens


def bpe_tokenizer(texts: list[str], vocab_size: int, repeats: int = 10, added: list[str] = (),
                  **options) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``texts`` (each ``repeats`` times) with <pad>/<s>/</s>, a BOS
    prepended to every encoding, and ``added`` pieces as single tokens."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(list(texts) * repeats, trainer)
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  **options)
    if added:
        tok.add_tokens(list(added))
    return tok


def tiny_tokenizer(vocab_size: int = 600) -> PreTrainedTokenizerFast:
    text = [r1.SEEDS_R1] + [f"{title}: {body}" for _, title, body in PASSAGES]
    return bpe_tokenizer(text, vocab_size, added=STATES + TAGS + WORDS, clean_up_tokenization_spaces=False)


def script_weights(lm, chain: dict[int, int], head_value: float):
    """Make ``lm`` a lookup table: attention and MLP outputs zeroed, so the next token depends on
    the current one only, and each ``token -> successor`` of ``chain`` gets logit ``head_value``
    times the RMSNorm's scale (8 for these widths) through orthonormal embedding rows."""
    with torch.no_grad():
        for layer in lm.model.layers:  # residual stream = token embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = lm.model.embed_tokens.weight, lm.lm_head.weight
        head.zero_()
        for k, (token, successor) in enumerate(chain.items()):
            embed[token] = 0.0
            embed[token, k] = 1.0  # after the RMSNorm: 8 at position k
            head[successor, k] = head_value
    return lm


def tiny_llama(tokenizer, init: float = 0.3, seed: int = 0, context: int = 4096) -> LlamaForCausalLM:
    return random_llama(tokenizer, init=init, seed=seed, context=context)


def tiny_gemma3(tokenizer, window: int = 6, init: float = 0.3, seed: int = 0) -> Gemma3ForCausalLM:
    """Layers: sliding (``window`` tokens), sliding, full attention; so every turn of an episode
    reaches past the window."""
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=window,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"], max_position_embeddings=4096,
        initializer_range=init, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return Gemma3ForCausalLM(config).eval()
