"""The tools a chat declares: the limits and name rule both fronts check (gRPC and OpenAI)."""

import re

MAX_TOOLS = 128  # tools in one request, as OpenAI allows
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def tool_name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid function name (OpenAI's ``[a-zA-Z0-9_-]{1,64}``), or None."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if _NAME.fullmatch(name) is None:
        return f"must match [a-zA-Z0-9_-]{{1,64}}, got {name[:70]!r}"
    return None
