"""benchmarks/decode_ceiling.py: the matmul shapes it times are exactly the model's linear layers."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from decode_ceiling import decode_ceiling, linear_shapes  # noqa: E402


def test_linear_shapes_cover_every_matmul_weight_once(tiny_model_dir):
    from hybrid_rl.workers.model_loader import load_causal_lm, load_hf_config

    model = load_causal_lm(tiny_model_dir)
    counted = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    counted[id(model.get_output_embeddings().weight)] = model.get_output_embeddings().weight.numel()  # tied or not
    shapes = linear_shapes(load_hf_config(tiny_model_dir))
    assert sum(d_in * d_out * n for (d_in, d_out), n in shapes.items()) == sum(counted.values())


def test_ceiling_is_the_slower_of_memory_and_matmuls(tiny_model_dir):
    from hybrid_rl.workers.model_loader import load_hf_config

    c = decode_ceiling(load_hf_config(tiny_model_dir), rows=4, context=10, dtype=torch.float32, bandwidth=1e9)
    step_ms = max(c["memory_ms"], c["matmul_ms"])
    assert abs(c["ceiling_tok_s"] - 4 / (step_ms / 1e3)) < 1e-6 * c["ceiling_tok_s"]
    assert c["bound"] == ("memory" if c["memory_ms"] >= c["matmul_ms"] else "matmul")
    assert abs(c["memory_ms"] - 1e3 * (c["weight_gb"] + c["kv_gb"])) < 1e-9  # 1 GB/s
