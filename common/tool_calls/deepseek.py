"""DeepSeek's tool-call layout (``deepseek_v32``), as ``common/tokenizer/family.py`` renders it:

    <｜tool▁calls▁begin｜>
      <｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city":"Paris"}<｜tool▁call▁end｜>
      ...more calls...
    <｜tool▁calls▁end｜>

The head is the function's name; the layout carries no id, so each call gets a fresh ``call_<hex>``.
"""

from common.tool_calls.parser import ToolCallFormat


def _deepseek_head(head: str) -> tuple[str | None, str] | None:
    name = head.strip()
    return (None, name) if name else None


DEEPSEEK_FORMAT = ToolCallFormat(
    name="deepseek",
    section_begin="<｜tool▁calls▁begin｜>",
    call_begin="<｜tool▁call▁begin｜>",
    head_end="<｜tool▁sep｜>",
    call_end="<｜tool▁call▁end｜>",
    section_end="<｜tool▁calls▁end｜>",
    read_head=_deepseek_head,
    call_head=lambda name: name,
)
