"""TextArena through the adapter: a real game (GuessTheNumber-v0) played with scripted moves to known
returns, TextArena's invalid-move rule, seeding, the one-line errors, the rows, and EnvAgentLoop episodes
over a scripted engine with exact masks."""

import random
import subprocess
import sys

import pytest
import torch
from installed import import_installed

import_installed("textarena", "envs")  # skips without the envs extra; fails under CI=true

from hybrid_rl.agents.chat import ObservationEncoder  # noqa: E402
from hybrid_rl.hub import textarena as hub  # noqa: E402
from hybrid_rl.hub.textarena import TextArenaEnv, generate_textarena, make_row  # noqa: E402
from hybrid_rl.protocol import DataProto  # noqa: E402
from hybrid_rl.utils.testing import build_byte_tokenizer  # noqa: E402
from hybrid_rl.workers.rollout.base import GenerationParams  # noqa: E402
from hybrid_rl.workers.rollout.config import RolloutConfig  # noqa: E402
from hybrid_rl.workers.rollout.multi_turn import MultiTurnGenerator  # noqa: E402

GAME = {"min_number": 1, "max_number": 16, "max_turns": 5}
HIGHER, LOWER = "The target number is higher.", "The target number is lower."


def _env():
    return TextArenaEnv("GuessTheNumber-v0", dict(GAME))


def _binary_search(env, seed):
    """Play binary search through the game's hints; return (secret, number of guesses, last step)."""
    first, _ = env.reset(seed=seed)
    assert "guess the number between 1 and 16 within 5 turns" in first
    lo, hi, guesses = 1, 16, 0
    while True:
        guess = (lo + hi) // 2
        observation, reward, terminated, truncated, info = env.step(str(guess))  # ActionFormattingWrapper: [guess]
        guesses += 1
        if terminated:
            return guess, guesses, (observation, reward, terminated, truncated, info)
        assert observation in (HIGHER, LOWER) and reward == 0.0 and not truncated
        lo, hi = (guess + 1, hi) if observation == HIGHER else (lo, guess - 1)


def test_binary_search_wins_with_textarenas_reward_one_and_seeds_fix_the_secret():
    secrets = set()
    for seed in range(12):
        secret, guesses, (observation, reward, terminated, truncated, info) = _binary_search(_env(), seed)
        assert (reward, terminated, truncated) == (1.0, True, False) and guesses <= 5
        assert observation == "Congratulations! You guessed the correct number." and not info["invalid_move"]
        assert _binary_search(_env(), seed)[0] == secret  # the same seed, the same game
        secrets.add(secret)
    assert len(secrets) > 1  # seeds do draw different games


def test_losing_scores_textarenas_partial_credit_and_invalid_moves_are_textarenas():
    secret = _binary_search(_env(), 5)[0]
    wrong = [g for g in range(1, 17) if g != secret][:6]
    env = _env()
    env.reset(seed=5)
    for g in wrong[:5]:  # TextArena's check comes before its turn counter moves: the 6th guess ends it
        assert env.step(f"[{g}]")[1:4] == (0.0, False, False)
    observation, reward, terminated, _, info = env.step(f"[{wrong[5]}]")
    assert terminated and reward == pytest.approx(1 - abs(wrong[5] - secret) / 15)  # 1 - distance / range
    assert "turn limit" in info["reason"]

    env.reset(seed=5)
    observation, reward, terminated, _, _ = env.step("no number here")  # first invalid move: a warning
    assert "You attempted an invalid move" in observation and (reward, terminated) == (0.0, False)
    assert env.step(f"[{wrong[0]}]")[2] is False  # a valid move clears the error count
    observation, reward, terminated, _, info = env.step(f"[{wrong[0]}]")  # repeated: invalid, warned again
    assert "already guessed" in observation and not terminated
    _, reward, terminated, _, info = env.step("still nothing")  # the second in a row ends the game
    assert terminated and info["invalid_move"] and reward == pytest.approx(1 - abs(wrong[0] - secret) / 15)


