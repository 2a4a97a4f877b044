"""Generation throughput of the rollout engines (hf, vllm) on the embedded SmolLM2-135M-Instruct.

Each engine is built through the real rollout class (``build_rollout``) and timed on
``generate_sequences`` (DataProto in and out). Two workloads:

* ``--batch-sizes`` (default 1 8 32 64): synthetic chat prompts (8 different questions, ~40 tokens),
  sampling at temperature 1, exactly ``--new-tokens`` tokens per row (EOS is replaced by the last,
  practically never sampled, vocabulary id; ``--stop-at-eos`` measures real answer lengths instead).
* ``--default-run``: the two generate calls of the default training run (``python -m
  hybrid_rl.trainer.main_ppo``): 16 arithmetic prompts x n=8 (~100-token prompts sharing a one-shot
  prefix, 16 new tokens, temperature 0.8, real EOS) and the 200-prompt greedy validation.

Each synthetic batch row also gets the machine's decode ceiling for the model at that row count
(``benchmarks/decode_ceiling.py``: weight + KV bytes per step against the measured read bandwidth,
and the step's matmuls timed at that row count; measured right before each timed call) and the
rollout's tokens/s as a fraction of it: the median of the per-call fractions, since this host's
matmul speed drifts by tens of percent between minutes and adjacent measurements share the drift.

Reported per row: generated tokens / wall second (median of ``--repeats`` calls, each from an empty
prefix cache as after a weight sync; one untimed warm-up call per engine), process CPU milliseconds per generated token (less sensitive to other load than
wall time), engine start-up and the load average. The benchmark restarts itself once with the
environment the trainer gives the worker that hosts the engine (allocator, OpenMP, library logging;
``--allocator`` as ``trainer.cpu_allocator``). Results depend strongly on other load on the
cores: compare settings interleaved, and on a quiet machine.

Run from the repo root (vLLM's CPU backend needs the ``__main__`` guard this file has)::

    python benchmarks/bench_rollout.py                        # hf + vllm, batches 1 8 32 64 (~3 min)
    python benchmarks/bench_rollout.py --engines vllm vllm-compiled --default-run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Callable, Optional

from hybrid_rl.utils.cpu_env import cpu_openmp_env  # torch-free

# As the trainer's CPU workers get it: a short OpenMP spin unless OMP_WAIT_POLICY or GOMP_SPINCOUNT
# is set. Must be set before torch loads OpenMP.
os.environ.update(cpu_openmp_env(os.environ))

import torch  # noqa: E402

from hybrid_rl.protocol import DataProto  # noqa: E402
from hybrid_rl.utils.precision import resolve_dtype  # noqa: E402
from hybrid_rl.workers.model_loader import load_tokenizer, resolve_model_path  # noqa: E402
from hybrid_rl.workers.rollout import RolloutConfig, build_rollout  # noqa: E402
from bench_step import reexec_like_command  # noqa: E402
from decode_ceiling import decode_ceiling, memory_bandwidth  # noqa: E402

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
ENGINES = ("hf", "vllm", "vllm-compiled")


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


def default_run_batches(tokenizer) -> dict[str, DataProto]:
    """The default training run's generate inputs: one training step (16 prompts x n) and validation."""
    from hybrid_rl.trainer import get_config
    from hybrid_rl.trainer.core import generation
    from hybrid_rl.trainer.core.inputs import resolve_data_files
    from hybrid_rl.trainer.ppo.inputs import build_dataset

    cfg = get_config([])
    train_files, val_files = resolve_data_files(cfg)
    batches = {}
    for name, files, validate in (("train step", train_files, False), ("validation", val_files, True)):
        dataset = build_dataset(files, tokenizer, cfg)
        size = len(dataset) if validate else cfg.data.train_batch_size
        batch = DataProto.from_single_dict(dataset.collate_fn([dataset[i] for i in range(size)]))
        if not validate:
            batch = generation.prepare_rollout_batch(batch, cfg.actor_rollout_ref.rollout.n, step=1)
        gen, _ = generation.split_generation_inputs(batch)
        gen.meta_info.update(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                             validate=validate, seed=cfg.trainer.seed)
        batches[name] = gen
    return batches


