"""A chat's ``Chat`` message from OpenAI-shaped dicts: messages (with an assistant turn's
``tool_calls`` and a tool turn's ``tool_call_id``), ``tools`` and ``tool_choice``.

Only type and shape are checked; names, schemas and limits are the server's to validate (it answers
INVALID_ARGUMENT naming ``chat.tools[i].name`` and the like). A bad argument raises ``InvalidRequest``.
"""

import json
from collections.abc import Iterable, Mapping

from proto.baton.v1 import generation_pb2

from .errors import InvalidRequest

_MODES = {"auto": "MODE_AUTO", "none": "MODE_NONE", "required": "MODE_REQUIRED"}


def chat_pb(
    messages, *, add_generation_prompt: bool, tools=None, tool_choice="auto", parallel_tool_calls: bool = True
) -> generation_pb2.Chat:
    """The ``Chat`` of ``messages`` and ``tools`` (OpenAI's ``{"type": "function", "function": {"name",
    "description", "parameters"}}``, or the inner dict alone). ``tool_choice``: ``"auto"``, ``"none"``,
    ``"required"`` or ``{"type": "function", "function": {"name": ...}}``; ``parallel_tool_calls``
    False: only the first parsed call comes back."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        raise InvalidRequest(
            f"messages: expected a list of {{'role', 'content'}} dicts, got {_kind(messages)}"
        )
    chat = generation_pb2.Chat(add_generation_prompt=add_generation_prompt)
    for position, message in enumerate(messages):
        _message(chat.messages.add(), message, f"messages[{position}]")
    for position, tool in enumerate(_list("tools", tools)):
        _tool(chat.tools.add(), tool, f"tools[{position}]")
    _tool_choice(chat.tool_choice, tool_choice)
    if not isinstance(parallel_tool_calls, bool):
        raise InvalidRequest(f"parallel_tool_calls: expected a bool, got {_kind(parallel_tool_calls)}")
    chat.single_tool_call = not parallel_tool_calls
    return chat


def _message(out: generation_pb2.ChatMessage, message, where: str) -> None:
    calls = message.get("tool_calls") if isinstance(message, Mapping) else None
    if not isinstance(message, Mapping) or "role" not in message or ("content" not in message and not calls):
        raise InvalidRequest(f"{where}: expected a dict with 'role' and 'content' (or 'tool_calls')")
    content = message.get("content")
    if not isinstance(message["role"], str) or not isinstance(content if content is not None else "", str):
        raise InvalidRequest(f"{where}: 'role' and 'content' must be strings")
    out.role, out.content = message["role"], content or ""
    for key in ("tool_call_id", "name"):
        value = message.get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidRequest(f"{where}.{key}: expected a string, got {_kind(value)}")
        setattr(out, key, value or "")
    for j, call in enumerate(_list(f"{where}.tool_calls", calls)):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"{at}: expected {{'id', 'function': {{'name', 'arguments'}}}}")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, Mapping):
            arguments = json.dumps(dict(arguments), ensure_ascii=False)
        if not isinstance(arguments, str) or not isinstance(call.get("id", ""), str):
            raise InvalidRequest(f"{at}: 'id' and 'function.arguments' must be strings")
        out.tool_calls.add(id=call.get("id", ""), name=function["name"], arguments=arguments)


def _tool(out: generation_pb2.Tool, tool, where: str) -> None:
    function = tool.get("function", tool) if isinstance(tool, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise InvalidRequest(f"{where}: expected {{'type': 'function', 'function': {{'name', ...}}}}")
    description, parameters = function.get("description", ""), function.get("parameters")
    if not isinstance(description, str):
        raise InvalidRequest(f"{where}.description: expected a string, got {_kind(description)}")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise InvalidRequest(f"{where}.parameters: expected a JSON schema dict, got {_kind(parameters)}")
    out.name, out.description = function["name"], description
    out.parameters = "" if parameters is None else json.dumps(dict(parameters), ensure_ascii=False)


def _tool_choice(out: generation_pb2.ToolChoice, choice) -> None:
    if isinstance(choice, str) and choice in _MODES:
        out.mode = generation_pb2.ToolChoice.Mode.Value(_MODES[choice])
        return
    function = choice.get("function") if isinstance(choice, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise InvalidRequest(
            "tool_choice: expected 'auto', 'none', 'required' "
            "or {'type': 'function', 'function': {'name': ...}}"
        )
    out.mode, out.function_name = generation_pb2.ToolChoice.MODE_FUNCTION, function["name"]


def _list(name: str, value) -> list:
    if value is None:
        return []
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise InvalidRequest(f"{name}: expected a list, got {_kind(value)}")
    return list(value)


def _kind(value) -> str:
    return type(value).__name__
