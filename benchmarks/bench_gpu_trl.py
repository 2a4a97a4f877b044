"""TRL's ``GRPOTrainer`` on bench_gpu.py's workload, for a side-by-side comparison (issue #20).

TRL is not a dependency of hybrid_rl: install it beside the project, e.g.

    python -m venv /tmp/trl && /tmp/trl/bin/pip install 'trl==1.16.0' datasets && /tmp/trl/bin/pip install -e .
    /tmp/trl/bin/python benchmarks/bench_gpu_trl.py --json /tmp/trl_smollm2.json
    /tmp/trl/bin/python benchmarks/bench_gpu_trl.py --model llama-1b
    python benchmarks/bench_gpu.py --json /tmp/ours_smollm2.json        # then ours, on the same machine

The same work as ``bench_gpu.py`` (its Hydra overrides are composed here and read back, so the two
cannot drift): the same model folder, the same arithmetic prompts (1-shot chat turns), scored by
hybrid_rl's ``default_compute_score``; 64 prompts x 8 completions, <= 256 completion tokens, one
optimizer step per generation batch (``per_device_train_batch_size`` x ``gradient_accumulation_steps``
= 512 completions), KL coefficient ``beta`` = 0.04, the same learning rate, temperature and top-p.
TRL's own choices stay: transformers ``generate`` unless ``--use-vllm``, padded micro-batches, its
loss type. Two settings favour TRL's speed and are flags: bf16 weights (``--dtype float32`` = TRL's
default, fp32 weights under bf16 autocast, as hybrid_rl's fp32 master weights) and gradient
checkpointing off, as in hybrid_rl's run (``--gradient-checkpointing`` = TRL's default). TRL skips the
old-log-prob pass of an on-policy step, as hybrid_rl does.

``--bench-step`` runs bench_step.py's CPU work instead (issue #17's side-by-side; docs/memory.md):

    /tmp/trl/bin/python benchmarks/bench_gpu_trl.py --bench-step --steps 6   # dtype: hybrid_rl's auto on this CPU
    python benchmarks/bench_step.py --steps 6

Per optimizer step it prints the wall time between consecutive steps and, measured by wrapping
GRPOTrainer's methods (with a CUDA sync at each edge): ``generate`` (``_generate``), ``reward``
(``_calculate_rewards``), ``logprob`` (``_generate_and_score_completions`` minus those two: the
reference pass and bookkeeping), ``loss_fwd`` (``compute_loss``, every micro-batch), ``backward``
(``accelerator.backward``) and ``other`` (the rest: optimizer step, clipping, logging); then the
peak host RSS of the process tree and the peak GPU memory (used memory of the visible GPUs, and this
process's ``max_memory_allocated``). A method missing from the installed TRL is reported as not
measured (NaN). The last line is ``median step: <seconds>``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu import GpuMemoryMonitor, add_run_args, parse_run_args, workload  # noqa: E402
from bench_step import DEFAULT_OVERRIDES, RssMonitor, rss_line, write_json  # noqa: E402

# label -> GRPOTrainer method (a dotted path from the trainer) whose inclusive time is summed per optimizer step
TIMED = {"generate": "_generate", "reward": "_calculate_rewards", "score": "_generate_and_score_completions",
         "loss_fwd": "compute_loss", "backward": "accelerator.backward"}


def time_methods(trainer, sync: Callable[[], None]) -> dict[str, float]:
    """Wrap ``trainer``'s :data:`TIMED` methods (where they exist) to sum their seconds into the dict returned."""
    totals: dict[str, float] = defaultdict(float)
    for label, path in TIMED.items():
        *owners, name = path.split(".")
        owner = trainer
        for attr in owners:
            owner = getattr(owner, attr, None)
        method = getattr(owner, name, None)
        if method is None:
            continue

        def timed(*args, _method=method, _label=label, **kwargs):
            sync()
            start = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                sync()
                totals[_label] += time.perf_counter() - start

        setattr(owner, name, timed)
    return totals


