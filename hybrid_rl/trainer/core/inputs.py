"""What a run reads, built from its config: tokenizer, datasets and the resumable loader, reward managers.

Each builder returns one component, so a mode (or a notebook) can replace one of them and keep the
rest. The builders take the pieces they use (:func:`load_model_tokenizer`, :func:`build_prompt_dataset`,
:func:`make_reward_manager`) or the sections every mode has (:class:`RunConfig`); a mode's own
sections are read in its package (PPO's: :mod:`hybrid_rl.trainer.ppo.inputs`). The worker groups are
:mod:`hybrid_rl.trainer.core.worker_groups`'; the model's size and compute dtype :mod:`hybrid_rl.trainer.core.model_facts`'.
"""

from __future__ import annotations

import logging

from typing import Any, Optional

from hybrid_rl.trainer.config import CustomRewardFunctionConfig
from hybrid_rl.trainer.config.run_checks import as_file_list
from hybrid_rl.trainer.core.run_config import RunConfig

logger = logging.getLogger(__name__)


def supervised_tokenizer(model: Any):
    """The tokenizer of a supervised mode's ``model.partial_pretrain`` (SFT, RM)."""
    return load_model_tokenizer(model.partial_pretrain, "model.partial_pretrain", model.trust_remote_code)


def load_model_tokenizer(path: str, key: str, trust_remote_code: bool = False):
    """The tokenizer of the model folder ``path`` (the embedded model's id is resolved; ``key``
    names the setting in a message when the folder is missing)."""
    from hybrid_rl.workers.model_loader import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path(path, key=key), trust_remote_code=trust_remote_code)


def resolve_data_files(cfg: RunConfig) -> tuple[list[str], list[str]]:
    """(train files, val files). Unset train files = the arithmetic task, generated on first use."""
    if cfg.data.train_files is None:
        from hybrid_rl.trainer.core.default_task import ensure_default_task

        train, test = ensure_default_task(cfg.data.arithmetic)
        return [train], [test]
    return as_file_list(cfg.data.train_files), as_file_list(cfg.data.val_files)


def build_prompt_dataset(files: list[str], tokenizer, *, prompt_key: str, max_prompt_length: int,
                         filter_overlong_prompts: bool = True, truncation: str = "error", return_raw_chat: bool = True,
                         tools: Optional[list[dict]] = None, bad_rows: str = "error", max_bad_fraction: float = 0.01):
    """An :class:`~hybrid_rl.data.RLHFDataset` of prompts (with data source and ground truth)."""
    from hybrid_rl.data import RLHFDataset

    return RLHFDataset(files, tokenizer, prompt_key=prompt_key, max_prompt_length=max_prompt_length,
                       filter_overlong_prompts=filter_overlong_prompts, truncation=truncation,
                       return_raw_chat=return_raw_chat, tools=tools, bad_rows=bad_rows,
                       max_bad_fraction=max_bad_fraction)


def build_train_dataloader(dataset, cfg: RunConfig):
    """Resumable loader: ``state_dict()`` goes into every checkpoint."""
    from hybrid_rl.data import build_dataloader

    if len(dataset) < cfg.data.train_batch_size:
        raise ValueError(
            f"the training set has {len(dataset)} prompts after filtering, fewer than data.train_batch_size="
            f"{cfg.data.train_batch_size}; lower the batch size or add data"
        )
    return build_dataloader(dataset, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.data.seed, drop_last=True)


def make_reward_manager(name: str, tokenizer, num_examine: int, custom: CustomRewardFunctionConfig, *,
                        reward_fn_key: str = "data_source", timeout_s: float = 10.0, tool_reward_weight: float = 0.0,
                        single_process: Optional[bool] = None, num_workers: int = 1):
    """The registered reward manager ``name`` around the custom (``custom.path``) or built-in scorer.

    It runs on the driver, so a scorer registered with ``@register_reward`` in the driver process
    (e.g. a notebook cell) is used as is.
    """
    from hybrid_rl.reward import get_reward_manager_cls, load_custom_reward_fn

    manager_cls = get_reward_manager_cls(name)
    compute_score = None
    if custom.path:
        compute_score = load_custom_reward_fn(custom.path, custom.name, batched=getattr(manager_cls, "batched", False))
    return manager_cls(tokenizer, num_examine=num_examine, compute_score=compute_score, reward_fn_key=reward_fn_key,
                       timeout_s=timeout_s, tool_reward_weight=tool_reward_weight,
                       avoid_fork=bool(single_process), num_workers=num_workers)  # avoid_fork: this process holds the models
