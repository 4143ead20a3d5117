"""One chat generation's output split into content and parsed tool calls, message by message.

Built for a chat with tools whose ``tool_choice`` is not ``MODE_NONE`` (with ``MODE_NONE`` the tools are
rendered but the output stays text). ``MODE_REQUIRED`` / ``MODE_FUNCTION``: the assistant turn is
prefilled with the opening of a call (``prefix``, appended to the rendered prompt) and the parser starts
from it; the model writes the rest of the call (its name too, for ``MODE_REQUIRED``), constrained by the
call's grammar (``common/tool_calls/call_grammar.py``, set by the router's servicer). That call's
first delta (id, name) goes out with the first message.
"""

from common.tool_calls import ToolCallDelta, ToolCallFormat, ToolCallParser
from proto.baton.v1 import generation_pb2

_MODE = generation_pb2.ToolChoice.Mode


class ToolCallStream:
    """Args: the family's format, the chat's ``tool_choice`` and ``single_tool_call`` (keep call 0 only)."""

    def __init__(self, fmt: ToolCallFormat, choice: generation_pb2.ToolChoice, single: bool):
        forced = choice.mode in (_MODE.Value("MODE_REQUIRED"), _MODE.Value("MODE_FUNCTION"))
        name = choice.function_name if choice.mode == _MODE.Value("MODE_FUNCTION") else None
        self.prefix = fmt.call_prefix(name) if forced else ""
        self._parser = ToolCallParser(fmt)
        self._single = single
        self._pending: list[ToolCallDelta] = self._parser.feed(self.prefix)[1]

    @property
    def forced(self) -> bool:
        """Whether the chat forces a call (``tool_choice`` required or named): its opening is prefilled."""
        return bool(self.prefix)

    @property
    def called(self) -> bool:
        """Whether a call was parsed (the finish reason becomes ``FINISH_REASON_TOOL_CALLS``)."""
        return self._parser.calls > 0

    def feed(self, text: str, final: bool) -> tuple[str, list[generation_pb2.ToolCall]]:
        """The content and call pieces decided by ``text`` (the last piece when ``final``)."""
        content, deltas = self._parser.feed(text)
        if final:
            rest, last = self._parser.finish()
            content, deltas = content + rest, deltas + last
        deltas, self._pending = self._pending + deltas, []
        return content, [
            generation_pb2.ToolCall(index=d.index, id=d.id, name=d.name, arguments=d.arguments)
            for d in deltas
            if not (self._single and d.index > 0)
        ]
