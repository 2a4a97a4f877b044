"""Wall time of whole GRPO steps through the real trainer (driver + colocated worker), broken down.

    python benchmarks/bench_step.py                          # 6 steps of the fixed config below
    python benchmarks/bench_step.py --steps 6 --json /tmp/step.json actor_rollout_ref.actor.use_dynamic_bsz=true
    python benchmarks/bench_step.py --lora-rank 32           # the same work with a LoRA actor

Fixed config (the work a user would give TRL's GRPOTrainer): embedded SmolLM2-135M-Instruct,
8 prompts x 4 responses, <= 32 response tokens, synthetic arithmetic, KL loss to the reference
policy with coefficient 0.04, one optimizer step per batch, no validation, no checkpoints. Extra
``key=value`` arguments are Hydra overrides on top of it.

Per step it prints the ``timing_s/*`` breakdown (driver side), the driver/Ray overhead (step minus
the listed parts) and the dispatch cost (driver-side call time minus worker-side compute), tokens/s,
achieved FLOP/s and MFU of each model pass against the matmul peak of the compute dtype that ran
(``auto`` resolved: bf16 only where the CPU computes it natively), also against the fp32 and bf16
peaks where they can be measured quickly (2048-square matmuls with the worker's thread count, before
Ray starts; an emulated bf16 gets no peak and no MFU, never minutes of measuring), and the peak RSS of this
process tree. FLOPs per pass: ``2 * N_body * tokens + 2 * N_embed * response_tokens`` forward (the
LM head only runs on response-predicting positions), x3 for forward + backward, and x ``ppo_epochs``
for the update; attention scores are not counted (a few % at ~100 tokens/row). ``tokens`` are the
tokens the pass must compute: padding and the repeated copies of a prompt shared by GRPO's n
responses are not counted (the worker reports ``perf/computed_token_frac/<pass>``, computed / valid
tokens; with the prefix grouper it is below 1, and FLOP/s are those of the work actually done). The
first ``--warmup`` steps are shown but left out of the medians. The last line is ``median step:
<seconds>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import psutil

DEFAULT_OVERRIDES = [
    "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4", "data.max_response_length=32",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.04",
    "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.val_before_train=false",
    "trainer.val_at_end=false", "trainer.logger=[jsonl]", "trainer.progress_bar=false",
    "trainer.plot=false", "trainer.resume_mode=disable",
]
# (label, timing key, FLOP multiplier: 1 = forward only, 3 = forward + backward, 0 = not a model pass)
# the teacher pass (on-policy distillation) is timed only: its model's size is not the actor's
PARTS = [("gen", "gen", 0), ("reward", "reward", 0), ("old_log_prob", "old_log_prob", 1), ("teacher", "teacher", 0),
         ("ref", "ref", 1), ("adv", "adv", 0), ("update_actor", "update_actor", 3)]
# driver-side step -> worker-side timing keys of the same call (Ray dispatch = the difference)
WORKER_KEYS = {"gen": ["generate_sequences_worker", "weight_sync"], "teacher": ["compute_teacher_log_prob_worker"],
               "old_log_prob": ["compute_log_prob_worker"], "ref": ["compute_ref_log_prob_worker"],
               "update_actor": ["update_actor_worker"]}


class RssMonitor(threading.Thread):
    """Polls the memory of this process and all its descendants (Ray's raylet and workers, inductor's
    compile workers) every ``interval_s``.

    Summed RSS counts a page shared by several processes (a mapped library such as libtorch) once per
    process; PSS divides it among them, so summed PSS is what the tree really holds. Both are kept, as
    peaks over the whole run and over the steady part (from :meth:`mark_steady` on, after the warm-up
    steps that compile; None when it never began). Reading PSS walks each process's page map (~10 ms per
    GiB held), so it is read on every :data:`PSS_EVERY`-th poll only. ``top`` lists the largest processes
    at the tree's RSS peak."""

    TOP = 6
    PSS_EVERY = 5

    def __init__(self, interval_s: float = 0.2):
        super().__init__(daemon=True)
        self.interval_s, self._done, self._steady, self._polls = interval_s, threading.Event(), False, 0
        self._lock = threading.Lock()
        self.peak_total = self.peak_single = self.peak_pss = self.steady_total = self.steady_pss = 0
        self.top: list[dict] = []

    def mark_steady(self) -> None:
        """From now on also track the steady-state peaks."""
        self._steady = True

    def run(self) -> None:
        while not self._done.wait(self.interval_s):
            self._polls += 1
            self.sample_tree(pss=self._polls % self.PSS_EVERY == 1)

    def sample_tree(self, pss: bool = True) -> None:
        """One poll of this process and its descendants."""
        root = psutil.Process()
        self.sample([root, *root.children(recursive=True)], pss)

    def sample(self, procs: Sequence[psutil.Process], pss: bool = True) -> None:
        """One poll of ``procs`` (their PSS too when ``pss``): update the peaks (bytes)."""
        rows = []
        for proc in procs:
            try:
                rows.append((*_rss_pss(proc, pss), proc))
            except psutil.Error:  # the process ended between listing and reading it
                pass
        with self._lock:
            self._update(rows, pss)

    def _update(self, rows: list[tuple[int, Optional[int], psutil.Process]], with_pss: bool) -> None:
        total = sum(r[0] for r in rows)
        if total > self.peak_total:
            self.top = [_process_row(proc, rss, p) for rss, p, proc in sorted(rows, key=lambda r: -r[0])[:self.TOP]]
        self.peak_total = max(self.peak_total, total)
        self.peak_single = max(self.peak_single, max((r[0] for r in rows), default=0))
        pss = sum(r[1] for r in rows) if with_pss else 0
        self.peak_pss = max(self.peak_pss, pss)
        if self._steady:
            self.steady_total, self.steady_pss = max(self.steady_total, total), max(self.steady_pss, pss)

    def figures(self) -> dict:
        """The peaks in GiB and the largest processes at the RSS peak."""
        def gib(n: int) -> Optional[float]:
            return n / 2**30 if n else None

        return {"peak_rss_gib": self.peak_total / 2**30, "peak_rss_one_process_gib": self.peak_single / 2**30,
                "peak_pss_gib": gib(self.peak_pss), "steady_rss_gib": gib(self.steady_total),
                "steady_pss_gib": gib(self.steady_pss), "peak_rss_top": self.top}

    def stop(self) -> None:
        """A last poll with PSS (a short steady part may fall between two polls); then the thread ends."""
        try:
            self.sample_tree()
        finally:
            self._done.set()
            if self.is_alive():
                self.join(timeout=30)


