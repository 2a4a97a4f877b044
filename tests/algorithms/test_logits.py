"""logprobs_from_logits / entropy_from_logits: exact values, reference equality, gradients, memory."""

import math

import pytest
import torch

from hybrid_rl.algorithms import entropy_from_logits, logprobs_and_entropy_from_logits, logprobs_from_logits

F64 = torch.float64


def test_hand_values():
    logits = torch.tensor([[0.0, math.log(3.0)]], dtype=F64)
    logp = logprobs_from_logits(logits, torch.tensor([1]))
    assert logp.tolist() == pytest.approx([math.log(0.75)], rel=1e-12)
    assert logprobs_from_logits(logits, torch.tensor([0])).tolist() == pytest.approx([math.log(0.25)], rel=1e-12)
    ent = entropy_from_logits(logits)
    assert ent.tolist() == pytest.approx([-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))], rel=1e-12)
    assert entropy_from_logits(torch.zeros(3, 4)).tolist() == pytest.approx([math.log(4)] * 3, rel=1e-6)


def _reference_logprobs(logits, labels):
    return torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _reference_entropy(logits):
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _sliced_logits(seed=0):
    """[B, R, V] logits sliced out of [B, L, V] model output: non-contiguous, not viewable as 2-D."""
    gen = torch.Generator().manual_seed(seed)
    full = (torch.randn(3, 9, 11, generator=gen, dtype=F64) * 3).requires_grad_(True)
    labels = torch.randint(0, 11, (3, 5), generator=gen)
    return full, full[:, 3:8], labels


@pytest.mark.parametrize("chunk_rows", [None, 1, 4])
def test_logprobs_equal_log_softmax_gather_with_gradient(chunk_rows):
    full, logits, labels = _sliced_logits()
    ours = logprobs_from_logits(logits, labels, chunk_rows=chunk_rows)
    upstream = torch.randn(ours.shape, dtype=F64)
    (g_ours,) = torch.autograd.grad((ours * upstream).sum(), full)
    ref = _reference_logprobs(logits, labels)
    (g_ref,) = torch.autograd.grad((ref * upstream).sum(), full)
    assert ours.shape == labels.shape
    assert torch.allclose(ours, ref, atol=1e-12, rtol=0)
    assert torch.allclose(g_ours, g_ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("chunk_rows", [None, 2])
def test_entropy_equals_reference_with_gradient(chunk_rows):
    full, logits, _ = _sliced_logits(seed=1)
    ours = entropy_from_logits(logits, chunk_rows=chunk_rows)
    upstream = torch.randn(ours.shape, dtype=F64)
    (g_ours,) = torch.autograd.grad((ours * upstream).sum(), full)
    ref = _reference_entropy(logits)
    (g_ref,) = torch.autograd.grad((ref * upstream).sum(), full)
    assert torch.allclose(ours, ref, atol=1e-12, rtol=0)
    assert torch.allclose(g_ours, g_ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_entropy_and_temperature_equal_the_reference(temperature):
    full, logits, labels = _sliced_logits(seed=4)
    logp, entropy = logprobs_and_entropy_from_logits(logits, labels, chunk_rows=4, temperature=temperature)
    upstream = torch.randn(logp.shape, dtype=F64)
    (g_ours,) = torch.autograd.grad((logp * upstream).sum(), full)
    scaled = logits / temperature
    ref_logp = _reference_logprobs(scaled, labels)
    (g_ref,) = torch.autograd.grad((ref_logp * upstream).sum(), full)
    assert torch.allclose(logp, ref_logp, atol=1e-12, rtol=0)
    assert torch.allclose(g_ours, g_ref, atol=1e-12, rtol=0)
    assert not entropy.requires_grad  # a metric: no backward pass over the vocabulary
    assert torch.allclose(entropy, _reference_entropy(scaled.detach()), atol=1e-12, rtol=0)
    assert torch.equal(logprobs_from_logits(logits, labels, chunk_rows=4, temperature=temperature), logp)
    # the separate entropy with temperature, and its gradient
    ent = entropy_from_logits(logits, temperature=temperature)
    (g_ent,) = torch.autograd.grad((ent * upstream).sum(), full)
    (g_ent_ref,) = torch.autograd.grad((_reference_entropy(logits / temperature) * upstream).sum(), full)
    assert torch.allclose(ent, entropy, atol=1e-12, rtol=0)
    assert torch.allclose(g_ent, g_ent_ref, atol=1e-12, rtol=0)
    assert full.grad is None and torch.equal(full, _sliced_logits(seed=4)[0])  # the logits are not written


def test_gradcheck():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 6, generator=gen, dtype=F64, requires_grad=True)
    labels = torch.randint(0, 6, (4,), generator=gen)
    assert torch.autograd.gradcheck(lambda z: logprobs_from_logits(z, labels, chunk_rows=3), (logits,))
    assert torch.autograd.gradcheck(lambda z: entropy_from_logits(z, chunk_rows=3), (logits,))
    assert torch.autograd.gradcheck(lambda z: logprobs_from_logits(z, labels, chunk_rows=3, temperature=0.6), (logits,))
    assert torch.autograd.gradcheck(lambda z: entropy_from_logits(z, chunk_rows=3, temperature=1.7), (logits,))


def test_bfloat16_logits_give_float32_close_to_reference():
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(2, 4, 50, generator=gen) * 4).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, 50, (2, 4), generator=gen)
    out = logprobs_from_logits(logits, labels)
    assert out.dtype == torch.float32
    assert torch.allclose(out, _reference_logprobs(logits.float(), labels), atol=1e-5)
    out.sum().backward()
    assert logits.grad.dtype == torch.bfloat16 and torch.isfinite(logits.grad.float()).all()
    assert entropy_from_logits(logits).dtype == torch.float32


