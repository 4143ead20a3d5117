"""The tool-calling fields of a chat body (``tools``, ``tool_choice``, an assistant message's
``tool_calls``), checked into frozen dataclasses; ``RequestError`` names the field."""

import json
from dataclasses import dataclass
from typing import Any

from common.limits import MAX_PROMPT_BYTES
from common.tool_calls import MAX_TOOLS, ToolCall, tool_name_problem

from . import fields
from .fields import RequestError


@dataclass(frozen=True)
class Tool:
    """A declared function: ``parameters`` its JSON schema, as JSON text."""

    name: str
    description: str
    parameters: str


def tools(value: Any) -> tuple[Tool, ...]:
    """OpenAI's ``tools``: at most ``MAX_TOOLS`` functions with valid, distinct names and object schemas."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise RequestError("tools", f"tools: must be a list of tools, got {fields.quote(value)}")
    if len(value) > MAX_TOOLS:
        raise RequestError("tools", f"tools: {len(value)} tools, more than the limit of {MAX_TOOLS}")
    tools: list[Tool] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise RequestError(f"{where}.type", f"{where}.type: only 'function' tools are supported")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise RequestError(f"{where}.function", f"{where}.function: must be an object with a name")
        name = function.get("name")
        problem = tool_name_problem(name)
        if problem is not None:
            raise RequestError(f"{where}.function.name", f"{where}.function.name: {problem}")
        if any(t.name == name for t in tools):
            raise RequestError(f"{where}.function.name", f"{where}.function.name: {name!r} is declared twice")
        description = fields.string(function, "description", "", MAX_PROMPT_BYTES)
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise RequestError(
                f"{where}.function.parameters", f"{where}.function.parameters: must be a JSON schema object"
            )
        text = "" if parameters is None else json.dumps(parameters, ensure_ascii=False)
        tools.append(
            Tool(name, description, fields.text(text, f"{where}.function.parameters", MAX_PROMPT_BYTES))
        )
    return tuple(tools)


def tool_choice(value: Any, tools: tuple[Tool, ...]) -> tuple[str, bool]:
    """``tool_choice`` as (mode or function name, whether it names a function)."""
    if value is None or value == "auto" or value == "none":
        return value or "auto", False
    if value == "required":
        if not tools:
            raise RequestError("tool_choice", "tool_choice: 'required' needs tools")
        return value, False
    function = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise RequestError(
            "tool_choice",
            "tool_choice: must be 'auto', 'none', 'required' or "
            f"{{'type': 'function', 'function': {{'name': ...}}}}, got {fields.quote(value)}",
        )
    if not any(t.name == name for t in tools):
        raise RequestError("tool_choice", f"tool_choice: function {name[:70]!r} is not one of tools")
    return name, True


def tool_calls(value: Any, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls``: ``{"id", "type": "function", "function": {"name",
    "arguments"}}``."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise RequestError(where, f"{where}: must be a list of at most {MAX_TOOLS} tool calls")
    calls = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise RequestError(at, f"{at}: must be an object with a function")
        problem = tool_name_problem(function.get("name"))
        if problem is not None:
            raise RequestError(f"{at}.function.name", f"{at}.function.name: {problem}")
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # some clients send the object itself
            arguments = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(arguments, str):
            raise RequestError(f"{at}.function.arguments", f"{at}.function.arguments: must be a JSON string")
        call_id = fields.string(call, "id")
        calls.append(
            ToolCall(
                call_id,
                function["name"],
                fields.text(arguments, f"{at}.function.arguments", MAX_PROMPT_BYTES),
            )
        )
    return tuple(calls)