def empty_prefix_cache(rollout) -> None:
    """In training every generate call follows a weight sync, which empties vLLM's prefix cache:
    time each call from that state (a repeated identical batch would otherwise be all cache hits)."""
    llm = getattr(rollout, "llm", None)
    if llm is not None:
        llm.reset_prefix_cache()


def time_calls(rollout, batch: DataProto, repeats: int,
               ceiling_at: Optional[Callable[[int], dict]] = None) -> dict[str, Any]:
    """``repeats`` timed calls, each from an empty prefix cache: median wall s, CPU ms per token.
    With ``ceiling_at``, the decode ceiling at the batch's row count is measured right before each
    call, and the fraction is the median of the per-call fractions: the host's speed drifts by tens
    of percent between minutes (other tenants), and adjacent measurements share the drift."""
    walls, cpus, ceils, tokens = [], [], [], 0
    for _ in range(repeats):
        if ceiling_at is not None:
            ceils.append(ceiling_at(len(batch))["ceiling_tok_s"])
        empty_prefix_cache(rollout)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        out = rollout.generate_sequences(batch)
        walls.append(time.perf_counter() - wall0)
        cpus.append(time.process_time() - cpu0)
        tokens = int(out.batch["response_mask"].sum())
    wall = statistics.median(walls)
    row = {"rows": len(batch), "tokens": tokens, "seconds": round(wall, 3), "tok_per_s": round(tokens / wall, 1),
           "cpu_ms_per_tok": round(1000 * statistics.median(cpus) / max(tokens, 1), 2)}
    if ceils:
        row["ceiling_tok_s"] = round(statistics.median(ceils))
        row["of_ceiling"] = round(statistics.median(tokens / w / c for w, c in zip(walls, ceils)), 3)
        row["ceiling_range"] = [round(min(ceils)), round(max(ceils))]
    return row


def engine_config(engine: str, args, response_length: int, temperature: float) -> RolloutConfig:
    return RolloutConfig(name="hf" if engine == "hf" else "vllm", dtype=args.dtype, temperature=temperature,
                         response_length=response_length, prompt_length=128, cpu_kvcache_space_gib=1,
                         enforce_eager=engine != "vllm-compiled", seed=0, block_size=args.block_size)


def bench_engine(engine: str, args, model_dir: str, tokenizer, ceiling_at: Callable[[int], dict]) -> list[dict]:
    """All rows of one engine: the synthetic batch sizes and, with --default-run, the default run."""
    workloads: list[tuple[str, DataProto, int, float, bool]] = []
    # Without --stop-at-eos, "EOS" is the last vocabulary id, which the model practically never
    # samples (engines reject ids outside the vocabulary); tokens are counted exactly either way.
    eos = tokenizer.eos_token_id if args.stop_at_eos else len(tokenizer) - 1
    for size in args.batch_sizes:
        workloads.append((f"batch {size}", prompt_batch(tokenizer, size, 128, eos), args.new_tokens, 1.0, True))
    if args.default_run:
        workloads += [(name, batch, 16, 0.8, False) for name, batch in default_run_batches(tokenizer).items()]
    rows, rollout, built_for = [], None, None
    for name, batch, response_length, temperature, synthetic in workloads:
        if built_for != response_length:  # response_length is an engine setting: rebuild when it changes
            if rollout is not None:
                rollout.shutdown()
            start = time.perf_counter()
            rollout = build_rollout(engine_config(engine, args, response_length, temperature), model_dir,
                                    tokenizer, "cpu")
            startup, built_for = time.perf_counter() - start, response_length
            rollout.generate_sequences(prompt_batch(tokenizer, 2, 128, eos))  # untimed warm-up
        row = {"engine": engine if rollout.name != "hf" else "hf", "workload": name,
               "startup_s": round(startup, 1),
               **time_calls(rollout, batch, args.repeats, ceiling_at if synthetic else None),
               "load": round(os.getloadavg()[0], 1)}
        print(f"{row['engine']:14s} {name:11s}: {row['tokens']:5d} tokens in {row['seconds']:6.2f} s = "
              f"{row['tok_per_s']:7.1f} tok/s, {row['cpu_ms_per_tok']:6.2f} CPU ms/token "
              f"(load {row['load']})", flush=True)
        rows.append(row)
    rollout.shutdown()
    return rows