def _saved_tensor_numels(fn, logits):
    """numel of every tensor autograd saves for backward, except those sharing the logits' storage."""
    others = []

    def pack(t):
        if t.untyped_storage().data_ptr() != logits.untyped_storage().data_ptr():
            others.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(logits)
    return others


def test_no_vocab_sized_tensor_saved_for_backward():
    vocab = 64
    logits = torch.randn(2, 8, vocab, requires_grad=True)
    labels = torch.randint(0, vocab, (2, 8))
    rows = 2 * 8
    for fn in (lambda z: logprobs_from_logits(z, labels), entropy_from_logits,
               lambda z: logprobs_and_entropy_from_logits(z, labels, temperature=0.5)[0]):
        assert all(n <= rows for n in _saved_tensor_numels(fn, logits))
    # Control: the naive version keeps a full [2, 8, V] log_softmax output alive.
    naive = _saved_tensor_numels(lambda z: _reference_logprobs(z, labels), logits)
    assert max(naive) == rows * vocab


def test_label_shape_mismatch_rejected():
    with pytest.raises(ValueError, match="labels"):
        logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_gpu_blocks_are_larger_than_cpu_blocks():
    from hybrid_rl.algorithms.logits import _default_chunk_rows

    assert _default_chunk_rows(49152) == 42  # 2**21 logits: cache-sized on a CPU
    assert _default_chunk_rows(49152, "cuda") == 1365  # 2**26 logits: few kernel launches on a GPU
    assert _default_chunk_rows(2**27, "cuda") == 1  # a block never has zero rows


def _default_blocks_match_reference(device: str, rows: int, vocab: int) -> None:
    """The default blocks of ``device`` against log_softmax: log-probs, entropy and the log-probs'
    gradient (the entropy returned beside them carries no gradient)."""
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(device).requires_grad_(True)
    labels = torch.randint(0, vocab, (rows,), generator=gen).to(device)
    weights = torch.randn(rows, generator=gen).to(device)
    logp, entropy = logprobs_and_entropy_from_logits(logits, labels)
    (logp * weights).sum().backward()
    ref = logits.detach().clone().requires_grad_(True)
    ref_logp = _reference_logprobs(ref, labels)
    (ref_logp * weights).sum().backward()
    torch.testing.assert_close(logp, ref_logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, _reference_entropy(ref.detach()), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(logits.grad, ref.grad, rtol=1e-4, atol=1e-6)


def test_cpu_default_blocks_equal_the_reference():
    _default_blocks_match_reference("cpu", rows=600, vocab=8192)  # blocks of 256, 256 and 88 rows


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_default_blocks_equal_the_reference():
    _default_blocks_match_reference("cuda", rows=20000, vocab=8192)  # blocks of 8192, 8192 and 3616 rows
