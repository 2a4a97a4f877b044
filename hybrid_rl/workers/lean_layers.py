"""Memory-lean RMSNorm and SwiGLU MLP for training: the same forward, fewer saved activations.

A Llama-style decoder layer keeps, per token, about 24 KiB of activations for backward in bf16
(SmolLM2-135M: hidden 576, intermediate 1536), and most of it is not matmul input:

* HF's ``RMSNorm`` upcasts to float32 and autograd saves the float32 input and the bf16
  normalised output of every norm (3.5 KB at hidden 576, two norms a layer);
* ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` saves the gate (for SiLU), SiLU's output and
  the up projection (for the product) and the product (for ``down_proj``): four
  ``[tokens, intermediate]`` tensors.

Here an RMSNorm saves its bf16 input and a ``[tokens, 1]`` float32 ``rstd`` and recomputes the
normalised value in backward; the MLP saves only the gate and up projections and recomputes
``silu(gate) * up`` in backward (also for ``down_proj``'s weight gradient when it is a plain
``nn.Linear``). Recomputing elementwise ops is what Liger-Kernel's fused RMSNorm/SwiGLU do on GPUs
and what torch.compile's partitioner chooses there; this is the eager, any-device form.

The forward outputs are bit-identical to Llama's HF modules' (the same ops in the same order), and
so are the gradients of the MLP. A module is patched only when a probe shows it computes exactly
that: look-alike classes with extra terms (multipliers, clamps, dropout, a norm that scales in
float32 first) keep their own forward. The norm's input gradient is the same formula autograd would
apply, in float32, so it agrees to float32 rounding. :func:`apply_lean_layers` rebinds the
``forward`` of each matching module in place: the module objects, their parameters, checkpoints,
LoRA wrappers and FSDP2's per-layer hooks stay as they are.
"""

from __future__ import annotations

import copy
import types
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["apply_lean_layers", "lean_mlp", "lean_rms_norm"]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's RMSNorm, op for op: ``(output [..., H], rstd [..., 1] float32)``."""
    xf = x.to(torch.float32)  # [..., H]
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)  # [..., 1]
    return weight * (xf * rstd).to(x.dtype), rstd


class _RMSNorm(torch.autograd.Function):
    """``weight * (x * rsqrt(mean(x**2) + eps)).to(x.dtype)`` with the statistics in float32."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out, rstd = _rms_norm(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        xf = x.to(torch.float32)
        grad_x = grad_weight = None
        if ctx.needs_input_grad[1]:
            normed = (xf * rstd).to(x.dtype)
            grad_weight = (grad_out * normed).sum_to_size(weight.shape).to(weight.dtype)
        if ctx.needs_input_grad[0]:
            grad_normed = (grad_out * weight).to(x.dtype).to(torch.float32)  # [..., H]
            # y = xf * rstd, rstd = (mean(xf^2) + eps)^-1/2: dy/dxf = rstd - xf * rstd^3 * mean(g * xf)
            dot = (grad_normed * xf).mean(-1, keepdim=True)  # [..., 1]
            grad_x = (grad_normed * rstd - xf * (rstd.pow(3) * dot)).to(x.dtype)
        return grad_x, grad_weight, None


class _SwiGLU(torch.autograd.Function):
    """``silu(gate) * up``, saving only ``gate`` and ``up``."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        gate, up = ctx.saved_tensors
        return _swiglu_grads(grad_out, gate, up)


