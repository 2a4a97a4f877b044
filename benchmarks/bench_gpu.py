"""GPU-sized GRPO steps through the real trainer (issue #20), measured per phase and per model pass.

Prints seconds per phase, TFLOP/s and MFU per model pass, rollout tokens/s, peak GPU memory and host RSS:

    python benchmarks/bench_gpu.py                                   # SmolLM2-135M, 64 prompts x 8, <= 256 tokens
    python benchmarks/bench_gpu.py --model llama-1b --json /tmp/gpu_1b.json   # random-init 1.07B Llama
    python benchmarks/bench_gpu.py --max-token-len 65536 actor_rollout_ref.actor.enable_gradient_checkpointing=true
    python benchmarks/bench_gpu.py --device cpu --json /tmp/smoke.json        # CI smoke: tiny model, 2 x 2, 8 tokens

Workload on ``--device cuda``: bench_step.py's fixed settings (synthetic arithmetic, KL loss to the
reference with coefficient 0.04, no validation, no checkpoints) at the issue's size: 64 prompts x 8
responses, <= 256 response tokens, one mini-batch (one optimizer step per batch), bf16 compute over
fp32 master weights, micro-batches by token budget (``use_dynamic_bsz``: ``TOKEN_BUDGET`` computed
tokens per micro-batch in the update and ``LOG_PROB_BUDGET_FACTOR`` times that in both log-prob
passes; ``--max-token-len`` sets one budget for every pass). ``--device cpu`` runs the
same code on a smoke-sized workload (2 prompts x 2 responses, <= 8 tokens, HF rollout) in well under
two minutes. Extra ``key=value`` arguments are Hydra overrides on top of everything (printed first).

Models (``--model``): ``smollm2`` = the embedded ``HuggingFaceTB/SmolLM2-135M-Instruct``; ``llama-1b`` =
a randomly initialised Llama of TinyLlama-1.1B's shape with SmolLM2's tokenizer
(``scripts/make_random_model.py --preset llama-1b``: 1.07B parameters, bf16), written once into
``--model-dir`` (nothing is downloaded; its rewards are ~0, which changes no pass's cost);
``tiny`` = the 2-layer test model of ``hybrid_rl.utils.testing`` (the default on CPU).

Figures are bench_step.py's (``step_figures``: FLOPs per pass ``2 * N_body * tokens + 2 * N_embed *
response_tokens``, x3 for forward + backward, attention scores not counted) with MFU against matmul
peaks measured in the same run: 8192-square matmuls on a GPU (2048-square ones reach only about half
of an H100's bf16 peak), bench_step's 2048-square ones on CPU. GPU memory is the used memory of the
visible GPUs, all processes together (the Ray workers, the driver's CUDA context, vLLM's pre-allocated
KV cache when vLLM runs), polled by the driver every 0.2 s: the peak of each step and of the run.
``torch.cuda.max_memory_allocated`` would count one process only, and the workers are Ray processes.
Host RSS is the peak of the whole process tree. The first ``--warmup`` steps (compilation, allocator
growth) are shown but left out of the medians. The last line is ``median step: <seconds>``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
from bench_step import (DEFAULT_OVERRIDES, _pct, measure_steps, median_figures, rss_line,  # noqa: E402
                        run_dir_overrides, write_json)

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
LLAMA_1B_DIR = "~/.cache/hybrid_rl/random_models/llama-1b"
# computed tokens per micro-batch of the update on a GPU when --max-token-len is not given (on CPU:
# the config's 4096 for every pass): the 1B model's activations at 32k tokens without gradient
# checkpointing would not leave room on an 80 GB GPU; SmolLM2's update peaked at 21.1 GiB at 32k
# (H100, 2026-11-27), so 64k fits with room. Unmeasured at 64k so far.
TOKEN_BUDGET = {"smollm2": 65536, "llama-1b": 16384, "tiny": 32768}
LOG_PROB_BUDGET_FACTOR = 4
"""On a GPU the log-prob passes (``ref``, ``old_log_prob``: no autograd, so a small fraction of the
update's activation memory per token) get this many times the update's budget: fewer, larger
micro-batches, hence fewer kernel launches in passes that measured host-bound (the GPU idle 74% of
the ``ref`` pass at 32k, docs/gpu.md). SmolLM2's whole 64 x 8 batch (~196k tokens) is one."""
WORKLOAD = {
    "cuda": ["data.train_batch_size=64", "actor_rollout_ref.rollout.n=8", "data.max_response_length=256",
             "actor_rollout_ref.actor.ppo_mini_batch_size=64", "trainer.device=cuda",
             "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bfloat16",
             "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bfloat16",
             "actor_rollout_ref.rollout.dtype=bfloat16"],
    "cpu": ["data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "data.max_response_length=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.device=cpu",
            "actor_rollout_ref.rollout.name=hf"],
}
PEAK_SIZE = {"cuda": 8192, "cpu": 2048}
PASSES = ("old_log_prob", "ref", "update_actor")


def token_budget_overrides(max_token_len: int, log_prob_max_token_len: Optional[int] = None) -> list[str]:
    """Micro-batches of at most ``max_token_len`` computed tokens in the update and of
    ``log_prob_max_token_len`` (default: the same) in both log-prob passes."""
    log_prob = log_prob_max_token_len or max_token_len
    return ["actor_rollout_ref.actor.use_dynamic_bsz=true",
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={max_token_len}",
            f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={log_prob}",
            f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={log_prob}"]


def llama_1b_dir(folder: Optional[str] = None) -> str:
    """The random-init ~1B Llama folder, written once (bf16, seed 0) into ``folder`` and reused after.
    Written into a temporary sibling and renamed, so a half-written folder is never used."""
    from make_random_model import PRESETS, build

    path = Path(folder or LLAMA_1B_DIR).expanduser()
    if (path / "config.json").is_file():
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        count = build(tmp, **PRESETS["llama-1b"], dtype="bfloat16", seed=0)
        print(f"wrote a random {count / 1e9:.2f}B-parameter Llama to {path}", flush=True)
        os.rename(tmp, path)
    except OSError:
        if not (path / "config.json").is_file():  # not a lost race with another run: a real failure
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(path)


def model_overrides(model: str, model_dir: Optional[str]) -> list[str]:
    """The model path (built first where it is a random model) and the settings it needs."""
    if model == "smollm2":
        return [f"actor_rollout_ref.model.path={model_dir or SMOLLM2}"]
    if model == "llama-1b":
        return [f"actor_rollout_ref.model.path={llama_1b_dir(model_dir)}"]
    from hybrid_rl.utils.testing import build_tiny_model_dir

    path = build_tiny_model_dir(model_dir or tempfile.mkdtemp(prefix="bench_gpu_tiny_"))
    # a byte-level tokenizer: one token per character, so no demonstration turn and a longer prompt limit
    return [f"actor_rollout_ref.model.path={path}", "data.arithmetic.num_shots=0", "data.max_prompt_length=160"]


def workload(args: argparse.Namespace) -> list[str]:
    """Every Hydra override of the run, in order (later ones win): bench_step's fixed settings, the
    device's workload, the token budget, the model, then the user's ``key=value`` arguments."""
    if args.max_token_len:  # the user's budget, for every pass
        budget, log_prob = args.max_token_len, args.max_token_len
    elif args.device == "cuda":
        budget = TOKEN_BUDGET[args.model]
        log_prob = budget * LOG_PROB_BUDGET_FACTOR
    else:
        budget, log_prob = 4096, 4096
    return (DEFAULT_OVERRIDES + WORKLOAD[args.device] + token_budget_overrides(budget, log_prob)
            + model_overrides(args.model, args.model_dir) + args.overrides)


class GpuMemoryMonitor(threading.Thread):
    """Polls the used memory of every visible GPU (all processes: ``total - free`` from the driver),
    keeping the peak of the run and of the current step."""

    def __init__(self, interval_s: float = 0.2):
        super().__init__(daemon=True)
        self.interval_s, self._done = interval_s, threading.Event()
        self.baseline = self.used()
        self.peak = self.step_peak = self.baseline

    @staticmethod
    def used() -> int:
        import torch

        return sum(total - free for free, total in
                   (torch.cuda.mem_get_info(i) for i in range(torch.cuda.device_count())))

    def run(self) -> None:
        while not self._done.wait(self.interval_s):
            used = self.used()
            self.peak, self.step_peak = max(self.peak, used), max(self.step_peak, used)

    def take_step_peak(self) -> int:
        """The peak since the last call (the step that just ended; what is used now counts too, so a
        peak between two polls is not lost), then starts the next step's."""
        now = self.used()
        peak, self.step_peak = max(self.step_peak, now), now
        return peak

    def stop(self) -> None:
        self._done.set()


def run(args: argparse.Namespace) -> dict:
    import torch

    overrides = workload(args) + run_dir_overrides(args.steps, prefix="bench_gpu_")
    print("overrides: " + " ".join(overrides), flush=True)
    gpu = GpuMemoryMonitor() if args.device == "cuda" else None
    step_peaks: list[int] = []
    on_step = (lambda metrics: step_peaks.append(gpu.take_step_peak())) if gpu else None
    result = measure_steps(overrides, args.warmup, PEAK_SIZE[args.device], [gpu] if gpu else [], on_step)
    for figures, peak in zip(result["steps"], step_peaks):
        figures["gpu_mem_gib"] = peak / 2**30
    result.update(model=args.model, peak_matmul_size=PEAK_SIZE[args.device],
                  accelerator=torch.cuda.get_device_name(0) if gpu else f"CPU {result['cpu_capability']}")
    if gpu:
        result.update(gpu_mem_peak_gib=gpu.peak / 2**30, gpu_mem_before_gib=gpu.baseline / 2**30)
    result["median"] = median_figures(result)
    return result


def print_report(result: dict) -> None:
    med = result["median"]
    peaks = ", ".join(f"{d} {p / 1e12:.3g} TFLOP/s" if p else f"{d} n/a" for d, p in result["peak_flops"].items())
    params = sum(result["params"].values()) / 1e9
    print(f"{result['accelerator']}, model {result['model']} ({params:.3g}B parameters), compute dtype "
          f"{result['compute_dtype']}; peak matmul ({result['peak_matmul_size']}-square): {peaks}")
    cols = ["step_s", "gen_s", "old_log_prob_s", "ref_s", "update_actor_s", "update_weights_s", "overhead_s"]
    gpu = "gpu_mem_gib" in med
    print("step " + " ".join(f"{c[:-2]:>13}" for c in cols) + f" {'gen tok/s':>10}" + (" GPU GiB" if gpu else ""))
    for i, s in enumerate(result["steps"], 1):
        mark = "*" if i <= result["warmup"] else " "
        print(f"{i:>3}{mark} " + " ".join(f"{s[c]:13.2f}" for c in cols) + f" {s['gen_tok_s']:10.0f}"
              + (f" {s['gpu_mem_gib']:7.1f}" if gpu else ""))
    print(f"median (steps after {result['warmup']} warm-up): rollout {med['gen_tok_s']:.0f} tok/s "
          f"({med['response_tokens']:.0f} response tokens), trained {med['train_tok_s']:.0f} tok/s")
    for label in PASSES:
        if f"{label}_gflops" in med:
            print(f"  {label:>13}: {med[f'{label}_s']:6.2f} s, {med[f'{label}_gflops'] / 1e3:7.3g} TFLOP/s = "
                  f"{_pct(med[f'{label}_mfu_bfloat16'])} MFU (bf16 peak)")
    if gpu:
        print(f"  GPU memory, all processes: peak {result['gpu_mem_peak_gib']:.1f} GiB "
              f"(before the run {result['gpu_mem_before_gib']:.1f} GiB)")
    print(f"  host {rss_line(result)}")
    print(f"median step: {med['step_s']:.2f}")


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """The options bench_gpu_trl.py shares: device, model and its folder, steps, warm-up, JSON."""
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda: the issue's workload; cpu: a smoke-sized run of the same code (CI)")
    parser.add_argument("--model", choices=["smollm2", "llama-1b", "tiny"], default=None,
                        help="default: smollm2 on cuda, tiny on cpu")
    parser.add_argument("--model-dir", default=None,
                        help=f"llama-1b: where the random model is written once (default {LLAMA_1B_DIR}); "
                             "smollm2: a local folder instead of the embedded model")
    parser.add_argument("--steps", type=int, default=None, help="default: 5 on cuda, 2 on cpu")
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the medians")
    parser.add_argument("--json", default=None, help="also write all figures to this JSON file")


def parse_run_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse, fill the device-dependent defaults, and stop with one line where CUDA is asked for but absent."""
    args = parser.parse_args()
    args.model = args.model or ("smollm2" if args.device == "cuda" else "tiny")
    args.steps = args.steps or (5 if args.device == "cuda" else 2)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(1, f"{parser.prog}: no CUDA device is visible; run it on a GPU machine, or with --device cpu "
                       "for the smoke-sized run\n")
    return args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_args(parser)
    parser.add_argument("--max-token-len", type=int, default=None,
                        help="computed tokens per micro-batch of every pass (default on cuda: the update "
                             + ", ".join(f"{m} {n}" for m, n in TOKEN_BUDGET.items())
                             + f", the log-prob passes {LOG_PROB_BUDGET_FACTOR}x that; 4096 on cpu)")
    parser.add_argument("overrides", nargs="*", help="Hydra key=value overrides")
    args = parse_run_args(parser)
    result = run(args)
    write_json(args.json, result)
    print(json.dumps({"median": result["median"]}))
    print_report(result)


if __name__ == "__main__":
    main()
