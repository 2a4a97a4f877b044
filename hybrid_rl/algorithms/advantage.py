"""Advantage estimators behind a name registry, with one uniform call path.

Every estimator is registered with ``@register_adv_est(name)`` and is called by
:func:`compute_advantage` with the same keyword arguments (see ``ADV_ESTIMATOR_INPUTS``); each
accepts ``**kwargs`` and ignores what it does not use, and returns ``(advantages, returns)``, both
``[B, R]``. Semantics follow veRL's ``core_algos`` so numbers carry over:

* ``gae``: GAE over response tokens; masked (e.g. observation/tool) tokens are skipped — the next
  value and the running GAE are carried across them — then advantages are whitened over the mask.
* ``grpo``: outcome reward minus the group mean, divided by the group std (+eps) unless
  ``norm_adv_by_std_in_grpo=False`` (Dr.GRPO). Singleton groups use mean 0 / std 1.
* ``rloo``: leave-one-out baseline ``(r - mean) * n / (n - 1)``; singletons keep their raw score.
* ``reinforce_plus_plus``: discounted return-to-go (reset after the last valid token), whitened.
* ``reinforce_plus_plus_baseline``: score minus group mean, broadcast over tokens, whitened.
* ``remax``: return-to-go minus the greedy-decoding reward ``reward_baselines``.

Group statistics are vectorised (``index_add_`` over dense group ids) instead of per-sample loops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from hybrid_rl.algorithms.masked import masked_whiten
from hybrid_rl.utils.registry import Registry, first_doc_line


@dataclass(frozen=True)
class AdvEstimatorInfo:
    """What an advantage estimator needs from the run; the driver and the config checks read it."""

    needs_critic: bool = False
    """It reads ``values``: the run trains a critic (``critic.*``) and computes values each step."""
    needs_groups: bool = False
    """Its baseline comes from the other responses to the same prompt (``index``): with
    ``rollout.n=1`` every advantage is zero, so the run requires ``rollout.n >= 2``."""
    needs_greedy_baseline: bool = False
    """It reads ``reward_baselines``: the driver generates and scores one greedy response per prompt
    each step (a synchronous-mode step; the decoupled mode refuses it)."""
    per_token: bool = False
    """Its advantage varies along a response (a return-to-go, a critic's values), so one rollout's
    advantage cannot be shared by several rows (``rollout.agent.rows=every_call`` refuses it)."""
    requires: tuple[str, ...] = ()
    """Config keys it cannot run without (not null, not empty), e.g. gdpo's ``algorithm.gdpo_reward_keys``;
    the config checks name them."""
    description: str = ""
    """One line for listings (``--help``, the studio); default: the function's first docstring line."""


_ADV_REGISTRY: Registry[AdvEstimatorInfo] = Registry("advantage estimator", "algorithm.adv_estimator")

#: The keyword arguments every estimator receives from :func:`compute_advantage`, with defaults.
#: ``token_level_rewards`` [B, R] and ``response_mask`` [B, R] are required.
ADV_ESTIMATOR_INPUTS: dict[str, Any] = {
    "values": None,  # [B, R] critic values (gae)
    "index": None,  # length-B group ids, e.g. non_tensor_batch["uid"] (grpo, rloo, rf++ baseline)
    "reward_baselines": None,  # [B] greedy-decoding reward (remax)
    "gamma": 1.0,
    "lam": 1.0,
    "norm_adv_by_std_in_grpo": True,
    "epsilon": 1e-6,
    "reward_components": None,  # {name: [B]} scores per reward component (gdpo)
    "reward_weights": None,  # one weight per component (gdpo)
}
_REQUIRED_INPUTS = ("token_level_rewards", "response_mask")


def register_adv_est(name: str, *, needs_critic: bool = False, needs_groups: bool = False,
                     needs_greedy_baseline: bool = False, requires: tuple[str, ...] = (),
                     description: Optional[str] = None, per_token: bool = False) -> Callable:
    """Decorator registering an advantage estimator under ``name`` (duplicate names raise ValueError).

    The function must accept the keywords of :data:`ADV_ESTIMATOR_INPUTS` plus
    ``token_level_rewards`` and ``response_mask`` (take ``**kwargs`` for the ones it ignores) and
    return ``(advantages [B, R], returns [B, R])``. The flags say what it needs from the run
    (:class:`AdvEstimatorInfo`): the trainer provides it and the config checks require it.
    """

    def decorator(fn: Callable) -> Callable:
        info = AdvEstimatorInfo(needs_critic=needs_critic, needs_groups=needs_groups,
                                needs_greedy_baseline=needs_greedy_baseline, per_token=per_token,
                                requires=tuple(requires),
                                description=first_doc_line(fn) if description is None else description)
        return _ADV_REGISTRY.register(name, info)(fn)

    return decorator


def adv_estimator_info(name: str) -> AdvEstimatorInfo:
    """What the estimator registered as ``name`` needs; unknown names raise ValueError listing the valid ones."""
    return _ADV_REGISTRY.info(name)


def describe_adv_estimators() -> dict[str, AdvEstimatorInfo]:
    """Every registered estimator's :class:`AdvEstimatorInfo`, by name."""
    return _ADV_REGISTRY.describe()


def unregister_adv_est(name: str) -> None:
    """Remove a registered estimator (tests, plugin reloads); a no-op for unknown names."""
    _ADV_REGISTRY.unregister(name)


def get_adv_estimator_fn(name: str) -> Callable:
    """The estimator registered as ``name``; unknown names raise ValueError listing the registered ones."""
    return _ADV_REGISTRY.get(name)


def registered_adv_estimators() -> list[str]:
    """Names of all registered advantage estimators."""
    return _ADV_REGISTRY.names()


def compute_advantage(adv_estimator: str, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator registered as ``adv_estimator`` on the uniform inputs.

    Missing optional inputs get the defaults of :data:`ADV_ESTIMATOR_INPUTS`; unknown keywords
    raise (a typo such as ``norm_adv_by_std_in_gpro`` would otherwise be silently ignored).

    Returns:
        ``(advantages [B, R], returns [B, R])``.
    """
    fn = get_adv_estimator_fn(adv_estimator)
    unknown = sorted(set(inputs) - set(ADV_ESTIMATOR_INPUTS) - set(_REQUIRED_INPUTS))
    if unknown:
        raise ValueError(
            f"compute_advantage got unknown inputs {unknown}; the uniform estimator inputs are "
            f"{list(_REQUIRED_INPUTS) + list(ADV_ESTIMATOR_INPUTS)}"
        )
    missing = [k for k in _REQUIRED_INPUTS if inputs.get(k) is None]
    if missing:
        raise ValueError(f"compute_advantage({adv_estimator!r}) needs {missing} ([batch, response_len] tensors)")
    full = {**ADV_ESTIMATOR_INPUTS, **inputs}
    _check_shapes(**full)
    return fn(**full)


def _check_shapes(token_level_rewards, response_mask, values, index, reward_baselines, **_) -> None:
    """Uniform shape checks shared by every estimator (no per-estimator branches)."""
    shape = tuple(token_level_rewards.shape)
    if token_level_rewards.dim() != 2 or tuple(response_mask.shape) != shape:
        raise ValueError(
            f"token_level_rewards {shape} and response_mask {tuple(response_mask.shape)} must both be "
            "[batch, response_len]"
        )
    if values is not None and tuple(values.shape) != shape:
        raise ValueError(f"values has shape {tuple(values.shape)}, expected {shape} like token_level_rewards")
    if index is not None and len(index) != shape[0]:
        raise ValueError(f"index has {len(index)} entries, expected one group id per row ({shape[0]})")
    if reward_baselines is not None and tuple(reward_baselines.shape) != shape[:1]:
        raise ValueError(f"reward_baselines has shape {tuple(reward_baselines.shape)}, expected ({shape[0]},)")


def _require(value: Any, name: str, estimator: str, how: str) -> None:
    if value is None:
        raise ValueError(f"adv_estimator {estimator!r} needs `{name}`, which was None; {how}")


# ----------------------------------------------------------------------------- group helpers


def group_ids(index: Any, device: torch.device | str | None = None) -> tuple[torch.Tensor, int]:
    """Map arbitrary group labels (uid strings, ints, ...) to dense ids ``0..G-1``.

    Args:
        index: length-B sequence / np.ndarray (object dtype allowed) / tensor of group labels.
        device: device of the returned ids.

    Returns:
        ``(ids [B] int64, G)``; rows with equal labels share an id.
    """
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    labels = np.asarray(index)
    try:
        _, inverse = np.unique(labels, return_inverse=True)
    except TypeError:
        # Mixed, unorderable labels: fall back to first-seen order (O(B) dict, no sorting needed).
        seen: dict[Any, int] = {}
        inverse = np.array([seen.setdefault(label, len(seen)) for label in labels.tolist()], dtype=np.int64)
    ids = torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device)
    num_groups = int(ids.max().item()) + 1 if ids.numel() else 0
    return ids, num_groups


def group_mean_std(scores: torch.Tensor, ids: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, ...]:
    """Per-row statistics of each row's group.

    Args:
        scores: ``[B]`` one scalar per row.
        ids: ``[B]`` dense group ids from :func:`group_ids`.
        num_groups: G.

    Returns:
        ``(mean [B], std [B], count [B])`` of the row's group: mean, unbiased std (like
        ``torch.std``; 0 for singletons, callers decide what a singleton means) and group size.
    """
    count = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(0, ids, torch.ones_like(scores))
    total = torch.zeros_like(count).index_add_(0, ids, scores)
    mean = (total / count)[ids]  # [B]
    # Two-pass variance: numerically closer to torch.std than E[x^2] - E[x]^2.
    sq_dev = torch.zeros_like(count).index_add_(0, ids, (scores - mean) ** 2)
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))[ids]
    return mean, std, count[ids]


# ----------------------------------------------------------------------------- estimators


@register_adv_est("gae", needs_critic=True, per_token=True)
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2015) over response tokens.

    Args:
        token_level_rewards: ``[B, R]``.
        values: ``[B, R]`` critic values V(s_t).
        response_mask: ``[B, R]``; positions with 0 are skipped: the TD recursion carries the next
            value and running GAE across them (veRL's handling of multi-turn observation tokens).
        gamma: discount factor.
        lam: GAE lambda.

    Returns:
        ``(advantages [B, R] whitened over the mask, returns [B, R] = raw advantages + values)``.
    """
    _require(values, "values", "gae", "GAE needs a critic: configure the critic worker (it runs when "
             "algorithm.adv_estimator=gae) so compute_values fills batch['values'], or use a critic-free "
             "estimator such as 'grpo'")
    mask = response_mask.to(values.dtype)
    next_values = torch.zeros_like(values[:, 0])  # [B]
    last_gae = torch.zeros_like(values[:, 0])  # [B]
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = token_level_rewards[:, t] + gamma * next_values - values[:, t]
        gae_t = delta + gamma * lam * last_gae
        m = mask[:, t]
        # Masked position: keep the state of the next valid token instead of resetting it.
        next_values = values[:, t] * m + (1 - m) * next_values
        last_gae = gae_t * m + (1 - m) * last_gae
        advantages[:, t] = last_gae
    returns = advantages + values
    return masked_whiten(advantages, mask), returns


@register_adv_est("grpo", needs_groups=True)
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: one scalar per response, normalised within its prompt group.

    Args:
        token_level_rewards: ``[B, R]``; the response score is its sum over R.
        response_mask: ``[B, R]``.
        index: length-B group ids (the prompt ``uid``).
        epsilon: added to the std to avoid division by zero.
        norm_adv_by_std_in_grpo: divide by the group std (GRPO); False = Dr.GRPO (mean only).

    Returns:
        ``(advantages, returns)``, identical ``[B, R]`` tensors, zero outside the mask.
    """
    _require(index, "index", "grpo", "pass the prompt group ids (non_tensor_batch['uid']) as index")
    scores = token_level_rewards.sum(dim=-1)  # [B]
    ids, num_groups = group_ids(index, scores.device)
    mean, std, count = group_mean_std(scores, ids, num_groups)
    singleton = count == 1
    mean = torch.where(singleton, torch.zeros_like(mean), mean)
    std = torch.where(singleton, torch.ones_like(std), std)
    adv = (scores - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores - mean
    adv = adv.unsqueeze(-1) * response_mask.to(adv.dtype)  # [B, R]
    return adv, adv


@register_adv_est("rloo", needs_groups=True)
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024): baseline = mean of the *other* group members.

    ``r_i - mean_{j != i} r_j == (r_i - mean) * n / (n - 1)``; singleton groups keep their raw score.

    Args:
        token_level_rewards: ``[B, R]``.
        response_mask: ``[B, R]``.
        index: length-B group ids.

    Returns:
        ``(advantages, returns)``, identical ``[B, R]`` tensors, zero outside the mask.
    """
    _require(index, "index", "rloo", "pass the prompt group ids (non_tensor_batch['uid']) as index")
    scores = token_level_rewards.sum(dim=-1)  # [B]
    ids, num_groups = group_ids(index, scores.device)
    mean, _, count = group_mean_std(scores, ids, num_groups)
    loo = (scores - mean) * count / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, loo, scores)
    adv = adv.unsqueeze(-1) * response_mask.to(adv.dtype)
    return adv, adv