def _rss_pss(proc: psutil.Process, pss: bool) -> tuple[int, Optional[int]]:
    """``(rss, pss)`` in bytes (pss None unless asked); PSS is the RSS where the system does not let it
    be read (smaps)."""
    if not pss:
        return proc.memory_info().rss, None
    try:
        info = proc.memory_full_info()
        return info.rss, getattr(info, "pss", info.rss)
    except psutil.AccessDenied:
        rss = proc.memory_info().rss
        return rss, rss


def _process_row(proc: psutil.Process, rss: int, pss: Optional[int]) -> dict:
    """One process at the RSS peak: pid, a short command line, RSS and PSS in GiB (PSS None when that
    poll did not read it)."""
    try:
        command = " ".join(proc.cmdline())[:120] or proc.name()
    except psutil.Error:
        command = "?"
    return {"pid": proc.pid, "command": command, "rss_gib": rss / 2**30,
            "pss_gib": None if pss is None else pss / 2**30}


def step_figures(m: dict, sizes: tuple[int, int], rows: int, peaks: dict[str, Optional[float]],
                 epochs: int = 1, dtype: str = "bfloat16") -> dict:
    """Breakdown, overhead, throughput and MFU of one step's logged metrics ``m``; the update
    passes over the batch ``epochs`` times (``actor.ppo_epochs``)."""
    body, embed = sizes
    tokens = m["perf/total_num_tokens"]
    resp_tokens = m["response_length/mean"] * rows
    step = m["timing_s/step"]
    out = {"step_s": step, "tokens": tokens, "response_tokens": resp_tokens}
    listed = 0.0
    for label, key, mult in PARTS:
        sec = m.get(f"timing_s/{key}", 0.0)
        listed += sec
        out[f"{label}_s"] = sec
        if mult and sec > 0:
            # tokens that must be computed: padding and repeated copies of a shared prompt excluded
            needed = min(1.0, m.get(f"perf/computed_token_frac/{key}", 1.0))
            out[f"{label}_computed_token_frac"] = m.get(f"perf/computed_token_frac/{key}", float("nan"))
            flops = mult * (2 * body * tokens * needed + 2 * embed * resp_tokens)
            flops *= epochs if label == "update_actor" else 1
            out[f"{label}_gflops"] = flops / sec / 1e9
            for name, peak in peaks.items():
                out[f"{label}_mfu_{name}"] = flops / sec / peak if peak else float("nan")
            out[f"{label}_mfu"] = out[f"{label}_mfu_{dtype}"]  # against the dtype that ran
    out["update_weights_s"] = m.get("timing_s/weight_sync", 0.0)
    out["overhead_s"] = step - listed
    out["overhead_frac"] = out["overhead_s"] / step
    dispatch = sum(m[f"timing_s/{s}"] - sum(m.get(f"timing_s/{w}", 0.0) for w in ws)
                   for s, ws in WORKER_KEYS.items() if f"timing_s/{s}" in m and f"timing_s/{ws[0]}" in m)
    out["dispatch_s"] = dispatch
    out["dispatch_frac"] = dispatch / step
    out["gen_tok_s"] = resp_tokens / out["gen_s"] if out["gen_s"] else 0.0
    out["train_tok_s"] = tokens / out["update_actor_s"] if out["update_actor_s"] else 0.0
    out["padding_frac"] = m.get("actor/padding_frac", float("nan"))
    out["score"] = m.get("critic/score/mean", float("nan"))
    return out


