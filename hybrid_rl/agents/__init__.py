"""Agents: tools, interactions and the multi-turn loop that rollout engines call (knows no engine).

>>> from hybrid_rl.agents import BaseTool, register_tool
>>> @register_tool("echo")
... class Echo(BaseTool):
...     def get_openai_tool_schema(self):
...         return {"type": "function", "function": {"name": "echo", "description": "echo",
...                 "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}
...     async def execute(self, instance_id, parameters, **kwargs):
...         return str(parameters.get("text", "")), 0.0, {}

Write the tool YAML (``class_name: echo``) and set ``actor_rollout_ref.rollout.multi_turn.enable=true``
and ``...multi_turn.tool_config_path=<yaml>``; docs/agents.md has the trajectory layout and masks.
"""

from hybrid_rl.agents.agent_loop import AgentLoopBase, AgentLoopOutput, register as register_agent_loop
from hybrid_rl.agents.calculator import CalculatorTool
from hybrid_rl.agents.code_tool import PythonExecTool  # registers python_exec
from hybrid_rl.agents.config import MultiTurnConfig
from hybrid_rl.agents.config_files import load_interactions, load_tools
from hybrid_rl.agents.env import BaseTextEnv, register_env, registered_envs
from hybrid_rl.agents.env_loop import EnvAgentLoop
from hybrid_rl.agents.guess_number import GuessNumberEnv
from hybrid_rl.agents.interaction import BaseInteraction, register_interaction, registered_interactions
from hybrid_rl.agents.loop import END_REASONS, AgentLoop, RowContext, Trajectory
from hybrid_rl.agents.parser import ToolCall, parse_hermes
from hybrid_rl.agents.schemas import OpenAIFunctionToolSchema, ToolResponse
from hybrid_rl.agents.tool import BaseTool, register_tool, registered_tools

__all__ = [
    "END_REASONS", "AgentLoop", "AgentLoopBase", "AgentLoopOutput", "BaseInteraction", "BaseTextEnv", "BaseTool",
    "CalculatorTool", "EnvAgentLoop", "GuessNumberEnv", "MultiTurnConfig", "OpenAIFunctionToolSchema", "RowContext",
    "PythonExecTool", "ToolCall", "ToolResponse", "Trajectory", "load_interactions", "load_tools", "parse_hermes",
    "register_agent_loop", "register_env", "register_interaction", "register_tool", "registered_envs",
    "registered_interactions", "registered_tools",
]
