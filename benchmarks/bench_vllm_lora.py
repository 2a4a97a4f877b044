"""How fast vLLM generates with a LoRA adapter served as an adapter vs merged into the weights.

    python benchmarks/bench_vllm_lora.py                 # SmolLM2-135M, rank 32, batch 64 x 64 tokens
    python benchmarks/bench_vllm_lora.py --rank 8 --batch 16

A LoRA actor's rollout can either receive the adapter (vLLM's ``enable_lora`` + a ``LoRARequest``) or
the merged weights ``W + scaling * B @ A`` (what hybrid_rl does; the weight sync then streams the full
model, ``timing_s/weight_sync``). Each engine runs in its own process (one in-process engine per
process), with the same random non-zero adapter; the medians of ``--repeats`` timed calls are printed,
with the CPU kind and dtype.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def save_adapter(folder: str, rank: int) -> None:
    """A rank-``rank`` adapter on all linear layers with non-zero ``lora_B`` (a trained-looking one)."""
    import torch

    from hybrid_rl.workers.config import ModelConfig
    from hybrid_rl.workers.lora import apply_lora
    from hybrid_rl.workers.model_loader import load_causal_lm, resolve_model_path

    path = resolve_model_path(MODEL)
    model = apply_lora(load_causal_lm(path), ModelConfig(path=path, lora_rank=rank, lora_alpha=2 * rank))
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "lora_B" in name:
                tensor.normal_(0.0, 0.01, generator=torch.Generator().manual_seed(0))
    model.save_pretrained(folder)


def time_engine(mode: str, adapter: str, args: argparse.Namespace) -> list[float]:
    """tok/s of ``args.repeats`` generate calls; ``mode`` = adapter | merged (the merged model's speed
    is the base model's: merging changes values, not shapes)."""
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from hybrid_rl.utils.precision import resolve_dtype
    from hybrid_rl.workers.model_loader import resolve_model_path

    kwargs = dict(model=resolve_model_path(MODEL), dtype=resolve_dtype("auto", "cpu", "rollout"), enforce_eager=True,
                  skip_tokenizer_init=True, max_model_len=args.prompt_len + args.new_tokens + 8, block_size=32, seed=0)
    if mode == "adapter":
        kwargs.update(enable_lora=True, max_lora_rank=args.rank, max_loras=1)
    llm = LLM(**kwargs)
    prompts = [{"prompt_token_ids": list(range(100 + i, 100 + i + args.prompt_len))} for i in range(args.batch)]
    params = SamplingParams(max_tokens=args.new_tokens, temperature=1.0, seed=0, ignore_eos=True)
    request = LoRARequest("actor", 1, adapter) if mode == "adapter" else None
    llm.generate(prompts[:2], params, use_tqdm=False, lora_request=request)  # warm-up
    speeds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False, lora_request=request)
        speeds.append(args.batch * args.new_tokens / (time.perf_counter() - start))
    return speeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=60)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=["adapter", "merged"], help=argparse.SUPPRESS)
    parser.add_argument("--adapter", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(f"RESULT {statistics.median(time_engine(args.child, args.adapter, args)):.1f}", flush=True)
        return
    import torch

    from hybrid_rl.utils.precision import resolve_dtype

    with tempfile.TemporaryDirectory() as adapter:
        save_adapter(adapter, args.rank)
        results = {}
        for mode in ("merged", "adapter"):
            cmd = [sys.executable, __file__, "--child", mode, "--adapter", adapter, *sys.argv[1:]]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            results[mode] = float(next(ln for ln in out.splitlines() if ln.startswith("RESULT")).split()[1])
    print(f"CPU {torch.backends.cpu.get_cpu_capability()}, dtype {resolve_dtype('auto', 'cpu', 'rollout')}, "
          f"rank {args.rank}, batch {args.batch} x {args.new_tokens} new tokens: merged weights "
          f"{results['merged']:.0f} tok/s, vLLM LoRA adapter {results['adapter']:.0f} tok/s "
          f"({results['merged'] / results['adapter']:.1f}x)")


if __name__ == "__main__":
    main()