def _swiglu_grads(grad_out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d/d gate, d/d up)`` of ``silu(gate) * up``: the ops autograd itself would run."""
    grad_gate = torch.ops.aten.silu_backward(grad_out * up, gate)
    return grad_gate, grad_out * F.silu(gate)


class _SwiGLULinear(torch.autograd.Function):
    """``linear(silu(gate) * up, weight, bias)``, saving ``gate`` and ``up`` but not the product."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor,
                bias: Optional[torch.Tensor]) -> torch.Tensor:
        ctx.save_for_backward(gate, up, weight)
        ctx.has_bias = bias is not None
        return F.linear(F.silu(gate) * up, weight, bias)  # [..., out]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        gate, up, weight = ctx.saved_tensors
        grad_flat = grad_out.reshape(-1, grad_out.shape[-1])  # [N, out]
        grad_weight = grad_bias = None
        if ctx.needs_input_grad[2]:
            product = (F.silu(gate) * up).reshape(-1, gate.shape[-1])  # [N, intermediate], recomputed
            grad_weight = grad_flat.t().mm(product)
        if ctx.has_bias and ctx.needs_input_grad[3]:
            grad_bias = grad_flat.sum(0)
        grad_gate = grad_up = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            grad_product = grad_out.matmul(weight)  # [..., intermediate]
            grad_gate, grad_up = _swiglu_grads(grad_product, gate, up)
        return grad_gate, grad_up, grad_weight, grad_bias


class _SwiGLULoRA(torch.autograd.Function):
    """``linear(p, W, bias) + linear(linear(p, A), B) * scaling`` with ``p = silu(gate) * up``: a
    peft LoRA ``down_proj``, saving ``gate``, ``up`` and the rank-sized ``p @ A.T`` but not ``p``
    (which peft's ``lora_A`` would keep: ``[tokens, intermediate]``)."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
        product = F.silu(gate) * up  # [..., intermediate]
        result = F.linear(product, weight, bias)  # [..., out]
        low = F.linear(product.to(lora_a.dtype), lora_a)  # [..., rank]
        ctx.save_for_backward(gate, up, weight, lora_a, lora_b, low)
        ctx.has_bias, ctx.scaling = bias is not None, scaling
        return (result + F.linear(low, lora_b) * scaling).to(result.dtype)  # peft's order of ops

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        gate, up, weight, lora_a, lora_b, low = ctx.saved_tensors
        grad_flat = grad_out.reshape(-1, grad_out.shape[-1])  # [N, out]
        grad_low_out = grad_flat.to(lora_b.dtype) * ctx.scaling  # [N, out], as autograd: upcast, then scale
        grad_low = grad_low_out.mm(lora_b)  # [N, rank]
        product = (F.silu(gate) * up).reshape(-1, gate.shape[-1])  # [N, intermediate], recomputed
        grads = [None] * 7
        if ctx.needs_input_grad[2]:
            grads[2] = grad_flat.t().mm(product)
        if ctx.has_bias and ctx.needs_input_grad[3]:
            grads[3] = grad_flat.sum(0)
        if ctx.needs_input_grad[4]:
            grads[4] = grad_low.t().mm(product.to(lora_a.dtype))  # [rank, intermediate]
        if ctx.needs_input_grad[5]:
            grads[5] = grad_low_out.t().mm(low.reshape(-1, low.shape[-1]))  # [out, rank]
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            grad_product = grad_out.matmul(weight) + grad_low.mm(lora_a).view(*gate.shape[:-1], -1).to(gate.dtype)
            grads[0], grads[1] = _swiglu_grads(grad_product, gate, up)
        return tuple(grads)


def _plain_lora(module: nn.Module) -> Optional[tuple[nn.Linear, nn.Linear, nn.Linear, float]]:
    """``(base, lora_A, lora_B, scaling)`` when ``module`` is a peft LoRA ``Linear`` that computes
    exactly ``base(x) + lora_B(lora_A(x)) * scaling``: one active adapter, no dropout, no variant
    (DoRA ...), not merged, not disabled, no hooks; else None (it then runs its own forward)."""
    base = getattr(module, "base_layer", None)
    if type(base) is not nn.Linear or getattr(module, "disable_adapters", True) or getattr(module, "merged", True):
        return None
    active = [a for a in getattr(module, "active_adapters", []) if a in module.lora_A]
    if len(active) != 1 or active[0] in getattr(module, "lora_variant", {}):
        return None
    name = active[0]
    lora_a, lora_b = module.lora_A[name], module.lora_B[name]
    parts = (module, base, lora_a, lora_b)
    if (type(lora_a) is not nn.Linear or type(lora_b) is not nn.Linear or lora_a.bias is not None
            or lora_b.bias is not None or type(module.lora_dropout[name]) is not nn.Identity
            or any(m._forward_hooks or m._forward_pre_hooks for m in parts)):
        return None
    return base, lora_a, lora_b, float(module.scaling[name])


def lean_rms_norm(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """``forward`` of an HF RMSNorm (``weight``, ``variance_epsilon``) through :class:`_RMSNorm`."""
    if not torch.is_grad_enabled():
        return _rms_norm(hidden_states, self.weight, self.variance_epsilon)[0]
    return _RMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)


def lean_mlp(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``forward`` of an HF gated-SiLU MLP (``gate_proj``, ``up_proj``, ``down_proj``)."""
    gate, up = self.gate_proj(x), self.up_proj(x)  # [..., intermediate] each
    down = self.down_proj
    if not torch.is_grad_enabled():
        return down(F.silu(gate) * up)
    if type(down) is nn.Linear:
        return _SwiGLULinear.apply(gate, up, down.weight, down.bias)
    lora = _plain_lora(down)
    if lora is not None:
        base, lora_a, lora_b, scaling = lora
        return _SwiGLULoRA.apply(gate, up, base.weight, base.bias, lora_a.weight, lora_b.weight, scaling)
    return down(_SwiGLU.apply(gate, up))  # another wrapper runs its own forward


