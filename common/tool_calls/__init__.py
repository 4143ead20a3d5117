"""Tool calls in a model's output text, parsed per model family (torch-free).

``tool_call_format(family)`` gives a family's ``ToolCallFormat`` (its markers, as its chat template
renders an assistant message's ``tool_calls``); ``ToolCallParser`` turns streamed text into content
and OpenAI-style call deltas; ``parse_tool_calls`` does the same for a completed text.
"""

from common.tool_calls.parser import (
    ParsedOutput,
    ToolCall,
    ToolCallDelta,
    ToolCallFormat,
    ToolCallParser,
    new_call_id,
    parse_tool_calls,
)
from common.tool_calls.registry import has_tool_calls, tool_call_format
from common.tool_calls.tools import MAX_TOOLS, tool_name_problem

__all__ = [
    "MAX_TOOLS",
    "ParsedOutput",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallFormat",
    "ToolCallParser",
    "has_tool_calls",
    "new_call_id",
    "parse_tool_calls",
    "tool_call_format",
    "tool_name_problem",
]
