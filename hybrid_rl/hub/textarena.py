"""TextArena's single-player games as :class:`~hybrid_rl.agents.env.BaseTextEnv` environments.

The game is built by TextArena itself (``textarena.make(env_id, **game_kwargs)``, the id's own wrappers
included) and played through its API unchanged::

    reset(seed)  -> env.reset(num_players=1, seed=seed); env.get_observation()   # the first user turn
    step(action) -> env.step(action) -> (done, step_info); env.get_observation()  # the next user turn
    at done      -> rewards, game_info = env.close(); rewards[0] is the step's reward (the return)

Invalid moves are TextArena's business: a game's ``SinglePlayerState`` answers the first one with a
"You attempted an invalid move" message (shown to the model) and ends the game on the next with the
reward its game gives (e.g. GuessTheNumber's partial credit for the last guess's distance).

Departures, both for multi-turn chat:

* ``observation: new`` (the default) shows the model only the game's messages since its last move
  (the wrapper's copy of the model's own move left out), because the earlier turns are already in the
  conversation; TextArena's observation wrappers (``LLMObservationWrapper``) re-send the whole
  transcript each turn, which suits one-shot prompting but would re-feed every turn into the context.
  ``observation: wrapper`` passes the wrapper's string through unchanged. Action wrappers (e.g.
  ``ActionFormattingWrapper``, which brackets ``8`` as ``[8]``) always apply.
* TextArena games draw from Python's global ``random`` (``State`` calls ``random.seed(seed)``); each
  episode here keeps its own generator state, swapped in around ``reset``/``step`` under a lock, so
  an episode is reproducible from its seed and never reseeds the trainer's ``random``.

Rows: ``python -m hybrid_rl.hub.textarena --env_id GuessTheNumber-v0 --out_dir DIR`` writes
``train.parquet`` / ``test.parquet`` (one episode per row, disjoint seeds, ``agent_name: textarena``,
``reward_model.style: agent``). Agent-loop entry (``env: textarena`` once this module is imported, or
the dotted path, which needs no import)::

    - name: textarena
      _target_: hybrid_rl.agents.env_loop.EnvAgentLoop
      env: hybrid_rl.hub.textarena.TextArenaEnv
      env_kwargs: {env_id: GuessTheNumber-v0, game_kwargs: {max_number: 16, max_turns: 5}}
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import logging
import os
import random
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Iterator, Optional

from hybrid_rl.agents.env import BaseTextEnv, register_env
from hybrid_rl.data.arithmetic import _write_parquet  # atomic write: readers never see a partial file

logger = logging.getLogger(__name__)

__all__ = ["OBSERVATIONS", "TextArenaEnv", "import_textarena"]

OBSERVATIONS = ("new", "wrapper")
_RNG_LOCK = threading.Lock()  # the global random state is swapped per call: one swap at a time
_EXAMPLES = "GuessTheNumber-v0, TowerOfHanoi-v0, FrozenLake-v0, Minesweeper-v0"


def import_textarena() -> Any:
    """The ``textarena`` module; ValueError with the install command when it is missing."""
    try:
        import textarena
    except ImportError as exc:
        raise ValueError(f"TextArena environments need the 'textarena' package ({exc}). Fix: pip install -e .[envs] "
                         "(textarena==0.7.4).") from None
    return textarena


def make_game(env_id: str, game_kwargs: dict) -> Any:
    """``textarena.make(env_id, **game_kwargs)`` with one-line errors for an unknown id or bad kwargs."""
    ta = import_textarena()
    from textarena.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        near = difflib.get_close_matches(str(env_id), list(ENV_REGISTRY), n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        listing = "from textarena.envs.registration import ENV_REGISTRY; print(sorted(ENV_REGISTRY))"
        raise ValueError(f"textarena: unknown env_id {env_id!r}{hint}. Fix: use an id of textarena's registry "
                         f"(python -c \"{listing}\"), a single-player game such as {_EXAMPLES}.")
    try:
        return ta.make(env_id, **game_kwargs)
    except (ImportError, SyntaxError, LookupError) as exc:  # a game module that fails to import, nltk corpora
        raise ValueError(f"textarena: {env_id} cannot be built offline ({_first_line(exc)}). Fix: pick a game that "
                         f"needs no download or API key, such as {_EXAMPLES}.") from None
    except TypeError as exc:
        raise ValueError(f"textarena: {env_id} rejects game_kwargs {game_kwargs!r} ({exc}). Fix: use the "
                         "arguments of its class's __init__ (ENV_REGISTRY[env_id].entry_point in "
                         "textarena.envs.registration).") from None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip(" *") for line in str(exc).splitlines() if line.strip(" *")]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _innermost(env: Any) -> Any:
    """The game under TextArena's wrappers (the ``Wrapper.env`` chain)."""
    ta = import_textarena()
    while isinstance(env, ta.Wrapper):
        env = env.env
    return env


