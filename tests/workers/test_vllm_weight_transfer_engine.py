"""Pushes through vLLM's weight-transfer protocol (our ``hybrid_rl_shm`` engine, built by vLLM's
factory in the CPU worker): the same greedy tokens and log-probs as the in-process stream, a bad push
refused in one line with the engine refusing to generate until a complete push, the handle the only
payload, tied weights written and loaded once, and the HF engine loading the same buckets directly."""

import pickle

import pytest
import torch

from hybrid_rl.workers.rollout import RolloutConfig, build_rollout
from hybrid_rl.workers.weight_transfer import WeightExporter, WeightHandle, alias_groups, open_weights
from tests.workers.test_weight_transfer_engines import _greedy

pytestmark = pytest.mark.vllm

PROTOCOL_RPCS = ["start_weight_update", "update_weights", "finish_weight_update"]


@pytest.fixture(scope="module")
def tied_model(tmp_path_factory):
    """A tiny Llama with tied embeddings, as the HF model the trainer exports from."""
    from transformers import AutoModelForCausalLM

    from hybrid_rl.utils.testing import build_tiny_model_dir

    path = build_tiny_model_dir(tmp_path_factory.mktemp("tied"), tie_word_embeddings=True)
    return path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _config(name: str) -> RolloutConfig:
    return RolloutConfig(name=name, dtype="float32", response_length=8, prompt_length=16, calculate_log_probs=True,
                         max_num_seqs=4, cpu_kvcache_space_gib=1, seed=0)


@pytest.fixture(scope="module")
def engine(tied_model):
    from hybrid_rl.workers.model_loader import load_tokenizer

    path, _ = tied_model
    rollout = build_rollout(_config("vllm"), path, load_tokenizer(path), "cpu", weight_transfer=True)
    assert rollout.name == "vllm"
    yield rollout
    rollout.shutdown()


@pytest.fixture
def exporter(tmp_path):
    exporter = WeightExporter(str(tmp_path))
    yield exporter
    exporter.close()


def _state(model, scale: float = 0.0, seed: int = 1) -> dict[str, torch.Tensor]:
    """The model's state dict (``lm_head.weight`` an alias of the embeddings), perturbed by ``scale``."""
    gen = torch.Generator().manual_seed(seed)
    state = model.state_dict()
    unique = {t.data_ptr(): t for t in state.values()}  # tied names: one storage, one noise
    noise = {key: scale * torch.randn(t.shape, generator=gen) for key, t in unique.items()}
    return {name: t + noise[t.data_ptr()] if scale else t for name, t in state.items()}


def _export(exporter, model, state) -> WeightHandle:
    return exporter.export(iter(state.items()), alias_groups(model), "shm", bucket_bytes=64 << 10)


def _spy_rpcs(engine, monkeypatch) -> list:
    calls = []
    real = engine.llm.collective_rpc

    def spy(method, *args, **kwargs):
        calls.append((method if isinstance(method, str) else method.__name__, kwargs.get("kwargs")))
        return real(method, *args, **kwargs)

    monkeypatch.setattr(engine.llm, "collective_rpc", spy)
    return calls


def _tensors_in(value) -> int:
    """Tensors reachable from a payload (dataclasses, containers)."""
    if isinstance(value, torch.Tensor):
        return 1
    if hasattr(value, "__dataclass_fields__"):
        value = vars(value)
    if isinstance(value, dict):
        return sum(_tensors_in(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensors_in(v) for v in value)
    return 0


def test_a_protocol_push_generates_like_the_in_process_stream(engine, tied_model, exporter, monkeypatch):
    _, model = tied_model
    assert engine.llm.collective_rpc(lambda worker: type(worker.weight_transfer_engine).__name__) == [
        "HybridRLShmEngine"]
    perturbed = _state(model, 0.1)
    try:
        engine.update_weights(iter(perturbed.items()))  # the in-process path (reload_weights)
        streamed = _greedy(engine).batch
        engine.update_weights(iter(_state(model).items()))
        assert not torch.equal(_greedy(engine).batch["responses"], streamed["responses"])  # the push matters
        handle = _export(exporter, model, perturbed)
        calls = _spy_rpcs(engine, monkeypatch)
        resets, reset = [], engine._reset_prefix_cache
        monkeypatch.setattr(engine, "_reset_prefix_cache", lambda: (resets.append(True), reset()))
        engine.load_weight_push(handle)
        assert [name for name, _ in calls if name != "restore_released_parameters"] == PROTOCOL_RPCS
        assert calls[-2][1] == {"update_info": {"handle": handle}}  # the handle is all that crosses
        assert _tensors_in(handle) == 0 and len(pickle.dumps(handle)) < 8192
        assert resets == [True]  # the prefix cache is dropped after the load
        monkeypatch.undo()
        pushed = _greedy(engine).batch
        assert torch.equal(pushed["responses"], streamed["responses"])
        assert torch.equal(pushed["rollout_log_probs"], streamed["rollout_log_probs"])
    finally:
        engine.update_weights(iter(_state(model).items()))


def test_tied_weights_are_written_and_sent_once(engine, tied_model, exporter):
    _, model = tied_model
    handle = _export(exporter, model, _state(model, 0.1))
    tied = [entry.names for entry in handle.entries if len(entry.names) > 1]
    assert tied == [("model.embed_tokens.weight", "lm_head.weight")]
    assert len(handle.entries) == len(model.state_dict()) - 1
    assert handle.num_bytes == sum(p.numel() * 4 for p in model.parameters())  # parameters() lists a tied one once
    engine.load_weight_push(_export(exporter, model, _state(model)))
    assert not engine.needs_weights


@pytest.mark.parametrize("bad, message", [
    ("mis-shaped", r"weight 'model.layers.1.mlp.up_proj.weight' has shape \(255, 128\) but the rollout model "
                   r"expects \(256, 128\)"),
    ("missing", r"update_weights: 9 weights were not sent \(model.layers.1.input_layernorm.weight, "),
    ("unknown", r"update_weights: unexpected weight 'model.layers.9.mlp.up_proj.weight'"),
])
def test_a_bad_push_is_refused_and_the_engine_waits_for_a_complete_one(engine, tied_model, exporter, bad, message):
    _, model = tied_model
    before = _greedy(engine).batch["responses"]
    state = _state(model)
    if bad == "mis-shaped":
        state["model.layers.1.mlp.up_proj.weight"] = state["model.layers.1.mlp.up_proj.weight"][:-1]
    elif bad == "missing":
        state = {k: v for k, v in state.items() if "layers.1." not in k}
    else:
        state["model.layers.9.mlp.up_proj.weight"] = state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=message):
        engine.load_weight_push(_export(exporter, model, state))
    assert engine.needs_weights
    with pytest.raises(RuntimeError, match="failed weight update"):
        _greedy(engine)
    engine.load_weight_push(_export(exporter, model, _state(model)))  # a complete push: generating again
    assert torch.equal(_greedy(engine).batch["responses"], before)


