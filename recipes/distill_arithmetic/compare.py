"""The student runs of run.sh (and any others under OUT) side by side: held-out accuracy per step and per training second,
the steps each needs to reach 90% of the teacher's accuracy, and one PNG of the curves.

    python recipes/distill_arithmetic/compare.py [OUT]     # OUT: run.sh's OUT (default checkpoints/distill_arithmetic)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from hybrid_rl.trainer.core.plotting import plot_comparison, read_curves

SERIES = "val arithmetic/reward/mean@1"
MODES = {"distill": "distillation only", "distill_task": "distillation + task reward",
         "distill_topk": "top-32 forward KL only", "grpo": "GRPO alone"}


def seconds_per_step(path: Path) -> dict[int, float]:
    """Cumulative ``timing_s/step`` (training and validation) at the end of each step."""
    total, out = 0.0, {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        total += row.get("timing_s/step", 0.0)
        out[int(row["step"])] = total
    return out


def variant_label(name: str) -> str:
    """``distill_topk_b4_lr5e-6`` -> ``top-32 forward KL only, 4 prompts/step, lr 5e-6`` (a folder named
    ``<mode>[_b<prompts per step>][_lr<learning rate>][_seed<seed>]``, as run.sh names them)."""
    match = re.fullmatch(r"(.+?)(?:_b(\d+))?(?:_lr([^_]+))?(?:_seed(\d+))?", name)
    mode, prompts, lr, seed = match.groups()
    parts = ([MODES.get(mode, mode)] + ([f"{prompts} prompts/step"] if prompts else []) + ([f"lr {lr}"] if lr else [])
             + ([f"seed {seed}"] if seed else []))
    return ", ".join(parts)


def main(out: Path) -> None:
    teacher = dict(read_curves(str(out / "teacher" / "metrics.jsonl"))[SERIES])
    target = teacher[max(teacher)]
    print(f"teacher (default GRPO run, step {max(teacher)}): {target:.1%} held-out; 90% of it = {0.9 * target:.1%}")
    runs = {label: out / mode / "metrics.jsonl" for mode, label in MODES.items() if (out / mode).is_dir()}
    for extra in sorted(out.glob("*/metrics.jsonl")):  # further students run with another default_local_dir
        name = extra.parent.name
        if name != "teacher" and name not in MODES:
            runs[variant_label(name)] = extra
    print(f"{'run':<52} " + " ".join(f"{s:>6}" for s in range(9)) + "  first step >= 90% of teacher (s)")
    for label, path in runs.items():
        if not path.exists():
            print(f"{label:<52} not run")
            continue
        acc, clock = dict(read_curves(str(path))[SERIES]), seconds_per_step(path)
        reached = next((s for s in sorted(acc) if acc[s] >= 0.9 * target), None)
        when = "not reached" if reached is None else f"step {reached} ({clock.get(reached, 0.0):.0f} s)"
        print(f"{label:<52} " + " ".join(f"{acc[s]:6.1%}" if s in acc else f"{'':>6}" for s in range(9)) + f"  {when}")
    png = plot_comparison({k: str(v) for k, v in runs.items()}, str(out / "distill_curves.png"), SERIES,
                          "held-out greedy accuracy (200 problems)", {f"teacher ({target:.1%})": target})
    print(f"curves: {png}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "checkpoints/distill_arithmetic"))
