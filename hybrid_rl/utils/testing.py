"""Tiny, hub-free models and tokenizers for tests, examples and smoke runs.

Nothing here downloads anything: the tokenizer is a byte-level BPE with no merges (every byte is a
token) plus ChatML special tokens, and the model is a randomly initialised Llama built from a config.
Both save to an ordinary HF folder, so every code path (FSDP, HF generate, vLLM) loads them exactly
like a real checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Iterator

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_byte_tokenizer(extra_special_tokens: tuple[str, ...] = (), chat_template: str = CHAT_TEMPLATE):
    """A ``PreTrainedTokenizerFast`` over raw bytes: 3 special tokens (ids 0-2) + 256 byte tokens.

    eos = ``<|im_end|>`` (id 2), pad = ``<|endoftext|>`` (id 0); ChatML chat template by default.
    ``extra_special_tokens`` come after the three (shifting every byte's id: another tokenizer over
    the same text, for tokenizer-mismatch tests).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = SPECIAL_TOKENS + list(extra_special_tokens)
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    hf_tok.chat_template = chat_template
    return hf_tok


def tiny_llama_config(vocab_size: int = 320, **overrides):
    """A 2-layer Llama config (~0.3M params). head_dim 64 so vLLM's CPU attention accepts it."""
    from transformers import LlamaConfig

    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
        dtype="float32",
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def build_tiny_model_dir(path: str | os.PathLike, seed: int = 0, **config_overrides) -> str:
    """Write a randomly initialised tiny Llama + byte tokenizer to ``path``; return it as a string.

    Deterministic for a given ``seed``. Re-uses an existing folder if ``config.json`` is there.
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return str(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_byte_tokenizer()
    config = tiny_llama_config(**config_overrides)
    assert len(tokenizer) <= config.vocab_size, "tokenizer larger than the model's vocab"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        # Larger init than the default 0.02 so a random tiny model is not uniform: tests can see
        # a weight update change the sampled tokens.
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.2)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return str(path)


@contextlib.contextmanager
def library_warnings(logger: str = "transformers") -> Iterator[list[str]]:
    """The messages of WARNING or above that ``logger`` (or a child) records inside the block, whatever
    handlers and streams the library set up (they print to a stream captured before the test)."""
    messages: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger(logger).addHandler(handler)
    try:
        yield messages
    finally:
        logging.getLogger(logger).removeHandler(handler)
