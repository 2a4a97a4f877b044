"""Speed of the actor's ``compute_log_prob`` and ``update_policy`` (FSDP2, 1 process, no Ray).

    python benchmarks/bench_actor.py                                   # SmolLM2-135M, auto dtype, 32 rows
    python benchmarks/bench_actor.py --dtypes float32,bfloat16 --remove-padding 0,1
    python benchmarks/bench_actor.py --model /path/to/hf --rows 64 --response-len 128

The model is sharded with FSDP2 over a 1-process gloo group (the worker's real code path); bf16
means FSDP2 mixed precision: bf16 forward/backward, fp32 master weights and gradient reduction.
Rows are ragged like RL batches (prompt lengths uniform in [P/2, P], left-padded; response
lengths uniform in [R/4, R], right-padded). Tokens counted = valid tokens; FLOPs per forward =
``2 * N_body * tokens + 2 * N_embed * response_tokens`` (x3 with backward), compared with a
2048-square matmul peak measured in this process. The first call of each kind is a warm-up.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from hybrid_rl.protocol import DataProto
from hybrid_rl.trainer.core.model_facts import measure_peak_flops
from hybrid_rl.utils.precision import resolve_dtype
from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.builders import build_causal_lm, build_optimizer
from hybrid_rl.workers.config import ActorConfig, FSDPConfig, MixedPrecisionConfig, ModelConfig, OptimConfig
from hybrid_rl.workers.model_loader import resolve_model_path


def make_batch(rows: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0) -> DataProto:
    """Ragged rows: left-padded prompts, right-padded responses, random tokens and advantages."""
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(prompt_len // 2, prompt_len + 1, (rows,), generator=g)
    r_len = torch.randint(max(1, response_len // 4), response_len + 1, (rows,), generator=g)
    cols = torch.arange(prompt_len + response_len)
    prompt_mask = (cols[None, :prompt_len] >= prompt_len - p_len[:, None]).long()  # [B, P]
    response_mask = (cols[None, :response_len] < r_len[:, None]).long()  # [B, R]
    attention_mask = torch.cat([prompt_mask, response_mask], 1)  # [B, P + R]
    input_ids = torch.randint(100, vocab, attention_mask.shape, generator=g) * attention_mask
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    tensors = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
               "responses": input_ids[:, prompt_len:], "response_mask": response_mask,
               "advantages": torch.randn(rows, response_len, generator=g)}
    return DataProto.from_dict(tensors, meta_info={"temperature": 1.0})


def forward_flops(model, data: DataProto) -> float:
    """Model FLOPs of one forward over ``data``'s valid tokens (LM head on response tokens only)."""
    embed = model.config.vocab_size * model.config.hidden_size
    body = sum(p.numel() for p in model.parameters()) - embed
    return 2.0 * body * float(data.batch["attention_mask"].sum()) + 2.0 * embed * float(
        data.batch["response_mask"].sum())


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]  # median


def build_actor(path: str, param_dtype: str, remove_padding: bool, args: argparse.Namespace
                ) -> DataParallelPPOActor:
    """The worker's actor: FSDP2 model (1 rank), AdamW, batching from ``args``."""
    fsdp = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype=param_dtype))
    model = build_causal_lm(ModelConfig(path=path), path, fsdp, torch.device("cpu"), trainable=True)
    dynamic = args.dynamic_bsz
    config = ActorConfig(ppo_mini_batch_size=args.rows, ppo_micro_batch_size_per_gpu=None if dynamic else args.micro,
                         use_dynamic_bsz=dynamic, ppo_max_token_len_per_gpu=args.max_token_len,
                         fsdp_config=fsdp, optim=OptimConfig(lr=1e-7))
    return DataParallelPPOActor(config, model, build_optimizer(model, config.optim),
                                use_remove_padding=remove_padding)


