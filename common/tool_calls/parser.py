"""The incremental tool-call parser shared by every marker-based family layout.

A family's layout (``ToolCallFormat``) is five markers and a head: content, then a section of calls::

    content <section_begin> ( <call_begin> head <head_end> arguments <call_end> )* <section_end> content

``ToolCallParser.feed`` takes text pieces as they are detokenized and returns what is decided: plain
content, and call deltas in OpenAI's streaming shape (a call's first delta carries its ``index``, ``id``
and ``name``; later ones pieces of its ``arguments``). Text that may still become a marker (a tail that
is a marker's prefix) is held back until the next piece decides it.

Malformed output never raises: a section that opens no call, or a head never closed by ``head_end``,
falls back to content (nothing of it was sent as a call yet); a call whose arguments never reach
``call_end`` (the stream ended, e.g. at ``max_tokens``) is kept with the arguments it has, since they
were already streamed. Text inside a section that is neither a marker nor whitespace is content.
Feeding a text at once or in any split gives the same content and calls.
"""

import secrets
from collections.abc import Callable
from dataclasses import dataclass

MAX_HEAD_CHARS = 256  # a head longer than this is not a call's id or name: the call falls back to content


@dataclass(frozen=True)
class ToolCall:
    """A complete call: ``arguments`` is the JSON text the model wrote (not checked)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of call ``index`` (0, 1, ... in output order): ``id`` and ``name`` on its first delta
    only (else empty), ``arguments`` a piece of its JSON text (possibly empty)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class ToolCallFormat:
    """A family's markers and how to read a call's head.

    Attributes:
        read_head: the text between ``call_begin`` and ``head_end`` -> ``(id or None, name)``, or None
            when it is not a call head (the call then falls back to content). A None id: the format
            carries none, ``new_call_id`` makes one.
        call_head: the head the format writes for a call of the named function (its id or its name).
    """

    name: str
    section_begin: str
    call_begin: str
    head_end: str
    call_end: str
    section_end: str
    read_head: Callable[[str], tuple[str | None, str] | None]
    call_head: Callable[[str], str]

    def call_prefix(self, name: str | None) -> str:
        """The text that opens a call of the named function (None: any function, its head left to the
        model), as a generation prompt's continuation: the assistant turn prefilled so the model writes
        the rest of the call (``tool_choice`` required or named)."""
        head = "" if name is None else self.call_head(name) + self.head_end
        return self.section_begin + self.call_begin + head

    @property
    def markers(self) -> tuple[str, ...]:
        """Every marker: the detokenizer must keep these (special) tokens for the parser to see them."""
        return (self.section_begin, self.call_begin, self.head_end, self.call_end, self.section_end)


@dataclass(frozen=True)
class ParsedOutput:
    """A completed text split into its content and its calls."""

    content: str
    tool_calls: tuple[ToolCall, ...]


def new_call_id() -> str:
    """A fresh OpenAI-style call id, ``call_`` and 24 hex digits."""
    return "call_" + secrets.token_hex(12)


_CONTENT, _SECTION, _HEAD, _ARGUMENTS = range(4)


class ToolCallParser:
    """Streaming split of model output into content and tool-call deltas (see the module docstring).

    Args:
        fmt: the family's layout.
        new_id: makes an id for a call whose format carries none (default ``new_call_id``).
    """

    def __init__(self, fmt: ToolCallFormat, new_id: Callable[[], str] = new_call_id):
        self.fmt = fmt
        self._new_id = new_id
        self._state = _CONTENT
        self._buffer = ""
        self._section_text = ""  # the section so far while it has opened no call (its fallback content)
        self._calls = 0  # calls opened so far

    @property
    def calls(self) -> int:
        """How many calls were opened so far."""
        return self._calls

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """Add a piece of output; return the content and call deltas it decides."""
        self._buffer += text
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        while self._step(content, deltas):
            pass
        return "".join(content), deltas

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """End of output: what was held back, as content (an unfinished marker or head) or as the last
        piece of an unterminated call's arguments. The parser is spent afterwards."""
        rest, self._buffer = self._buffer, ""
        state, opening = self._state, self._section_text
        self._state, self._section_text = _CONTENT, ""
        if state == _ARGUMENTS:
            return "", [ToolCallDelta(self._calls - 1, arguments=rest)] if rest else []
        if state == _HEAD:
            return opening + self.fmt.call_begin + rest, []
        return opening + rest, []

    def _step(self, content: list[str], deltas: list[ToolCallDelta]) -> bool:
        """Consume what the buffer decides in the current state; False when it must wait for more."""
        if self._state == _CONTENT:
            return self._in_content(content)
        if self._state == _SECTION:
            return self._in_section(content)
        if self._state == _HEAD:
            return self._in_head(content, deltas)
        return self._in_arguments(deltas)

    def _in_content(self, content: list[str]) -> bool:
        fmt, buffer = self.fmt, self._buffer
        at = buffer.find(fmt.section_begin)
        if at < 0:
            keep = len(buffer) - _marker_tail(buffer, (fmt.section_begin,))
            content.append(buffer[:keep])
            self._buffer = buffer[keep:]
            return False
        content.append(buffer[:at])
        self._buffer = buffer[at + len(fmt.section_begin) :]
        self._state, self._section_text = _SECTION, fmt.section_begin
        return True

    def _in_section(self, content: list[str]) -> bool:
        """Between calls (or right after ``section_begin``): whitespace before a marker is dropped."""
        fmt, buffer = self.fmt, self._buffer
        stripped = buffer.lstrip()
        lead = buffer[: len(buffer) - len(stripped)]
        if stripped.startswith(fmt.call_begin):
            self._buffer, self._state = stripped[len(fmt.call_begin) :], _HEAD
            return True
        if stripped.startswith(fmt.section_end):
            if self._section_text:  # a section that opened no call: all of it is content
                content.append(self._section_text + lead + fmt.section_end)
            self._buffer = stripped[len(fmt.section_end) :]
            self._state, self._section_text = _CONTENT, ""
            return True
        if not stripped or fmt.call_begin.startswith(stripped) or fmt.section_end.startswith(stripped):
            return False  # whitespace, or a marker still arriving
        if self._section_text:  # no call yet: the opening was not a section, parse on as content
            content.append(self._section_text)
            self._state, self._section_text = _CONTENT, ""
            return True
        # Text between calls is content; trailing whitespace waits (it may precede a marker).
        segment = stripped[: _next_marker(stripped, (fmt.call_begin, fmt.section_end))].rstrip()
        content.append(lead + segment)
        self._buffer = stripped[len(segment) :]
        return True

    def _in_head(self, content: list[str], deltas: list[ToolCallDelta]) -> bool:
        fmt, buffer = self.fmt, self._buffer
        at = buffer.find(fmt.head_end)
        others = (fmt.call_begin, fmt.call_end, fmt.section_begin, fmt.section_end)
        clash = min([i for i in (buffer.find(m) for m in others) if i >= 0], default=-1)
        if at < 0 or (0 <= clash < at) or at > MAX_HEAD_CHARS:
            undecided = len(buffer) - _marker_tail(buffer, (fmt.head_end,))
            if at < 0 and clash < 0 and undecided <= MAX_HEAD_CHARS:
                return False
            self._fall_back(content)
            return True
        head = fmt.read_head(buffer[:at])
        if head is None:
            self._fall_back(content)
            return True
        call_id, name = head
        deltas.append(ToolCallDelta(self._calls, id=call_id or self._new_id(), name=name))
        self._calls += 1
        self._buffer = buffer[at + len(fmt.head_end) :]
        self._state, self._section_text = _ARGUMENTS, ""
        return True

    def _in_arguments(self, deltas: list[ToolCallDelta]) -> bool:
        fmt, buffer = self.fmt, self._buffer
        at = buffer.find(fmt.call_end)
        if at < 0:
            keep = len(buffer) - _marker_tail(buffer, (fmt.call_end,))
            if keep:
                deltas.append(ToolCallDelta(self._calls - 1, arguments=buffer[:keep]))
            self._buffer = buffer[keep:]
            return False
        if at:
            deltas.append(ToolCallDelta(self._calls - 1, arguments=buffer[:at]))
        self._buffer = buffer[at + len(fmt.call_end) :]
        self._state = _SECTION
        return True

    def _fall_back(self, content: list[str]) -> None:
        """A call head that is not one: ``call_begin`` (and the section's opening, when the section has
        no call yet) is content; the head's text is parsed again, as content or between calls."""
        content.append(self._section_text + self.fmt.call_begin)
        self._state = _CONTENT if self._section_text else _SECTION
        self._section_text = ""


def parse_tool_calls(text: str, fmt: ToolCallFormat, new_id: Callable[[], str] = new_call_id) -> ParsedOutput:
    """Split a completed output into content and calls: ``ToolCallParser`` fed the whole text."""
    parser = ToolCallParser(fmt, new_id)
    content, deltas = parser.feed(text)
    rest, last = parser.finish()
    return ParsedOutput(content + rest, merge_deltas(deltas + last))


def merge_deltas(deltas: list[ToolCallDelta]) -> tuple[ToolCall, ...]:
    """Streamed deltas joined into whole calls, by index."""
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        call = calls.setdefault(delta.index, [delta.id, delta.name, ""])
        call[2] += delta.arguments
    return tuple(ToolCall(*calls[i]) for i in sorted(calls))


def _marker_tail(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest tail of ``text`` that is a proper prefix of a marker (held back)."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


def _next_marker(text: str, markers: tuple[str, ...]) -> int:
    """Where the first of ``markers`` (or a marker's prefix at the very end) starts; ``len(text)`` if none."""
    found = [at for at in (text.find(m) for m in markers) if at >= 0]
    tail = len(text) - _marker_tail(text, markers)
    return min([*found, tail])
