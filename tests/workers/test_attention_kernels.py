"""Packed-attention kernels: FlexAttention (and, on CUDA, the varlen kernels) equal the reference
attention on random row-packed and prefix-grouped layouts; one place chooses the kernel."""

from __future__ import annotations

import copy

import pytest
import torch

from hybrid_rl.workers import attention_backend, varlen_attention
from hybrid_rl.workers.actor import DataParallelPPOActor
from hybrid_rl.workers.attention_backend import AttentionChoice, resolve_attention
from hybrid_rl.workers.config import ModelConfig
from hybrid_rl.workers.flex_attention import bucket_length, flex_packed_attention, segment_ids
from hybrid_rl.workers.model_loader import load_causal_lm
from hybrid_rl.workers.packing import group_mask
from tests.workers.helpers import actor_config, make_batch
from tests.workers.test_prefix_grouper import grouped_batch

CUDA = torch.cuda.is_available()


def random_layout(grouped: bool, seed: int = 0) -> varlen_attention.PackedLayout:
    """Causal rows of random lengths, and (``grouped``) prompt groups of 1-3 responses between them."""
    g = torch.Generator().manual_seed(seed)
    blocks, cursor = [], 0
    for i in range(7):
        if grouped and i % 2:
            prompt = int(torch.randint(1, 9, (1,), generator=g))
            responses = torch.randint(1, 7, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g).tolist()
            length = prompt + sum(responses)
            blocks.append(varlen_attention.PackedBlock(cursor, cursor + length, group_mask(prompt, responses),
                                                       (prompt, *responses)))
        else:
            length = int(torch.randint(1, 20, (1,), generator=g))
            blocks.append(varlen_attention.PackedBlock(cursor, cursor + length))
        cursor += length
    if grouped:
        return varlen_attention.PackedLayout(blocks)
    bounds = torch.tensor([0] + [b.end for b in blocks], dtype=torch.int32)
    return varlen_attention.PackedLayout.from_cu_seq_lens(bounds)


def qkv(length: int, dtype: torch.dtype, device: str = "cpu", seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 6, length, 16, generator=g)  # 6 query heads share 2 kv heads
    k, v = (torch.randn(1, 2, length, 16, generator=g) for _ in range(2))
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def reference(q, k, v, layout) -> torch.Tensor:
    """One SDPA call per block with its explicit mask: ``[1, T, H, D]``."""
    return varlen_attention._blocks_attention(q, k, v, layout.blocks, 0.0, 16**-0.5).transpose(1, 2)


def test_bucket_lengths_and_segment_ids_by_hand():
    assert [bucket_length(n) for n in (1, 128, 129, 300, 4096, 4097)] == [128, 128, 256, 512, 4096, 8192]
    # a row of 2, then a group: prompt 2 (segment 1), responses of 1 and 2 (prefix: segment 1), 1 padding
    seg, prefix = segment_ids([(2, None), (2, None), (1, 1), (2, 1)], 8, torch.device("cpu"))
    assert seg.tolist() == [0, 0, 1, 1, 2, 3, 3, 4]
    assert prefix.tolist() == [-2, -2, -2, -2, 1, 1, 1, -2]


