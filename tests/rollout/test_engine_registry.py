"""Rollout engines by name: a tiny fake engine registered, checked by the config and built; the
fallback and the refusal read the engine's info; the built-ins describe themselves."""

import logging
from types import SimpleNamespace

import pytest
import torch

import hybrid_rl.workers.rollout as rollout_pkg
from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout import BaseRollout, RolloutConfig, build_rollout, register_rollout_engine
from hybrid_rl.workers.rollout.config import ROLLOUT_NAMES
from hybrid_rl.workers.rollout.registry import (describe_rollout_engines, rollout_engine_info,
                                                unregister_rollout_engine)

EOS, PAD = 9, 0


class FakeEngine(BaseRollout):
    """Answers each prompt with (its last token + 1, EOS, 5)."""

    name = "fake"

    def __init__(self, config, model_path, tokenizer, *, device, **kwargs):
        self.config, self.tokenizer, self.built_with = config, tokenizer, dict(device=device, **kwargs)
        self.init_agents()

    def generate_turn(self, token_lists, max_tokens, params):
        rows = [[row[-1] + 1, EOS, 5][:limit] for row, limit in zip(token_lists, max_tokens)]
        rows = [row[:row.index(EOS) + 1] if EOS in row else row for row in rows]
        return [(row, [-0.5, -0.25][:len(row)]) for row in rows]

    def update_weights(self, named_tensors):
        list(named_tensors)

    def sleep(self):
        pass

    def wake_up(self):
        pass

    def shutdown(self):
        pass


@pytest.fixture
def fake_engines(monkeypatch):
    monkeypatch.setattr(rollout_pkg, "_fallback_logged", False)
    register_rollout_engine("fake", backend="fake generator")(FakeEngine)
    register_rollout_engine("fake_gpu", devices=("cuda",), fallback="fake")(FakeEngine)
    register_rollout_engine("fake_missing", unavailable=lambda cfg, path, device, trust: "its library is missing")(
        FakeEngine)
    yield
    for name in ("fake", "fake_gpu", "fake_missing"):
        unregister_rollout_engine(name)


def _prompts() -> DataProto:
    input_ids = torch.tensor([[PAD, 5, 6], [7, 8, 4]])  # [B=2, P=3], left-padded
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask,
                                "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})


def _config(name: str) -> RolloutConfig:
    return RolloutConfig(name=name, response_length=3, prompt_length=4, calculate_log_probs=True)


def test_a_registered_engine_is_a_valid_rollout_name_and_is_built_by_it(fake_engines):
    assert "fake" in ROLLOUT_NAMES and tuple(ROLLOUT_NAMES)[:2] == ("vllm", "hf")
    tokenizer = SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD)
    engine = build_rollout(_config("fake"), "model", tokenizer, "cpu", rows_per_call=2)
    assert isinstance(engine, FakeEngine) and engine.multi_turn is None
    assert engine.built_with == {"device": "cpu", "trust_remote_code": False, "rows_per_call": 2,
                                 "planned_tokens": None}
    out = engine.generate_sequences(_prompts())  # the base class's single-turn path over generate_turn
    assert out.batch["responses"].tolist() == [[7, EOS, PAD], [5, EOS, PAD]]
    assert out.batch["response_mask"].tolist() == [[1, 1, 0], [1, 1, 0]]
    assert out.batch["rollout_log_probs"].tolist() == [[-0.5, -0.25, 0.0], [-0.5, -0.25, 0.0]]
    assert out.batch["input_ids"].tolist() == [[PAD, 5, 6, 7, EOS, PAD], [7, 8, 4, 5, EOS, PAD]]


def test_unregistered_names_fail_the_config_check_naming_the_engines(fake_engines):
    unregister_rollout_engine("fake")
    with pytest.raises(ValueError, match=r"^rollout\.name='fake' is invalid: must be one of \('vllm', 'hf', "):
        _config("fake")


def test_an_engine_that_cannot_run_here_falls_back_with_one_notice(fake_engines, caplog):
    tokenizer = SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD)
    with caplog.at_level(logging.WARNING):
        engines = [build_rollout(_config("fake_gpu"), "model", tokenizer, "cpu") for _ in range(2)]
    assert all(isinstance(e, FakeEngine) for e in engines)
    notices = [r.getMessage() for r in caplog.records if "falling back" in r.getMessage()]
    assert notices == ["rollout.name=fake_gpu: it runs on cuda, not 'cpu'; falling back to the fake rollout "
                       "(fake generator)."]


def test_an_engine_without_fallback_that_cannot_run_is_one_line(fake_engines):
    tokenizer = SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD)
    with pytest.raises(ValueError) as error:  # a user's choice: main_ppo's one-line config error
        build_rollout(_config("fake_missing"), "model", tokenizer, "cpu")
    message = str(error.value)
    assert message.startswith("rollout.name=fake_missing cannot run here: its library is missing. Fix: set ")
    assert "\n" not in message and "'hf'" in message


def test_the_built_in_engines_describe_themselves():
    infos = describe_rollout_engines()
    assert infos["vllm"].fallback == "hf" and infos["vllm"].devices == ("cpu", "cuda")
    assert infos["hf"].fallback is None and infos["hf"].backend == "transformers generate"
    assert rollout_engine_info("hf").description and infos["vllm"].unavailable is not None
    with pytest.raises(ValueError, match="already registered"):
        register_rollout_engine("hf")(FakeEngine)
