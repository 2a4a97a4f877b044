"""Generation throughput of the rollout engines (hf, vllm) on the embedded SmolLM2-135M-Instruct.

For each engine and batch size: one ``generate_sequences`` call through the real rollout class
(DataProto in and out, sampling at temperature 1), ``--new-tokens`` tokens per row. EOS is
replaced by the last (practically never sampled) vocabulary id so rows generate ``--new-tokens`` tokens
(pass ``--stop-at-eos`` to measure real answer lengths instead). Reports generated tokens / wall
second (median of ``--repeats``) and the engine start-up time. Results are very sensitive to
other load on the cores.

Run from the repo root (vLLM's CPU backend needs the ``__main__`` guard this file has)::

    python benchmarks/bench_rollout.py --engines hf vllm --batch-sizes 1 8 32 64 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.model_loader import load_tokenizer, resolve_model_path
from hybrid_rl.workers.rollout import RolloutConfig, build_rollout

QUESTIONS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle stays upright while moving.",
    "What is 17 times 23? Show your reasoning step by step.",
    "Describe the water cycle to a ten-year-old.",
    "List some tips for learning a new language quickly.",
    "Why is the sky blue? Give a detailed answer.",
    "Write a poem about the ocean at night.",
    "How do vaccines train the immune system?",
]


def prompt_batch(tokenizer, batch_size: int, prompt_length: int, eos_token_id: int) -> DataProto:
    """Chat prompts, left-padded to the longest one: input_ids/attention_mask/position_ids [B, P]."""
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                                           add_generation_prompt=True, tokenize=False)
             for i in range(batch_size)]
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=prompt_length,
                    add_special_tokens=False)
    mask = enc["attention_mask"].long()
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return DataProto.from_dict({"input_ids": enc["input_ids"].long(), "attention_mask": mask, "position_ids": pos},
                               meta_info={"eos_token_id": eos_token_id, "pad_token_id": tokenizer.pad_token_id})


def bench_engine(name: str, args, model_dir: str, tokenizer) -> dict:
    cfg = RolloutConfig(name=name, dtype=args.dtype, response_length=args.new_tokens, prompt_length=128,
                        max_num_seqs=max(args.batch_sizes), cpu_kvcache_space_gib=1,
                        enforce_eager=not args.compile, seed=0)
    start = time.perf_counter()
    rollout = build_rollout(cfg, model_dir, tokenizer, "cpu")
    startup = time.perf_counter() - start
    # Without --stop-at-eos, "EOS" is the last vocabulary id, which the model practically never
    # samples (engines reject ids outside the vocabulary); tokens are counted exactly either way.
    eos = tokenizer.eos_token_id if args.stop_at_eos else len(tokenizer) - 1
    rollout.generate_sequences(prompt_batch(tokenizer, 2, 128, eos))  # warm-up
    rows = []
    for batch_size in args.batch_sizes:
        batch = prompt_batch(tokenizer, batch_size, 128, eos)
        times, tokens = [], 0
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = rollout.generate_sequences(batch)
            times.append(time.perf_counter() - t0)
            tokens = int(out.batch["response_mask"].sum())
        seconds = statistics.median(times)
        rows.append({"engine": rollout.name, "batch": batch_size, "tokens": tokens, "seconds": round(seconds, 3),
                     "tok_per_s": round(tokens / seconds, 1)})
        print(f"{rollout.name:5s} batch {batch_size:3d}: {tokens:5d} tokens in {seconds:6.2f} s = "
              f"{tokens / seconds:7.1f} tok/s", flush=True)
    rollout.shutdown()
    return {"engine": rollout.name, "startup_s": round(startup, 1), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=1, help="calls per batch size (median reported)")
    parser.add_argument("--compile", action="store_true", help="vLLM: torch.compile instead of eager")
    parser.add_argument("--stop-at-eos", action="store_true", help="stop rows at EOS (fewer tokens)")
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()

    model_dir = resolve_model_path(args.model)
    tokenizer = load_tokenizer(model_dir)
    print(f"model {model_dir}, dtype {args.dtype}, {args.new_tokens} new tokens, torch threads "
          f"{torch.get_num_threads()}, cores {len(os.sched_getaffinity(0))}", flush=True)
    results = [bench_engine(name, args, model_dir, tokenizer) for name in args.engines]
    for res in results:
        print(f"{res['engine']}: start-up {res['startup_s']} s; tok/s by batch: "
              + ", ".join(f"{r['batch']}: {r['tok_per_s']}" for r in res["rows"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