def _is_rms_norm(module: nn.Module) -> bool:
    return (type(module).__name__.endswith("RMSNorm") and isinstance(getattr(module, "weight", None), torch.Tensor)
            and isinstance(getattr(module, "variance_epsilon", None), float) and module.weight.dim() == 1
            and not list(module.children()) and [n for n, _ in module.named_parameters(recurse=False)] == ["weight"])


def _is_silu_mlp(module: nn.Module) -> bool:
    act = getattr(module, "act_fn", None)
    return (type(module).__name__.endswith("MLP")
            and {n for n, _ in module.named_children()} == {"gate_proj", "up_proj", "down_proj", "act_fn"}
            and not list(module.parameters(recurse=False)) and not list(module.buffers(recurse=False))
            and (isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"))


def _same_forward(module: nn.Module, lean_forward, width: int) -> bool:
    """Whether ``lean_forward`` gives ``module``'s own output, bit for bit, on a random probe, in the
    module's dtype and in bf16 (where mixed precision computes), in training mode (so a dropout or
    any extra term shows). A class that looks like Llama's but computes more (multipliers, clamps,
    dropout, a norm that scales in float32 before rounding) fails."""
    candidates = [module]
    if next(module.parameters()).dtype != torch.bfloat16:
        candidates.append(copy.deepcopy(module).to(torch.bfloat16))
    for candidate in candidates:
        param = next(candidate.parameters())
        probe = torch.randn(2, 3, width, generator=torch.Generator().manual_seed(0)).to(param.device, param.dtype)
        was_training = candidate.training
        candidate.train()
        try:
            with torch.no_grad():
                own, lean = candidate(probe), lean_forward(candidate, probe)
        finally:
            candidate.train(was_training)
        if own.dtype != lean.dtype or not torch.equal(own, lean):
            return False
    return True


def apply_lean_layers(model: nn.Module) -> dict[str, int]:
    """Rebind the ``forward`` of every HF RMSNorm and gated-SiLU MLP of ``model`` whose output the
    lean version reproduces exactly (checked on a probe), in place; other modules are left alone.
    Returns ``{"rms_norm": n, "mlp": m, "skipped": k}`` (look-alikes whose forward differs)."""
    counts = {"rms_norm": 0, "mlp": 0, "skipped": 0}
    for module in model.modules():
        if _is_rms_norm(module):
            kind, lean, width = "rms_norm", lean_rms_norm, module.weight.shape[0]
        elif _is_silu_mlp(module):
            kind, lean, width = "mlp", lean_mlp, module.gate_proj.in_features
        else:
            continue
        if _same_forward(module, lean, width):
            module.forward = types.MethodType(lean, module)
            counts[kind] += 1
        else:
            counts["skipped"] += 1
    return counts
