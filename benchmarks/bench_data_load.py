"""Time and peak memory of loading a large public-shaped file (``data.bad_rows=skip``).

    python benchmarks/bench_data_load.py                     # 1M HH-RLHF-shaped pairs, .jsonl.gz
    python benchmarks/bench_data_load.py --rows 200000 --shape rl --form parquet

Generates the file once into ``--work`` (HH-RLHF dialogues with 0.1% bad rows mixed in, or veRL RL rows),
then loads it in a fresh child process and reports wall time and the child's peak RSS (``VmHWM``),
beside the bytes on disk. The load is the library's (rows read, parsed into pairs or validated prompt
rows, bad ones counted and reported); RL rows stop before tokenizing (the tokenizer's cost is the
model's, not the file's).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

BAD_EVERY = 1000
"""One row in this many is bad (identical chosen and rejected): 0.1%, under the default 1% limit."""


def _hh_row(i: int) -> dict:
    q = f"What is {i % 97} plus {i % 89}? Please explain how you get there, step by step."
    chosen = f"\n\nHuman: {q}\n\nAssistant: It is {i % 97 + i % 89}. Add the ones, then the tens."
    rejected = chosen if i % BAD_EVERY == 7 else f"\n\nHuman: {q}\n\nAssistant: I am not sure, maybe {i}."
    return {"chosen": chosen, "rejected": rejected}


def _rl_row(i: int) -> dict:
    return {"data_source": "bench", "prompt": [{"role": "user", "content": f"What is {i % 97} + {i % 89}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(i % 97 + i % 89)},
            "extra_info": {"index": i, "split": "train"}}


def generate(path: Path, rows: int, shape: str, form: str) -> None:
    make = _hh_row if shape == "hh" else _rl_row
    if form == "parquet":
        pd.DataFrame([make(i) for i in range(rows)]).to_parquet(path)
        return
    opener = gzip.open if form.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        for i in range(rows):
            f.write(json.dumps(make(i)) + "\n")


def peak_rss_gib() -> float:
    """This process's peak resident set (VmHWM: unlike ru_maxrss it starts afresh at exec, so a child
    does not inherit its parent's peak)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def load(path: str, shape: str) -> None:
    """The child: load, then print rows kept, seconds and peak RSS as JSON."""
    start = time.perf_counter()
    if shape == "hh":
        from hybrid_rl.data.preference import load_preference_pairs

        kept = len(load_preference_pairs(path, bad_rows="skip"))
    else:
        from hybrid_rl.data.bad_rows import BadRows
        from hybrid_rl.data.files import read_rows
        from hybrid_rl.data.rows import validate_row

        policy = BadRows("skip")
        kept = sum(policy.parse(path, i, validate_row, row, path=path, row_idx=i) is not None
                   for i, row in enumerate(read_rows(path)))
        policy.finish()
    seconds = time.perf_counter() - start
    print(json.dumps({"kept": kept, "seconds": seconds, "peak_rss_gib": peak_rss_gib()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shape", choices=("hh", "rl"), default="hh")
    parser.add_argument("--form", choices=("jsonl.gz", "jsonl", "parquet"), default="jsonl.gz")
    parser.add_argument("--work", default="/tmp/bench_data_load")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return load(args.child, args.shape)
    os.makedirs(args.work, exist_ok=True)
    path = Path(args.work) / f"{args.shape}_{args.rows}.{args.form}"
    if not path.exists():
        generate(path, args.rows, args.shape, args.form)
    baseline = subprocess.run([sys.executable, "-c", "import hybrid_rl.data.preference, hybrid_rl.data.rows, sys;"
                               f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r});"
                               "from bench_data_load import peak_rss_gib; print(peak_rss_gib())"],
                              capture_output=True, text=True, check=True)
    out = subprocess.run([sys.executable, __file__, "--shape", args.shape, "--child", str(path)],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{args.rows} {args.shape} rows, {args.form}, {path.stat().st_size / 2**20:.0f} MiB on disk: "
          f"{result['seconds']:.1f} s, peak RSS {result['peak_rss_gib']:.2f} GiB "
          f"(the imports alone {float(baseline.stdout):.2f} GiB), {result['kept']} rows kept")


if __name__ == "__main__":
    main()
