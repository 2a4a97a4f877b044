"""Synthetic ``calculator`` task: multiply a 3-digit by a 2-digit number, with a calculator tool.

SmolLM2-135M-Instruct alone gets almost none of these right; with the ``calculator`` tool
(:mod:`hybrid_rl.agents.calculator`) it only has to call it and copy the result after ``####``.
Each prompt is a system message naming the tool and its ``<tool_call>`` syntax, one solved
demonstration as earlier chat turns (user question, assistant tool call, tool result, assistant answer:
the same device as the default task's demonstration, without which the small model never calls the
tool), then the question. Rows follow veRL's tool-agent schema: ``agent_name: tool_agent`` and
``extra_info.tools_kwargs.calculator.create_kwargs.ground_truth`` (so the tool can report whether a
call computed the answer). Train and test problems are disjoint; the demonstration is a training
problem not in either split.

CLI: ``python -m hybrid_rl.data.calculator --out_dir ~/.cache/hybrid_rl/calculator``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
from collections.abc import Sequence
from pathlib import Path

from hybrid_rl.data.arithmetic import _write_parquet  # atomic write: readers never see a partial file

logger = logging.getLogger(__name__)

DATA_SOURCE = "calculator"
SYSTEM_PROMPT = (
    'You can use a calculator. To use it, write <tool_call>{"name": "calculator", "arguments": '
    '{"expression": "..."}}</tool_call> and wait for the result. Give the final answer after "####".'
)
QUESTION = "What is {a} * {b}?"


def _call(a: int, b: int) -> str:
    return json.dumps({"name": "calculator", "arguments": {"expression": f"{a} * {b}"}})


def demonstration(a: int, b: int) -> list[dict[str, str]]:
    """One solved problem as chat turns: question, tool call, tool result, answer."""
    return [
        {"role": "user", "content": QUESTION.format(a=a, b=b)},
        {"role": "assistant", "content": f"<tool_call>{_call(a, b)}</tool_call>"},
        {"role": "tool", "content": str(a * b)},
        {"role": "assistant", "content": f"{a * b}\n#### {a * b}"},
    ]


def make_row(a: int, b: int, split: str, index: int, demo: tuple[int, int], agent_name: str = "tool_agent") -> dict:
    """One veRL tool-agent row for ``a * b`` (``agent_name``: the loop that runs it)."""
    answer = a * b
    return {
        "data_source": DATA_SOURCE,
        "agent_name": agent_name,
        "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, *demonstration(*demo),
                   {"role": "user", "content": QUESTION.format(a=a, b=b)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, "a": a, "b": b,
                       "tools_kwargs": {"calculator": {"create_kwargs": {"ground_truth": str(answer)}}}},
    }


def sample_products(num: int, seed: int, a_digits: int = 3, b_digits: int = 2) -> list[tuple[int, int]]:
    """``num`` distinct (a, b) with the given digit counts, seeded, without replacement."""
    a_lo, a_hi = 10 ** (a_digits - 1), 10 ** a_digits - 1
    b_lo, b_hi = 10 ** (b_digits - 1), 10 ** b_digits - 1
    width = b_hi - b_lo + 1
    space = (a_hi - a_lo + 1) * width
    if num > space:
        raise ValueError(f"asked for {num} distinct problems but {a_digits}-digit x {b_digits}-digit has only {space}; "
                         "lower num_train/num_test")
    return [(a_lo + i // width, b_lo + i % width) for i in random.Random(seed).sample(range(space), num)]


def generate_calculator(out_dir: str | os.PathLike, num_train: int = 2000, num_test: int = 200,
                        seed: int = 0, agent_name: str = "tool_agent") -> tuple[str, str]:
    """Write ``train.parquet`` and ``test.parquet`` into ``out_dir``; return their paths. ``agent_name``
    names the loop of every row (``tool_agent``: the in-process tool loop; an agent-loop YAML name,
    e.g. the black-box agent of ``recipes/calculator_openai``)."""
    if num_train < 1 or num_test < 1:
        raise ValueError(f"need num_train >= 1 and num_test >= 1, got num_train={num_train}, num_test={num_test}")
    problems = sample_products(num_train + num_test + 1, seed)
    demo, test, train = problems[0], problems[1:num_test + 1], problems[num_test + 1:]
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, chunk in (("train", train), ("test", test)):
        path = out / f"{split}.parquet"
        _write_parquet([make_row(a, b, split, i, demo, agent_name) for i, (a, b) in enumerate(chunk)], path)
        paths.append(str(path))
    logger.info("wrote %d train / %d test calculator problems to %s", num_train, num_test, out)
    return paths[0], paths[1]


def main(argv: Sequence[str] | None = None) -> tuple[str, str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", required=True, help="folder for train.parquet / test.parquet")
    parser.add_argument("--num_train", type=int, default=2000)
    parser.add_argument("--num_test", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--agent_name", default="tool_agent", help="the agent loop of every row")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return generate_calculator(args.out_dir, args.num_train, args.num_test, args.seed, args.agent_name)


if __name__ == "__main__":
    main()