@register_env("textarena")
class TextArenaEnv(BaseTextEnv):
    """One episode of a single-player TextArena game.

    Args:
        env_id: TextArena's game id, e.g. ``GuessTheNumber-v0`` (its variants ``-train``/``-raw`` pick
            other wrappers).
        game_kwargs: the game's constructor arguments over the id's registered ones, e.g.
            ``{max_number: 16, max_turns: 5}``.
        observation: ``new`` (the game's messages since the model's last move) or ``wrapper`` (the id's
            observation wrapper's string, usually the whole transcript).
    """

    def __init__(self, env_id: str, game_kwargs: Optional[dict] = None, observation: str = "new", **kwargs: Any):
        super().__init__(env_id=env_id, game_kwargs=game_kwargs, observation=observation, **kwargs)
        if observation not in OBSERVATIONS:
            raise ValueError(f"textarena: observation={observation!r} is not one of {OBSERVATIONS}. Fix: set "
                             "env_kwargs.observation to 'new' (only the game's new messages) or 'wrapper'.")
        if kwargs:
            raise ValueError(f"textarena: unknown env_kwargs {sorted(kwargs)}. Fix: put the game's own arguments "
                             f"under env_kwargs.game_kwargs, e.g. game_kwargs: {dict(kwargs)!r}.")
        self.env_id, self.observation_mode = env_id, observation
        self.game = make_game(env_id, dict(game_kwargs or {}))
        self.done, self._rng_state = False, None

    @contextlib.contextmanager
    def _own_rng(self) -> Iterator[None]:
        """Run TextArena code against this episode's random state, leaving the global one as it was."""
        with _RNG_LOCK:
            outer = random.getstate()
            if self._rng_state is not None:
                random.setstate(self._rng_state)
            try:
                yield
            finally:
                self._rng_state = random.getstate()
                random.setstate(outer)

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[str, dict]:
        self._rng_state, self.done = None, False
        with self._own_rng():
            if seed is None:
                random.seed()  # State seeds only when given one: an unseeded episode draws fresh
            try:
                self.game.reset(num_players=1, seed=seed)
            except (AssertionError, ValueError) as exc:  # TextArena's games check their player count so
                raise ValueError(f"textarena: {self.env_id} did not start with one player ({_first_line(exc)}). "
                                 f"Fix: pick a single-player game such as {_EXAMPLES}.") from None
        return self._observe(), {"env_id": self.env_id, "seed": seed}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        with self._own_rng():
            done, step_info = self.game.step(str(action))
        info = dict(step_info or {})
        if not done:
            return self._observe(), 0.0, False, False, info
        self.done = True
        closing = self._observe()
        rewards, game_info = self.game.close()
        info.update(game_info.get(0, {}) if isinstance(game_info, dict) else {})
        reward = float(rewards.get(0, 0.0)) if isinstance(rewards, dict) else 0.0
        return closing or str(info.get("reason", "")), reward, True, False, info

    def _observe(self) -> str:
        if self.observation_mode == "wrapper":
            return str(self.game.get_observation()[1])
        _, messages = _innermost(self.game).get_observation()
        from textarena.core import ObservationType

        return "\n".join(text for _, text, kind in messages if kind != ObservationType.PLAYER_ACTION).strip()


# ---- rows: one episode per row -------------------------------------------------------------------

AGENT_NAME = "textarena"
SYSTEM_PROMPT = "You are playing a text game. Each user turn is the game's message; reply with your next move only."


def demonstration(env_id: str, game_kwargs: dict, seed: int, moves: list[str]) -> list[dict[str, str]]:
    """One game played through TextArena with the given moves, as chat turns (user: the game's message,
    assistant: the move): the observations are the game's own text, exactly as the model will see them."""
    env = TextArenaEnv(env_id, game_kwargs)
    observation, _ = env.reset(seed=seed)
    turns = [{"role": "user", "content": observation}]
    for move in moves:
        observation, _, terminated, truncated, _ = env.step(move)
        turns += [{"role": "assistant", "content": move}, {"role": "user", "content": observation}]
        if terminated or truncated:
            break
    return turns


def make_row(env_id: str, seed: int, split: str, index: int, prompt: list[dict], game_kwargs: dict,
             agent_name: str = AGENT_NAME) -> dict:
    """One episode of ``env_id`` from ``seed``: ``prompt`` precedes the game's first observation."""
    env_kwargs: dict[str, Any] = {"env_id": env_id, "seed": seed}
    if game_kwargs:
        env_kwargs["game_kwargs"] = game_kwargs
    return {
        "data_source": f"textarena/{env_id}",
        "agent_name": agent_name,
        "prompt": prompt,
        "ability": "game",
        "reward_model": {"style": "agent", "ground_truth": ""},  # TextArena's reward is the score
        "extra_info": {"split": split, "index": index, "env_kwargs": env_kwargs},
    }


