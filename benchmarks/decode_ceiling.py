"""The decode ceiling of this machine for a model: how many tokens/s batched decoding could reach.

One decode step of ``rows`` sequences reads every weight once (the LM head included) and each
row's KV cache, and does ``2 x matmul parameters x rows`` FLOPs. Both are measured here, not taken
from a data sheet:

- memory bandwidth: the median time to sum a 512 MiB buffer (read-bound), with this process's
  threads;
- matmul FLOP/s at the batch's row count: ``x [rows, in] @ W [in, out]`` for every distinct linear
  shape of the model, in the engine's dtype, weighted by how often each shape occurs.

The ceiling step time is the larger of the two times (a roofline: the step can go no faster than
its memory traffic or its matmuls); the ceiling is ``rows / step time`` tokens/s. Attention
scores, norms, the sampler and the engine's own per-step work are not counted: the gap between the
measured rollout and the ceiling is where they go.

    python benchmarks/decode_ceiling.py --rows 1 8 32 64     # standalone, on the embedded SmolLM2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from typing import Any

import torch

BANDWIDTH_BUFFER_BYTES = 512 * 2**20


def memory_bandwidth(repeats: int = 7) -> float:
    """Read bandwidth in bytes/s: the median time to ``sum`` a 512 MiB fp32 buffer."""
    buf = torch.ones(BANDWIDTH_BUFFER_BYTES // 4)
    buf.sum()  # fault the pages in before timing
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        buf.sum()
        times.append(time.perf_counter() - start)
    return BANDWIDTH_BUFFER_BYTES / statistics.median(times)


def linear_shapes(hf_config: Any) -> Counter:
    """``{(in, out): count}`` of the decoder's matmuls per token (Llama/Qwen/Mistral layout) and
    the LM head."""
    c = getattr(hf_config, "text_config", None) or hf_config
    hidden, heads = c.hidden_size, c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or hidden // heads
    layers, mlp = c.num_hidden_layers, c.intermediate_size
    shapes: Counter = Counter()
    shapes[(hidden, heads * head_dim)] += layers  # q
    shapes[(hidden, kv_heads * head_dim)] += 2 * layers  # k, v
    shapes[(heads * head_dim, hidden)] += layers  # o
    shapes[(hidden, mlp)] += 2 * layers  # gate, up
    shapes[(mlp, hidden)] += layers  # down
    shapes[(hidden, c.vocab_size)] += 1  # LM head
    return shapes


def matmul_seconds(shapes: Counter, rows: int, dtype: torch.dtype, min_time_s: float = 0.05) -> float:
    """Measured time of one token step's matmuls at ``rows`` rows: the sum over shapes of count x
    the median time of one ``[rows, in] @ [in, out]`` matmul."""
    total = 0.0
    for (d_in, d_out), count in shapes.items():
        x, w = torch.randn(rows, d_in, dtype=dtype), torch.randn(d_in, d_out, dtype=dtype)
        x @ w  # warm-up (oneDNN primitive creation)
        reps, elapsed = 0, 0.0
        start = time.perf_counter()
        while elapsed < min_time_s or reps < 3:
            x @ w
            reps += 1
            elapsed = time.perf_counter() - start
        total += count * elapsed / reps
    return total


def decode_ceiling(hf_config: Any, rows: int, context: int, dtype: torch.dtype,
                   bandwidth: float | None = None) -> dict[str, float]:
    """Ceiling tokens/s for ``rows`` sequences decoding at ``context`` tokens of KV each, and its parts."""
    from hybrid_rl.workers.rollout.vllm_rollout import kv_bytes_per_token

    shapes = linear_shapes(hf_config)
    matmul_params = sum(d_in * d_out * n for (d_in, d_out), n in shapes.items())
    bandwidth = bandwidth or memory_bandwidth()
    weight_bytes = matmul_params * dtype.itemsize
    kv_bytes = rows * context * kv_bytes_per_token(hf_config, dtype)
    memory_s = (weight_bytes + kv_bytes) / bandwidth
    compute_s = matmul_seconds(shapes, rows, dtype)
    step_s = max(memory_s, compute_s)
    return {"rows": rows, "bandwidth_gb_s": bandwidth / 1e9, "weight_gb": weight_bytes / 1e9,
            "kv_gb": kv_bytes / 1e9, "memory_ms": 1e3 * memory_s, "matmul_ms": 1e3 * compute_s,
            "matmul_tflop_s": 2 * matmul_params * rows / compute_s / 1e12,
            "bound": "memory" if memory_s >= compute_s else "matmul", "ceiling_tok_s": rows / step_s}


def main() -> None:
    from hybrid_rl.utils.precision import resolve_dtype
    from hybrid_rl.workers.model_loader import load_hf_config, resolve_model_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--context", type=int, default=160, help="KV tokens per row (prompt + half the response)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    args = parser.parse_args()
    hf_config = load_hf_config(resolve_model_path(args.model))
    dtype = getattr(torch, resolve_dtype(args.dtype, "cpu", "rollout"))
    bandwidth = memory_bandwidth()
    print(f"CPU {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads, {dtype}, "
          f"read bandwidth {bandwidth / 1e9:.1f} GB/s")
    for rows in args.rows:
        c = decode_ceiling(hf_config, rows, args.context, dtype, bandwidth)
        print(f"rows {rows:4d}: weights {c['weight_gb']:.3f} GB + KV {c['kv_gb']:.3f} GB -> {c['memory_ms']:.1f} ms; "
              f"matmuls {c['matmul_ms']:.1f} ms ({c['matmul_tflop_s']:.2f} TFLOP/s); {c['bound']}-bound; "
              f"ceiling {c['ceiling_tok_s']:.0f} tok/s")


if __name__ == "__main__":
    main()
