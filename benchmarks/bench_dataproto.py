"""Time DataProto pickling (what Ray does between driver and workers) and chunk/concat.

Batch: 256 x 2048 int64 ``input_ids`` + 4 float32 [256, 2048] tensors + a ``uid`` object array
(~12 MiB of tensors). Prints the median over ``--runs`` repetitions.

    python benchmarks/bench_dataproto.py --runs 21   # PYTHONPATH=. until the package is pip-installed
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time
from typing import Callable

import numpy as np
import torch

from hybrid_rl.protocol import DataProto


def build_batch(rows: int = 256, seq_len: int = 2048) -> DataProto:
    generator = torch.Generator().manual_seed(0)
    tensors = {"input_ids": torch.randint(0, 32000, (rows, seq_len), generator=generator)}
    for name in ("old_log_probs", "ref_log_prob", "advantages", "returns"):
        tensors[name] = torch.randn(rows, seq_len, generator=generator)
    uid = np.array([f"uid-{i // 4}" for i in range(rows)], dtype=object)
    return DataProto.from_dict(tensors, {"uid": uid}, {"temperature": 1.0})


def median_ms(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm-up (allocator, imports)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=21, help="repetitions per measurement (median reported)")
    args = parser.parse_args()

    data = build_batch()
    payload = pickle.dumps(data)
    results = {
        "pickle.dumps": median_ms(lambda: pickle.dumps(data), args.runs),
        "pickle.loads": median_ms(lambda: pickle.loads(payload), args.runs),
        "pickle round trip": median_ms(lambda: pickle.loads(pickle.dumps(data)), args.runs),
        "chunk(2)": median_ms(lambda: data.chunk(2), args.runs),
        "chunk(2) + concat": median_ms(lambda: DataProto.concat(data.chunk(2)), args.runs),
    }
    tensor_mib = sum(t.numel() * t.element_size() for t in data.batch.values()) / 2**20
    print(f"batch: {len(data)} rows, {tensor_mib:.1f} MiB of tensors, pickle payload {len(payload) / 2**20:.1f} MiB")
    for name, ms in results.items():
        print(f"{name:>20}: {ms:8.2f} ms (median of {args.runs})")


if __name__ == "__main__":
    main()
