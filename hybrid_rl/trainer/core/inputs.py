"""What a run reads, built from its config: tokenizer, datasets and the resumable loader, reward managers.

Each builder takes the typed :class:`PPOConfig` and returns one component, so a mode (or a notebook)
can replace one of them and keep the rest. The worker groups are :mod:`hybrid_rl.trainer.core.worker_groups`';
the model's size and compute dtype :mod:`hybrid_rl.trainer.core.model_facts`'.
"""

from __future__ import annotations

import logging

from hybrid_rl.trainer.config import PPOConfig
from hybrid_rl.trainer.config.checks import as_file_list

logger = logging.getLogger(__name__)

logger = logging.getLogger(__name__)


def build_tokenizer(cfg: PPOConfig):
    """The tokenizer of ``data.tokenizer`` or the actor model (the embedded model is resolved)."""
    from hybrid_rl.workers.model_loader import load_tokenizer, resolve_model_path

    model = cfg.actor_rollout_ref.model
    path = cfg.data.tokenizer or model.tokenizer_path or model.path
    key = "data.tokenizer" if cfg.data.tokenizer else "actor_rollout_ref.model.path"
    return load_tokenizer(resolve_model_path(path, key=key), trust_remote_code=model.trust_remote_code)


def resolve_data_files(cfg: PPOConfig) -> tuple[list[str], list[str]]:
    """(train files, val files). Unset train files = the arithmetic task, generated on first use."""
    if cfg.data.train_files is None:
        from hybrid_rl.trainer.core.default_task import ensure_default_task

        train, test = ensure_default_task(cfg.data.arithmetic)
        return [train], [test]
    return as_file_list(cfg.data.train_files), as_file_list(cfg.data.val_files)


def tool_schemas(cfg: PPOConfig) -> list[dict] | None:
    """The multi-turn tools' OpenAI schemas, rendered into the prompts by the chat template (as veRL's
    agent loop does: templates with tool support, e.g. Qwen2.5, list them in the system turn); None
    without tools."""
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    if not (multi_turn.enable and multi_turn.tool_config_path):
        return None
    from hybrid_rl.agents import load_tools

    return [tool.tool_schema for tool in load_tools(multi_turn.tool_config_path).values()]


def build_dataset(files: list[str], tokenizer, cfg: PPOConfig):
    from hybrid_rl.data import RLHFDataset

    data = cfg.data
    return RLHFDataset(
        files,
        tokenizer,
        prompt_key=data.prompt_key,
        max_prompt_length=data.max_prompt_length,
        filter_overlong_prompts=data.filter_overlong_prompts,
        truncation=data.truncation,
        return_raw_chat=data.return_raw_chat,
        tools=tool_schemas(cfg),
    )


def build_train_dataloader(dataset, cfg: PPOConfig):
    """Resumable loader: ``state_dict()`` goes into every checkpoint."""
    from hybrid_rl.data import build_dataloader

    if len(dataset) < cfg.data.train_batch_size:
        raise ValueError(
            f"the training set has {len(dataset)} prompts after filtering, fewer than data.train_batch_size="
            f"{cfg.data.train_batch_size}; lower the batch size or add data"
        )
    return build_dataloader(dataset, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.data.seed, drop_last=True)


def build_reward_manager(cfg: PPOConfig, tokenizer, num_examine: int):
    """The reward manager of ``reward_model.reward_manager`` around the custom or built-in scorer.

    It runs on the driver, so a scorer registered with ``@register_reward`` in the driver process
    (e.g. a notebook cell) is used as is.
    """
    from hybrid_rl.reward import get_reward_manager_cls, load_custom_reward_fn

    manager_cls = get_reward_manager_cls(cfg.reward_model.reward_manager)
    compute_score = None
    if cfg.custom_reward_function.path:
        compute_score = load_custom_reward_fn(
            cfg.custom_reward_function.path,
            cfg.custom_reward_function.name,
            batched=getattr(manager_cls, "batched", False),
        )
    return manager_cls(
        tokenizer,
        num_examine=num_examine,
        compute_score=compute_score,
        reward_fn_key=cfg.data.reward_fn_key,
        timeout_s=cfg.reward_model.timeout,
        tool_reward_weight=cfg.reward_model.tool_reward_weight,
        avoid_fork=bool(cfg.trainer.single_process),  # this process will hold the models
    )