def test_the_hf_engine_loads_the_same_buckets_directly(tied_model, exporter):
    from hybrid_rl.workers.model_loader import load_tokenizer

    path, model = tied_model
    hf = build_rollout(_config("hf"), path, load_tokenizer(path), "cpu", weight_transfer=True)
    perturbed = _state(model, 0.1)
    hf.load_weight_push(_export(exporter, model, perturbed))
    loaded = hf.model.state_dict()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in perturbed.items())
    with open_weights(_export(exporter, model, perturbed)) as named:  # the same views the default reads
        assert [name for name, _ in named] == list(perturbed)


def test_the_worker_engine_refuses_a_bad_push_on_its_own(engine, tied_model, exporter):
    """Driven by the RPCs directly (no pre-check in the rollout), our engine in the worker refuses the
    push before loading anything, vLLM ends the session, and the next push loads."""
    from hybrid_rl.workers.weight_transfer.vllm_engine import update_info

    _, model = tied_model
    before = _greedy(engine).batch["responses"]
    state = _state(model, 0.1)
    state["model.norm.weight"] = state["model.norm.weight"][:3]
    engine.llm.collective_rpc("start_weight_update")
    with pytest.raises(ValueError, match=r"weight 'model.norm.weight' has shape \(3,\) but the rollout model "
                                         r"expects \(128,\)"):
        engine.llm.collective_rpc("update_weights", kwargs={"update_info": update_info(_export(exporter, model, state))})
    with pytest.raises(ValueError, match="Invalid update_info for HybridRLShmEngine.*unexpected keyword"):
        engine.llm.collective_rpc("start_weight_update")
        engine.llm.collective_rpc("update_weights", kwargs={"update_info": {"weights": "not a handle"}})
    engine.load_weight_push(_export(exporter, model, _state(model)))
    assert torch.equal(_greedy(engine).batch["responses"], before)


def test_a_streamed_request_is_interrupted_by_a_protocol_push_and_resumes(engine, tied_model, exporter, monkeypatch):
    """Partial rollout on the protocol-built engine: ``stream_load_push`` aborts the request mid-generation,
    loads through vLLM's three RPCs, and the request continues from its tokens; tokens after the push carry
    the new version, and the whole response equals a greedy continuation computed in two plain parts."""
    from hybrid_rl.workers.rollout.params import GenerationParams
    from hybrid_rl.workers.rollout.streaming import StreamRequest

    _, model = tied_model
    params = GenerationParams(do_sample=False, temperature=0.0, top_p=1.0, top_k=-1, seed=None, eos_token_ids=(319,),
                              pad_token_id=0, response_length=8)
    try:
        engine.stream_set_version(engine.stream_state()["version"])
        base = engine.stream_state()["version"]
        engine.stream_submit([StreamRequest("p", [5, 6, 7], 8, {})], params)
        while not engine._streamer.in_flight["p"].response_ids:
            assert engine.stream_step(0.01) == []
        before = list(engine._streamer.in_flight["p"].response_ids)
        calls = _spy_rpcs(engine, monkeypatch)
        engine.stream_load_push(_export(exporter, model, _state(model, 0.1)), base + 1)
        assert [name for name, _ in calls if name != "restore_released_parameters"] == PROTOCOL_RPCS
        monkeypatch.undo()
        samples = []
        while not samples:
            samples = engine.stream_step(0.05)
        sample = samples[0]
        assert sample.response_ids[:len(before)] == before and len(sample.response_ids) == 8
        assert sample.versions == [base] * len(before) + [base + 1] * (8 - len(before))
        engine.stream_submit([StreamRequest("q", [5, 6, 7] + before, 8 - len(before), {})], params)
        rest = []
        while not rest:
            rest = engine.stream_step(0.05)
        assert sample.response_ids[len(before):] == rest[0].response_ids  # resumed: prompt + partial, new weights
    finally:
        engine.update_weights(iter(_state(model).items()))
