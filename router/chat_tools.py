"""A chat's tools and tool-call turns (``Chat.tools``, ``ChatMessage.tool_calls``): checked, and turned
into the dicts the chat template reads (OpenAI's shapes: ``common/tokenizer/messages.py``)."""

import json

from common.limits import MAX_LABEL_CHARS, FieldError, check_count, check_text, utf8_bytes
from common.tool_calls import MAX_TOOLS, tool_name_problem
from proto.baton.v1 import generation_pb2

_MODE = generation_pb2.ToolChoice.Mode
_PARAMETERS_MAX_DEPTH = 64  # a JSON schema deeper than this is refused, not recursed into


def check_chat_tools(chat: generation_pb2.Chat) -> int:
    """Check a chat's tools, tool choice and tool-call turns; return the UTF-8 bytes they add to the
    client's text (descriptions, schemas, arguments). Raises FieldError naming the field
    (``chat.tools[1].name``, ``chat.tool_choice.function_name``, ``chat.messages[2].tool_calls[0].name``)."""
    check_count(len(chat.tools), "chat.tools", MAX_TOOLS, "tools")
    names: set[str] = set()
    size = 0
    for i, tool in enumerate(chat.tools):
        where = f"chat.tools[{i}]"
        problem = tool_name_problem(tool.name)
        if problem is not None:
            raise FieldError(f"{where}.name", problem)
        if tool.name in names:
            raise FieldError(f"{where}.name", f"{tool.name!r} is declared twice")
        names.add(tool.name)
        size += utf8_bytes(tool.description, f"{where}.description")
        size += utf8_bytes(tool.parameters, f"{where}.parameters")
        tool_parameters(tool, where)
    choice = chat.tool_choice
    if choice.mode not in _MODE.values():
        raise FieldError("chat.tool_choice.mode", f"unknown mode {choice.mode}")
    if choice.mode == _MODE.Value("MODE_FUNCTION"):
        if choice.function_name not in names:
            raise FieldError(
                "chat.tool_choice.function_name", f"{choice.function_name[:70]!r} is not one of chat.tools"
            )
    elif choice.function_name:
        raise FieldError("chat.tool_choice.function_name", "only with mode MODE_FUNCTION")
    if choice.mode == _MODE.Value("MODE_REQUIRED") and not chat.tools:
        raise FieldError("chat.tool_choice", "MODE_REQUIRED needs chat.tools")
    for i, message in enumerate(chat.messages):
        where = f"chat.messages[{i}]"
        check_text(message.tool_call_id, f"{where}.tool_call_id", MAX_LABEL_CHARS)
        check_text(message.name, f"{where}.name", MAX_LABEL_CHARS)
        if message.tool_calls and message.role != "assistant":
            raise FieldError(f"{where}.tool_calls", "only assistant messages carry tool calls")
        check_count(len(message.tool_calls), f"{where}.tool_calls", MAX_TOOLS, "calls")
        for j, call in enumerate(message.tool_calls):
            check_text(call.id, f"{where}.tool_calls[{j}].id", MAX_LABEL_CHARS)
            problem = tool_name_problem(call.name)
            if problem is not None:
                raise FieldError(f"{where}.tool_calls[{j}].name", problem)
            size += utf8_bytes(call.arguments, f"{where}.tool_calls[{j}].arguments")
    return size


def tool_parameters(tool: generation_pb2.Tool, where: str) -> dict:
    """A tool's ``parameters``: its JSON schema object (``{}`` when empty). Raises FieldError."""
    if not tool.parameters:
        return {}
    try:
        value = json.loads(tool.parameters)
    except (ValueError, RecursionError):
        raise FieldError(f"{where}.parameters", "must be a JSON object (a JSON schema)") from None
    if not isinstance(value, dict):
        raise FieldError(
            f"{where}.parameters", "must be a JSON object (a JSON schema), not an array or a value"
        )
    if _depth(value) > _PARAMETERS_MAX_DEPTH:
        raise FieldError(f"{where}.parameters", f"nested deeper than {_PARAMETERS_MAX_DEPTH} levels")
    return value


def template_parameters(chat: generation_pb2.Chat) -> dict[str, dict]:
    """Each declared tool's parameters schema by name (``{}``: none given). Raises FieldError."""
    return {tool.name: tool_parameters(tool, f"chat.tools[{i}]") for i, tool in enumerate(chat.tools)}


def template_messages(chat: generation_pb2.Chat) -> list[dict]:
    """The messages as the chat template reads them: ``tool_calls`` in OpenAI's shape, ``tool_call_id``."""
    messages = []
    for m in chat.messages:
        message = {"role": m.role, "content": m.content}
        if m.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id or None,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in m.tool_calls
            ]
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        if m.name:
            message["name"] = m.name
        messages.append(message)
    return messages


def template_tools(chat: generation_pb2.Chat) -> list[dict] | None:
    """The tools as OpenAI declares them (``{"type": "function", "function": {...}}``), None without any."""
    if not chat.tools:
        return None
    tools = []
    for i, tool in enumerate(chat.tools):
        function = {"name": tool.name}
        if tool.description:
            function["description"] = tool.description
        function["parameters"] = tool_parameters(tool, f"chat.tools[{i}]")
        tools.append({"type": "function", "function": function})
    return tools


def _depth(value, level: int = 1) -> int:
    """Nesting depth of a parsed JSON value, iteratively (no recursion limit to hit)."""
    deepest, stack = 0, [(value, level)]
    while stack:
        item, at = stack.pop()
        deepest = max(deepest, at)
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, at + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