def test_episodes_keep_their_own_random_state():
    random.seed(1234)
    expected = [random.random() for _ in range(3)]
    random.seed(1234)
    a, b = _env(), _env()
    a.reset(seed=7)
    got = [random.random()]
    b.reset(seed=7)
    a.step("[8]")
    got.append(random.random())
    b.step("[8]")
    got.append(random.random())
    assert got == expected  # TextArena's random.seed() never touched the caller's generator
    assert hub._innermost(a.game).game_number == hub._innermost(b.game).game_number


def test_wrapper_observation_is_textarenas_transcript():
    env = TextArenaEnv("GuessTheNumber-v0", dict(GAME), observation="wrapper")
    first, _ = env.reset(seed=0)
    assert first.startswith("\n[GAME] You are Player 0.")
    observation = env.step("[1]" if hub._innermost(env.game).game_number != 1 else "[2]")[0]
    assert observation.startswith(first + "\n[Player] [")  # the whole transcript again, LLMObservationWrapper's


def test_one_line_errors(monkeypatch):
    with pytest.raises(ValueError, match=r"unknown env_id 'GuessTheNumbr-v0' \(did you mean GuessTheNumber-v0"):
        TextArenaEnv("GuessTheNumbr-v0")
    with pytest.raises(ValueError, match="TicTacToe-v0 did not start with one player .AssertionError: The number"):
        TextArenaEnv("TicTacToe-v0").reset(seed=0)
    with pytest.raises(ValueError, match="Chess-v0 cannot be built offline .SyntaxError: f-string"):
        TextArenaEnv("Chess-v0")  # textarena 0.7.4's Chess module is not valid Python 3.11
    with pytest.raises(ValueError, match="rejects game_kwargs {'max_numbr': 3}"):
        TextArenaEnv("GuessTheNumber-v0", {"max_numbr": 3})
    with pytest.raises(ValueError, match=r"unknown env_kwargs \['max_number'\]. Fix: put the game's own"):
        TextArenaEnv("GuessTheNumber-v0", max_number=3)
    with pytest.raises(ValueError, match="observation='all' is not one of"):
        TextArenaEnv("GuessTheNumber-v0", observation="all")
    with pytest.raises(ValueError, match="--game_kwargs '{max: 3}' is not JSON"):
        hub.main(["--env_id", "GuessTheNumber-v0", "--out_dir", "x", "--game_kwargs", "{max: 3}"])
    cli = subprocess.run([sys.executable, "-m", "hybrid_rl.hub.textarena", "--env_id", "Nope-v0", "--out_dir", "x"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1 and cli.stderr.strip().splitlines()[-1].startswith("error: textarena: unknown env_id")
    assert "Traceback" not in cli.stderr
    monkeypatch.setitem(sys.modules, "textarena", None)  # as if not installed
    with pytest.raises(ValueError, match=r"Fix: pip install -e \.\[envs\]"):
        TextArenaEnv("GuessTheNumber-v0")


def test_rows_have_disjoint_seeds_and_a_demonstration_played_by_the_game(tmp_path):
    import pyarrow.parquet as pq

    train, test = hub.main(["--env_id", "GuessTheNumber-v0", "--out_dir", str(tmp_path), "--num_train", "6",
                            "--num_test", "4", "--seed", "10", "--game_kwargs", '{"max_number": 16, "max_turns": 5}',
                            "--demo_seed", "2014", "--demo_moves", '["[8]", "[12]", "[10]", "[11]"]'])
    rows = {split: pq.read_table(path).to_pylist() for split, path in (("train", train), ("test", test))}
    seeds = {k: [r["extra_info"]["env_kwargs"]["seed"] for r in v] for k, v in rows.items()}
    assert seeds == {"train": [14, 15, 16, 17, 18, 19], "test": [10, 11, 12, 13]}
    row = rows["test"][0]
    assert row["agent_name"] == "textarena" and row["reward_model"]["style"] == "agent"
    assert row["data_source"] == "textarena/GuessTheNumber-v0"
    assert row["extra_info"]["env_kwargs"]["game_kwargs"] == {"max_number": 16, "max_turns": 5}
    replies = [t["content"] for t in row["prompt"] if t["role"] == "user"][1:]
    assert replies == [HIGHER, LOWER, HIGHER, "Congratulations! You guessed the correct number."]  # secret 11


EOS = 2
PARAMS = GenerationParams(do_sample=False, temperature=0.0, top_p=1.0, top_k=-1, seed=3, eos_token_ids=(EOS,),
                          pad_token_id=0, response_length=400)


class Script:
    """A turn_fn answering row i's k-th turn with ``moves[i][k]`` (rows found by a marker in the prompt)."""

    def __init__(self, tok, moves):
        self.tok, self.moves = tok, moves

    def __call__(self, token_lists, max_tokens, params):
        out = []
        for tokens, limit in zip(token_lists, max_tokens):
            text = self.tok.decode(tokens)
            row = next(i for i in self.moves if f"row{i} " in text)
            turn = text.count("The target number is") + text.count("You attempted an invalid move")
            ids = self.tok(self.moves[row][turn], add_special_tokens=False)["input_ids"] + [EOS]
            out.append((ids[:limit], [-0.1] * len(ids[:limit])))
        return out


@pytest.mark.parametrize("env_name", ["hybrid_rl.hub.textarena.TextArenaEnv", "textarena"])
def test_env_agent_loop_scores_textarenas_reward_and_masks_observations(tmp_path, env_name):
    path = tmp_path / "agents.yaml"
    path.write_text(f"""- name: textarena
  _target_: hybrid_rl.agents.env_loop.EnvAgentLoop
  env: {env_name}
  env_kwargs: {{env_id: GuessTheNumber-v0, game_kwargs: {GAME}}}
  max_steps: 8
""")
    cfg = RolloutConfig(name="hf", response_length=400, prompt_length=1024, calculate_log_probs=True,
                        agent={"agent_loop_config_path": str(path)})
    tok = build_byte_tokenizer()
    secret, _, _ = _binary_search(_env(), 3)
    low = 1 if secret != 1 else 2
    moves = {0: [str(secret)], 1: [f"[{low}]", "huh", f"[{secret}]"], 2: [f"[{low}]", "huh", "what"]}
    rows = [make_row("GuessTheNumber-v0", 3, "test", i, [{"role": "system", "content": f"row{i} "}], {})
            for i in range(3)]
    messages = [r["prompt"] for r in rows]
    ids, mask = torch.ones(3, 4, dtype=torch.long), torch.ones(3, 4, dtype=torch.long)
    batch = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1},
                                non_tensors={"agent_name": ["textarena"] * 3, "raw_prompt": messages,
                                             "extra_info": [r["extra_info"] for r in rows],
                                             "reward_model": [r["reward_model"] for r in rows]})
    out = MultiTurnGenerator(cfg, tok, EOS).generate(batch, [[1]] * 3, PARAMS, Script(tok, moves))
    # row 0 wins at once; row 1 wins after an invalid move; row 2's second invalid move ends it with
    # TextArena's partial credit for its last valid guess
    assert list(out.non_tensor_batch["reward_score"]) == pytest.approx([1.0, 1.0, 1 - abs(low - secret) / 15])
    hint = HIGHER if low < secret else LOWER
    encoder = ObservationEncoder(tok, tok.eos_token)
    move = [tok(m, add_special_tokens=False)["input_ids"] + [EOS] for m in moves[1]]
    obs = encoder.encode([{"role": "user", "content": hint}])
    resp, row_mask = out.batch["responses"][1].tolist(), out.batch["response_mask"][1].tolist()
    n = len(move[0]) + len(obs)
    assert resp[:n] == move[0] + obs and row_mask[:n] == [1] * len(move[0]) + [0] * len(obs)
    warning_start = n
    n_valid = int(out.batch["attention_mask"][1, 1024:].sum())
    # the rest: "huh" (1) | the invalid-move warning (0) | the winning move (1), and nothing after it
    assert row_mask[warning_start:warning_start + len(move[1])] == [1] * len(move[1])
    assert row_mask[n_valid - len(move[2]):n_valid] == [1] * len(move[2])
    assert resp[n_valid - len(move[2]):n_valid] == move[2]
    assert sum(row_mask[:n_valid]) == sum(len(m) for m in move)  # every other token is an observation
    prompt_text = tok.decode(out.batch["prompts"][1][out.batch["attention_mask"][1, :1024].bool()].tolist())
    assert "You are playing Guess The Number" in prompt_text  # reset's observation is the first user turn
    assert out.meta_info["metrics"]["agent/loop/env_terminated"] == 1.0
