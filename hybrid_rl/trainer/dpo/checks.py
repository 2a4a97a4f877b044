"""The checks of ``main_dpo``'s config (:class:`~hybrid_rl.trainer.dpo.config.DPOConfig`) and its run plan.

They start from what every mode shares (:mod:`hybrid_rl.trainer.config.run_checks`: devices, the
``trainer.*`` keys, data files, the model folder) and add DPO's own: the ``dpo.*`` settings
(the objective's own checks), the pair lengths (:func:`hybrid_rl.data.dpo_data.dpo_problems`), the
batch against the workers, the token budget against a pair, and the held-out generations' engine.
Every problem is one line naming the keys, their values and the fix, all reported together. The run
folder and the resume point are the runtime's (:mod:`hybrid_rl.trainer.core.runtime_checks`).
"""

from __future__ import annotations

from typing import Any

from hybrid_rl.data.dpo_data import dpo_problems
from hybrid_rl.trainer.config.run_checks import (RunPlan, check_data_files, check_devices, check_model_path,
                                                 check_trainer, raise_problems)
from hybrid_rl.trainer.config.supervised_checks import (batch_share_problems, build_problem,
                                                        held_out_rollout_problems, supervised_plan)
from hybrid_rl.trainer.dpo.config import DPOConfig, dpo_actor_config, dpo_objective
from hybrid_rl.utils.bounds import bound_problems

__all__ = ["dpo_plan", "validate_dpo_config"]


def dpo_plan(cfg: DPOConfig) -> RunPlan:
    """One policy per worker, with the frozen reference when the loss reads it (not ``simpo`` or
    ``dpo.reference_free``); no critic, reward model or separate rollout pool."""
    return supervised_plan(cfg, use_reference_policy=dpo_objective(cfg).needs_reference)


def _data_problems(cfg: DPOConfig, training: bool) -> list[str]:
    d = cfg.data
    errors = check_data_files(d) + dpo_problems(d.max_prompt_length, d.max_length, d.truncation)
    if not training:
        return errors
    errors += batch_share_problems(cfg, "the pairs")
    if d.use_dynamic_bsz and 1 <= d.max_token_len_per_gpu < 2 * d.max_length:  # < 1: its bound
        errors.append(f"data.max_token_len_per_gpu={d.max_token_len_per_gpu} is smaller than one pair of up to 2 x "
                      f"data.max_length={d.max_length} tokens (its two rows train together); raise it to at least "
                      f"{2 * d.max_length}.")
    return errors


def validate_dpo_config(cfg: Any, *, training: bool = True) -> None:
    """Raise one ValueError listing every problem of a DPO config (``training=False``: the batch
    sizes are not checked)."""
    m = cfg.model
    errors = bound_problems(cfg) + check_devices(cfg) + check_trainer(cfg) + build_problem(dpo_objective, cfg)
    errors += _data_problems(cfg, training) + held_out_rollout_problems(cfg, "offline DPO")
    errors += check_model_path("model.partial_pretrain", m.partial_pretrain, m.trust_remote_code)
    raise_problems(errors or build_problem(dpo_actor_config, cfg))  # else a problem is told twice
