"""The checks of the supervised modes' configs (:class:`SFTConfig`, :class:`RMConfig`) and their run plan.

They start from what every mode shares (:mod:`hybrid_rl.trainer.config.run_checks`: devices, the
``trainer.*`` keys, data files) and add their own: the model folder, the batch against the
workers, the lengths; SFT also the engine of its held-out generations. Every problem is one line
naming the keys, their values and the fix, all reported together. The run folder and the resume point
are the runtime's (:mod:`hybrid_rl.trainer.core.runtime_checks`). The pieces offline DPO's checks
(:mod:`hybrid_rl.trainer.dpo.checks`) share with these are public here: the plan
(:func:`supervised_plan`), the batch against the workers (:func:`batch_share_problems`), the held-out
generations' engine (:func:`held_out_rollout_problems`) and the checks of a config built from theirs
(:func:`build_problem`: the worker config's, DPO's objective's).
"""

from __future__ import annotations

from typing import Any, Callable, Union

from hybrid_rl.trainer.config.run_checks import (RunPlan, check_data_files, check_devices, check_model_path,
                                                 check_trainer, file_problem, raise_problems,
                                                 worker_layout)
from hybrid_rl.trainer.config.supervised import RMConfig, SFTConfig, rm_critic_config, sft_actor_config
from hybrid_rl.utils.bounds import bound_problems

__all__ = ["batch_share_problems", "build_problem", "held_out_rollout_problems", "supervised_plan",
           "validate_rm_config", "validate_sft_config", "validate_supervised_config"]

TRUNCATIONS = ("error", "left", "right")


def supervised_plan(cfg: Any, *, use_reference_policy: bool = False) -> RunPlan:
    """One trained model per worker (with a frozen reference when ``use_reference_policy``): no critic,
    reward model or separate rollout pool."""
    device, world, threads = worker_layout(cfg)
    return RunPlan(device=device, world_size=world, use_critic=False, use_reference_policy=use_reference_policy,
                   threads_per_worker=threads, single_process=cfg.trainer.single_process is True)


def batch_share_problems(cfg: Any, share: str) -> list[str]:
    """``data.train_batch_size`` against the workers, each of which gets an equal ``share``
    (e.g. ``"a batch"``, ``"the pairs"``)."""
    d, t = cfg.data, cfg.trainer
    world = max(1, t.nnodes * t.n_gpus_per_node)
    if d.train_batch_size >= 1 and d.train_batch_size % world:  # >= 1: its declared bound
        return [f"data.train_batch_size={d.train_batch_size} must be a positive multiple of the {world} "
                f"workers (trainer.nnodes * trainer.n_gpus_per_node): each gets an equal share of {share}."]
    return []


def held_out_rollout_problems(cfg: Any, mode: str, more: str = "") -> list[str]:
    """The rollout section of a mode whose engine only answers the held-out prompts (``mode`` names
    it in the message, ``more`` ends its rollout.n advice): one sample, lengths from ``data.*``, the
    reward function's file."""
    d, rollout, errors = cfg.data, cfg.rollout, []
    if rollout.n != 1:
        errors.append(f"rollout.n={rollout.n}: {mode} samples no responses to train on (its engine only answers "
                      f"the held-out prompts); leave rollout.n=1 and set rollout.val_kwargs.n for more answers{more}.")
    for data_key, rollout_key in (("max_response_length", "response_length"), ("max_prompt_length", "prompt_length")):
        if getattr(d, data_key) != getattr(rollout, rollout_key):
            errors.append(f"rollout.{rollout_key}={getattr(rollout, rollout_key)} differs from data.{data_key}="
                          f"{getattr(d, data_key)}; set only data.{data_key} (rollout.{rollout_key} follows it).")
    path = cfg.custom_reward_function.path
    problem = None if path is None else file_problem("custom_reward_function.path", path,
                                                     "point it at a .py file or set it to null")
    return errors + ([problem] if problem else [])


def _check_data(cfg: Any, training: bool) -> list[str]:
    """Lengths always; with ``training`` the batch against the workers."""
    d = cfg.data
    errors = check_data_files(d)
    if d.truncation not in TRUNCATIONS:
        errors.append(f"data.truncation={d.truncation!r} must be one of {TRUNCATIONS} (error stops at the first "
                      "overlong conversation; left keeps its end, right its start).")
    return errors + (batch_share_problems(cfg, "a batch") if training else [])


def _common(cfg: Any, training: bool) -> list[str]:
    m = cfg.model
    errors = bound_problems(cfg) + check_devices(cfg) + check_trainer(cfg) + _check_data(cfg, training)
    errors += check_model_path("model.partial_pretrain", m.partial_pretrain, m.trust_remote_code)
    return errors


def build_problem(build: Callable[[Any], Any], cfg: Any) -> list[str]:
    """What ``build(cfg)`` refuses, as a list of its one message (``[]`` when it builds): the checks of a
    config built from ``cfg`` (a worker config's dtypes, LoRA, optimizer; an objective's settings),
    reported among the others."""
    try:
        build(cfg)
    except ValueError as error:
        return [str(error)]
    return []


def validate_sft_config(cfg: SFTConfig, *, training: bool = True) -> None:
    """Raise one ValueError listing every problem of an SFT config."""
    errors = _common(cfg, training)
    d = cfg.data
    if training and d.use_dynamic_bsz and 1 <= d.max_token_len_per_gpu < d.max_length:  # < 1: its bound
        errors.append(f"data.max_token_len_per_gpu={d.max_token_len_per_gpu} is smaller than one conversation of up "
                      f"to data.max_length={d.max_length} tokens; raise it to at least {d.max_length}.")
    errors += held_out_rollout_problems(cfg, "SFT", " per prompt")
    raise_problems(errors or build_problem(sft_actor_config, cfg))  # else a problem is told twice


def validate_rm_config(cfg: RMConfig, *, training: bool = True) -> None:
    """Raise one ValueError listing every problem of a reward-model config."""
    raise_problems(_common(cfg, training) or build_problem(rm_critic_config, cfg))


def validate_supervised_config(cfg: Union[SFTConfig, RMConfig], *, training: bool = True) -> None:
    """:func:`validate_sft_config` or :func:`validate_rm_config`, by the type of ``cfg``."""
    (validate_sft_config if isinstance(cfg, SFTConfig) else validate_rm_config)(cfg, training=training)
