"""The fused LM-head log-probs against autograd through full float64 logits."""

from __future__ import annotations

import pytest
import torch

from hybrid_rl.algorithms import linear_logits
from hybrid_rl.algorithms.linear_logits import linear_logprobs_and_entropy


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(linear_logits, "VOCAB_BLOCK", 64)  # several blocks, the last one partial


def _inputs(rows: int = 13, hidden: int = 8, vocab: int = 300, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(vocab, hidden, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, vocab, (rows,), generator=g)
    labels[0], labels[1] = vocab - 1, 0  # the partial last block and the first column
    return h, w, labels


def _reference(h, w, labels, temperature):
    logp = torch.log_softmax(h @ w.T / temperature, dim=-1)  # [N, V]
    return logp.gather(1, labels[:, None]).squeeze(1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy", [None, "metric", "grad"])
def test_values_and_gradients_equal_autograd_through_the_full_logits(temperature, entropy):
    h, w, labels = _inputs()
    lp, ent = linear_logprobs_and_entropy(h, w, labels, temperature=temperature, entropy=entropy)
    lp_ref, ent_ref = _reference(h, w, labels, temperature)
    torch.testing.assert_close(lp, lp_ref, rtol=0, atol=1e-12)
    assert (ent is None) == (entropy is None)
    if ent is not None:
        torch.testing.assert_close(ent, ent_ref, rtol=0, atol=1e-12)
    g = torch.Generator().manual_seed(3)
    g_lp, g_ent = torch.randn(lp.shape, generator=g, dtype=lp.dtype), torch.randn(lp.shape, generator=g, dtype=lp.dtype)
    loss = (lp * g_lp).sum() + ((ent * g_ent).sum() if entropy == "grad" else 0.0)
    loss_ref = (lp_ref * g_lp).sum() + ((ent_ref * g_ent).sum() if entropy == "grad" else 0.0)
    for got, want in zip(torch.autograd.grad(loss, [h, w]), torch.autograd.grad(loss_ref, [h, w])):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


def test_a_metric_entropy_has_no_gradient_and_a_frozen_weight_gets_none():
    h, w, labels = _inputs()
    w.requires_grad_(False)
    lp, ent = linear_logprobs_and_entropy(h, w, labels, entropy="metric")
    assert not ent.requires_grad and lp.requires_grad
    (grad_h,) = torch.autograd.grad(lp.sum(), [h])
    (grad_ref,) = torch.autograd.grad(_reference(h, w, labels, 1.0)[0].sum(), [h])
    torch.testing.assert_close(grad_h, grad_ref, rtol=0, atol=1e-11)


def test_a_row_does_not_depend_on_the_rows_beside_it():
    h, w, labels = _inputs(rows=12)
    whole, _ = linear_logprobs_and_entropy(h.detach().float(), w.detach().float(), labels)
    halves = [linear_logprobs_and_entropy(h.detach().float()[s], w.detach().float(), labels[s])[0]
              for s in (slice(0, 5), slice(5, 12))]
    torch.testing.assert_close(torch.cat(halves), whole, rtol=0, atol=2e-6)


def test_bf16_inputs_match_the_bf16_logits_to_float32_rounding():
    h, w, labels = _inputs(rows=16, hidden=32)
    hb, wb = h.detach().bfloat16(), w.detach().bfloat16()
    lp, ent = linear_logprobs_and_entropy(hb, wb, labels, temperature=0.7, entropy="metric")
    # the truth: the head's bf16 logits (blocks of the matmul equal the whole one), then float64
    logp = torch.log_softmax((hb @ wb.T).double() / 0.7, dim=-1)  # [N, V]
    lp_ref, ent_ref = logp.gather(1, labels[:, None]).squeeze(1), -(logp.exp() * logp).sum(-1)
    assert lp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(lp.double(), lp_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), ent_ref, rtol=1e-5, atol=1e-4)  # lse - E[z] cancels


@pytest.mark.parametrize("bad, message", [
    (dict(hidden=torch.zeros(3, 4), weight=torch.zeros(10, 5)), "must be \\[N, H\\]"),
    (dict(labels=torch.zeros(2, dtype=torch.long)), "must be \\[N\\]"),
    (dict(weight=torch.zeros(10, 4, dtype=torch.float64)), "must share a dtype"),
    (dict(entropy="yes"), "must be None, 'metric' or 'grad'"),
])
def test_bad_arguments_are_named(bad, message):
    kwargs = dict(hidden=torch.zeros(3, 4), weight=torch.zeros(10, 4), labels=torch.zeros(3, dtype=torch.long))
    kwargs.update(bad)
    with pytest.raises(ValueError, match=message):
        linear_logprobs_and_entropy(**kwargs)
