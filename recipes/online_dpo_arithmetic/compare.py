"""Online DPO (run.sh) against the GRPO baseline on the same steps: held-out accuracy and training reward
per step, cumulative wall time, and one PNG of the held-out curves.

    python recipes/online_dpo_arithmetic/compare.py [DPO_RUN_DIR GRPO_RUN_DIR [PNG]]

Defaults: run.sh's folder and the baseline's (``bash recipes/arithmetic_grpo/run.sh
trainer.total_training_steps=8``), both under ``checkpoints/hybrid_rl/``; the PNG goes next to this file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hybrid_rl.trainer.core.plotting import plot_comparison, read_curves

SERIES = "val arithmetic/reward/mean@1"
HERE = Path(__file__).resolve().parent


def table(label: str, path: Path) -> list[str]:
    """Markdown rows: held-out accuracy, training reward and cumulative ``timing_s/step`` per step."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    curves = read_curves(str(path))
    acc, reward = dict(curves.get(SERIES, [])), dict(curves.get("train reward", []))
    steps = sorted({int(r["step"]) for r in rows})
    clock, total = {}, 0.0
    for row in rows:
        total += row.get("timing_s/step", 0.0)
        clock[int(row["step"])] = total
    cells = lambda values, fmt: " | ".join(fmt(values[s]) if s in values else "" for s in steps)  # noqa: E731
    return [f"| {label} | " + " | ".join(str(s) for s in steps) + " |",
            "|---|" + "---|" * len(steps),
            "| held-out greedy accuracy | " + cells(acc, lambda v: f"**{v:.1%}**") + " |",
            "| training reward (`critic/score/mean`) | " + cells(reward, lambda v: f"{v:.2f}") + " |",
            "| time since start of training (s) | " + cells(clock, lambda v: f"{v:.0f}") + " |"]


def main(dpo: Path, grpo: Path, png: Path) -> None:
    runs = {"online DPO": dpo / "metrics.jsonl", "GRPO": grpo / "metrics.jsonl"}
    for label, path in runs.items():
        print("\n".join(table(label, path)) + "\n")
    out = plot_comparison({k: str(v) for k, v in runs.items()}, str(png), SERIES,
                          "held-out greedy accuracy (200 problems): online DPO vs GRPO")
    print(f"curves: {out}")


if __name__ == "__main__":
    args = [Path(a) for a in sys.argv[1:]]
    root = Path("checkpoints/hybrid_rl")
    main(args[0] if args else root / "online_dpo_arithmetic", args[1] if len(args) > 1 else root / "arithmetic_grpo",
         args[2] if len(args) > 2 else HERE / "online_dpo_curves.png")
