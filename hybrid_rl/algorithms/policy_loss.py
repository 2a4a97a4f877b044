"""Policy-gradient losses behind a name registry (``actor.policy_loss.loss_mode`` in veRL terms).

Every registered loss has the uniform signature::

    fn(old_log_prob, log_prob, advantages, response_mask, *, loss_agg_mode="token-mean",
       clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0,
       global_batch_num_tokens=None, global_batch_num_seqs=None, **kwargs)
    -> (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)

All tensors are ``[B, R]``; the outputs are 0-dim tensors. ``pg_loss`` is aggregated with
:func:`~hybrid_rl.algorithms.loss_agg.agg_loss` and so obeys its micro-batch/rank split contract
when the global denominators are passed; the three metrics are plain masked means over *this*
call's tokens (for logging, not for summing).

* ``vanilla``: PPO clipped surrogate (Schulman et al. 2017) with asymmetric ``clip_ratio_low/high``
  and dual-clip (Ye et al. 2019): for negative advantages the loss is capped at
  ``-A * clip_ratio_c``. The log-ratio is clamped to [-20, 20] before ``exp`` for stability.
* ``gspo``: Group Sequence Policy Optimization (Zheng et al. 2025): the importance ratio is the
  per-sequence geometric mean ``exp(mean_t(log_prob - old_log_prob))``, applied per token as
  ``sg[s_i] * pi / sg[pi]`` so each token gets the gradient of its own log-prob scaled by ``s_i``.
  veRL recommends ``loss_agg_mode="seq-mean-token-mean"`` with it.
* ``sft``: the negative log-likelihood of the masked tokens (supervised fine-tuning on the actor's
  update path: packing, micro-batching, FSDP2, checkpoints).
* ``decoupled``: AReaL's decoupled PPO for asynchronous (stale) samples: the vanilla surrogate against
  the recomputed proximal policy, weighted per token by the capped behaviour importance weight
  ``pi_prox / pi_behav`` (needs ``rollout_log_probs``; ``behav_imp_weight_cap``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch

from hybrid_rl.algorithms.loss_agg import agg_loss
from hybrid_rl.algorithms.masked import masked_mean
from hybrid_rl.utils.registry import Registry, first_doc_line


@dataclass(frozen=True)
class PolicyLossInfo:
    """What a policy loss needs from the run; the driver and the config checks read it."""

    needs_rollout_log_probs: bool = False
    """It reads ``rollout_log_probs`` (the behaviour policy's log-probs from the engine): the run must
    set ``actor_rollout_ref.rollout.calculate_log_probs=true``."""
    uses_advantages: bool = True
    """It weights tokens by ``advantages``; false for a supervised loss (no rewards needed)."""
    applies_rollout_is_weights: bool = False
    """It multiplies each token's loss by ``rollout_is_weights`` (the rollout correction's importance
    weights, ``algorithm.rollout_correction.rollout_is``) before aggregation; a run asking for those
    weights needs a loss that applies them."""
    requires: tuple[str, ...] = ()
    """Config keys it cannot run without (their value must not be null), e.g. dro's
    ``actor_rollout_ref.actor.policy_loss.dro_beta``; the config checks name them."""
    recommended: Mapping[str, Any] = field(default_factory=dict)
    """Config values it is meant to run with (``key -> value``, e.g. GSPO's tiny clip ratios); a run
    that picks the loss and leaves one of them at another value gets a one-line notice."""
    description: str = ""
    """One line for listings (``--help``, the studio); default: the function's first docstring line."""


_POLICY_LOSS_REGISTRY: Registry[PolicyLossInfo] = Registry(
    "policy loss", "actor.policy_loss.loss_mode", aliases=("actor_rollout_ref.actor.policy_loss.loss_mode",))

#: Bound on ``log_prob - old_log_prob`` before exponentiation (exp(20) ~ 5e8 is still finite in fp32).
LOG_RATIO_CLAMP = 20.0
#: Upper bound of GSPO's sequence log-ratio, as in veRL.
GSPO_LOG_RATIO_MAX = 10.0


def register_policy_loss(name: str, *, needs_rollout_log_probs: bool = False, uses_advantages: bool = True,
                         applies_rollout_is_weights: bool = False, requires: tuple[str, ...] = (),
                         recommended: Optional[Mapping[str, Any]] = None,
                         description: Optional[str] = None) -> Callable:
    """Decorator registering a policy loss with the uniform signature (duplicate names raise ValueError);
    the keywords say what it needs from the run (:class:`PolicyLossInfo`)."""

    def decorator(fn: Callable) -> Callable:
        info = PolicyLossInfo(needs_rollout_log_probs=needs_rollout_log_probs, uses_advantages=uses_advantages,
                              applies_rollout_is_weights=applies_rollout_is_weights, requires=tuple(requires),
                              recommended=dict(recommended or {}),
                              description=first_doc_line(fn) if description is None else description)
        return _POLICY_LOSS_REGISTRY.register(name, info)(fn)

    return decorator


def policy_loss_info(name: str) -> PolicyLossInfo:
    """What the loss registered as ``name`` needs; unknown names raise ValueError listing the valid ones."""
    return _POLICY_LOSS_REGISTRY.info(name)


def describe_policy_losses() -> dict[str, PolicyLossInfo]:
    """Every registered policy loss's :class:`PolicyLossInfo`, by name."""
    return _POLICY_LOSS_REGISTRY.describe()


def unregister_policy_loss(name: str) -> None:
    """Remove a registered policy loss (tests, plugin reloads); a no-op for unknown names."""
    _POLICY_LOSS_REGISTRY.unregister(name)


def get_policy_loss_fn(name: str) -> Callable:
    """The policy loss registered as ``name``; unknown names raise ValueError listing the registered ones."""
    return _POLICY_LOSS_REGISTRY.get(name)


def registered_policy_losses() -> list[str]:
    """Names of all registered policy losses."""
    return _POLICY_LOSS_REGISTRY.names()


def _check_clip(clip_ratio_low: float, clip_ratio_high: float, clip_ratio_c: float | None = None) -> None:
    if clip_ratio_low is None or clip_ratio_high is None:
        raise ValueError(
            f"clip ratios must be set, got clip_ratio_low={clip_ratio_low}, clip_ratio_high={clip_ratio_high}; "
            "set actor.clip_ratio (or clip_ratio_low / clip_ratio_high), e.g. 0.2"
        )
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(
            f"clip_ratio_c ({clip_ratio_c}) is the dual-clip lower bound of the ratio for negative advantages "
            "and must be > 1.0; the usual value is 3.0"
        )


@register_policy_loss("vanilla", applies_rollout_is_weights=True)
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    rollout_is_weights: Optional[torch.Tensor] = None,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    global_batch_num_tokens: Any = None,
    global_batch_num_seqs: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate with dual-clip; see the module docstring.

    Args:
        old_log_prob: ``[B, R]`` log-probs of the behaviour policy (no grad).
        log_prob: ``[B, R]`` log-probs of the current policy (with grad).
        advantages: ``[B, R]``.
        response_mask: ``[B, R]``.
        loss_agg_mode, global_batch_num_tokens, global_batch_num_seqs: passed to ``agg_loss``.
        clip_ratio_low / clip_ratio_high: ratio clipped to ``[1 - low, 1 + high]``.
        clip_ratio_c: dual-clip bound (> 1) for negative advantages.
        rollout_is_weights: ``[B, R]`` detached rollout-correction weights multiplying each token's
            clipped loss before aggregation (None = 1).

    Returns:
        ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``: the loss; fraction of tokens where
        the clipped term was active; mean ``old_log_prob - log_prob``; fraction of tokens where the
        dual clip was active.
    """
    pg_losses, pg_clipfrac, ppo_kl, pg_clipfrac_lower = _clipped_token_losses(
        old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, global_batch_num_tokens, global_batch_num_seqs)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def _clipped_token_losses(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high,
                          clip_ratio_c):
    """Per-token PPO clipped + dual-clipped losses ``[B, R]`` and the three metrics (see ``vanilla``)."""
    _check_clip(clip_ratio_low, clip_ratio_high, clip_ratio_c)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)  # [B, R]
    ppo_kl = masked_mean(-log_ratio, response_mask)

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_loss = torch.maximum(loss_unclipped, loss_clipped)
    pg_clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).to(ratio.dtype), response_mask)

    # Dual clip: with A < 0 a huge ratio would give an unbounded loss; cap it at -A * c.
    loss_dual = -advantages * clip_ratio_c
    negative = advantages < 0
    pg_clipfrac_lower = masked_mean((torch.gt(clip_loss, loss_dual) & negative).to(ratio.dtype), response_mask)
    pg_losses = torch.where(negative, torch.minimum(clip_loss, loss_dual), clip_loss)  # [B, R]
    return pg_losses, pg_clipfrac, ppo_kl, pg_clipfrac_lower


@register_policy_loss("decoupled", needs_rollout_log_probs=True, description=(
    "AReaL's decoupled PPO for stale samples: the clipped surrogate against the recomputed proximal policy, "
    "weighted by the capped behaviour importance weight."))
def compute_policy_loss_decoupled(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    rollout_log_probs: torch.Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    global_batch_num_tokens: Any = None,
    global_batch_num_seqs: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decoupled PPO (AReaL, Fu et al. 2025) for stale samples: the clipped surrogate is taken against
    the *proximal* policy (``old_log_prob``, recomputed by the trainer before the update) and each
    token is weighted by the detached behaviour importance weight ``w = pi_prox / pi_behav``
    (``rollout_log_probs`` = the policy version that sampled it). As in AReaL, tokens with
    ``w > behav_imp_weight_cap`` are dropped from the loss (weight 0, still counted in the
    denominator); ``rollout_log_probs == old_log_prob`` gives exactly ``vanilla``.

    Args:
        old_log_prob: ``[B, R]`` proximal log-probs (no grad).
        log_prob: ``[B, R]`` current log-probs (with grad).
        advantages, response_mask: ``[B, R]``.
        rollout_log_probs: ``[B, R]`` behaviour log-probs from the rollout engine (required).
        behav_imp_weight_cap: drop tokens whose weight exceeds it (> 1); None keeps every token.
        the rest: as ``vanilla``.
    """
    if rollout_log_probs is None:
        raise ValueError("actor.policy_loss.loss_mode=decoupled needs the behaviour log-probs of the rollout: set "
                         "actor_rollout_ref.rollout.calculate_log_probs=true.")
    if behav_imp_weight_cap is not None and behav_imp_weight_cap <= 1.0:
        raise ValueError(f"actor.policy_loss.behav_imp_weight_cap={behav_imp_weight_cap} is invalid: it must be > 1 "
                         "(tokens whose importance weight exceeds it are dropped). Fix: use e.g. 5, or null.")
    pg_losses, pg_clipfrac, ppo_kl, pg_clipfrac_lower = _clipped_token_losses(
        old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c)
    behav_log_ratio = (old_log_prob - rollout_log_probs).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    weight = torch.exp(behav_log_ratio)  # [B, R]
    if behav_imp_weight_cap is not None:
        weight = torch.where(weight <= behav_imp_weight_cap, weight, torch.zeros_like(weight))
    pg_loss = agg_loss(pg_losses * weight, response_mask, loss_agg_mode, global_batch_num_tokens,
                       global_batch_num_seqs)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


@register_policy_loss("sft", uses_advantages=False,
                      description="Supervised fine-tuning: the negative log-likelihood of the target tokens.")
def compute_policy_loss_sft(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    global_batch_num_tokens: Any = None,
    global_batch_num_seqs: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Supervised fine-tuning through the actor: the negative log-likelihood of the target tokens
    (``response_mask`` 1 = an assistant token to learn), aggregated like every loss here (token-mean
    over the mini-batch's tokens by default, so micro-batch splits are invariant). ``old_log_prob``
    and ``advantages`` are ignored; the three PPO metrics are 0.

    Args:
        log_prob: ``[B, R]`` log-probs of the target tokens (with grad).
        response_mask: ``[B, R]`` the loss mask.
    """
    loss = agg_loss(-log_prob, response_mask, loss_agg_mode, global_batch_num_tokens, global_batch_num_seqs)
    zero = log_prob.new_zeros(())
    return loss, zero, zero, zero


def behaviour_weight_stats(old_log_prob: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor,
                           cap: float | None = None) -> dict[str, float]:
    """Statistics of the behaviour importance weights ``pi_prox / pi_behav`` over the response tokens
    (all ``[B, R]``): ``behav_imp_weight/{mean,min,max}`` and, with a ``cap``, ``capped_frac`` (the
    fraction of tokens the decoupled loss drops). Empty when the mask selects nothing."""
    weights = torch.exp((old_log_prob - rollout_log_probs).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weights = weights[response_mask.bool()].float()
    if weights.numel() == 0:
        return {}
    out = {"behav_imp_weight/mean": float(weights.mean()), "behav_imp_weight/min": float(weights.min()),
           "behav_imp_weight/max": float(weights.max())}
    if cap is not None:
        out["behav_imp_weight/capped_frac"] = float((weights > cap).float().mean())
    return out


@register_policy_loss("gspo", applies_rollout_is_weights=True, recommended={  # GSPO paper's, veRL's / TRL's recipes
    "actor_rollout_ref.actor.clip_ratio_low": 3e-4, "actor_rollout_ref.actor.clip_ratio_high": 4e-4,
    "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean"})
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    rollout_is_weights: Optional[torch.Tensor] = None,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    global_batch_num_tokens: Any = None,
    global_batch_num_seqs: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO: PPO clipping applied to the sequence-level importance ratio.

    Args:
        old_log_prob, log_prob, advantages, response_mask: ``[B, R]``.
        loss_agg_mode: passed to ``agg_loss``; GSPO is meant for ``"seq-mean-token-mean"``.
        clip_ratio_low / clip_ratio_high: sequence ratio clipped to ``[1 - low, 1 + high]``
            (GSPO uses much smaller values than token-level PPO, e.g. 3e-4 / 4e-4).
        clip_ratio_c: unused (no dual clip in GSPO); accepted for the uniform signature.
        rollout_is_weights: ``[B, R]`` rollout-correction weights scaling each token's loss (None = 1).

    Returns:
        ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``; ``pg_clipfrac_lower`` is always 0.
    """
    _check_clip(clip_ratio_low, clip_ratio_high)
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob  # [B, R]
    seq_len = mask.sum(dim=-1).clamp(min=1)  # [B]
    seq_log_ratio = (log_ratio * mask).sum(dim=-1) / seq_len  # [B] log s_i

    # log s_i,t = sg[log s_i] + log_prob - sg[log_prob]: value s_i, gradient s_i * d log_prob.
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)  # [B, R]
    ratio = torch.exp(torch.clamp(token_log_ratio, max=GSPO_LOG_RATIO_MAX))

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, global_batch_num_tokens, global_batch_num_seqs)

    pg_clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).to(ratio.dtype), response_mask)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    pg_clipfrac_lower = torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """veRL's classic PPO loss entry point; equals ``vanilla`` with ``cliprange_low/high`` defaulting to ``cliprange``.

    Args:
        old_log_prob, log_prob, advantages, response_mask: ``[B, R]``.
        cliprange: symmetric clip epsilon, used for whichever side is not given.
        cliprange_low / cliprange_high: asymmetric clip epsilons.
        clip_ratio_c: dual-clip bound (> 1).
        loss_agg_mode: see ``agg_loss``.

    Returns:
        ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``.
    """
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    return compute_policy_loss_vanilla(
        old_log_prob, log_prob, advantages, response_mask,
        loss_agg_mode=loss_agg_mode, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=clip_ratio_c,
    )
