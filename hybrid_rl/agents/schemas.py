"""The objects a tool sees and returns, shaped like veRL's ``verl/tools/schemas.py``.

A tool written for veRL reads its schema with attribute access (``self.tool_schema.function.name``)
and dumps it with ``model_dump(exclude_unset=True, exclude_none=True)``; it returns a
``ToolResponse(text=..., image=..., video=...)``. These pydantic models give the same attribute names
and methods, so such a tool runs with its imports pointed here. They accept any JSON schema a chat
template takes (nested ``items``, ``enum``, ``anyOf``: extra keys are kept), where veRL's models drop
keys they do not name.

:func:`chat_tool` turns a tool as the Anthropic Messages API (``name``, ``description``,
``input_schema``) or the OpenAI Responses API (``type: function``, ``name``, ``parameters``) declares
it into the chat-completions form the chat template's ``tools=`` takes.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["OpenAIFunctionParametersSchema", "OpenAIFunctionPropertySchema", "OpenAIFunctionSchema",
           "OpenAIFunctionToolSchema", "ToolResponse", "as_tool_schema", "chat_tool", "schema_dict"]


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter: ``type``, ``description``, ``enum`` (other JSON-schema keys are kept as extras)."""

    model_config = ConfigDict(extra="allow")
    type: Optional[Any] = None
    description: Optional[str] = None
    enum: Optional[list[Any]] = None


class OpenAIFunctionParametersSchema(BaseModel):
    """The parameters object: ``{"type": "object", "properties": {...}, "required": [...]}``."""

    model_config = ConfigDict(extra="allow")
    type: str = "object"
    properties: dict[str, OpenAIFunctionPropertySchema] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(BaseModel):
    """The function: ``name``, ``description``, ``parameters`` (and ``strict``)."""

    model_config = ConfigDict(extra="allow")
    name: str
    description: str = ""
    parameters: OpenAIFunctionParametersSchema = Field(default_factory=OpenAIFunctionParametersSchema)
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """A tool in OpenAI's function-calling format: ``{"type": "function", "function": {...}}``."""

    model_config = ConfigDict(extra="allow")
    type: str = "function"
    function: OpenAIFunctionSchema


class ToolResponse(BaseModel):
    """What a tool returns to the model. hybrid_rl's rollout is text-only: a response with ``image``
    or ``video`` becomes an error observation that says so."""

    text: Optional[str] = None
    image: Optional[list[Any]] = None
    video: Optional[list[Any]] = None

    def is_empty(self) -> bool:
        """No text, image or video."""
        return not self.text and not self.image and not self.video

    def is_text_only(self) -> bool:
        """Text and nothing else."""
        return bool(self.text) and not self.image and not self.video


_FIX = ("Fix: write it as {type: function, function: {name: ..., description: ..., parameters: "
        "{type: object, properties: {...}, required: [...]}}} (OpenAI function-calling schema)")


def as_tool_schema(schema: Any, where: str) -> OpenAIFunctionToolSchema:
    """A schema given as a mapping, one of these models or another pydantic model with the same fields
    (veRL's), validated into :class:`OpenAIFunctionToolSchema`; ValueError naming ``where`` otherwise."""
    if isinstance(schema, OpenAIFunctionToolSchema):
        return schema
    if hasattr(schema, "model_dump"):
        schema = schema.model_dump(exclude_none=True)
    if not isinstance(schema, dict) or schema.get("type") != "function" or not isinstance(schema.get("function"), dict):
        raise ValueError(f"{where}: the tool schema must be a mapping with type 'function' and a 'function' "
                         f"mapping, got {schema!r:.200}. {_FIX}.")
    name = schema["function"].get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: the tool schema has no function.name. {_FIX}.")
    try:
        parsed = OpenAIFunctionToolSchema.model_validate(schema)
    except ValidationError as exc:
        problem = exc.errors()[0]
        at = ".".join(str(p) for p in problem.get("loc", ()))
        raise ValueError(f"{where}: tool {name!r} schema field {at or '?'}: {problem.get('msg')}. {_FIX}.") from None
    if parsed.function.parameters.type != "object":
        raise ValueError(f"{where}: function.parameters of tool {name!r} must be a JSON-schema object, got type "
                         f"{parsed.function.parameters.type!r}. {_FIX}.")
    return parsed


def schema_dict(schema: Any) -> dict[str, Any]:
    """The plain mapping a chat template's ``tools=`` takes (veRL's
    ``model_dump(exclude_unset=True, exclude_none=True)``)."""
    if isinstance(schema, dict):
        return schema
    return schema.model_dump(exclude_unset=True, exclude_none=True)


_ROUTE_TOOL = {
    "anthropic": ("input_schema", "custom", "a client tool {name, description, input_schema}"),
    "responses": ("parameters", "function", "a function tool {type: function, name, description, parameters}"),
}


def chat_tool(tool: Any, api: str, where: str) -> dict[str, Any]:
    """The chat-completions tool (``{type: function, function: {...}}``) of a tool declared in the
    ``anthropic`` or ``responses`` API's form; ValueError naming ``where`` when it is not a client
    function tool (server tools such as web search run at the provider, not here)."""
    schema_key, kind, shape = _ROUTE_TOOL[api]
    if not isinstance(tool, dict):
        raise ValueError(f"{where} must be a tool object, got {type(tool).__name__}. Fix: send {shape}.")
    declared = tool.get("type") or kind  # Anthropic's client tools may leave type out
    if declared != kind:
        raise ValueError(f"{where}.type={declared!r} is not supported: hybrid_rl serves client tools only, which "
                         f"the agent runs itself. Fix: send {shape}.")
    function = {"name": tool.get("name"), "description": tool.get("description") or "",
                "parameters": tool.get(schema_key) if tool.get(schema_key) is not None else {"type": "object"}}
    return schema_dict(as_tool_schema({"type": "function", "function": function}, where))