@register_adv_est("reinforce_plus_plus", per_token=True)
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): discounted return-to-go, whitened over the mask.

    Masked positions (padding, multi-turn tool observations) are skipped as in veRL 0.9.1: their
    return is 0, their reward is dropped, and the running return is carried across them
    undiscounted, so the outcome reward reaches every earlier turn.

    Args:
        token_level_rewards: ``[B, R]``.
        response_mask: ``[B, R]``.
        gamma: discount factor.

    Returns:
        ``(advantages [B, R] whitened and zero outside the mask, returns [B, R])``.
    """
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])  # [B]
    for t in reversed(range(token_level_rewards.shape[1])):
        candidate = token_level_rewards[:, t] + gamma * running
        m = mask[:, t]
        returns[:, t] = candidate * m
        running = candidate * m + running * (1 - m)
    advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


@register_adv_est("reinforce_plus_plus_baseline", needs_groups=True)
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline: ``score - group mean`` per token, whitened over the mask.

    Singleton groups use a baseline of 0.

    Args:
        token_level_rewards: ``[B, R]``.
        response_mask: ``[B, R]``.
        index: length-B group ids.

    Returns:
        ``(advantages, returns)``, identical ``[B, R]`` tensors, zero outside the mask.
    """
    _require(index, "index", "reinforce_plus_plus_baseline",
             "pass the prompt group ids (non_tensor_batch['uid']) as index")
    mask = response_mask.to(token_level_rewards.dtype)
    scores = token_level_rewards.sum(dim=-1)  # [B]
    ids, num_groups = group_ids(index, scores.device)
    mean, _, count = group_mean_std(scores, ids, num_groups)
    centred = scores - torch.where(count == 1, torch.zeros_like(mean), mean)
    adv = centred.unsqueeze(-1) * mask  # [B, R]
    adv = masked_whiten(adv, mask) * mask
    return adv, adv


@register_adv_est("remax", needs_greedy_baseline=True, per_token=True)
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor, response_mask: torch.Tensor, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023): return-to-go minus the reward of the greedy response to the same prompt.

    Args:
        token_level_rewards: ``[B, R]``.
        reward_baselines: ``[B]`` reward of the greedy (do_sample=False) response.
        response_mask: ``[B, R]``.

    Returns:
        ``(advantages [B, R], returns [B, R])``, zero outside the mask.
    """
    _require(reward_baselines, "reward_baselines", "remax",
             "the driver must generate a greedy response per prompt and score it into "
             "batch['reward_baselines'] (done when algorithm.adv_estimator=remax)")
    mask = response_mask.to(token_level_rewards.dtype)
    returns = (token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])  # [B, R]
    advantages = returns - reward_baselines.to(returns.dtype).unsqueeze(-1) * mask
    return advantages, returns
