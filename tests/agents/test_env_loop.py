"""Text environments: the guess_number rules, EnvAgentLoop's episodes (masks, discounted returns, limits,
failures) over a scripted engine, and the reward manager keeping the environment's score."""

import numpy as np
import pytest
import torch

from hybrid_rl.agents import BaseTextEnv, GuessNumberEnv, register_env
from hybrid_rl.agents.chat import ObservationEncoder
from hybrid_rl.data.guess_number import demonstration, generate_guess_number
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout.base import GenerationParams
from hybrid_rl.workers.rollout.config import RolloutConfig
from hybrid_rl.workers.rollout.multi_turn import MultiTurnGenerator
from hybrid_rl.utils.testing import build_byte_tokenizer

EOS = 2
PARAMS = GenerationParams(do_sample=False, temperature=0.0, top_p=1.0, top_k=-1, seed=3, eos_token_ids=(EOS,),
                          pad_token_id=0, response_length=120)


def test_guess_number_rules():
    env = GuessNumberEnv(low=1, high=16, max_guesses=3, secret=11)
    assert env.reset(seed=0)[0].startswith("I am thinking of a number from 1 to 16.")
    assert env.step("8") == ("Higher.", 0.0, False, False, {"guess": 8, "secret": 11})
    assert env.step("I say 30") [:4] == (env.rules(), 0.0, False, False)  # out of range: the rules again
    assert env.step("12")[:4] == ("Lower.", 0.0, False, True)  # third move: truncated
    env.reset()
    assert env.step("11")[:4] == ("Correct!", 1.0, True, False)
    drawn = {GuessNumberEnv().reset(seed=s)[1]["secret"] for s in range(200)}
    assert drawn == set(range(1, 17))
    with pytest.raises(ValueError, match="need integers low < high"):
        GuessNumberEnv(low=5, high=5)


def test_demonstration_is_a_binary_search_and_test_secrets_cover_the_range(tmp_path):
    assert [t["content"] for t in demonstration(1, 16) if t["role"] == "assistant"] == ["8", "12", "10", "11"]
    import pyarrow.parquet as pq

    _, test = generate_guess_number(tmp_path, num_train=4, num_test=32)
    rows = pq.read_table(test).to_pylist()
    assert sorted(r["extra_info"]["env_kwargs"]["secret"] for r in rows) == sorted(list(range(1, 17)) * 2)
    assert rows[0]["reward_model"]["style"] == "agent" and rows[0]["agent_name"] == "guess_number"


@register_env("test_countdown")
class Countdown(BaseTextEnv):
    """Rewards 1, 2, 3, ... per step; terminates on 'stop'; raises on 'boom'."""

    def reset(self, seed=None, options=None):
        self.t = 0
        return f"start {seed} {options}", {}

    async def step(self, action):  # async methods work as well
        if "boom" in action:
            raise RuntimeError("the environment broke")
        self.t += 1
        return f"obs{self.t}", float(self.t), action.strip() == "stop", False, {}


class Policy:
    """A turn_fn that answers each row's k-th turn with the script of its row (found by a marker)."""

    def __init__(self, tok, scripts):
        self.tok, self.scripts = tok, scripts

    def __call__(self, token_lists, max_tokens, params):
        out = []
        for tokens, limit in zip(token_lists, max_tokens):
            text = self.tok.decode(tokens)
            row = next(i for i in self.scripts if f"row{i} " in text)
            turn = text.count("obs") + text.count("Higher") + text.count("Lower")
            ids = self.tok(self.scripts[row][turn], add_special_tokens=False)["input_ids"] + [EOS]
            out.append((ids[:limit], [-0.1] * len(ids[:limit])))
        return out


@pytest.fixture()
def setup(tmp_path):
    path = tmp_path / "agents.yaml"
    path.write_text("""- name: countdown
  _target_: hybrid_rl.agents.env_loop.EnvAgentLoop
  env: test_countdown
  max_steps: 3
  gamma: 0.5
- name: guess
  _target_: hybrid_rl.agents.EnvAgentLoop
  env: guess_number
  env_kwargs: {low: 1, high: 16, max_guesses: 5}
  max_steps: 5
""")
    cfg = RolloutConfig(name="hf", response_length=120, prompt_length=200, calculate_log_probs=True,
                        agent={"agent_loop_config_path": str(path)})
    tok = build_byte_tokenizer()
    return MultiTurnGenerator(cfg, tok, EOS), tok


