"""What a PPO-family run reads, built from its :class:`PPOConfig`: the tokenizer, the prompt datasets
(with the multi-turn tools' schemas), the reward managers and the compute dtypes of the models it
builds (``main_ppo``, ``eval``, ``debug``). The generic builders they call are
:mod:`hybrid_rl.trainer.core.inputs`' and :mod:`hybrid_rl.trainer.core.model_facts`'."""

from __future__ import annotations

from hybrid_rl.trainer.config import PPOConfig
from hybrid_rl.trainer.config.run_checks import RunPlan
from hybrid_rl.trainer.core.inputs import build_prompt_dataset, load_model_tokenizer, make_reward_manager


def build_tokenizer(cfg: PPOConfig):
    """The tokenizer of ``data.tokenizer`` or the actor model (the embedded model is resolved)."""
    model = cfg.actor_rollout_ref.model
    path = cfg.data.tokenizer or model.tokenizer_path or model.path
    key = "data.tokenizer" if cfg.data.tokenizer else "actor_rollout_ref.model.path"
    return load_model_tokenizer(path, key, model.trust_remote_code)


def tool_schemas(cfg: PPOConfig) -> list[dict] | None:
    """The multi-turn tools' OpenAI schemas, rendered into the prompts by the chat template (as veRL's
    agent loop does: templates with tool support, e.g. Qwen2.5, list them in the system turn); None
    without tools."""
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    if not (multi_turn.enable and multi_turn.tool_config_path):
        return None
    from hybrid_rl.agents import load_tools
    from hybrid_rl.agents.tool import tool_schema_dict

    return [tool_schema_dict(tool) for tool in load_tools(multi_turn.tool_config_path).values()]


def build_dataset(files: list[str], tokenizer, cfg: PPOConfig):
    """The prompt dataset of ``files`` as ``data.*`` describes it."""
    data = cfg.data
    return build_prompt_dataset(files, tokenizer, prompt_key=data.prompt_key, max_prompt_length=data.max_prompt_length,
                                filter_overlong_prompts=data.filter_overlong_prompts, truncation=data.truncation,
                                return_raw_chat=data.return_raw_chat, tools=tool_schemas(cfg), bad_rows=data.bad_rows,
                                max_bad_fraction=data.max_bad_fraction)


def build_reward_manager(cfg: PPOConfig, tokenizer, num_examine: int):
    """The reward manager of ``reward_model.reward_manager`` around the custom or built-in scorer."""
    rm = cfg.reward_model
    return make_reward_manager(rm.reward_manager, tokenizer, num_examine, cfg.custom_reward_function,
                               reward_fn_key=cfg.data.reward_fn_key, timeout_s=rm.timeout,
                               tool_reward_weight=rm.tool_reward_weight, single_process=cfg.trainer.single_process,
                               num_workers=rm.num_workers)


def compute_dtype_fields(cfg: PPOConfig, plan: RunPlan) -> dict[str, str]:
    """The compute-dtype keys of the models this run builds, with their configured values (the
    actor's first: :func:`~hybrid_rl.trainer.core.model_facts.report_precision` resolves it)."""
    arr = cfg.actor_rollout_ref
    fields = {"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype":
              arr.actor.fsdp_config.mixed_precision.param_dtype,
              "actor_rollout_ref.rollout.dtype": arr.rollout.dtype}
    if plan.use_reference_policy:
        fields["actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype"] = \
            arr.ref.fsdp_config.mixed_precision.param_dtype
    if plan.use_critic:
        fields["critic.model.fsdp_config.mixed_precision.param_dtype"] = \
            cfg.critic.model.fsdp_config.mixed_precision.param_dtype
    if plan.use_reward_model:
        fields["reward_model.model.fsdp_config.mixed_precision.param_dtype"] = \
            cfg.reward_model.model.fsdp_config.mixed_precision.param_dtype
    return fields
