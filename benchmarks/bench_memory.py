"""Where the memory of a training run goes: peak RSS per process and per owner, at each step phase.

    python benchmarks/bench_memory.py                         # bench_step.py's work, 4 steps
    python benchmarks/bench_memory.py --preset default        # the default run (validation included)
    python benchmarks/bench_memory.py --lora-rank 32          # the same work with a LoRA actor
    python benchmarks/bench_memory.py --json /tmp/mem.json key=value ...

Everything is measured, nothing estimated:
- the whole process tree (driver, Ray's own processes, the worker ranks) is polled every 0.1 s and
  each sample is filed under the step phase the driver is in (``generate``, ``compute_ref_log_prob``,
  ``update_actor``, ...); a phase's figure is the sample with the largest tree total;
- each worker rank reports its exact peak RSS inside every call (the kernel's high-water mark,
  reset at the call's start: ``perf/peak_rss_gib/<phase>``), and after each step the bytes it holds
  per owner, counted from the live tensors (``memory_breakdown``): actor parameters, gradients (as
  held at the optimizer step), optimizer state, the reference's own copy, the rollout engine's
  weights and KV cache, and the RSS before any model was built (Python, torch, Ray's worker runtime).
  What the phase peak holds beyond those is activations and transients (logits, FSDP2 all-gather
  buffers, the engine's scratch, allocator caches).

The last line is ``peak RSS: <GiB>`` (process tree).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from collections import defaultdict
from typing import Optional

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_step import DEFAULT_OVERRIDES, command_config, fit_monitored, lora_overrides, reexec_like_command  # noqa: E402

GIB = 2**30
# driver step -> worker metric of the same call
PHASES = {"generate": "gen", "compute_old_log_prob": "old_log_prob", "compute_ref_log_prob": "ref",
          "compute_values": "values", "update_critic": "update_critic", "update_actor": "update_actor",
          "validate": "gen"}
PRESETS = {"bench_step": DEFAULT_OVERRIDES,
           "default": ["trainer.save_freq=-1", "trainer.resume_mode=disable", "trainer.progress_bar=false",
                       "trainer.plot=false", "trainer.logger=[jsonl]"]}


def role_of(proc: psutil.Process, root_pid: int) -> str:
    """``driver``, ``worker`` (a colocated worker rank) or ``ray`` (GCS, raylet, agents, idle workers)."""
    if proc.pid == root_pid:
        return "driver"
    try:
        cmd = " ".join(proc.cmdline()[:2])
    except psutil.Error:
        return "ray"
    return "worker" if "Colocated" in cmd or "Worker." in cmd else "ray"


class PhaseMonitor(threading.Thread):
    """Polls the RSS of the process tree, filing each sample under ``phase()``; keeps per phase
    the sample with the largest total (its per-role split) and the largest single process."""

    def __init__(self, phase, interval_s: float = 0.1):
        super().__init__(daemon=True)
        self.phase, self.interval_s, self._done = phase, interval_s, threading.Event()
        self.peaks: dict[str, dict] = {}

    def sample(self) -> dict[str, int]:
        root = psutil.Process()
        by_role: dict[str, int] = defaultdict(int)
        for proc in [root, *root.children(recursive=True)]:
            try:
                by_role[role_of(proc, root.pid)] += proc.memory_info().rss
            except psutil.Error:
                pass
        return dict(by_role)

    def run(self) -> None:
        while not self._done.wait(self.interval_s):
            phase = self.phase()
            roles = self.sample()
            total = sum(roles.values())
            for key in (phase, "run"):
                if total > self.peaks.get(key, {}).get("total", -1):
                    self.peaks[key] = {"total": total, **roles}

    def stop(self) -> None:
        self._done.set()


def run(args: argparse.Namespace) -> dict:
    from hybrid_rl.trainer.main_ppo import build_trainer
    from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer

    run_dir = tempfile.mkdtemp(prefix="bench_memory_")
    overrides = (PRESETS[args.preset] + [f"trainer.total_training_steps={args.steps}",
                                         f"trainer.default_local_dir={run_dir}"]
                 + lora_overrides(args.lora_rank) + args.overrides)
    steps: list[dict] = []
    state = {"phase": "init"}

    class Recording(RayPPOTrainer):
        def _run_step(self, name, batch, metrics):
            state["phase"] = name
            try:
                return super()._run_step(name, batch, metrics)
            finally:
                state["phase"] = "driver"

        def run_validation(self):
            state["phase"] = "validate"
            try:
                return super().run_validation()
            finally:
                state["phase"] = "driver"

        def on_step_end(self, metrics: dict) -> None:
            owners = self.actor_rollout_wg.memory_breakdown()  # one dict per rank
            steps.append({"metrics": dict(metrics), "owners": owners})

    trainer = build_trainer(command_config(overrides), Recording)
    monitor = PhaseMonitor(lambda: state["phase"])
    wall_s = fit_monitored(trainer, monitor)
    import torch

    return {"overrides": overrides, "preset": args.preset, "steps": steps, "tree_peaks": monitor.peaks,
            "wall_s": wall_s, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "compute_dtype": trainer.actor_compute_dtype, "warmup": args.warmup}


def worker_table(result: dict) -> tuple[list[str], list[tuple[str, list[Optional[float]]]]]:
    """Rank 0's owners (GiB, last step) against each phase's worker peak (max over measured steps)."""
    kept = result["steps"][result["warmup"]:] or result["steps"]
    owners = kept[-1]["owners"][0]
    phases = [p for p in dict.fromkeys(PHASES.values())
              if any(f"perf/peak_rss_gib/{p}" in s["metrics"] for s in kept)]
    peaks = {p: max(s["metrics"].get(f"perf/peak_rss_gib/{p}", 0.0) for s in kept) for p in phases}
    labels = [("process/baseline_rss", "libraries + runtime (RSS before the models)"),
              ("actor/params", "actor parameters"), ("actor/grads", "actor gradients (update only)"),
              ("actor/optimizer", "optimizer state"), ("ref/params", "reference copy"),
              ("rollout/weights", "rollout engine weights"), ("rollout/kv_cache", "rollout KV cache")]
    rows = []
    for key, label in labels:
        if key not in owners:
            continue
        rows.append((label, [owners[key] / GIB if key != "actor/grads" or p.startswith("update") else 0.0
                             for p in phases]))
    counted = [sum(r[1][i] for r in rows) for i in range(len(phases))]
    rows.append(("activations + transients (the rest)", [peaks[p] - counted[i] for i, p in enumerate(phases)]))
    rows.append(("**worker peak RSS** (high-water mark in the call)", [peaks[p] for p in phases]))
    return phases, rows


def print_report(result: dict) -> None:
    print(f"CPU {result['cpu_capability']}, compute dtype {result['compute_dtype']}, preset {result['preset']}, "
          f"wall {result['wall_s']:.0f} s")
    phases, rows = worker_table(result)
    print("\n| worker rank 0, GiB | " + " | ".join(phases) + " |")
    print("|---|" + "---|" * len(phases))
    for label, values in rows:
        print(f"| {label} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    tree = result["tree_peaks"]
    names = [n for n in (*PHASES, "driver", "run") if n in tree]
    print("\n| process tree at its peak, GiB | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for role in ("driver", "ray", "worker", "total"):
        print(f"| {role} | " + " | ".join(f"{tree[n].get(role, 0) / GIB:.2f}" for n in names) + " |")
    print(f"peak RSS: {tree.get('run', {}).get('total', 0) / GIB:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="bench_step",
                        help="bench_step: bench_step.py's fixed work; default: the default run")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the worker table")
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA actor of this rank (bench_step.py's preset)")
    parser.add_argument("--json", default=None, help="also write all figures to this JSON file")
    parser.add_argument("overrides", nargs="*", help="Hydra key=value overrides")
    args = parser.parse_args()
    reexec_like_command(PRESETS[args.preset] + lora_overrides(args.lora_rank) + args.overrides)
    result = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    print_report(result)


if __name__ == "__main__":
    main()
