"""Validation of chat messages and tool schemas before they reach a chat template.

Templates fail late and obscurely on malformed input (a missing key renders as an empty string), so
requests are checked up front and errors name the offending field, e.g.
"messages[2].role: unknown role 'bot'".
"""

from __future__ import annotations

from typing import Any

ROLES = ("system", "user", "assistant", "tool")


def _check_string(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a string, got {type(value).__name__}")


def _check_tool_calls(tool_calls: Any, where: str) -> None:
    if not isinstance(tool_calls, list):
        raise ValueError(f"{where}: expected a list, got {type(tool_calls).__name__}")
    for j, call in enumerate(tool_calls):
        at = f"{where}[{j}]"
        if not isinstance(call, dict):
            raise ValueError(f"{at}: expected a dict, got {type(call).__name__}")
        if call.get("id") is not None:
            _check_string(call["id"], f"{at}.id")
        function = call.get("function")
        if not isinstance(function, dict):
            raise ValueError(f"{at}.function: expected a dict with 'name' and 'arguments'")
        if "name" not in function:
            raise ValueError(f"{at}.function.name: missing")
        _check_string(function["name"], f"{at}.function.name")
        if not isinstance(function.get("arguments"), (str, dict)):
            raise ValueError(f"{at}.function.arguments: expected a JSON string or a dict")


def _check_message(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise ValueError(f"{where}: expected a dict, got {type(message).__name__}")
    # Drop None values as transformers does: APIs send `content: null` next to tool calls.
    message = {key: value for key, value in message.items() if value is not None}
    if "role" not in message:
        raise ValueError(f"{where}.role: missing")
    role = message["role"]
    if role not in ROLES:
        raise ValueError(f"{where}.role: unknown role {role!r}; expected one of {list(ROLES)}")
    has_tool_calls = role == "assistant" and "tool_calls" in message
    if "tool_calls" in message:
        if role != "assistant":
            raise ValueError(f"{where}.tool_calls: only assistant messages may carry tool calls")
        _check_tool_calls(message["tool_calls"], f"{where}.tool_calls")
    if "content" in message:
        _check_string(message["content"], f"{where}.content")
    elif not has_tool_calls:
        raise ValueError(f"{where}.content: missing")
    if "tool_call_id" in message:
        _check_string(message["tool_call_id"], f"{where}.tool_call_id")
    return message


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Check a conversation and return it in the form templates receive.

    Each message must be a dict with a `role` in ROLES and a string `content`; an assistant message
    may replace `content` with `tool_calls` (a list of {"id"?, "function": {"name", "arguments"}}),
    and a tool message may name the call it answers in `tool_call_id`. Keys whose value is None are
    dropped from the returned copies; the caller's dicts are not modified.

    Raises:
        ValueError: naming the index and field, e.g. "messages[2].role: unknown role 'bot'".
    """
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: expected a non-empty list of message dicts")
    return [_check_message(message, f"messages[{i}]") for i, message in enumerate(messages)]


def validate_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Check that `tools` is None or a list of JSON-schema dicts; return it unchanged.

    Raises:
        ValueError: naming the offending index, e.g. "tools[1]: expected a dict, got str".
    """
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ValueError(f"tools: expected a list of JSON schemas, got {type(tools).__name__}")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ValueError(f"tools[{i}]: expected a dict, got {type(tool).__name__}")
    return tools
