"""Masked reductions over padded ``[batch, response_len]`` tensors.

Same names and semantics as veRL's ``verl.utils.torch_functional`` helpers so ported code reads
the same. ``mask`` is 1 (or True) on real response tokens and 0 on padding; it may also hold soft
weights, which are applied multiplicatively.
"""

from __future__ import annotations

import torch

_EPS = 1e-8


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of ``values * mask`` over ``axis`` (all elements when ``axis`` is None).

    Args:
        values: any shape, e.g. ``[B, R]``.
        mask: broadcastable to ``values``.
        axis: dimension to reduce, or None for a scalar.
    """
    return (values * mask).sum() if axis is None else (values * mask).sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is set.

    ``sum(values * mask) / (sum(mask) + 1e-8)`` exactly as veRL, so an all-zero mask gives 0.

    Args:
        values: e.g. ``[B, R]``.
        mask: same shape as ``values``.
        axis: None for a scalar over everything, or a dim (``-1`` gives ``[B]``).
    """
    denom = mask.sum() if axis is None else mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / (denom + _EPS)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Scalar variance of ``values`` over the masked positions.

    Args:
        values: e.g. ``[B, R]``.
        mask: same shape as ``values``.
        unbiased: apply Bessel's correction ``n / (n - 1)`` with ``n = sum(mask)``.

    Raises:
        ValueError: with ``unbiased=True`` when the mask selects fewer than 2 elements, since the
            unbiased variance of 0 or 1 sample is undefined.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count < 2:
            raise ValueError(
                f"masked_var(unbiased=True) needs at least 2 masked elements, got sum(mask)={float(count)}; "
                "whitening over a batch with a single response token is undefined — use a larger batch "
                "or call masked_var(..., unbiased=False)"
            )
        variance = variance * count / (count - 1)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``values`` to zero mean / unit variance using statistics over the mask only.

    Returns a tensor of the same shape; positions outside the mask are transformed too (they are
    not zeroed), as in veRL. Callers that need zeros there multiply by the mask.

    Args:
        values: e.g. ``[B, R]``.
        mask: same shape as ``values``.
        shift_mean: if False, add the mean back (only rescale).
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + _EPS)
    if not shift_mean:
        whitened = whitened + mean
    return whitened