def _batch(names, extras):
    n = len(names)
    messages = [[{"role": "user", "content": f"row{i} "}] for i in range(n)]
    ids, mask = torch.ones(n, 4, dtype=torch.long), torch.ones(n, 4, dtype=torch.long)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1},
                               non_tensors={"agent_name": names, "extra_info": extras, "raw_prompt": messages,
                                            "reward_model": [{"style": "agent"}] * n})


def test_episodes_mask_observations_and_score_the_discounted_return(setup):
    gen, tok = setup
    scripts = {0: ["a", "b", "c", "never reached"], 1: ["a", "stop"], 2: ["a", "boom"], 3: ["8", "12", "10", "11"]}
    extras = [{"index": 7, "env_kwargs": {"options": {"k": 1}}}, {"index": 8}, {"index": 9},
              {"index": 0, "env_kwargs": {"secret": 11}}]
    out = gen.generate(_batch(["countdown", "countdown", "countdown", "guess"], extras), [[1]] * 4, PARAMS,
                       Policy(tok, scripts))
    scores = list(out.non_tensor_batch["reward_score"])
    # gamma 0.5: rewards 1, 2, 3 -> 1 + 1 + 0.75; max_steps 3 ends row 0 after its third move
    assert scores == [2.75, 1 + 0.5 * 2, 0.0, 1.0]
    encoder = ObservationEncoder(tok, tok.eos_token)
    obs1 = encoder.encode([{"role": "user", "content": "obs1"}])
    a = tok("a", add_special_tokens=False)["input_ids"] + [EOS]
    resp, mask = out.batch["responses"][1].tolist(), out.batch["response_mask"][1].tolist()
    stop = tok("stop", add_special_tokens=False)["input_ids"] + [EOS]
    n = len(a) + len(obs1) + len(stop)
    assert resp[:n] == a + obs1 + stop and mask[:n] == [1] * len(a) + [0] * len(obs1) + [1] * len(stop)
    assert out.batch["rollout_log_probs"][1, :n].tolist() == pytest.approx(
        [-0.1] * len(a) + [0.0] * len(obs1) + [-0.1] * len(stop))
    prompt_text = tok.decode(out.batch["prompts"][0][out.batch["attention_mask"][0, :200].bool()].tolist())
    assert "start 7 {'k': 1}" in prompt_text  # reset(seed=row index, options=row's) became a user turn
    assert out.batch["response_mask"][2].sum() == 0  # the environment raised: empty row, score 0
    last = int(out.batch["attention_mask"][0, 200:].sum()) - 1
    assert out.batch["response_mask"][0, last] == 1  # max_steps reached: no observation after the last move
    metrics = out.meta_info["metrics"]
    assert metrics["agent/ended_by/error"] == 0.25 and metrics["agent/loop/env_terminated"] == 0.5


def test_reward_manager_keeps_given_scores_and_zeroes_agent_rows_without_one():
    from hybrid_rl.reward.manager import NaiveRewardManager

    tok = build_byte_tokenizer()
    calls = []

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        calls.append(ground_truth)
        return 0.5

    resp = torch.tensor([[5, 6, 0], [5, 0, 0], [7, 7, 7]])
    data = DataProto.from_dict(
        {"responses": resp, "response_mask": (resp > 0).long(), "attention_mask": torch.cat([torch.ones(3, 2, dtype=torch.long), (resp > 0).long()], 1)},
        non_tensors={"data_source": ["x", "game", "game"], "reward_score": np.array([None, 0.9, None], dtype=object),
                     "reward_model": [{"ground_truth": "g"}, {"style": "agent"}, {"style": "agent"}]})
    manager = NaiveRewardManager(tok, num_examine=0, compute_score=scorer, isolation="thread")
    scores = manager(data)
    assert calls == ["g"]  # only the row the reward function scores
    assert scores[0, 1].item() == 0.5 and scores[1, 0].item() == pytest.approx(0.9) and scores[2].sum() == 0
    assert manager.last_metrics["reward/num_invalid"] == 1


def test_agent_scored_rows_are_left_out_of_the_data_source_check(tmp_path):
    from hybrid_rl.data.dataset import RLHFDataset

    train, _ = generate_guess_number(tmp_path, num_train=3, num_test=2)
    dataset = RLHFDataset(train, build_byte_tokenizer(), max_prompt_length=4096)
    assert dataset.data_sources() == ["guess_number"] and dataset.data_sources(scored_only=True) == []