def phases(t: dict[str, float], step_s: float) -> dict[str, float]:
    """One optimizer step's breakdown from the summed method times ``t`` (NaN where not measured):
    ``logprob`` = the scoring call minus generation and reward (the reference pass and bookkeeping),
    ``other`` = the rest of the step (optimizer, clipping, logging, data loading)."""
    nan = float("nan")
    out = {"step_s": step_s, **{f"{k}_s": t.get(k, nan) for k in ("generate", "reward", "loss_fwd", "backward")}}
    out["logprob_s"] = t.get("score", nan) - out["generate_s"] - out["reward_s"]
    out["other_s"] = step_s - t.get("score", nan) - out["loss_fwd_s"] - out["backward_s"]
    return out


def dataset_rows(cfg) -> list[dict]:
    """The arithmetic training prompts hybrid_rl's run sees (chat messages), with what the scorer needs."""
    from hybrid_rl.data import read_rows
    from hybrid_rl.trainer.core.default_task import ensure_default_task

    return [{"prompt": list(r["prompt"]), "ground_truth": r["reward_model"]["ground_truth"],
             "data_source": r["data_source"]} for r in read_rows(ensure_default_task(cfg.data.arithmetic)[0])]


def arithmetic_reward(completions, ground_truth, data_source, **_) -> list[float]:
    """hybrid_rl's rule scorer on each completion (conversational: the last message's content)."""
    from hybrid_rl.reward import default_compute_score

    scores = []
    for completion, truth, source in zip(completions, ground_truth, data_source):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        score = default_compute_score(source, text, truth)
        scores.append(float(score["score"] if isinstance(score, dict) else score))
    return scores


def grpo_config(cfg, args: argparse.Namespace, output_dir: str):
    """GRPOConfig of the workload in hybrid_rl config ``cfg``: one optimizer step per generation batch."""
    from trl import GRPOConfig

    arr = cfg.actor_rollout_ref
    rows = cfg.data.train_batch_size * arr.rollout.n
    micro = min(args.per_device_batch, rows)
    if rows % micro:
        raise ValueError(f"--per-device-batch {micro} must divide the {rows} completions per step")
    cuda = args.device == "cuda"
    autocast = args.dtype == "bfloat16" and (cuda or args.bench_step)  # on CPU: fp32 weights, bf16 autocast
    return GRPOConfig(
        output_dir=output_dir, max_steps=args.steps, per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro, num_generations=arr.rollout.n,
        max_completion_length=cfg.data.max_response_length,
        beta=arr.actor.kl_loss_coef if arr.actor.use_kl_loss else 0.0,
        learning_rate=arr.actor.optim.lr, temperature=arr.rollout.temperature, top_p=arr.rollout.top_p,
        epsilon=arr.actor.clip_ratio, bf16=autocast, use_cpu=not cuda,
        gradient_checkpointing=args.gradient_checkpointing, use_vllm=args.use_vllm,
        model_init_kwargs={"dtype": args.dtype if cuda else "float32"},
        logging_steps=1, report_to="none", save_strategy="no", seed=cfg.data.seed)


