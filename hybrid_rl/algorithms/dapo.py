"""DAPO's two reward-side pieces (Yu et al. 2025), pure math.

* :func:`overlong_penalty`: the soft overlong punishment. A response longer than
  ``max_response_length - buffer_len`` tokens loses reward linearly, reaching ``-penalty_factor`` at
  ``max_response_length`` (veRL's ``reward_model.overlong_buffer``).
* :func:`informative_groups`: dynamic sampling's filter. A group (the responses to one prompt) whose
  metric is the same for every response (all right or all wrong) has zero GRPO advantage and teaches
  nothing; it is dropped and more prompts are generated (veRL's ``algorithm.filter_groups``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["informative_groups", "overlong_penalty"]


def overlong_penalty(response_lengths: torch.Tensor, max_response_length: int, buffer_len: int,
                     penalty_factor: float) -> torch.Tensor:
    """``[B]`` penalties (<= 0): ``min(-(L - (max_len - buffer_len)) / buffer_len * factor, 0)``.

    Args:
        response_lengths: ``[B]`` valid tokens of each response.
        max_response_length: the longest a response may be (``data.max_response_length``).
        buffer_len: length of the ramp before it (``overlong_buffer.len``, > 0).
        penalty_factor: the penalty at ``max_response_length`` (``overlong_buffer.penalty_factor``).
    """
    if not 0 < buffer_len <= max_response_length:
        raise ValueError(f"reward_model.overlong_buffer.len={buffer_len} must lie in (0, data.max_response_length="
                         f"{max_response_length}]; e.g. a quarter of the response length.")
    exceed = response_lengths.to(torch.float32) - (max_response_length - buffer_len)
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


def informative_groups(uids: Any, values: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: the rows of groups whose metric varies (not all equal), and of singletons.

    Args:
        uids: length-B group labels (the prompt ``uid``).
        values: ``[B]`` the metric of each response (its accuracy, score, ...).
    """
    labels = np.asarray(uids)
    _, inverse = np.unique(labels, return_inverse=True)
    ids = torch.as_tensor(inverse.reshape(-1), dtype=torch.long)
    values = values.detach().to(torch.float64).reshape(-1)
    groups = int(ids.max()) + 1 if ids.numel() else 0
    count = torch.zeros(groups, dtype=torch.float64).index_add_(0, ids, torch.ones_like(values))
    # max > min, not std > 0: equal values that are no binary fractions leave a rounding-sized std
    high = torch.full((groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, ids, values, reduce="amax")
    low = torch.full((groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, ids, values, reduce="amin")
    keep = (high > low) | (count == 1)
    return keep[ids]
