"""Profile one actor update and one reference log-prob pass: kernel launches, time in attention, host gaps.

    python benchmarks/profile_update.py --attn sdpa --json $OUT/before.json --trace $OUT/before   # on a GPU
    python benchmarks/profile_update.py --attn auto --json $OUT/after.json --trace $OUT/after
    python benchmarks/profile_update.py --device cpu --model tiny --rows 16 --response-len 16     # smoke run

No Ray, no rollout: the plain :class:`~hybrid_rl.workers.actor.DataParallelPPOActor` of the workers
on GRPO-shaped synthetic rows (``--rows`` = prompts x ``--n`` responses sharing their prompt,
``--prompt-len`` prompt tokens, response lengths uniform in ``[1, --response-len]``), micro-batches
by token budget, KL loss to a reference, one optimizer step, the model stored in ``--dtype`` (bf16 by
default: the kernels of mixed precision without FSDP2's copies). One warm-up pass of each, then one
profiled pass of each under ``torch.profiler``. It prints and writes (``--json``), per pass:

* ``wall_s``; ``kernel_launches`` (CUDA kernels launched; on CPU the aten ops run);
* ``attention_calls`` and ``attention_s``: the forward packed-attention calls (the
  ``hybrid_rl/packed_attention`` profiler range around each layer's call) and the time inside them
  (on the GPU timeline on CUDA, host time on CPU), and its share of the pass; attention's backward
  kernels run outside that range (see them in the trace);
* ``device_busy_s`` and ``host_gap_s`` (CUDA only): the union of kernel intervals, and the wall
  time the GPU sat idle waiting for the host;
* ``host_phases_s``: host time inside each phase range of :mod:`hybrid_rl.utils.profiling`
  (``inputs``, ``model``, ``log_probs``, ``loss``, ``backward``, ``metrics``, ``optimizer_step``;
  nested ranges count in their parents too);
* ``idle_by_phase_s`` (CUDA only): the GPU's idle time split by the phase the host was in
  meanwhile, the innermost range winning (``unlabelled``: outside every range);
* ``runtime_calls`` (CUDA only): the eight CUDA runtime and driver calls that took the most host
  time, with their counts (a ``cudaStreamSynchronize`` or a blocking ``cudaMemcpy`` is the host waiting).

``--fsdp`` adds ``update_actor_fsdp2_per_layer`` and ``update_actor_fsdp2_root``: the same update
of an fp32 model under FSDP2 in a one-rank group, computing in ``--dtype``, its parameters grouped
per decoder layer or on the root alone (``fsdp_config.layer_wrap``; the trainer's one-GPU actor
takes ``root`` for a small model, its reference is not wrapped on one rank). Their differences to
``update_actor`` are what FSDP2's hooks, copies and casts cost.

``--trace DIR`` also writes each pass's Chrome trace. This is issue #20's before/after profile
(``--attn sdpa``, the CPU path, against ``--attn auto``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional

import torch

from hybrid_rl.utils.profiling import PREFIX
from hybrid_rl.workers.varlen_attention import PROFILE_LABEL


def synthetic_rows(rows: int, n: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0):
    """GRPO-shaped DataProto: ``rows // n`` prompts x ``n`` responses, left-padded prompts (lengths
    in ``[prompt_len / 2, prompt_len]``), right-padded responses, advantages and old/ref log-probs."""
    from hybrid_rl.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    prompts = rows // n
    p_len = torch.randint(prompt_len // 2, prompt_len + 1, (prompts,), generator=g).repeat_interleave(n)
    r_len = torch.randint(1, response_len + 1, (prompts * n,), generator=g)
    p_mask = (torch.arange(prompt_len)[None] >= prompt_len - p_len[:, None]).long()
    r_mask = (torch.arange(response_len)[None] < r_len[:, None]).long()
    prompt_ids = (torch.randint(3, vocab, (prompts, prompt_len), generator=g).repeat_interleave(n, 0)) * p_mask
    responses = torch.randint(3, vocab, (prompts * n, response_len), generator=g) * r_mask
    attention_mask = torch.cat([p_mask, r_mask], 1)
    batch = {"input_ids": torch.cat([prompt_ids, responses], 1), "attention_mask": attention_mask,
             "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0), "responses": responses,
             "response_mask": r_mask, "advantages": torch.randn(prompts * n, response_len, generator=g) * r_mask,
             "old_log_probs": -torch.rand(prompts * n, response_len, generator=g),
             "ref_log_prob": -torch.rand(prompts * n, response_len, generator=g)}
    return DataProto.from_dict(batch, meta_info={"temperature": 1.0})


def union_busy(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals as disjoint sorted intervals."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def idle_intervals(busy: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The parts of ``[start, end]`` outside every ``busy`` interval (where the device sat idle)."""
    gaps, cursor = [], start
    for a, b in union_busy(busy):
        if a > cursor:
            gaps.append((cursor, min(a, end)))
        cursor = max(cursor, b)
        if cursor >= end:
            break
    if cursor < end:
        gaps.append((cursor, end))
    return [(a, b) for a, b in gaps if b > a]


