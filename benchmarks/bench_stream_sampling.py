"""Do streamed agent rows sample what the batch path samples? Same weights, same rows, side by side.

Issue 56's partial rollout serves each model turn of an agent row as its own request of the engine's
streamer (``agent_stream.py``: continuous batching on vLLM, segments on HF), while the batch path runs
an agent's turns in rounds (``BatchingServer`` -> ``generate_turn``). Greedy equality of the two is
tested (tests/rollout/test_agent_streaming.py); this benchmark compares their *sampled* distributions
on the guess-the-number environment (``recipes/guess_number_env``): for ``--games`` games x ``--n``
episodes, each path's mean return, episode turns, model tokens per row (winners / losers), and the
mean sampled log-prob per model token (what a sampler that drew from the wrong distribution would
move first). ``--reps`` alternates the two paths; sampled runs differ by chance, so read the spread
between repetitions of one path before a difference between paths.

    python benchmarks/bench_stream_sampling.py --engine vllm --games 32 --reps 2

Measured figures: docs/async.md ("Streamed and batch sampling").
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

import numpy as np
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.model_loader import load_tokenizer, resolve_model_path
from hybrid_rl.workers.rollout import RolloutConfig, build_rollout
from hybrid_rl.workers.rollout.params import GenerationParams
from hybrid_rl.workers.rollout.streaming import StreamRequest

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AGENTS = os.path.join(ROOT, "recipes", "guess_number_env", "agents.yaml")


def game_rows(games: int, n: int) -> list[dict[str, Any]]:
    """``games`` training games of the guess_number task, each repeated ``n`` times (agent-row columns)."""
    import pandas as pd

    from hybrid_rl.data.guess_number import main as make_games

    out = tempfile.mkdtemp(prefix="bench_stream_sampling_")
    make_games(["--out_dir", out])
    frame = pd.read_parquet(os.path.join(out, "train.parquet")).iloc[:games]
    return [{"raw_prompt": list(r["prompt"]), "extra_info": dict(r["extra_info"]), "agent_name": r["agent_name"]}
            for _, r in frame.iterrows() for _ in range(n)]


def summary(path: str, returns: list, masks: list, log_probs: list, turns: list) -> dict[str, float]:
    """One path's figures; ``masks``/``log_probs``: per row, over its response tokens."""
    model = np.array([sum(m) for m in masks], dtype=float)
    won = np.array(returns, dtype=float) > 0
    sampled = [lp for row_lp, m in zip(log_probs, masks) for lp, keep in zip(row_lp, m) if keep]
    return {"path": path, "return": float(np.mean(returns)), "turns": float(np.mean(turns)),
            "model_tokens": float(model.mean()), "model_tokens_won": float(model[won].mean()) if won.any() else None,
            "model_tokens_lost": float(model[~won].mean()) if (~won).any() else None,
            "log_prob_per_token": float(np.mean(sampled))}


def batch_path(rollout, tokenizer, rows: list[dict], prompts: list[list[int]], seed: int) -> dict[str, float]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    columns = {}
    for key in rows[0]:
        column = np.empty(len(rows), dtype=object)
        column[:] = [r[key] for r in rows]
        columns[key] = column
    out = rollout.generate_sequences(DataProto.from_dict(
        {"input_ids": ids, "attention_mask": att, "position_ids": (att.cumsum(1) - 1).clamp(min=0)},
        non_tensors=columns, meta_info={"eos_token_id": [tokenizer.eos_token_id], "pad_token_id": 0,
                                        "do_sample": True, "global_steps": seed, "seed": seed}))
    return summary("batch", [float(x) for x in out.non_tensor_batch["reward_score"]],
                   out.batch["response_mask"].tolist(), out.batch["rollout_log_probs"].tolist(),
                   list(out.non_tensor_batch["num_turns"]))


def stream_path(rollout, rows: list[dict], prompts: list[list[int]], params: GenerationParams, rep: int) -> dict:
    rollout.stream_submit([StreamRequest(f"{rep}-{i}", p, params.response_length, {"row": r})
                           for i, (p, r) in enumerate(zip(prompts, rows))], params)
    done = {}
    while rollout.stream_pending():
        done.update({s.request_id: s for s in rollout.stream_step(0.05)})
    samples = [done[f"{rep}-{i}"] for i in range(len(rows))]
    return summary("stream", [s.meta["trajectory"]["reward_score"] for s in samples],
                   [s.meta["trajectory"]["response_mask"] for s in samples], [s.log_probs for s in samples],
                   [s.meta["trajectory"]["num_turns"] for s in samples])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    parser.add_argument("--games", type=int, default=32)
    parser.add_argument("--n", type=int, default=4, help="episodes per game")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--output", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    path = resolve_model_path(MODEL)
    tokenizer = load_tokenizer(path)
    cfg = RolloutConfig(name=args.engine, dtype="bfloat16", response_length=96, prompt_length=320,
                        calculate_log_probs=True, max_num_seqs=64, cpu_kvcache_space_gib=1, seed=0,
                        temperature=args.temperature, agent={"agent_loop_config_path": AGENTS})
    rollout = build_rollout(cfg, path, tokenizer, "cpu")
    rows = game_rows(args.games, args.n)
    prompts = [tokenizer(tokenizer.apply_chat_template(r["raw_prompt"], add_generation_prompt=True, tokenize=False),
                         add_special_tokens=False)["input_ids"] for r in rows]
    params = GenerationParams(do_sample=True, temperature=args.temperature, top_p=1.0, top_k=-1, seed=None,
                              eos_token_ids=(tokenizer.eos_token_id,), pad_token_id=0, response_length=96)
    results = []
    for rep in range(args.reps):
        for figures in (batch_path(rollout, tokenizer, rows, prompts, 100 + rep),
                        stream_path(rollout, rows, prompts, params, rep)):
            figures["rep"] = rep
            results.append(figures)
            print(json.dumps(figures), flush=True)
    rollout.shutdown()
    if args.output:
        with open(args.output, "w") as fh:
            json.dump({"engine": args.engine, "games": args.games, "n": args.n, "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
