"""End-of-run plot: training reward (or SFT loss), validation score (and correct tool use) per step, as a PNG.

matplotlib draws it when installed (it is a runtime dependency of hybrid_rl); otherwise a small
Pillow renderer draws the same two series so a run never ends without its curve.
"""

from __future__ import annotations

import json
import logging
import math
import os

logger = logging.getLogger(__name__)

REWARD_KEY = "critic/score/mean"
PLOT_FILE = "reward_curve.png"
LOSS_KEYS = {"train/loss": "train loss", "val/sft_loss": "val loss", "val/rm/loss": "val loss",
             "val/rm/accuracy": "val pairwise accuracy"}
"""SFT and reward-model runs plot their loss curves (and the RM its held-out accuracy) beside the
validation score."""
CORRECT_TOOL_USE_SUFFIX = "/correct"
"""A tool metric named ``correct`` (share of held-out rows that used the tool correctly) is plotted too."""


def read_curves(jsonl_path: str) -> dict[str, list[tuple[int, float]]]:
    """Series to plot from ``metrics.jsonl``: ``{"train reward": [(step, v)], "<val key>": ...}``.

    A step logged twice (a resumed run re-doing steps after its last checkpoint) keeps its last
    value, which is the one of the run that continued.
    """
    by_step: dict[str, dict[int, float]] = {}
    with open(jsonl_path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            step = int(row["step"])
            for key, value in row.items():
                if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                    continue
                if key == REWARD_KEY:
                    by_step.setdefault("train reward", {})[step] = float(value)
                elif key in LOSS_KEYS:  # SFT (main_sft): the training and held-out loss
                    by_step.setdefault(LOSS_KEYS[key], {})[step] = float(value)
                elif key.startswith("val-core/") and "/reward/mean@" in key:
                    name = "val " + key[len("val-core/"):]
                    by_step.setdefault(name, {})[step] = float(value)
                elif key.startswith("val-aux/") and key.endswith(CORRECT_TOOL_USE_SUFFIX) and "/agent/tool/" in key:
                    source, tool = key[len("val-aux/"):].split("/agent/tool/")
                    name = f"val {source} used {tool[:-len(CORRECT_TOOL_USE_SUFFIX)]} correctly"
                    by_step.setdefault(name, {})[step] = float(value)
    return {name: sorted(points.items()) for name, points in by_step.items()}


def plot_run(jsonl_path: str, png_path: str, title: str = "") -> str | None:
    """Write the reward / validation-score curves of ``jsonl_path`` to ``png_path``.

    Returns the path, or None when there is nothing to plot yet.
    """
    if not os.path.exists(jsonl_path):
        return None
    curves = read_curves(jsonl_path)
    if not curves:
        return None
    try:
        _plot_matplotlib(curves, png_path, title)
    except ImportError:
        _plot_pillow(curves, png_path, title)
    logger.info("Curves written to %s", png_path)
    return png_path


def _plot_matplotlib(curves, png_path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, points in curves.items():
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o" if name.startswith("val") else None, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("reward / score / loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


_COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189)]


def _plot_pillow(curves, png_path: str, title: str, size=(800, 450), margin=60) -> None:
    from PIL import Image, ImageDraw

    width, height = size
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    all_steps = [s for pts in curves.values() for s, _ in pts]
    all_vals = [v for pts in curves.values() for _, v in pts]
    s_lo, s_hi = min(all_steps), max(max(all_steps), min(all_steps) + 1)
    v_lo, v_hi = min(all_vals), max(all_vals)
    if v_hi - v_lo < 1e-9:
        v_lo, v_hi = v_lo - 0.5, v_hi + 0.5

    def to_xy(step: float, value: float) -> tuple[float, float]:
        x = margin + (step - s_lo) / (s_hi - s_lo) * (width - 2 * margin)
        y = height - margin - (value - v_lo) / (v_hi - v_lo) * (height - 2 * margin)
        return x, y

    draw.rectangle([margin, margin, width - margin, height - margin], outline="black")
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        value = v_lo + frac * (v_hi - v_lo)
        _, y = to_xy(s_lo, value)
        draw.line([margin, y, width - margin, y], fill=(225, 225, 225))
        draw.text((5, y - 6), f"{value:.3g}", fill="black")
    draw.text((margin, height - margin + 8), f"step {s_lo}", fill="black")
    draw.text((width - margin - 50, height - margin + 8), f"step {s_hi}", fill="black")
    draw.text((margin, 20), title, fill="black")
    for i, (name, points) in enumerate(curves.items()):
        color = _COLORS[i % len(_COLORS)]
        xy = [to_xy(s, v) for s, v in points]
        if len(xy) > 1:
            draw.line(xy, fill=color, width=2)
        for x, y in xy:
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=color)
        draw.text((width - margin - 260, margin + 8 + 14 * i), name, fill=color)
    img.save(png_path)


def plot_comparison(runs: dict[str, str], png_path: str, series: str, title: str = "",
                    lines: dict[str, float] | None = None) -> str | None:
    """One series (a :func:`read_curves` name, e.g. ``"val arithmetic/reward/mean@1"``) of several
    runs on one plot: ``runs`` maps a label to its ``metrics.jsonl``; ``lines`` adds constant levels
    (a teacher's accuracy, say) across the steps. Returns the path, or None with nothing to plot."""
    curves = {label: read_curves(path).get(series, []) for label, path in runs.items() if os.path.exists(path)}
    curves = {label: points for label, points in curves.items() if points}
    if not curves:
        return None
    steps = [s for points in curves.values() for s, _ in points]
    for label, level in (lines or {}).items():
        curves[label] = [(min(steps), level), (max(steps), level)]
    try:
        _plot_matplotlib(curves, png_path, title)
    except ImportError:
        _plot_pillow(curves, png_path, title)
    return png_path