def attribute(gaps: list[tuple[float, float]], ranges: list[tuple[float, float, str]]) -> dict[str, float]:
    """Length of ``gaps`` under each named range, the innermost (latest-starting) range winning where
    ranges nest; ``"unlabelled"`` where none is open. Sorted by length, largest first."""
    points = sorted({p for a, b in gaps for p in (a, b)} | {p for a, b, _ in ranges for p in (a, b)})
    opens = sorted(ranges, key=lambda r: r[0])
    gaps, totals, active, i, g = sorted(gaps), {}, [], 0, 0
    for a, b in zip(points, points[1:]):
        while i < len(opens) and opens[i][0] <= a:
            active.append(opens[i])
            i += 1
        active = [r for r in active if r[1] > a]
        while g < len(gaps) and gaps[g][1] <= a:
            g += 1
        if g < len(gaps) and gaps[g][0] <= a:  # the segment [a, b] lies in gap g
            name = max(active, key=lambda r: (r[0], -r[1]))[2] if active else "unlabelled"
            totals[name] = totals.get(name, 0.0) + (b - a)
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def _host_figures(events: list) -> dict:
    """Host time in each ``hybrid_rl/`` phase range (nested ranges count in their parents too) and,
    on CUDA, the eight CUDA runtime and driver calls that took the most host time (a
    ``cudaStreamSynchronize`` or ``cudaMemcpy`` there means the host waited on the GPU)."""
    phases: dict[str, float] = {}
    runtime: dict[str, list] = {}
    for e in events:
        if e.device_type.name != "CPU":
            continue
        if e.name.startswith(PREFIX):
            name = e.name[len(PREFIX):]
            phases[name] = phases.get(name, 0.0) + e.time_range.elapsed_us() / 1e6
        elif e.name.startswith("cu"):  # runtime (cuda*) and driver (cu*) calls
            entry = runtime.setdefault(e.name, [0, 0.0])
            entry[0] += 1
            entry[1] += e.time_range.elapsed_us() / 1e6
    top = sorted(runtime.items(), key=lambda kv: -kv[1][1])[:8]
    return {"host_phases_s": dict(sorted(phases.items(), key=lambda kv: -kv[1])),
            **({"runtime_calls": {k: {"calls": n, "s": t} for k, (n, t) in top}} if runtime else {})}


def device_kernels(events: list) -> list:
    """The GPU's own work among profiler ``events``: CUDA-side events less the ranges annotated on
    the GPU's timeline (ours, ``hybrid_rl/...``, and torch's, ``FSDP::...``, ``Optimizer.step#...``),
    which span kernels rather than being ones."""
    return [e for e in events if e.device_type.name == "CUDA" and not getattr(e, "is_user_annotation", False)
            and not e.name.startswith(PREFIX)]


def summarize(prof, wall: float, cuda: bool) -> dict:
    """The figures of one profiled pass (see the module docstring)."""
    events = list(prof.events())
    ranges = [e for e in events if e.name == PROFILE_LABEL and (e.device_type.name == "CUDA") == cuda]
    attention = sum(e.time_range.elapsed_us() for e in ranges) / 1e6  # the packed-attention ranges
    figures = {"wall_s": wall, "attention_calls": len(ranges), "attention_s": attention,
               "attention_frac": attention / wall, **_host_figures(events)}
    if not cuda:
        return {**figures, "kernel_launches": sum(e.name.startswith("aten::") for e in events)}
    kernels = device_kernels(events)
    busy = union_busy([(e.time_range.start, e.time_range.end) for e in kernels])  # microseconds
    busy_s = sum(b - a for a, b in busy) / 1e6
    cpu = [e for e in events if e.device_type.name == "CPU"]
    start = min(e.time_range.start for e in cpu)
    end = max([e.time_range.end for e in cpu] + [b for _, b in busy[-1:]])
    labelled = [(e.time_range.start, e.time_range.end, e.name[len(PREFIX):]) for e in cpu if e.name.startswith(PREFIX)]
    idle = {k: v / 1e6 for k, v in attribute(idle_intervals(busy, start, end), labelled).items()}
    return {**figures, "kernel_launches": len(kernels), "device_busy_s": busy_s,
            "host_gap_s": max(0.0, wall - busy_s), "idle_by_phase_s": idle}