def run(args: argparse.Namespace, trl) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from hybrid_rl.trainer import get_config

    cfg = get_config(DEFAULT_OVERRIDES if args.bench_step else workload(args))
    model_path = cfg.actor_rollout_ref.model.path
    if not os.path.isdir(model_path):  # the embedded model id: its converted local folder
        from hybrid_rl.workers.model_loader import resolve_model_path

        model_path = resolve_model_path(model_path)
    cuda = args.device == "cuda"
    trainer = trl.GRPOTrainer(model=model_path, reward_funcs=arithmetic_reward, train_dataset=Dataset.from_list(
        dataset_rows(cfg)), args=grpo_config(cfg, args, tempfile.mkdtemp(prefix="bench_gpu_trl_")))
    totals = time_methods(trainer, torch.cuda.synchronize if cuda else (lambda: None))
    steps: list[dict] = []

    class StepTimes(TrainerCallback):
        def on_train_begin(self, *_, **__):
            self.last = time.perf_counter()
            totals.clear()

        def on_step_end(self, *_, **__):
            now = time.perf_counter()
            steps.append(phases(dict(totals), now - self.last))
            self.last = now
            totals.clear()
            if len(steps) >= args.warmup:
                rss.mark_steady()  # the steady-state peaks leave the warm-up steps out

    trainer.add_callback(StepTimes())
    gpu = GpuMemoryMonitor() if cuda else None
    rss = RssMonitor()
    if args.warmup <= 0:
        rss.mark_steady()
    for monitor in filter(None, (rss, gpu)):
        monitor.start()
    try:
        trainer.train()
    finally:
        for monitor in filter(None, (rss, gpu)):
            monitor.stop()
    kept = steps[args.warmup:] or steps
    result = {"trl_version": trl.__version__, "model": args.model, "model_path": model_path, "steps": steps,
              "warmup": args.warmup, "median": {k: statistics.median(s[k] for s in kept) for k in kept[0]},
              "args": vars(args), **rss.figures(), "log_history": trainer.state.log_history}
    if gpu:
        result.update(gpu_mem_peak_gib=gpu.peak / 2**30, gpu_mem_before_gib=gpu.baseline / 2**30,
                      max_memory_allocated_gib=torch.cuda.max_memory_allocated() / 2**30,
                      accelerator=torch.cuda.get_device_name(0))
    return result


def print_report(result: dict) -> None:
    cols = ["step_s", "generate_s", "reward_s", "logprob_s", "loss_fwd_s", "backward_s", "other_s"]
    print(f"TRL {result['trl_version']} GRPOTrainer, model {result['model']} ({result['model_path']})")
    print("step " + " ".join(f"{c[:-2]:>10}" for c in cols))
    for i, s in enumerate(result["steps"], 1):
        print(f"{i:>3}{'*' if i <= result['warmup'] else ' '} " + " ".join(f"{s[c]:10.2f}" for c in cols))
    med = result["median"]
    print(f"median (steps after {result['warmup']} warm-up): "
          + ", ".join(f"{c[:-2]} {med[c]:.2f} s" for c in cols))
    if "gpu_mem_peak_gib" in result:
        print(f"  GPU memory, all processes: peak {result['gpu_mem_peak_gib']:.1f} GiB (before the run "
              f"{result['gpu_mem_before_gib']:.1f} GiB); this process's max_memory_allocated "
              f"{result['max_memory_allocated_gib']:.1f} GiB")
    print(f"  host {rss_line(result)}")
    print(f"median step: {med['step_s']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(parser)
    parser.add_argument("--per-device-batch", type=int, default=64,
                        help="completions per micro-batch (gradient accumulation makes up the 512)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                        help="weights as loaded on cuda (bf16 also turns on TRL's bf16 autocast); with "
                             "--bench-step, bfloat16 = bf16 autocast over fp32 weights. Default: bfloat16 on "
                             "cuda, on CPU the dtype hybrid_rl's auto picks on this CPU")
    parser.add_argument("--bench-step", action="store_true",
                        help="bench_step.py's work instead (embedded SmolLM2, 8 prompts x 4, <= 32 tokens, "
                             "KL 0.04) on the CPU: the side-by-side of docs/memory.md (--model is ignored)")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="TRL's default; off in hybrid_rl's run")
    parser.add_argument("--use-vllm", action="store_true", help="TRL's colocated vLLM generation (needs vllm)")
    if parser.parse_known_args()[0].bench_step:
        parser.set_defaults(device="cpu")  # bench_step's work is the CPU comparison
    args = parse_run_args(parser)
    try:
        import trl
    except ImportError:
        sys.exit("bench_gpu_trl.py needs TRL, which hybrid_rl does not depend on: pip install 'trl==1.16.0' datasets")
    args.max_token_len, args.overrides = None, []  # bench_gpu's workload() reads them
    if args.bench_step:
        args.model, args.per_device_batch = "smollm2", min(args.per_device_batch, 32)
    if args.dtype is None:
        from hybrid_rl.utils.precision import resolve_dtype

        args.dtype = "bfloat16" if args.device == "cuda" else resolve_dtype("auto", "cpu")
    result = run(args, trl)
    write_json(args.json, result)
    print_report(result)


if __name__ == "__main__":
    main()