@pytest.mark.parametrize("grouped", [False, True], ids=["rows", "prompt_groups"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
def test_flex_forward_equals_reference_attention(grouped, dtype, tol):
    layout = random_layout(grouped)
    length = layout.blocks[-1].end
    q, k, v = qkv(length, dtype)
    got = flex_packed_attention(q, k, v, layout.flex(q.device), 16**-0.5)
    torch.testing.assert_close(got.float(), reference(q, k, v, layout).float(), atol=tol, rtol=tol)
    assert layout.flex(q.device) is layout.flex(q.device)  # built once per forward, shared by the layers


def test_auto_keeps_sdpa_on_cpu_and_unrunnable_kernels_are_one_line():
    assert resolve_attention("auto", "cpu") == AttentionChoice("sdpa", "sdpa")
    assert resolve_attention("sdpa", "cuda") == AttentionChoice("sdpa", "sdpa")
    with pytest.raises(ValueError, match=r"critic.model.attn_implementation=flex_attention: FlexAttention has no "
                                         r"backward on CPU.*Fix: set critic.model.attn_implementation=auto"):
        resolve_attention("flex_attention", "cpu", key="critic.model.attn_implementation")
    with pytest.raises(ValueError, match="flash_attention_2: flash-attn runs on CUDA only"):
        resolve_attention("flash_attention_2", "cpu")
    with pytest.raises(ValueError, match="varlen_attn: torch's varlen_attn runs on CUDA only"):
        resolve_attention("varlen_attn", "cpu")
    with pytest.raises(ValueError, match=r"model.attn_implementation='flash3' is invalid: must be one of"):
        ModelConfig(attn_implementation="flash3")


def test_auto_on_cuda_prefers_flash_attn_then_torch_varlen_then_flex(monkeypatch):
    for flash, varlen, rows in [(True, True, "flash_attention_2"), (False, True, "varlen_attn"),
                                (False, False, "flex_attention")]:
        monkeypatch.setattr(attention_backend, "has_flash_attn", lambda flash=flash: flash)
        monkeypatch.setattr(attention_backend, "has_torch_varlen", lambda varlen=varlen: varlen)
        assert resolve_attention("auto", "cuda") == AttentionChoice(rows, "flex_attention")


@pytest.fixture
def flex_everywhere():
    """Force FlexAttention for both layouts (forward only on CPU) and restore the choice after."""
    before = attention_backend.current_choice()
    attention_backend.set_attention(AttentionChoice("flex_attention", "flex_attention"))
    yield
    attention_backend.set_attention(before)


@pytest.mark.parametrize("grouped", [False, True], ids=["rows", "prompt_groups"])
def test_actor_log_probs_through_flex_equal_the_sdpa_path(tiny_model_dir, flex_everywhere, monkeypatch, grouped):
    model = load_causal_lm(tiny_model_dir)
    data = grouped_batch() if grouped else make_batch()
    data.meta_info.update(micro_batch_size=len(data), use_dynamic_bsz=False)
    cfg = actor_config(use_prefix_grouper=grouped)
    flex_actor = DataParallelPPOActor(cfg, model, use_remove_padding=True)
    assert flex_actor.group_prompts == grouped
    calls = []
    real = varlen_attention._kernel_attention
    monkeypatch.setattr(varlen_attention, "_kernel_attention", lambda kernel, *a: calls.append(kernel) or real(kernel, *a))
    flex, flex_entropy = flex_actor.compute_log_prob(data, calculate_entropy=True)
    assert calls == ["flex_attention"] * model.config.num_hidden_layers
    attention_backend.set_attention(AttentionChoice("sdpa", "sdpa"))
    sdpa, sdpa_entropy = DataParallelPPOActor(cfg, copy.deepcopy(model), use_remove_padding=True).compute_log_prob(
        data, calculate_entropy=True)
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(flex[mask], sdpa[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(flex_entropy[mask], sdpa_entropy[mask], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------- GPU
def _kernels_on_this_gpu():
    kernels = ["flex_attention"]
    if attention_backend.has_torch_varlen():
        kernels.append("varlen_attn")
    if attention_backend.has_flash_attn():
        kernels.append("flash_attention_2")
    return kernels


def _grads(fn, q, k, v):
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    out.backward(torch.linspace(-1, 1, out.numel(), device=out.device, dtype=out.dtype).view_as(out))
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("grouped", [False, True], ids=["rows", "prompt_groups"])
@pytest.mark.parametrize("kernel", ["flex_attention", "varlen_attn", "flash_attention_2"])
def test_gpu_kernels_equal_reference_forward_and_backward(kernel, grouped):
    if kernel not in _kernels_on_this_gpu():
        pytest.skip(f"{kernel} is not installed here")
    if grouped and kernel != "flex_attention":
        pytest.skip("varlen kernels compute row-packed layouts only")
    layout = random_layout(grouped, seed=3)
    q, k, v = qkv(layout.blocks[-1].end, torch.bfloat16, "cuda")
    for block in layout.blocks:
        block.mask = None if block.mask is None else block.mask.cuda()
    if layout.cu_seq_lens is not None:
        layout.cu_seq_lens = layout.cu_seq_lens.cuda()
    expected = _grads(lambda q, k, v: reference(q, k, v, layout), q, k, v)
    got = _grads(lambda q, k, v: varlen_attention._kernel_attention(kernel, q, k, v, layout, 16**-0.5), q, k, v)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, expected):
        torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2, msg=name)
