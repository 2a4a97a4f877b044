"""Synthetic ``guess_number`` task: rows for the built-in guess-the-number environment.

Each row is one game (:class:`hybrid_rl.agents.guess_number.GuessNumberEnv`): a system message with
the rules and one finished game as earlier chat turns (a binary search: 8, 12, 10, 11, correct), the
same device as the calculator task's demonstration, without which SmolLM2-135M rarely answers with a
bare number. The environment's first observation becomes the last user turn at rollout time. Rows
name the agent loop ``guess_number`` (``agent_name``), carry their secret in
``extra_info.env_kwargs.secret`` and are scored by their environment (``reward_model.style: agent``).

CLI: ``python -m hybrid_rl.data.guess_number --out_dir ~/.cache/hybrid_rl/guess_number``
"""

from __future__ import annotations

import argparse
import logging
import os
import random
from collections.abc import Sequence
from pathlib import Path

from hybrid_rl.data.arithmetic import _write_parquet  # atomic write: readers never see a partial file

logger = logging.getLogger(__name__)

DATA_SOURCE = "guess_number"
AGENT_NAME = "guess_number"
SYSTEM_PROMPT = ("We play a guessing game. I think of a whole number; you guess it. After each guess I say "
                 "Higher., Lower. or Correct!. Reply with the number only.")


def demonstration(low: int, high: int) -> list[dict[str, str]]:
    """One won game as chat turns (a binary search for 11 in 1..16, or its scaled equivalent)."""
    turns, lo, hi, secret = [], low, high, low + (high - low) * 2 // 3
    turns.append({"role": "user", "content": f"I am thinking of a number from {low} to {high}. Reply with one "
                                             "number only. Your first guess?"})
    while True:
        guess = (lo + hi) // 2
        turns.append({"role": "assistant", "content": str(guess)})
        if guess == secret:
            turns.append({"role": "user", "content": "Correct!"})
            return turns
        turns.append({"role": "user", "content": "Higher." if guess < secret else "Lower."})
        lo, hi = (guess + 1, hi) if guess < secret else (lo, guess - 1)


def make_row(secret: int, split: str, index: int, low: int, high: int) -> dict:
    """One game with the given secret."""
    return {
        "data_source": DATA_SOURCE,
        "agent_name": AGENT_NAME,
        "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, *demonstration(low, high)],
        "ability": "game",
        "reward_model": {"style": "agent", "ground_truth": str(secret)},
        "extra_info": {"split": split, "index": index, "env_kwargs": {"secret": secret, "low": low, "high": high}},
    }


def generate_guess_number(out_dir: str | os.PathLike, num_train: int = 1024, num_test: int = 64, low: int = 1,
                          high: int = 16, seed: int = 0) -> tuple[str, str]:
    """Write ``train.parquet`` and ``test.parquet`` into ``out_dir``; return their paths. The test
    secrets cycle through the whole range (every secret equally often), the training ones are drawn."""
    if num_train < 1 or num_test < 1 or low >= high:
        raise ValueError(f"need num_train >= 1, num_test >= 1 and low < high, got {num_train}, {num_test}, "
                         f"{low}, {high}")
    rng = random.Random(seed)
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    splits = {"train": [rng.randint(low, high) for _ in range(num_train)],
              "test": [low + i % (high - low + 1) for i in range(num_test)]}
    paths = []
    for split, secrets in splits.items():
        path = out / f"{split}.parquet"
        _write_parquet([make_row(s, split, i, low, high) for i, s in enumerate(secrets)], path)
        paths.append(str(path))
    logger.info("wrote %d train / %d test guess_number games to %s", num_train, num_test, out)
    return paths[0], paths[1]


def main(argv: Sequence[str] | None = None) -> tuple[str, str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", required=True, help="folder for train.parquet / test.parquet")
    parser.add_argument("--num_train", type=int, default=1024)
    parser.add_argument("--num_test", type=int, default=64)
    parser.add_argument("--low", type=int, default=1)
    parser.add_argument("--high", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return generate_guess_number(args.out_dir, args.num_train, args.num_test, args.low, args.high, args.seed)


if __name__ == "__main__":
    main()