def measure(actor: DataParallelPPOActor, data: DataProto, args: argparse.Namespace) -> dict[str, float]:
    """Median seconds, tokens/s and GFLOP/s of one compute_log_prob and one (on-policy) update_policy."""
    actor.mini_batch_rows = len(data)
    data.meta_info.update(micro_batch_size=args.micro, use_dynamic_bsz=args.dynamic_bsz,
                          max_token_len=args.max_token_len)
    tokens, flops = float(data.batch["attention_mask"].sum()), forward_flops(actor.actor_module, data)
    metrics = {}
    t_logp = timed(lambda: actor.compute_log_prob(data), args.repeats)
    t_update = timed(lambda: metrics.update(actor.update_policy(data)), args.repeats)
    pad = metrics.get("actor/padding_frac", [0.0])
    return {"tokens": tokens, "compute_log_prob_s": t_logp, "update_policy_s": t_update,
            "compute_log_prob_tok_s": tokens / t_logp, "update_policy_tok_s": tokens / t_update,
            "compute_log_prob_gflops": flops / t_logp / 1e9, "update_policy_gflops": 3 * flops / t_update / 1e9,
            "padding_frac": sum(pad) / len(pad)}


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=96)
    parser.add_argument("--response-len", type=int, default=32)
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch (fixed-size batching)")
    parser.add_argument("--dynamic-bsz", action="store_true", help="token-balanced micro-batches instead")
    parser.add_argument("--max-token-len", type=int, default=2048, help="tokens per micro-batch (dynamic)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())


def setup(args: argparse.Namespace) -> tuple[str, dict[str, float]]:
    """Threads, a 1-process gloo group, the model path and the measured matmul peaks (FLOP/s)."""
    torch.set_num_threads(args.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29000 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    peaks = {d: measure_peak_flops("cpu", 1.0, d) for d in ("float32", "bfloat16", "float16")}
    shown = ", ".join(f"{d} {p / 1e9:.0f} GFLOP/s" if p else f"{d} emulated (no peak)" for d, p in peaks.items())
    print(f"CPU {torch.backends.cpu.get_cpu_capability()}; peak matmul: {shown}; "
          f"threads={args.threads} load avg {os.getloadavg()[0]:.2f}", flush=True)
    return resolve_model_path(args.model, key="--model"), peaks


def _share(gflops: float, peak) -> str:
    """``gflops`` as a share of the measured peak (FLOP/s), or ``no peak`` for an emulated dtype."""
    return f"{gflops * 1e9 / peak:.0%}" if peak else "no peak"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(parser)
    parser.add_argument("--dtypes", default="auto", help="comma list; auto = what the trainer would pick here")
    parser.add_argument("--remove-padding", default="0,1", help="comma list of 0/1")
    args = parser.parse_args()
    path, peaks = setup(args)
    print(f"model={args.model} rows={args.rows} prompt<={args.prompt_len} response<={args.response_len} "
          f"micro={'dynamic ' + str(args.max_token_len) if args.dynamic_bsz else args.micro}", flush=True)
    for dtype in (resolve_dtype(d, "cpu") for d in args.dtypes.split(",")):
        for rmpad in (bool(int(x)) for x in args.remove_padding.split(",")):
            actor = build_actor(path, dtype, rmpad, args)
            data = make_batch(args.rows, args.prompt_len, args.response_len, actor.actor_module.config.vocab_size)
            r = measure(actor, data, args)
            print(f"{dtype:>9} remove_padding={int(rmpad)} padding={r['padding_frac']:.0%}: "
                  f"compute_log_prob {r['compute_log_prob_s']:.2f} s {r['compute_log_prob_tok_s']:6.0f} tok/s "
                  f"{r['compute_log_prob_gflops']:4.0f} GFLOP/s ({_share(r['compute_log_prob_gflops'], peaks[dtype])})"
                  f" | update_policy {r['update_policy_s']:.2f} s {r['update_policy_tok_s']:6.0f} tok/s "
                  f"{r['update_policy_gflops']:4.0f} GFLOP/s ({_share(r['update_policy_gflops'], peaks[dtype])})",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
