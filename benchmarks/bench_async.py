"""Synchronous vs decoupled (asynchronous) training with a slow environment, side by side.

The same job twice (or more) on this machine, back to back: the default arithmetic task on the
embedded SmolLM2-135M-Instruct, with a slow reward (latency, not CPU), one of:

* ``--reward remote`` (default): a remote reward-model service this benchmark starts on localhost
  (``reward_model.model.path=http://...``), answering each request of ``--rm-rows`` rows after
  ``--latency`` seconds with the task's correctness; every mode sends ``reward_model.num_workers``
  (``--workers``) requests at once;
* ``--reward function``: a custom reward function that waits ``--latency`` seconds per row (the
  serial baseline of the first figures: the ``naive`` manager scored rows one after another);
* ``--reward env``: an environment-bound agentic task instead of arithmetic: the guess-the-number
  game (``recipes/guess_number_env``) whose every ``step`` answers after ``--latency`` seconds (an
  ``async`` step, like a remote environment server: episodes wait side by side); the reward is the
  game's. The wait is part of generation, which the decoupled mode overlaps with the update.

Only training rows wait for a slow reward; held-out validation (greedy: 200 problems, or the 64
held-out games of ``--reward env``, whose moves wait too) is excluded from the trained samples per
second.

Reported per mode: trained samples per second over the training steps (rows x steps / the steps'
time, validation excluded), the speed-up over the synchronous mode, held-out accuracy before and
after the same number of trained samples, and the decoupled mode's staleness and idle times. Runs
with eta > 0 use AReaL's decoupled loss (``--vanilla-loss``: the vanilla loss with token-level TIS
instead; the vanilla loss alone is refused at eta > 0, it would train stale rows as on-policy). The
synchronous run uses one worker with every core; the decoupled run one training and one rollout
worker with half the cores each.

    python benchmarks/bench_async.py                       # sync, eta=1, eta=2 (~15 min on 2 cores)
    python benchmarks/bench_async.py --modes sync 1 --steps 8 --latency 2 --workers 8
    python benchmarks/bench_async.py --reward function --latency 0.5   # the serial baseline
    python benchmarks/bench_async.py --reward env --latency 2 --steps 8  # a slow environment
    python benchmarks/bench_async.py --workload longtail --modes sync 1 1p --steps 8  # a long tail, partial rollout

``--workload longtail``: the arithmetic task where every tenth training prompt first asks for a long
listing (``--long-tokens`` response tokens at most), so most batches wait for one long answer; the
reward is the task's own (``--reward none``). A mode ``<eta>p`` is the decoupled mode with partial
rollout (``async_training.partial_rollout=true``: groups stream into the buffer as they finish and a
weight push interrupts and resumes the requests in flight).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

SLOW_REWARD = '''
import time

from hybrid_rl.reward.registry import default_compute_score

LATENCY_S = {latency}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if (extra_info or {{}}).get("split") == "train":  # the slow environment serves training rollouts
        time.sleep(LATENCY_S)
    return default_compute_score(data_source, solution_str, ground_truth, extra_info=extra_info, **kwargs)
'''


SLOW_ENV = '''
import asyncio

from hybrid_rl.agents.guess_number import GuessNumberEnv

LATENCY_S = {latency}


class SlowGuessNumberEnv(GuessNumberEnv):
    """The guess-the-number game behind a slow server: each move's answer comes after LATENCY_S."""

    async def step(self, action):
        await asyncio.sleep(LATENCY_S)
        return GuessNumberEnv.step(self, action)
