"""``guess_number``: the built-in text environment that needs several moves.

The environment holds a secret integer in ``[low, high]``; each model turn is a guess, answered with
``Higher.``, ``Lower.`` or ``Correct!``. A turn without a number, or with one out of range, is
answered with the rules and counts as a move. Reward: 1.0 for the correct guess (the episode
terminates), 0.0 otherwise; the episode is truncated after ``max_guesses``. With ``low=1, high=16``
binary search always wins within 5 guesses, while guessing blindly wins 5 times in 16.
"""

from __future__ import annotations

import random
import re
from typing import Any, Optional

from hybrid_rl.agents.env import BaseTextEnv, register_env

__all__ = ["GuessNumberEnv"]

_NUMBER = re.compile(r"-?\d+")


@register_env("guess_number")
class GuessNumberEnv(BaseTextEnv):
    """Guess the secret number with higher/lower feedback.

    Args:
        low, high: the secret's range (inclusive).
        max_guesses: moves before the episode is truncated.
        secret: a fixed secret; None = drawn from ``reset``'s seed.
    """

    def __init__(self, low: int = 1, high: int = 16, max_guesses: int = 5, secret: Optional[int] = None, **kwargs: Any):
        super().__init__(low=low, high=high, max_guesses=max_guesses, secret=secret, **kwargs)
        if not (isinstance(low, int) and isinstance(high, int) and low < high and max_guesses >= 1):
            raise ValueError(f"guess_number: need integers low < high and max_guesses >= 1, got low={low!r} "
                             f"high={high!r} max_guesses={max_guesses!r}. Fix: e.g. env_kwargs: {{low: 1, high: 16}}.")
        self.low, self.high, self.max_guesses, self.fixed = low, high, max_guesses, secret
        self.secret, self.guesses = low, 0

    def rules(self) -> str:
        return f"I am thinking of a number from {self.low} to {self.high}. Reply with one number only."

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[str, dict]:
        self.secret = int(self.fixed) if self.fixed is not None else random.Random(seed).randint(self.low, self.high)
        self.guesses = 0
        return self.rules() + " Your first guess?", {"secret": self.secret}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        self.guesses += 1
        out_of_moves = self.guesses >= self.max_guesses
        match = _NUMBER.search(action)
        guess = int(match.group()) if match else None
        info = {"guess": guess, "secret": self.secret}
        if guess == self.secret:
            return "Correct!", 1.0, True, False, info
        if guess is None or not self.low <= guess <= self.high:
            return self.rules(), 0.0, False, out_of_moves, info
        return ("Higher." if guess < self.secret else "Lower."), 0.0, False, out_of_moves, info
