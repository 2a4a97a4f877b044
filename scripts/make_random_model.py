"""Write a randomly initialised Llama-shaped model (no download) with the embedded SmolLM2 tokenizer.

For measuring what a model size costs (memory, step time) without fetching weights:

    python scripts/make_random_model.py --out /tmp/llama-0.7b                 # ~0.68B parameters
    python benchmarks/bench_step.py --lora-rank 32 actor_rollout_ref.model.path=/tmp/llama-0.7b

The default shape (hidden 1536, 24 layers, MLP 4096, 24 heads of 64, 8 KV heads, SmolLM2's 49152-token
vocabulary, tied embeddings) has 0.68B parameters; weights are N(0, 0.02), saved in ``--dtype``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

logger = logging.getLogger("make_random_model")


def build(out: Path, hidden: int, layers: int, mlp: int, heads: int, kv_heads: int, dtype: str, seed: int) -> int:
    """Write the model and tokenizer into ``out``; returns the parameter count."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from hybrid_rl.workers.model_loader import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct"))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                         max_position_embeddings=2048, tie_word_embeddings=True, rope_theta=10000.0,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, dtype=dtype)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write (an HF model folder)")
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--mlp", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=24)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    count = build(Path(args.out), args.hidden, args.layers, args.mlp, args.heads, args.kv_heads, args.dtype, args.seed)
    logger.info("wrote a random %.2fB-parameter Llama to %s", count / 1e9, args.out)


if __name__ == "__main__":
    main()
