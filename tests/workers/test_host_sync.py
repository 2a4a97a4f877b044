"""The training passes never wait on the device per micro-batch: layouts are built on the host,
inputs copied asynchronously, metrics gathered once per mini-batch."""

from __future__ import annotations

import pytest
import torch

from hybrid_rl.workers.forward import _unpack, response_log_probs
from hybrid_rl.workers.fsdp_utils import to_device
from hybrid_rl.workers.model_loader import load_causal_lm
from hybrid_rl.workers.packing import pack, prompt_groups
from hybrid_rl.workers.update_utils import extend_metrics
from hybrid_rl.workers.varlen_attention import use_varlen_attention
from tests.workers.helpers import make_batch
from tests.workers.test_prefix_grouper import grouped_batch


def test_extend_metrics_keeps_order_and_mixes_floats_and_tensors():
    metrics = {"a": [0.5]}
    extend_metrics(metrics, {"a": [torch.tensor(1.0), 2.0, torch.tensor(3.0, dtype=torch.float64)],
                             "b": [torch.tensor(4)]})
    assert metrics == {"a": [0.5, 1.0, 2.0, 3.0], "b": [4.0]}
    assert all(type(v) is float for v in metrics["a"] + metrics["b"])


def test_to_device_on_cpu_is_a_plain_move():
    t = torch.arange(3)
    assert to_device(t, "cpu") is t


@pytest.mark.parametrize("grouped", [False, True], ids=["rows", "prompt_groups"])
def test_packed_batch_moves_its_layout_with_it(grouped):
    data = grouped_batch() if grouped else make_batch()
    b = data.batch
    groups = prompt_groups(b["input_ids"], b["attention_mask"], b["responses"].shape[1]) if grouped else None
    packed = pack(b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"].shape[1], groups)
    moved = packed.to("cpu")
    layout = moved.attention_kwargs["packed_layout"]
    assert layout.grouped == grouped and (layout.cu_seq_lens is None) == grouped
    values = torch.arange(1, len(moved.keep) + 1, dtype=torch.float32)  # [N]
    expected = torch.zeros(moved.window.shape)
    expected[moved.window] = values  # the boolean-mask placement (a device sync on GPU)
    assert torch.equal(_unpack(values, moved.window_index, moved.window.shape), expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("grouped", [False, True], ids=["rows", "prompt_groups"])
def test_gpu_forward_and_backward_of_a_host_batch_never_synchronise(tiny_model_dir, grouped):
    model = load_causal_lm(tiny_model_dir, dtype="bfloat16").cuda()
    assert use_varlen_attention(model, "auto", torch.device("cuda"))
    data = grouped_batch() if grouped else make_batch()
    batch = dict(data.batch.items())  # host tensors, as the workers hold them
    b = data.batch
    groups = prompt_groups(b["input_ids"], b["attention_mask"], b["responses"].shape[1]) if grouped else None
    response_log_probs(model, batch, 1.0, True, True, groups=groups, device=torch.device("cuda"))  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        log_probs, entropy = response_log_probs(model, batch, 1.0, True, True, groups=groups,
                                                device=torch.device("cuda"))
        (log_probs.sum() + entropy.sum()).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(log_probs).all()
