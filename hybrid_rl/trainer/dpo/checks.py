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
                                                 check_trainer, file_problem, raise_problems,
                                                 worker_layout)
from hybrid_rl.trainer.dpo.config import DPOConfig, dpo_actor_config, dpo_objective
from hybrid_rl.utils.bounds import bound_problems

__all__ = ["dpo_plan", "validate_dpo_config"]


def dpo_plan(cfg: DPOConfig) -> RunPlan:
    """One policy per worker, with the frozen reference when the loss reads it (not ``simpo`` or
    ``dpo.reference_free``); no critic, reward model or separate rollout pool."""
    device, world, threads = worker_layout(cfg)
    return RunPlan(device=device, world_size=world, use_critic=False,
                   use_reference_policy=dpo_objective(cfg).needs_reference, threads_per_worker=threads,
                   single_process=cfg.trainer.single_process is True)


def _objective_problem(cfg: DPOConfig) -> list[str]:
    try:
        dpo_objective(cfg)
    except ValueError as error:
        return [str(error)]
    return []


def _data_problems(cfg: DPOConfig, training: bool) -> list[str]:
    d, t = cfg.data, cfg.trainer
    errors = check_data_files(d) + dpo_problems(d.max_prompt_length, d.max_length, d.truncation)
    if not training:
        return errors
    world = max(1, t.nnodes * t.n_gpus_per_node)
    if d.train_batch_size >= 1 and d.train_batch_size % world:  # >= 1: its declared bound
        errors.append(f"data.train_batch_size={d.train_batch_size} must be a positive multiple of the {world} "
                      "workers (trainer.nnodes * trainer.n_gpus_per_node): each gets an equal share of the pairs.")
    if d.use_dynamic_bsz and 1 <= d.max_token_len_per_gpu < 2 * d.max_length:  # < 1: its bound
        errors.append(f"data.max_token_len_per_gpu={d.max_token_len_per_gpu} is smaller than one pair of up to 2 x "
                      f"data.max_length={d.max_length} tokens (its two rows train together); raise it to at least "
                      f"{2 * d.max_length}.")
    return errors


def _rollout_problems(cfg: DPOConfig) -> list[str]:
    d, rollout, errors = cfg.data, cfg.rollout, []
    if rollout.n != 1:
        errors.append(f"rollout.n={rollout.n}: offline DPO samples no responses to train on (its engine only answers "
                      "the held-out prompts); leave rollout.n=1 and set rollout.val_kwargs.n for more answers.")
    for data_key, rollout_key in (("max_response_length", "response_length"), ("max_prompt_length", "prompt_length")):
        if getattr(d, data_key) != getattr(rollout, rollout_key):
            errors.append(f"rollout.{rollout_key}={getattr(rollout, rollout_key)} differs from data.{data_key}="
                          f"{getattr(d, data_key)}; set only data.{data_key} (rollout.{rollout_key} follows it).")
    path = cfg.custom_reward_function.path
    problem = None if path is None else file_problem("custom_reward_function.path", path,
                                                     "point it at a .py file or set it to null")
    return errors + ([problem] if problem else [])


def _worker_config_problem(cfg: DPOConfig) -> list[str]:
    """The worker config's own checks (its dtypes, LoRA, optimizer), reported among the others."""
    try:
        dpo_actor_config(cfg)
    except ValueError as error:
        return [str(error)]
    return []


def validate_dpo_config(cfg: Any, *, training: bool = True) -> None:
    """Raise one ValueError listing every problem of a DPO config (``training=False``: the batch
    sizes are not checked)."""
    m = cfg.model
    errors = bound_problems(cfg) + check_devices(cfg) + check_trainer(cfg) + _objective_problem(cfg)
    errors += _data_problems(cfg, training) + _rollout_problems(cfg)
    errors += check_model_path("model.partial_pretrain", m.partial_pretrain, m.trust_remote_code)
    raise_problems(errors or _worker_config_problem(cfg))  # else a problem is told twice