def lora_overrides(rank: int) -> list[str]:
    """The LoRA preset of ``--lora-rank`` (the recipes/arithmetic_grpo_lora settings at that rank)."""
    if rank <= 0:
        return []
    return [f"actor_rollout_ref.model.lora_rank={rank}", f"actor_rollout_ref.model.lora_alpha={2 * rank}",
            "actor_rollout_ref.model.target_modules=all-linear", "actor_rollout_ref.actor.optim.lr=1e-4"]


def fit_monitored(trainer, *monitors: threading.Thread) -> float:
    """``trainer.fit()`` with ``monitors`` polling throughout; the trainer is shut down after. Returns
    the wall seconds of the fit."""
    for monitor in monitors:
        monitor.start()
    start = time.perf_counter()
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
        for monitor in monitors:
            monitor.stop()
    return time.perf_counter() - start


def run_dir_overrides(steps: int, prefix: str = "bench_step_") -> list[str]:
    """``steps`` training steps into a fresh temporary run folder."""
    return [f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={tempfile.mkdtemp(prefix=prefix)}"]


def command_config(overrides: list[str]):
    """The typed config a command-line run with ``overrides`` gets: ``trainer.single_process`` chosen as
    ``main_ppo`` chooses it (hybrid_rl/trainer/core/single_process.py)."""
    from hybrid_rl.trainer import get_config
    from hybrid_rl.trainer.config.loader import to_ppo_config
    from hybrid_rl.trainer.core.single_process import resolve_single_process

    return resolve_single_process(to_ppo_config(get_config(overrides)))


def reexec_like_command(overrides: list[str]) -> None:
    """As ``main_ppo`` does: when the run's worker will live in this process, restart this benchmark
    once with that worker's environment (allocator, logging), so what is measured is what a user's
    command gets."""
    from hybrid_rl.trainer.core.single_process import reexec_for_single_process

    cfg = command_config(overrides)
    if cfg.trainer.single_process:
        reexec_for_single_process(cfg)


#: What the workers chose at start-up, as their logs say it.
CHOICE_MARKERS = ("precision on ", "packed attention: ", "FSDP2 groups: ")


def _choice(message: str) -> Optional[str]:
    """``message`` from its first :data:`CHOICE_MARKERS` marker on, or None."""
    for marker in CHOICE_MARKERS:
        if marker in message:
            return message[message.index(marker):].strip()
    return None


class ChoiceLog(logging.Handler):
    """Collects the choice lines logged in this process (the driver and a worker it hosts, which
    log to no file under a benchmark) while attached to the ``hybrid_rl`` logger. That logger is
    lowered to INFO for the while and stops propagating; every record the logger would have let
    through before goes on to the root's handlers (``logging.lastResort`` when there are none), so
    what reaches the console does not change."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.lines: dict[str, None] = {}
        self._logger = logging.getLogger("hybrid_rl")
        self._saved = (self._logger.level, self._logger.propagate)
        self._passes = logging.WARNING

    def emit(self, record: logging.LogRecord) -> None:
        line = _choice(record.getMessage())
        if line:
            self.lines[line] = None
        if self._saved[1] and record.levelno >= self._passes:
            logging.getLogger().handle(record)

    def __enter__(self) -> "ChoiceLog":
        self._saved = (self._logger.level, self._logger.propagate)
        self._passes = self._logger.getEffectiveLevel()
        self._logger.setLevel(min(self._passes, logging.INFO))
        self._logger.propagate = False
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._saved[0])
        self._logger.propagate = self._saved[1]


_STAMP = "%Y-%m-%d %H:%M:%S"


def _logged_since(line: str, since: Optional[float]) -> bool:
    """Whether a log-file ``line`` (``YYYY-MM-DD HH:MM:SS,mmm ...``) was written at ``since`` or
    later; lines without a time stamp count."""
    if since is None:
        return True
    try:
        return time.mktime(time.strptime(line[:19], _STAMP)) >= int(since)
    except ValueError:
        return True


def worker_choices(run_dir: str, logged: Sequence[str] = (), since: Optional[float] = None) -> list[str]:
    """The distinct lines that report a worker's choices (the compute dtype, the packed-attention
    kernel, the FSDP2 grouping): ``logged`` in this process, then those of the Ray workers' log
    files anywhere under ``run_dir/logs/`` (the rollout and teacher pools log in subfolders) written
    at ``since`` (a ``time.time()``) or later, in the order first seen."""
    found = dict.fromkeys(logged)
    for path in sorted(Path(run_dir, "logs").rglob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if (choice := _choice(line)) is not None and _logged_since(line, since):
                found[choice] = None
    return list(found)


def measure_steps(overrides: list[str], warmup: int, peak_size: int = 2048,
                  monitors: Sequence[threading.Thread] = (), on_step: Optional[Callable[[dict], None]] = None) -> dict:
    """Run the trainer with ``overrides`` and return every step's :func:`step_figures`, the matmul peaks
    (``peak_size``-square matmuls on the run's device), the peak RSS of the process tree and the
    workers' start-up choices (:func:`worker_choices`).
    ``monitors`` (threads with a ``stop()``) poll during the fit beside the RSS monitor; ``on_step`` is
    called with each step's logged metrics."""
    import torch

    from hybrid_rl.trainer.core.model_facts import measure_peak_flops, model_param_split
    from hybrid_rl.trainer.main_ppo import build_trainer
    from hybrid_rl.trainer.ppo.trainer import RayPPOTrainer
    from hybrid_rl.trainer.config.checks import make_run_plan

    cfg = command_config(overrides)
    steps: list[dict] = []
    monitor = RssMonitor()

    class Recording(RayPPOTrainer):
        def on_step_end(self, metrics: dict) -> None:
            steps.append(dict(metrics))
            if len(steps) >= warmup:
                monitor.mark_steady()
            if on_step is not None:
                on_step(metrics)

    started = time.time()
    with ChoiceLog() as choices:  # the workers' start-up choices, logged while the trainer is built and fits
        trainer = build_trainer(cfg, Recording)
        plan = make_run_plan(trainer.config)
        torch.set_num_threads(plan.threads_per_worker)
        dtype = trainer.actor_compute_dtype
        peaks = {d: measure_peak_flops(plan.device, 1.0, d, size=peak_size)
                 for d in dict.fromkeys(("float32", "bfloat16", dtype))}
        if plan.device == "cuda":
            torch.cuda.empty_cache()  # the driver keeps no matmul buffers on the workers' GPU
        sizes = model_param_split(trainer.config.actor_rollout_ref.model)
        rows = trainer.config.data.train_batch_size * trainer.config.actor_rollout_ref.rollout.n
        if warmup <= 0:
            monitor.mark_steady()
        wall_s = fit_monitored(trainer, monitor, *monitors)
    epochs = trainer.config.actor_rollout_ref.actor.ppo_epochs
    figures = [step_figures(m, sizes, rows, peaks, epochs, dtype) for m in steps]
    return {"overrides": overrides, "peak_flops": peaks, "compute_dtype": dtype, "device": plan.device,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads_per_worker": plan.threads_per_worker,
            "params": {"body": sizes[0], "head": sizes[1]}, "steps": figures, "wall_s": wall_s,
            "worker_choices": worker_choices(trainer.run_dir, list(choices.lines), since=started),
            **monitor.figures(), "load_avg": os.getloadavg(), "warmup": warmup}


def run(args: argparse.Namespace) -> dict:
    overrides = (DEFAULT_OVERRIDES + run_dir_overrides(args.steps) + lora_overrides(args.lora_rank)
                 + args.overrides)
    return measure_steps(overrides, args.warmup)


def median_figures(result: dict) -> dict:
    kept = result["steps"][result["warmup"]:] or result["steps"]
    return {k: statistics.median(s[k] for s in kept) for k in kept[0]}


def _pct(share: float) -> str:
    """A share as a percentage; ``n/a`` where no peak was measurable (an emulated dtype)."""
    return "n/a" if share != share else f"{share:.0%}"


def write_json(path: Optional[str], result: dict) -> None:
    """All figures to ``path`` (nothing when None); what JSON cannot hold is written as its ``str``."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1, default=str)


def rss_line(result: dict) -> str:
    line = (f"peak RSS {result['peak_rss_gib']:.2f} GiB (process tree), largest process "
            f"{result['peak_rss_one_process_gib']:.2f} GiB")
    if result.get("peak_pss_gib") is not None:
        line += f"; PSS {result['peak_pss_gib']:.2f} GiB"
    if result.get("steady_rss_gib") is not None:
        line += (f"; after the warm-up RSS {result['steady_rss_gib']:.2f} GiB, PSS "
                 f"{result['steady_pss_gib'] or float('nan'):.2f} GiB")
    return line


def print_table(result: dict) -> None:
    cols = ["step_s", "gen_s", "old_log_prob_s", "ref_s", "adv_s", "update_actor_s", "update_weights_s",
            "overhead_s", "dispatch_s"]
    peaks = ", ".join(f"{d} {p / 1e9:.0f} GFLOP/s" if p else f"{d} not measurable quickly (emulated)"
                      for d, p in result["peak_flops"].items())
    print(f"CPU {result['cpu_capability']}, compute dtype {result['compute_dtype']}; peak matmul: {peaks} "
          f"({result['threads_per_worker']} threads); load avg {' '.join(f'{x:.2f}' for x in result['load_avg'])}")
    if any(s["teacher_s"] for s in result["steps"]):  # on-policy distillation: the teacher's pass
        cols.insert(cols.index("ref_s") + 1, "teacher_s")
    print("step " + " ".join(f"{c[:-2]:>13}" for c in cols))
    for i, s in enumerate(result["steps"], 1):
        mark = "*" if i <= result["warmup"] else " "
        print(f"{i:>3}{mark} " + " ".join(f"{s[c]:13.2f}" for c in cols))
    med = median_figures(result)
    print(f"median (steps after {result['warmup']} warm-up): tokens/step {med['tokens']:.0f} "
          f"(response {med['response_tokens']:.0f}), gen {med['gen_tok_s']:.0f} tok/s, trained "
          f"{med['train_tok_s']:.0f} tok/s, padding in trained micro-batches {med['padding_frac']:.1%}")
    for label in ("old_log_prob", "ref", "update_actor"):
        if f"{label}_gflops" in med:
            print(f"  {label:>13}: {med[f'{label}_gflops']:6.0f} GFLOP/s = {_pct(med[f'{label}_mfu'])} of the "
                  f"{result['compute_dtype']} peak (bf16 {_pct(med[f'{label}_mfu_bfloat16'])}, fp32 "
                  f"{_pct(med[f'{label}_mfu_float32'])}); computed/valid tokens "
                  f"{med[f'{label}_computed_token_frac']:.2f}")
    print(f"  driver/Ray overhead {med['overhead_s']:.2f} s ({med['overhead_frac']:.1%} of the step), "
          f"of which dispatch + serialization {med['dispatch_s']:.2f} s ({med['dispatch_frac']:.1%})")
    print(f"  {rss_line(result)}")
    print(f"median step: {med['step_s']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the medians")
    parser.add_argument("--json", default=None, help="also write all figures to this JSON file")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="LoRA actor of this rank on all linear layers (alpha 2x rank, lr 1e-4); 0 = full")
    parser.add_argument("overrides", nargs="*", help="Hydra key=value overrides")
    args = parser.parse_args()
    reexec_like_command(DEFAULT_OVERRIDES + lora_overrides(args.lora_rank) + args.overrides)
    result = run(args)
    write_json(args.json, result)
    print(json.dumps({"median": median_figures(result)}))
    print_table(result)


if __name__ == "__main__":
    main()