def ceiling_meter(args, model_dir: str) -> Callable[[int], dict]:
    """``ceiling_at(rows)``: the decode ceiling measured now at ``rows`` rows (context: a ~40-token
    prompt + half the new tokens); each measurement is printed. About 0.5 s each."""
    from hybrid_rl.workers.model_loader import load_hf_config

    hf_config = load_hf_config(model_dir)
    dtype = getattr(torch, resolve_dtype(args.dtype, "cpu", "rollout"))

    def ceiling_at(rows: int) -> dict:
        c = decode_ceiling(hf_config, rows, 40 + args.new_tokens // 2, dtype, memory_bandwidth(repeats=3))
        print(f"ceiling at {rows:3d} rows: {c['ceiling_tok_s']:7.0f} tok/s ({c['bound']}-bound: weights + KV "
              f"{c['memory_ms']:.1f} ms at {c['bandwidth_gb_s']:.1f} GB/s, matmuls {c['matmul_ms']:.1f} ms at "
              f"{c['matmul_tflop_s']:.2f} TFLOP/s)", flush=True)
        return c

    return ceiling_at


def print_table(rows: list[dict]) -> None:
    print("\n| engine | workload | rows | tokens | tok/s | ceiling tok/s | of ceiling | CPU ms/token | start-up s | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        frac = f"{r['of_ceiling']:.0%}" if r.get("of_ceiling") is not None else "-"
        print(f"| {r['engine']} | {r['workload']} | {r['rows']} | {r['tokens']} | {r['tok_per_s']} | "
              f"{r.get('ceiling_tok_s') or '-'} | {frac} | {r['cpu_ms_per_tok']} | {r['startup_s']} | {r['load']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=ENGINES,
                        help="vllm = eager (the CPU default); vllm-compiled = torch.compile (slow start-up)")
    parser.add_argument("--batch-sizes", nargs="*", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--default-run", action="store_true", help="also time the default run's generate calls")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                        help="auto = what the trainer would pick on this CPU (bf16 only where it is native)")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per row (median reported)")
    parser.add_argument("--stop-at-eos", action="store_true", help="synthetic rows stop at EOS (fewer tokens)")
    parser.add_argument("--block-size", type=int, default=None, help="vLLM KV block size (default: the rollout's)")
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--allocator", default="auto", choices=["auto", "glibc", "jemalloc"],
                        help="the memory allocator, as trainer.cpu_allocator gives it to the worker that hosts "
                             "the engine (this benchmark restarts itself once with that worker's environment)")
    args = parser.parse_args()
    # As a command-line training run does: the engine lives in a process started with the worker's
    # allocator and OpenMP settings (without them, every step's fresh logits buffers page-fault).
    reexec_like_command([f"trainer.cpu_allocator={args.allocator}"])

    model_dir = resolve_model_path(args.model)
    tokenizer = load_tokenizer(model_dir)
    print(f"model {model_dir}, dtype {args.dtype} -> {resolve_dtype(args.dtype, 'cpu', 'rollout')} "
          f"(CPU {torch.backends.cpu.get_cpu_capability()}), torch threads {torch.get_num_threads()}, cores "
          f"{len(os.sched_getaffinity(0))}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
          f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}, allocator "
          f"{'jemalloc' if 'jemalloc' in os.environ.get('LD_PRELOAD', '') else 'glibc'}, "
          f"uptime: {os.popen('uptime').read().strip()}", flush=True)
    ceiling_at = ceiling_meter(args, model_dir)
    rows = [row for engine in args.engines for row in bench_engine(engine, args, model_dir, tokenizer, ceiling_at)]
    print_table(rows)
    print(f"uptime: {os.popen('uptime').read().strip()}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
