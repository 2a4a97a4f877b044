"""A push through shared-memory buckets loads into both rollout engines exactly as the plain stream
does (bit for bit), and a failed load keeps today's rule: the vLLM engine refuses to generate."""

import os

import pytest
import torch

from hybrid_rl.protocol import DataProto
from hybrid_rl.workers.rollout import RolloutConfig, build_rollout, vllm_unavailable_reason
from hybrid_rl.workers.weight_transfer import WeightExporter, open_weights

_VLLM_SKIP = vllm_unavailable_reason("cpu")
ENGINES = ["hf", pytest.param("vllm", marks=[pytest.mark.vllm,
                                             pytest.mark.skipif(_VLLM_SKIP is not None, reason=str(_VLLM_SKIP))])]


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, tiny_model_dir):
    from hybrid_rl.workers.model_loader import load_tokenizer

    cfg = RolloutConfig(name=request.param, dtype="float32", response_length=8, prompt_length=16,
                        calculate_log_probs=True, max_num_seqs=4, cpu_kvcache_space_gib=1, seed=0)
    rollout = build_rollout(cfg, tiny_model_dir, load_tokenizer(tiny_model_dir), "cpu")
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def state_dict(tiny_model_dir):
    from safetensors.torch import load_file

    return load_file(os.path.join(tiny_model_dir, "model.safetensors"))


def _greedy(engine) -> DataProto:
    ids = torch.tensor([[5, 6, 7], [9, 10, 11]])
    batch = DataProto.from_dict({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                 "position_ids": torch.arange(3).expand(2, 3)},
                                non_tensors={"uid": ["0", "1"]},
                                meta_info={"eos_token_id": 2, "pad_token_id": 0, "do_sample": False})
    return engine.generate_sequences(batch)


@pytest.fixture
def push(tmp_path):
    exporter = WeightExporter(str(tmp_path))

    def export(state):
        return exporter.export(iter(state.items()), {}, "shm", bucket_bytes=64 << 10)

    yield export
    exporter.close()
    assert os.listdir(tmp_path) == []


def test_push_loads_like_the_plain_stream(engine, state_dict, push):
    gen = torch.Generator().manual_seed(1)
    perturbed = {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in state_dict.items()}
    try:
        engine.update_weights(iter(perturbed.items()))
        plain = _greedy(engine).batch
        engine.update_weights(iter(state_dict.items()))
        handle = push(perturbed)
        with open_weights(handle) as named:
            engine.update_weights(named)
        pushed = _greedy(engine).batch
        assert torch.equal(pushed["responses"], plain["responses"])
        assert torch.equal(pushed["rollout_log_probs"], plain["rollout_log_probs"])
        if engine.name == "hf":  # the HF engine's parameters can be read back
            loaded = engine.model.state_dict()
            assert all(torch.equal(loaded[k], v) for k, v in perturbed.items())
    finally:
        engine.update_weights(iter(state_dict.items()))


def test_a_failed_push_leaves_the_engine_refusing(engine, state_dict, push):
    before = _greedy(engine).batch["responses"]
    partial = {k: v for k, v in state_dict.items() if "layers.1." not in k}
    with pytest.raises(ValueError, match="weights were not sent"):
        with open_weights(push(partial)) as named:
            engine.update_weights(named)
    if engine.name == "vllm":
        with pytest.raises(RuntimeError, match="failed weight update"):
            _greedy(engine)
    with open_weights(push(state_dict)) as named:
        engine.update_weights(named)
    assert torch.equal(_greedy(engine).batch["responses"], before)
