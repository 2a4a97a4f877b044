"""The calculator task's agent, written as a black-box harness with the official ``anthropic`` client
(it borrows hybrid_rl's exact-arithmetic evaluator only so that its tool answers as the in-process tool
does, and ``anthropic_client`` only to point an ``AsyncAnthropic`` at the row's base URL).

It sends the row's conversation to ``/v1/messages`` with the calculator as an Anthropic tool
definition (``name``, ``description``, ``input_schema``), runs every ``tool_use`` block of the reply
(exact arithmetic), sends the results back as ``tool_result`` blocks after the reply's own blocks,
and stops when the model answers without a tool call or after 3 model turns, as the agent of
``recipes/calculator_openai`` does. It returns None: the calculator scorer scores the trajectory (the
rows are ``reward_model.style: rule``), so the curves of the three calculator recipes compare.

The rows are chat messages (a system prompt, one solved demonstration, the question). The Messages
API has no ``system`` or ``tool`` role: the system text goes to ``system``, and the demonstration's
``tool`` turn becomes a user turn holding one ``tool_result`` block. The demonstration's assistant turn
stays text (its ``<tool_call>`` syntax is what the model is taught to write), so the prompt the model
sees is token for token the one of the openai recipe.
"""

from hybrid_rl.agents.anthropic_route import anthropic_client
from hybrid_rl.agents.calculator import evaluate  # the same exact arithmetic as the in-process tool

TOOLS = [{"name": "calculator",
          "description": "Evaluate an arithmetic expression exactly (+, -, *, /, //, %, **, parentheses).",
          "input_schema": {"type": "object", "required": ["expression"],
                           "properties": {"expression": {"type": "string", "description": "e.g. '317 * 46'"}}}}]
MAX_TURNS = 3
MAX_TOKENS = 1024  # the Messages API requires it; the row's response budget (data.max_response_length) caps it


def run_tool(block) -> str:
    if block.name != "calculator":
        return f"Error: unknown tool {block.name!r}; available: calculator"
    try:
        return evaluate(str(block.input.get("expression", "")))
    except Exception as exc:  # a bad expression is the model's mistake: tell it, as the tool loop does
        return f"Error when executing tool 'calculator': {exc}"


def to_messages_api(chat: list[dict]) -> tuple[str, list[dict]]:
    """(``system``, ``messages``) of a chat conversation: system text joined, each ``tool`` turn a user
    turn with one ``tool_result`` block (its id names the demonstration's call; ids are not rendered)."""
    system = "\n".join(m["content"] for m in chat if m["role"] == "system")
    messages = []
    for i, m in enumerate(chat):
        if m["role"] == "tool":
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_demo_{i}", "content": m["content"]}]})
        elif m["role"] != "system":
            messages.append({"role": m["role"], "content": m["content"]})
    return system, messages


async def solve(client, row):
    claude = anthropic_client(client)  # an anthropic.AsyncAnthropic on this row's base URL
    system, messages = to_messages_api(list(row["raw_prompt"]))
    try:
        for _ in range(MAX_TURNS):
            reply = await claude.messages.create(model="policy", max_tokens=MAX_TOKENS, system=system,
                                                 messages=messages, tools=TOOLS)
            if reply.stop_reason != "tool_use":  # an answer, or cut by the budget
                return None
            results = [{"type": "tool_result", "tool_use_id": block.id, "content": run_tool(block)}
                       for block in reply.content if block.type == "tool_use"]
            # the reply's blocks as returned: the next call continues this one's exact ids
            messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": results}]
    finally:
        await claude.close()
    return None
