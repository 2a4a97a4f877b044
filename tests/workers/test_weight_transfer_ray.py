"""Both transports between two Ray actors on this node: the shared-memory buckets and the forced
cross-node fallback (Ray object-store uint8 buckets); tied weights once, bit-exact, freed on release."""

import os
import sys

import pytest
import torch

ray = pytest.importorskip("ray")

from hybrid_rl.workers.weight_transfer import WeightExporter, WeightHandle, alias_groups, open_weights  # noqa: E402


def _model_state():
    from transformers import AutoModelForCausalLM

    from hybrid_rl.utils.testing import tiny_llama_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama_config(tie_word_embeddings=True)).to(torch.bfloat16)
    return model, model.state_dict()


@ray.remote(num_cpus=0)
class _Trainer:
    def __init__(self):
        self.exporter = WeightExporter()

    def push(self, transport: str) -> WeightHandle:
        model, state = _model_state()
        return self.exporter.export(iter(state.items()), alias_groups(model), transport, bucket_bytes=64 << 10)

    def release(self, handle: WeightHandle) -> int:
        return self.exporter.release(handle)

    def live(self) -> list[int]:
        return self.exporter.live_pushes


@ray.remote(num_cpus=0)
class _Rollout:
    def load(self, handle: WeightHandle) -> dict:
        with open_weights(handle) as named:
            return {name: tensor.clone() for name, tensor in named}


@pytest.fixture(scope="module")
def actors():
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test file
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield _Trainer.remote(), _Rollout.remote()
    finally:
        ray.shutdown()


@pytest.mark.parametrize("transport", ["shm", "object_store"])
def test_push_between_actors_is_exact_and_freed(actors, transport):
    trainer, rollout = actors
    handle = ray.get(trainer.push.remote(transport))
    assert handle.transport == transport and handle.node_ip == ray.util.get_node_ip_address()
    if transport == "object_store":
        assert all(isinstance(ref, ray.ObjectRef) for ref in handle.buckets)
    else:
        assert all(os.path.exists(path) for path in handle.buckets)
    _, state = _model_state()
    loaded = ray.get(rollout.load.remote(handle))
    assert list(loaded) == list(state)
    assert all(torch.equal(loaded[k], v) and loaded[k].dtype == v.dtype for k, v in state.items())
    tied = [e for e in handle.entries if len(e.names) > 1]
    assert [e.names for e in tied] == [("model.embed_tokens.weight", "lm_head.weight")]
    assert ray.get(trainer.release.remote(handle)) == len(handle.buckets)
    assert ray.get(trainer.live.remote()) == []
    if transport == "shm":
        assert not any(os.path.exists(path) for path in handle.buckets)