def profiled(fn, device: torch.device, trace: str | None, name: str) -> dict:
    """Run ``fn`` once under the profiler; its figures (and Chrome trace under ``trace``)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    if trace:
        os.makedirs(trace, exist_ok=True)
        prof.export_chrome_trace(os.path.join(trace, f"{name}.json"))
    return summarize(prof, wall, cuda)


def trainer_model(path: str, dtype: str, device: torch.device, layer_wrap: Optional[str] = None) -> torch.nn.Module:
    """The actor as the trainer builds it (``builders.build_causal_lm``: lean layers; the fused
    head is the actor's switch, on in :func:`_passes` as in the trainer).
    Without ``layer_wrap``: stored and computed in ``dtype``, no FSDP2. With it: fp32 master weights
    under FSDP2 in a one-rank group (opened here if none is), computing in ``dtype`` (its mixed
    precision), gradients reduced in fp32, the parameters grouped per ``layer_wrap``."""
    import torch.distributed as dist

    from hybrid_rl.workers.builders import build_causal_lm
    from hybrid_rl.workers.config import FSDPConfig, MixedPrecisionConfig, ModelConfig

    if layer_wrap is None:
        if dist.is_initialized():
            raise ValueError("trainer_model: a process group is open, so the plain model would not be the "
                             "plain one. Fix: build it (layer_wrap=None) before any FSDP2 model.")
        return build_causal_lm(ModelConfig(path=path, dtype=dtype), path, FSDPConfig(), device, trainable=True)
    if not dist.is_initialized():
        from hybrid_rl.workers.fsdp_utils import default_backend

        # an in-process store: one rank needs no rendezvous port
        dist.init_process_group(default_backend(device), store=dist.HashStore(), rank=0, world_size=1)
    config = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype=dtype), layer_wrap=layer_wrap)
    return build_causal_lm(ModelConfig(path=path, dtype="float32"), path, config, device, trainable=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default="smollm2", help="smollm2 | tiny | a local HF folder")
    parser.add_argument("--attn", default="auto", help="model.attn_implementation")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--response-len", type=int, default=256)
    parser.add_argument("--token-budget", type=int, default=32768)
    parser.add_argument("--prefix-grouper", action="store_true", help="actor.use_prefix_grouper=true")
    parser.add_argument("--fsdp", action="store_true",
                        help="also profile the update of an fp32 model under FSDP2 on one process (both groupings)")
    parser.add_argument("--json")
    parser.add_argument("--trace", help="folder for the Chrome traces")
    return parser


def _model_path(model: str) -> str:
    from hybrid_rl.workers.model_loader import resolve_model_path

    if model == "tiny":
        import tempfile

        from hybrid_rl.utils.testing import build_tiny_model_dir
        return build_tiny_model_dir(os.path.join(tempfile.gettempdir(), "hybrid_rl_tiny_model"))
    return resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct" if model == "smollm2" else model)


def _passes(args, path: str, device: torch.device) -> tuple[dict, object]:
    """``{name: pass}`` (each takes the batch) and the batch: the plain model's ``ref`` and
    ``update_actor``, and with ``--fsdp`` the update under each FSDP2 grouping."""
    from hybrid_rl.workers.actor import DataParallelPPOActor
    from hybrid_rl.workers.builders import build_optimizer
    from hybrid_rl.workers.config import ActorConfig, ModelConfig, OptimConfig

    cfg = ActorConfig(ppo_mini_batch_size=args.rows, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=args.token_budget,
                      use_kl_loss=True, kl_loss_coef=0.04, use_prefix_grouper=args.prefix_grouper,
                      optim=OptimConfig(lr=1e-6))

    def actor_of(model):
        return DataParallelPPOActor(cfg, model, build_optimizer(model, cfg.optim),  # the trainer's (fused) AdamW
                                    use_remove_padding=True, device=device, attn_implementation=args.attn,
                                    fused_head=ModelConfig().use_fused_kernels)  # the trainer's default

    actor = actor_of(trainer_model(path, args.dtype, device))
    data = synthetic_rows(args.rows, args.n, args.prompt_len, args.response_len, actor.actor_module.config.vocab_size)
    data.meta_info.update(micro_batch_size=args.rows, use_dynamic_bsz=True, max_token_len=args.token_budget)
    passes = {"ref": actor.compute_log_prob, "update_actor": actor.update_policy}
    for layer_wrap in ("per_layer", "root") if args.fsdp else ():
        sharded = actor_of(trainer_model(path, args.dtype, device, layer_wrap))
        passes[f"update_actor_fsdp2_{layer_wrap}"] = sharded.update_policy
    return passes, data


def main(argv=None) -> dict:
    args = _parser().parse_args(argv)
    import torch.distributed as dist

    device = torch.device(args.device)
    owned = not dist.is_initialized()  # a group this run opens (--fsdp) is closed by it, whatever happens
    try:
        passes, data = _passes(args, _model_path(args.model), device)
        for fn in passes.values():  # warm-up: compilation, allocator growth
            fn(data)
        from hybrid_rl.workers.attention_backend import current_choice

        result = {"device": str(device), "model": args.model, "attn": args.attn, "kernels": vars(current_choice()),
                  "rows": args.rows, "torch": torch.__version__}
        for name, fn in passes.items():
            result[name] = profiled(lambda: fn(data), device, args.trace, name)
    finally:
        if owned and dist.is_initialized():
            dist.destroy_process_group()
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
