"""Pure tensor math of RL post-training: advantage estimators, losses, KL, log-probs.

No config objects, no DataProto, no collectives: every function takes tensors (``[batch,
response_len]`` unless stated) and returns tensors. Names and semantics follow veRL's
``core_algos`` / ``torch_functional`` so ported code reads the same.
"""

from hybrid_rl.algorithms.advantage import (
    ADV_ESTIMATOR_INPUTS,
    AdvEstimatorInfo,
    adv_estimator_info,
    compute_advantage,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    describe_adv_estimators,
    get_adv_estimator_fn,
    group_ids,
    group_mean_std,
    register_adv_est,
    registered_adv_estimators,
    unregister_adv_est,
)
from hybrid_rl.algorithms.kl import (
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    compute_rewards,
    get_kl_controller,
    kl_penalty,
)
from hybrid_rl.algorithms.logits import entropy_from_logits, logprobs_and_entropy_from_logits, logprobs_from_logits
from hybrid_rl.algorithms.loss_agg import LOSS_AGG_MODES, agg_loss, global_batch_denominators
from hybrid_rl.algorithms.masked import masked_mean, masked_sum, masked_var, masked_whiten
from hybrid_rl.algorithms.policy_loss import (
    PolicyLossInfo,
    behaviour_weight_stats,
    compute_policy_loss,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
    describe_policy_losses,
    get_policy_loss_fn,
    policy_loss_info,
    register_policy_loss,
    registered_policy_losses,
    unregister_policy_loss,
)
from hybrid_rl.algorithms import advantage_variants, policy_loss_variants  # noqa: F401  (register veRL's others)
from hybrid_rl.algorithms.preference_loss import DPO_LOSS_TYPES, dpo_loss, dpo_metrics, sequence_log_probs
from hybrid_rl.algorithms.reward_loss import bradley_terry_loss, preference_metrics
from hybrid_rl.algorithms.value_loss import compute_value_loss

__all__ = [
    "ADV_ESTIMATOR_INPUTS",
    "DPO_LOSS_TYPES",
    "dpo_loss",
    "dpo_metrics",
    "sequence_log_probs",
    "KL_PENALTY_TYPES",
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "AdvEstimatorInfo",
    "PolicyLossInfo",
    "adv_estimator_info",
    "describe_adv_estimators",
    "describe_policy_losses",
    "policy_loss_info",
    "unregister_adv_est",
    "unregister_policy_loss",
    "FixedKLController",
    "agg_loss",
    "compute_advantage",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "behaviour_weight_stats",
    "bradley_terry_loss",
    "compute_policy_loss",
    "compute_policy_loss_gspo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_value_loss",
    "entropy_from_logits",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "global_batch_denominators",
    "group_ids",
    "group_mean_std",
    "kl_penalty",
    "logprobs_and_entropy_from_logits",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "register_adv_est",
    "preference_metrics",
    "register_policy_loss",
    "registered_adv_estimators",
    "registered_policy_losses",
]
