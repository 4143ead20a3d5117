"""Kimi's tool-call layout (``k3``, ``kimi_linear``), as ``common/tokenizer/family.py`` renders it:

    <|tool_calls_section_begin|>
      <|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city":"Paris"}<|tool_call_end|>
      ...more calls...
    <|tool_calls_section_end|>

(no whitespace between the markers). The head is the call's id, ``functions.<name>:<index>``: the
id is kept, the name read out of it.
"""

import re

from common.tool_calls.parser import ToolCallFormat

_KIMI_ID = re.compile(r"(?:functions\.)?(?P<name>.+?)(?::\d+)?")


def _kimi_head(head: str) -> tuple[str | None, str] | None:
    head = head.strip()
    match = _KIMI_ID.fullmatch(head)
    if not head or match is None:
        return None
    return head, match.group("name")


KIMI_FORMAT = ToolCallFormat(
    name="kimi",
    section_begin="<|tool_calls_section_begin|>",
    call_begin="<|tool_call_begin|>",
    head_end="<|tool_call_argument_begin|>",
    call_end="<|tool_call_end|>",
    section_end="<|tool_calls_section_end|>",
    read_head=_kimi_head,
    call_head=lambda name: f"functions.{name}:0",
)