def split_seeds(num_train: int, num_test: int, first_seed: int = 0) -> dict[str, list[int]]:
    """Disjoint seeds: ``first_seed ..`` for the held-out games, the next ``num_train`` for training."""
    if num_train < 1 or num_test < 1 or first_seed < 0:
        raise ValueError(f"textarena rows: need num_train >= 1, num_test >= 1 and seed >= 0, got {num_train}, "
                         f"{num_test}, {first_seed}. Fix: pass positive --num_train/--num_test.")
    test = list(range(first_seed, first_seed + num_test))
    return {"train": list(range(test[-1] + 1, test[-1] + 1 + num_train)), "test": test}


def generate_textarena(out_dir: str | os.PathLike, env_id: str, num_train: int = 1024, num_test: int = 64,
                       first_seed: int = 0, game_kwargs: Optional[dict] = None, system_prompt: str = SYSTEM_PROMPT,
                       demo: Optional[tuple[int, list[str]]] = None, agent_name: str = AGENT_NAME) -> tuple[str, str]:
    """Write ``train.parquet`` and ``test.parquet`` for ``env_id`` into ``out_dir``; return their paths.

    ``demo``: (seed, moves) of a game played through TextArena and put in every prompt after the system
    message (a small model rarely finds a game's move format from the rules alone)."""
    game_kwargs = dict(game_kwargs or {})
    seeds = split_seeds(num_train, num_test, first_seed)
    TextArenaEnv(env_id, game_kwargs).reset(seed=seeds["test"][0])  # an unknown or multi-player id fails here
    prompt = [{"role": "system", "content": system_prompt}]
    if demo is not None:
        prompt += demonstration(env_id, game_kwargs, demo[0], demo[1])
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, split_seeds_ in seeds.items():
        path = out / f"{split}.parquet"
        rows = [make_row(env_id, s, split, i, prompt, game_kwargs, agent_name) for i, s in enumerate(split_seeds_)]
        _write_parquet(rows, path)
        paths.append(str(path))
    logger.info("wrote %d train / %d test %s games (seeds %d.. held out) to %s", num_train, num_test, env_id,
                first_seed, out)
    return paths[0], paths[1]


def _json_arg(text: Optional[str], flag: str, kind: type) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        example = '{"max_number": 16}' if kind is dict else '["[8]", "[12]"]'
        raise ValueError(f"{flag} {text!r} is not JSON ({exc}). Fix: e.g. {flag} '{example}'.") from None
    if not isinstance(value, kind):
        raise ValueError(f"{flag} must be a JSON {kind.__name__}, got {text!r}. Fix: e.g. {flag} "
                         f"'{'{}' if kind is dict else '[]'}'.")
    return value


def main(argv: Optional[Sequence[str]] = None) -> tuple[str, str]:
    parser = argparse.ArgumentParser(description="Rows (one episode each) for a single-player TextArena game.")
    parser.add_argument("--env_id", required=True, help="TextArena game id, e.g. GuessTheNumber-v0")
    parser.add_argument("--out_dir", required=True, help="folder for train.parquet / test.parquet")
    parser.add_argument("--num_train", type=int, default=1024)
    parser.add_argument("--num_test", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="first held-out seed; training seeds follow them")
    parser.add_argument("--game_kwargs", help="JSON object of the game's arguments, e.g. '{\"max_number\": 16}'")
    parser.add_argument("--system_prompt", default=SYSTEM_PROMPT)
    parser.add_argument("--demo_seed", type=int, help="seed of a demonstration game put in every prompt")
    parser.add_argument("--demo_moves", help="JSON list of the demonstration's moves, e.g. '[\"[8]\", \"[12]\"]'")
    parser.add_argument("--agent_name", default=AGENT_NAME, help="the agent-loop entry's name")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    moves = _json_arg(args.demo_moves, "--demo_moves", list)
    if (moves is None) != (args.demo_seed is None):
        raise ValueError("--demo_seed and --demo_moves go together. Fix: pass both or neither.")
    demo = None if moves is None else (args.demo_seed, [str(m) for m in moves])
    return generate_textarena(args.out_dir, args.env_id, args.num_train, args.num_test, args.seed,
                              _json_arg(args.game_kwargs, "--game_kwargs", dict), args.system_prompt, demo,
                              args.agent_name)


if __name__ == "__main__":
    try:
        main()
    except ValueError as exc:  # bad input: its one line, no traceback
        raise SystemExit(f"error: {exc}") from None
