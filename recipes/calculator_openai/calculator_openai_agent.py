"""The calculator task's agent, written as a black-box agent: plain OpenAI client code (it borrows
hybrid_rl's exact-arithmetic evaluator only so that its tool answers as the in-process tool does).

It sends the row's conversation to the model with the calculator's schema as ``tools``, runs every
tool call the model makes (exact arithmetic), sends the results back as ``tool`` messages, and stops
when the model answers without a tool call or after 3 model turns, as the in-process tool loop of
``recipes/calculator_agent`` does. It returns None: the reward function scores the trajectory (the
calculator scorer, the same as the in-process recipe's), so the two curves compare.
"""

import json

from hybrid_rl.agents.calculator import evaluate  # the same exact arithmetic as the in-process tool

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression exactly (+, -, *, /, //, %, **, parentheses).",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. '317 * 46'"}},
                   "required": ["expression"]}}}]
MAX_TURNS = 3


def run_tool(call) -> str:
    if call.function.name != "calculator":
        return f"Error: unknown tool {call.function.name!r}; available: calculator"
    try:
        return evaluate(str(json.loads(call.function.arguments).get("expression", "")))
    except Exception as exc:  # a bad expression is the model's mistake: tell it, as the tool loop does
        return f"Error when executing tool 'calculator': {exc}"


async def solve(client, row):
    messages = list(row["raw_prompt"])
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        if not message.tool_calls or reply.choices[0].finish_reason == "length":
            return None
        messages.append(message.model_dump(exclude_none=True))
        messages += [{"role": "tool", "content": run_tool(call), "tool_call_id": call.id} for call in message.tool_calls]
    return None
