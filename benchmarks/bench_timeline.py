"""Cost of the step timeline (``timeline.jsonl``): a span written, and a step's named steps timed with
and without their spans.

``timed`` with a recorder against ``timed`` alone, over a step of ``--names`` empty named steps plus the
enclosing ``step`` (the default run's plan has 8 named steps), in a temporary run folder; the difference is
what the timeline adds to each training step, to compare with the run's ``timing_s/step``
(docs/observability.md, "Step timeline")::

    python benchmarks/bench_timeline.py [--steps 2000] [--names 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from hybrid_rl.trainer.core.loop import timed
from hybrid_rl.trainer.core.timeline import TIMELINE_FILE, Timeline


def one_step(names: list[str], timeline: Timeline | None) -> None:
    """The loop's timing of one step: ``step`` around each named step, spans recorded when given a timeline."""
    timing: dict[str, float] = {}
    record = (lambda n, s, e: timeline.record("trainer", n, s, e)) if timeline is not None else None
    with timed("step", timing, record):
        for name in names:
            with timed(name, timing, record):
                pass


def seconds_per_step(names: list[str], steps: int, timeline: Timeline | None) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        one_step(names, timeline)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--names", type=int, default=8, help="named steps per training step")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    names = [f"step_{i}" for i in range(args.names)]
    with tempfile.TemporaryDirectory() as folder:
        timeline = Timeline(os.path.join(folder, TIMELINE_FILE))
        plain, spans = [], []
        for _ in range(args.repeats):
            plain.append(seconds_per_step(names, args.steps, None))
            spans.append(seconds_per_step(names, args.steps, timeline))
        timeline.close()
        size = os.path.getsize(os.path.join(folder, TIMELINE_FILE)) / (args.repeats * args.steps)
    added = statistics.median(spans) - statistics.median(plain)
    print(f"per step of {args.names} named steps: timed alone {statistics.median(plain) * 1e6:.1f} us, "
          f"with spans {statistics.median(spans) * 1e6:.1f} us; the timeline adds {added * 1e6:.1f} us "
          f"({added / (args.names + 1) * 1e6:.1f} us per span) and {size:.0f} bytes per step")


if __name__ == "__main__":
    main()