'''

ENV_AGENTS = """
- name: guess_number
  _target_: hybrid_rl.agents.env_loop.EnvAgentLoop
  env: slow_env.SlowGuessNumberEnv
  env_kwargs: {low: 1, high: 16, max_guesses: 5}
  max_steps: 5
  gamma: 1.0
"""

ACCURACY_KEYS = ("val-core/arithmetic/reward/mean@1", "val-core/guess_number/reward/mean@1")


class SlowRewardService:
    """A remote reward model on localhost: each POSTed request waits ``latency`` seconds, then gets
    the arithmetic task's correctness of each response against its label (OpenRLHF's protocol)."""

    def __init__(self, latency: float):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from hybrid_rl.reward.registry import default_compute_score

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(latency)
                rewards = [float(default_compute_score("arithmetic", r, label))
                           for r, label in zip(body["responses"], body["labels"])]
                self.send_response(200)
                self.end_headers()
                self.wfile.write(json.dumps({"rewards": rewards}).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


LONG_PREFIX = "First write out every whole number from 1 to 200 in words, separated by commas. Then: "


def write_longtail_data(workdir: str, every: int = 10) -> str:
    """The arithmetic task's files with every ``every``-th training prompt asking for a long listing first."""
    import dataclasses
    import shutil
    from pathlib import Path

    import pyarrow.parquet as pq

    from hybrid_rl.data.arithmetic import _write_parquet
    from hybrid_rl.trainer.config.schema import ArithmeticDataConfig
    from hybrid_rl.trainer.core.default_task import ensure_default_task

    # the default task's problems and demonstrations (its held-out accuracy is comparable with the others')
    train, test = ensure_default_task(dataclasses.replace(ArithmeticDataConfig(), cache_dir=os.path.join(workdir, "cache")))
    folder = Path(workdir) / "longtail"
    folder.mkdir(exist_ok=True)
    shutil.copy(test, folder / "test.parquet")
    rows = pq.read_table(train).to_pylist()
    for row in rows[::every]:
        row["prompt"][-1]["content"] = LONG_PREFIX + row["prompt"][-1]["content"]
    _write_parquet(rows, folder / "train.parquet")
    return str(folder)


def reward_overrides(args: argparse.Namespace, workdir: str, url: str | None) -> list[str]:
    """The overrides of the chosen slow reward (or slow environment) for every mode."""
    if args.workload == "longtail":
        data = os.path.join(workdir, "longtail")
        workload = [f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
                    f"data.max_response_length={args.long_tokens}"]
        return workload + ([] if args.reward == "none" else _reward_only(args, workdir, url))
    return _reward_only(args, workdir, url)


def _reward_only(args: argparse.Namespace, workdir: str, url: str | None) -> list[str]:
    if args.reward == "function":
        return [f"custom_reward_function.path={os.path.join(workdir, 'slow_reward.py')}"]
    if args.reward == "env":  # the recipe's settings (recipes/guess_number_env/run.sh)
        data = os.path.join(workdir, "guess_number")
        return [f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
                "data.max_prompt_length=320", "data.max_response_length=96", "actor_rollout_ref.rollout.temperature=1.0",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={os.path.join(workdir, 'agents.yaml')}",
                "actor_rollout_ref.actor.optim.lr=2e-5", "actor_rollout_ref.actor.use_kl_loss=false"]
    return ["reward_model.enable=true", f"reward_model.model.path={url}", f"reward_model.micro_batch_size_per_gpu={args.rm_rows}",
            f"reward_model.num_workers={args.workers}", f"reward_model.timeout={10 * args.latency + 30}"]


def run_mode(mode: str, args: argparse.Namespace, workdir: str, url: str | None = None) -> dict:
    """One training run; ``mode`` is ``sync`` or an eta (``0``, ``1``, ``2``...) for the decoupled mode."""
    run_dir = os.path.join(workdir, f"run_{mode}")
    overrides = [
        *reward_overrides(args, workdir, url),
        f"trainer.total_training_steps={args.steps}", f"data.train_batch_size={args.batch_size}",
        f"actor_rollout_ref.rollout.n={args.n}", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch_size}",
        "trainer.test_freq=-1", "trainer.val_before_train=true", "trainer.val_at_end=true", "trainer.save_freq=-1",
        "trainer.logger=[jsonl]", "trainer.progress_bar=false", f"trainer.default_local_dir={run_dir}",
        "trainer.log_val_generations=0", "reward_model.num_examine=0", *args.extra,
    ]
    if mode != "sync":
        eta = int(mode.rstrip("p"))
        overrides += ["async_training.enable=true", f"async_training.max_head_offpolicyness={eta}",
                      "rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1",
                      f"async_training.partial_rollout={str(mode.endswith('p')).lower()}"]
        if eta > 0:  # stale rows: AReaL's decoupled objective, or veRL's rollout correction
            overrides += ["algorithm.rollout_correction.preset=token_tis" if args.vanilla_loss
                          else "actor_rollout_ref.actor.policy_loss.loss_mode=decoupled",
                          "actor_rollout_ref.rollout.calculate_log_probs=true"]
        elif mode.endswith("p"):  # partial rollout keeps every token's behaviour log-prob
            overrides.append("actor_rollout_ref.rollout.calculate_log_probs=true")
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [workdir, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "hybrid_rl.trainer.main_ppo", *overrides], cwd=workdir,
                            capture_output=True, text=True, env=env)  # workdir: the slow environment's module
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"mode {mode} failed:\n{result.stderr[-4000:]}")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return summarize(mode, rows, args.batch_size * args.n, wall)


def summarize(mode: str, rows: list[dict], rows_per_step: int, wall: float) -> dict:
    """One mode's figures from its metric rows: trained samples/s, accuracy before/after, mean timings."""
    steps = [r for r in rows if r.get("training/global_step", 0) >= 1]
    seconds = sum(r["timing_s/step"] - r.get("timing_s/validate", 0.0) for r in steps)
    accuracy = [r[k] for r in rows for k in ACCURACY_KEYS if k in r]
    out = {"mode": mode, "steps": len(steps), "train_seconds": round(seconds, 1), "wall_s": round(wall, 1),
           "samples_per_s": round(rows_per_step * len(steps) / seconds, 3),
           "acc_before": accuracy[0] if accuracy else float("nan"),
           "acc_after": accuracy[-1] if accuracy else float("nan")}
    for key in ("async/staleness_mean", "actor/behav_imp_weight/mean", "timing_s/trainer_idle", "timing_s/rollout_idle", "timing_s/rollout_reward",
                "timing_s/rollout_generate", "timing_s/update_actor", "timing_s/gen", "timing_s/reward",
                "timing_s/compute_rm_score"):
        values = [r[key] for r in steps if key in r]
        if values:
            out[f"mean {key}"] = round(sum(values) / len(values), 3)
    return out


def write_task_files(args: argparse.Namespace, workdir: str) -> None:
    """The slow reward function, or the slow environment with its agent-loop config and games."""
    with open(os.path.join(workdir, "slow_reward.py"), "w") as fh:
        fh.write(SLOW_REWARD.format(latency=args.latency))
    if getattr(args, "workload", "default") == "longtail":
        write_longtail_data(workdir)
    if args.reward == "env":
        with open(os.path.join(workdir, "slow_env.py"), "w") as fh:
            fh.write(SLOW_ENV.format(latency=args.latency))
        with open(os.path.join(workdir, "agents.yaml"), "w") as fh:
            fh.write(ENV_AGENTS)
        subprocess.run([sys.executable, "-m", "hybrid_rl.data.guess_number", "--out_dir",
                        os.path.join(workdir, "guess_number")], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["sync", "1", "2"],
                        help="sync and/or etas; <eta>p: the decoupled mode with partial rollout")
    parser.add_argument("--workload", choices=("default", "longtail"), default="default")
    parser.add_argument("--long-tokens", type=int, default=256, help="longtail: response tokens at most")
    parser.add_argument("--reward", choices=("remote", "function", "env", "none"), default=None,
                        help="default: remote (longtail: none, the task's own reward)")
    parser.add_argument("--latency", type=float, default=None,
                        help="seconds a remote request (default 2), a function call per row (default 0.5) or an "
                             "environment step (default 2) waits")
    parser.add_argument("--rm-rows", type=int, default=4, help="remote: rows per request")
    parser.add_argument("--workers", type=int, default=8, help="remote: reward_model.num_workers in every mode")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per step")
    parser.add_argument("--n", type=int, default=4, help="responses per prompt")
    parser.add_argument("--vanilla-loss", action="store_true", help="eta > 0 with the vanilla loss and token-level TIS instead of the decoupled loss")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    parser.add_argument("--workdir", default=None, help="keep the runs (metrics.jsonl per mode) in this folder "
                                                         "instead of a temporary one")
    parser.add_argument("extra", nargs="*", help="more key=value overrides for every run")
    args = parser.parse_args()
    if args.reward is None:
        args.reward = "none" if args.workload == "longtail" else "remote"
    if args.latency is None:
        args.latency = 0.5 if args.reward == "function" else 2.0
    import torch

    kind = torch.backends.cpu.get_cpu_capability()
    per = {"remote": f"request of {args.rm_rows} rows, {args.workers} at once", "function": "row",
           "env": "guess-the-number environment step", "none": "nothing (the task's own reward)"}[args.reward]
    print(f"CPU capability {kind}, {os.cpu_count()} cores; {args.steps} steps x {args.batch_size} prompts x "
          f"{args.n} responses; reward {args.reward}: {args.latency} s per {per}; dtype auto", flush=True)
    results = []
    with (contextlib.nullcontext(os.path.abspath(args.workdir)) if args.workdir
          else tempfile.TemporaryDirectory()) as workdir:
        os.makedirs(workdir, exist_ok=True)
        write_task_files(args, workdir)
        service = SlowRewardService(args.latency) if args.reward == "remote" else None
        for mode in args.modes:
            results.append(run_mode(mode, args, workdir, service.url if service else None))
            print(json.dumps(results[-1]), flush=True)
    base = next((r for r in results if r["mode"] == "sync"), None)
    for r in results:
        if base is not None:
            r["speedup_vs_sync"] = round(r["samples_per_s"] / base["samples_per_s"], 2)
        print(f"{r['mode']:>5}: {r['samples_per_s']:.2f} trained samples/s"
              + (f" ({r['speedup_vs_sync']:.2f}x sync)" if base else "")
              + f", held-out accuracy {r['acc_before']:.3f} -> {r['acc_after']:.3f}")
    if args.output:
        with open(args.output, "w") as fh:
            json.dump({"cpu_capability": kind, "args": vars(args), "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
