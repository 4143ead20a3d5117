"""The tool-call format of each model family (``common/model_info.py``'s names)."""

from common.tool_calls.deepseek import DEEPSEEK_FORMAT
from common.tool_calls.kimi import KIMI_FORMAT
from common.tool_calls.parser import ToolCallFormat

_FORMATS: dict[str, ToolCallFormat] = {
    "k3": KIMI_FORMAT,
    "kimi_linear": KIMI_FORMAT,
    "deepseek_v32": DEEPSEEK_FORMAT,
}


def has_tool_calls(family: str) -> bool:
    """Whether ``family`` has a tool-call parser."""
    return family in _FORMATS


def tool_call_format(family: str) -> ToolCallFormat:
    """The tool-call format of ``family``.

    Raises:
        ValueError: starting ``tools:``, when the family has no parser.
    """
    try:
        return _FORMATS[family]
    except KeyError:
        raise ValueError(
            f"tools: model family {family!r} has no tool-call parser (families with one: {sorted(_FORMATS)})"
        ) from None
