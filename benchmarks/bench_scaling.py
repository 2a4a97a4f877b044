"""Does the actor's cost grow linearly in tokens? Log-prob + update time as response length and rows double.

    python benchmarks/bench_scaling.py                     # SmolLM2-135M, auto dtype, FSDP2 (1 process)
    python benchmarks/bench_scaling.py --remove-padding --dynamic-bsz --max-token-len 4096

One actor (the worker's code path, see bench_actor.py) is timed on ragged batches: rows
8 -> 16 -> 32 at the base response length, then response length 32 -> 64 -> 128 at the base rows.
For each it prints seconds per 1k valid tokens of ``compute_log_prob`` and ``update_policy``:
flat columns mean linear cost in tokens; a column that grows with the response length points at
a per-row quadratic term (attention) or at padding. Generation scaling is bench_rollout.py's.
"""

from __future__ import annotations

import argparse

import torch.distributed as dist

from bench_actor import add_args, build_actor, make_batch, measure, setup

from hybrid_rl.utils.precision import resolve_dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(parser)
    parser.add_argument("--dtype", default="auto", help="auto = bf16 only where the CPU computes it natively")
    parser.add_argument("--remove-padding", action="store_true")
    parser.set_defaults(rows=8, repeats=1, micro=8)
    args = parser.parse_args()
    path, peaks = setup(args)
    actor = build_actor(path, resolve_dtype(args.dtype, "cpu"), args.remove_padding, args)
    base_rows, base_resp = args.rows, args.response_len
    grid = [(base_rows * k, base_resp) for k in (1, 2, 4)] + [(base_rows, base_resp * k) for k in (2, 4)]
    print(f"{'rows':>5} {'resp<=':>6} {'tokens':>7} {'pad':>5} {'logp s':>7} {'s/1k tok':>8} {'update s':>8} "
          f"{'s/1k tok':>8} {'upd GFLOP/s':>11}", flush=True)
    for rows, resp in grid:
        data = make_batch(rows, args.prompt_len, resp, actor.actor_module.config.vocab_size)
        r = measure(actor, data, args)
        k = r["tokens"] / 1000
        print(f"{rows:5d} {resp:6d} {r['tokens']:7.0f} {r['padding_frac']:5.0%} {r['compute_log_prob_s']:7.2f} "
              f"{r['compute_log_prob_s'] / k:8.3f} {r['update_policy_s']:8.2f} {r['update_policy_s'] / k:8.3f} "
              f"{r['update_policy_gflops']:11.0f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
