"""Driver-side checks that need the built components (datasets, reward registry), run before Ray starts.

:func:`hybrid_rl.trainer.config.checks.validate_config` checks the config alone; the checks here look at
what the config produced, so a mistake that would otherwise surface only at the first reward
computation (after the workers loaded their models) fails in a second, with one line naming the
file and the fix.
"""

from __future__ import annotations

from typing import Any, Iterable

from hybrid_rl.trainer.config import PPOConfig

__all__ = ["check_agent_config", "check_agent_names", "check_experience_buffer", "check_reward_coverage"]


def check_experience_buffer(cfg: PPOConfig, run_dir: str) -> None:
    """With the decoupled mode's sql buffer: connect to its database, create or verify the table and
    check that this user can write it (:func:`hybrid_rl.buffer.check.open_checked`), so that a wrong
    URL, password or permission is one line naming ``async_training.buffer.path`` before Ray and the
    workers start, not a traceback after them."""
    a = cfg.async_training
    if not a.enable or a.buffer.storage_type != "sql":
        return
    from hybrid_rl.buffer import sql_location
    from hybrid_rl.buffer.check import open_checked

    open_checked(*sql_location(a.buffer, run_dir, cfg.trainer.experiment_name)).close()


def check_agent_config(cfg: PPOConfig, tokenizer: Any) -> None:
    """Load the agent-loop YAML (its classes import) and check the default loop's name; with
    ``rollout.multi_turn.enable``: build the tools and interactions (their YAML, classes and schemas) and
    check that the tokenizer's chat template can render observation turns. Here in the driver, so a
    mistake is one line before any worker starts."""
    rollout = cfg.actor_rollout_ref.rollout
    multi_turn, agent = rollout.multi_turn, rollout.agent
    if agent.agent_loop_config_path:
        from hybrid_rl.agents.agent_loop import DictConfigWrap, check_agent_loops, load_agent_loop_config
        from hybrid_rl.workers.rollout.multi_turn import rollout_config_tree

        loops = load_agent_loop_config(agent.agent_loop_config_path)
        check_agent_loops(loops, DictConfigWrap(rollout_config_tree(rollout)), tokenizer)
    if agent.default_agent_loop:
        from hybrid_rl.workers.rollout.multi_turn import check_agent_name

        check_agent_name(agent.default_agent_loop, "actor_rollout_ref.rollout.agent.default_agent_loop")
    if not multi_turn.enable:
        return
    from hybrid_rl.agents import load_interactions, load_tools
    from hybrid_rl.agents.chat import ObservationEncoder

    tools = load_tools(multi_turn.tool_config_path) if multi_turn.tool_config_path else {}
    interactions = load_interactions(multi_turn.interaction_config_path) if multi_turn.interaction_config_path else {}
    encoder = ObservationEncoder(tokenizer, getattr(tokenizer, "eos_token", None) or "")
    encoder.check_roles((["tool"] if tools else []) + (["user"] if interactions else []))


def check_agent_names(cfg: PPOConfig, *datasets: Any) -> None:
    """With agent loops on: every ``agent_name`` of the datasets names a built-in or registered loop
    (one line naming the file and the known names), before any worker starts."""
    from hybrid_rl.agents.config import agent_rollout_enabled

    if not agent_rollout_enabled(cfg.actor_rollout_ref.rollout):
        return
    from hybrid_rl.workers.rollout.multi_turn import check_agent_name

    for dataset, where in zip(datasets, _describe_files(cfg)):
        for name in getattr(dataset, "agent_names", lambda: [])():
            try:
                check_agent_name(name, "agent_name")
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from None


def check_reward_coverage(cfg: PPOConfig, *datasets: Any) -> None:
    """Raise ValueError if a dataset holds a ``data_source`` that no scorer handles.

    A custom reward function (``custom_reward_function.path``) scores every source, so nothing is
    checked then; nor for datasets that cannot list their sources (not an ``RLHFDataset``).
    """
    from hybrid_rl.reward import check_data_sources

    if cfg.custom_reward_function.path or cfg.data.reward_fn_key != "data_source":
        return
    for dataset, where in zip(datasets, _describe_files(cfg)):
        if not hasattr(dataset, "data_sources"):
            continue
        sources = dataset.data_sources(scored_only=True)
        try:
            check_data_sources(sources)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None


def _describe_files(cfg: PPOConfig) -> Iterable[str]:
    if cfg.data.train_files is None:
        return ("the built-in arithmetic training set", "the built-in arithmetic test set")
    return (f"data.train_files={cfg.data.train_files!r}", f"data.val_files={cfg.data.val_files!r}")
