"""``Gsm8kTool``: veRL's GSM8K answer-checking tool, written against veRL's tool interface.

This is the tool veRL's ``examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml`` names
(``class_name: verl.tools.gsm8k_tool.Gsm8kTool``); without the ``verl`` package installed that path
resolves here (:data:`hybrid_rl.agents.tool.VERL_ALIASES`), so veRL's YAML runs unchanged. It is also
the worked example of a veRL-style tool: it reads its schema by attribute, takes the ground truth as
``ground_truth=`` or from veRL's ``create_kwargs=``, and returns a :class:`ToolResponse`.

The model submits an answer (``{"answer": "72"}``); the tool scores it against the row's ground truth
with the GSM8K scorer (flexible extraction, 1.0 right, 0.0 otherwise), tells the model what it parsed
and what it scored, and gives a step reward of -0.05 when a submission does not improve on the
previous one (veRL's penalty for resubmitting). ``calc_reward`` is the last submission's score.
"""

from __future__ import annotations

import uuid
from typing import Any, Optional

from hybrid_rl.agents.schemas import OpenAIFunctionToolSchema, ToolResponse
from hybrid_rl.agents.tool import BaseTool
from hybrid_rl.reward.scorers import gsm8k

__all__ = ["Gsm8kTool"]

NO_IMPROVEMENT_PENALTY = -0.05
"""Step reward of a submission that scores no higher than the previous one."""


class Gsm8kTool(BaseTool):
    """Checks a GSM8K answer; one instance per trajectory holds its ground truth and best score so far."""

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema]):
        super().__init__(config, tool_schema)
        self._instances: dict[str, dict[str, Any]] = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.model_validate({
            "type": "function",
            "function": {
                "name": "calc_gsm8k_reward",
                "description": "Check an answer to the GSM8K question: 1.0 if it is right, 0.0 otherwise.",
                "parameters": {"type": "object", "required": ["answer"],
                               "properties": {"answer": {"type": "string", "description": "The answer, digits only"}}},
            },
        })

    async def create(self, instance_id: Optional[str] = None, ground_truth: Optional[str] = None,
                     **kwargs: Any) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid.uuid4())
        if ground_truth is None:
            ground_truth = (kwargs.get("create_kwargs") or {}).get("ground_truth")
        self._instances[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any],
                      **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        answer = str(parameters.get("answer", ""))
        state = self._instances[instance_id]
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = await self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed answer={answer!r} reward={reward}"), step_reward, {"correct": reward}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        state = self._instances[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return gsm8k.compute_score(state["response"], state["ground_truth"], method="flexible", format_score=0.0,
                                   score=1.0)

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)
