"""Rewards: rule-based scorers by ``data_source``, custom scorers, the guard, reward managers.

>>> from hybrid_rl.reward import default_compute_score
>>> default_compute_score("openai/gsm8k", "so the answer is #### 72", "72")
1.0

Add a scorer from a notebook with ``@register_reward("my_source")`` or from a file with
``load_custom_reward_fn(path, name)``; turn generated batches into ``token_level_scores`` with
``get_reward_manager_cls("naive")(tokenizer, num_examine=0)(data)``.
"""

from hybrid_rl.reward.guard import STATUSES, ScoreOutcome, normalize_score, safe_score, safe_score_many
from hybrid_rl.reward.manager import (
    BatchRewardManager,
    NaiveRewardManager,
    get_reward_manager_cls,
    register_reward_manager,
    registered_reward_managers,
)
from hybrid_rl.reward.registry import (
    MATH_DATA_SOURCES,
    check_data_sources,
    default_compute_score,
    default_compute_score_batched,
    get_reward_fn,
    load_custom_reward_fn,
    register_reward,
    registered_data_sources,
    unregister_reward,
)

__all__ = [
    "MATH_DATA_SOURCES",
    "STATUSES",
    "BatchRewardManager",
    "NaiveRewardManager",
    "ScoreOutcome",
    "check_data_sources",
    "default_compute_score",
    "default_compute_score_batched",
    "get_reward_fn",
    "get_reward_manager_cls",
    "load_custom_reward_fn",
    "normalize_score",
    "register_reward",
    "register_reward_manager",
    "registered_reward_managers",
    "registered_data_sources",
    "safe_score",
    "safe_score_many",
    "unregister_reward",
]
