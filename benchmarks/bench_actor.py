"""Tokens/s of the actor's ``compute_log_prob`` and ``update_policy`` (FSDP2, 1 process).

    python benchmarks/bench_actor.py                      # SmolLM2-135M, fp32 and bf16 compute
    python benchmarks/bench_actor.py --model /path/to/hf --rows 32 --response-len 128

The model is sharded with FSDP2 over a 1-process gloo group (the worker's real code path); bf16
means FSDP2 mixed precision: bf16 forward/backward, fp32 master weights and gradient reduction.
Tokens counted = valid tokens (prompt + response) of the batch; the first call is a warm-up.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.builders import build_causal_lm, build_optimizer
from hybrid_rl.workers.config import ActorConfig, FSDPConfig, MixedPrecisionConfig, ModelConfig, OptimConfig
from hybrid_rl.workers.model_loader import resolve_model_path


def make_batch(rows: int, prompt_len: int, response_len: int, vocab: int) -> DataProto:
    """Full-length rows (no padding) with random tokens and advantages."""
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(100, vocab, (rows, prompt_len + response_len), generator=g)
    attention_mask = torch.ones_like(input_ids)
    tensors = {"input_ids": input_ids, "attention_mask": attention_mask,
               "position_ids": torch.arange(prompt_len + response_len).expand(rows, -1).clone(),
               "responses": input_ids[:, prompt_len:], "response_mask": attention_mask[:, prompt_len:],
               "advantages": torch.randn(rows, response_len, generator=g)}
    return DataProto.from_dict(tensors, meta_info={"temperature": 1.0})


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def bench(path: str, param_dtype: str, args: argparse.Namespace) -> dict[str, float]:
    fsdp = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype=param_dtype))
    model = build_causal_lm(ModelConfig(path=path), path, fsdp, torch.device("cpu"), trainable=True)
    config = ActorConfig(ppo_mini_batch_size=args.rows, ppo_micro_batch_size_per_gpu=args.micro,
                         fsdp_config=fsdp, optim=OptimConfig(lr=1e-7))
    actor = DataParallelPPOActor(config, model, build_optimizer(model, config.optim))
    data = make_batch(args.rows, args.prompt_len, args.response_len, model.config.vocab_size)
    data.meta_info.update(micro_batch_size=args.micro, use_dynamic_bsz=False)
    log_probs, _ = actor.compute_log_prob(data)
    data.batch["old_log_probs"] = log_probs
    tokens = float(data.batch["attention_mask"].sum())
    t_logp = timed(lambda: actor.compute_log_prob(data), args.repeats)
    t_update = timed(lambda: actor.update_policy(data), args.repeats)
    return {"compute_log_prob_tok_s": tokens / t_logp, "update_policy_tok_s": tokens / t_update,
            "compute_log_prob_s": t_logp, "update_policy_s": t_update}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29633")
    dist.init_process_group("gloo", rank=0, world_size=1)
    path = resolve_model_path(args.model, key="--model")
    print(f"model={args.model} rows={args.rows} tokens/row={args.prompt_len + args.response_len} "
          f"micro={args.micro} threads={args.threads}", flush=True)
    for dtype in args.dtypes.split(","):
        r = bench(path, dtype, args)
        print(f"{dtype:>9}: compute_log_prob {r['compute_log_prob_tok_s']:8.0f} tok/s "
              f"({r['compute_log_prob_s']:.2f} s)   update_policy {r['update_policy_tok_s']:8.0f} tok/s "
              f"({r['update_policy_s']:.2f} s)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
