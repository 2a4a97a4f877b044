"""Carrying user-registered tools, interactions, agent loops and environments to the rollout workers.

``@register_tool`` / ``@register_interaction`` fill registries in the process that runs them (a
notebook, the driver script). The rollout runs in Ray worker processes, which only have the
built-ins and whatever their imports register. The trainer therefore sends a snapshot of both
registries with the worker's constructor arguments; Ray pickles classes defined in ``__main__`` or a
notebook by value, so the worker can rebuild them and register them again before its rollout starts.
"""

from __future__ import annotations

from hybrid_rl.agents import agent_loop, env, interaction, tool

__all__ = ["plugin_snapshot", "restore_plugins"]


def plugin_snapshot() -> dict[str, dict[str, type]]:
    """The registered tool and interaction classes by name."""
    return {"tools": tool._TOOLS.entries(), "interactions": interaction._INTERACTIONS.entries(),
            "agent_loops": agent_loop.agent_loop_snapshot(), "envs": env._ENVS.entries()}


def restore_plugins(snapshot: dict[str, dict[str, type]]) -> None:
    """Register every class of ``snapshot`` in this process (the same class again is a no-op)."""
    for name, cls in snapshot.get("tools", {}).items():
        tool.register_tool(name)(cls)
    for name, cls in snapshot.get("interactions", {}).items():
        interaction.register_interaction(name)(cls)
    agent_loop.restore_agent_loops(snapshot.get("agent_loops", {}))
    for name, cls in snapshot.get("envs", {}).items():
        env.register_env(name)(cls)
