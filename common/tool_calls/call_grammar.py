"""The grammar of a forced tool call (``tool_choice`` required or a named function): what the model may
write after the call's opening (``ToolCallFormat.call_prefix``, prefilled into the prompt), in
llguidance's Lark dialect, enforced by structured output (``common/structured_output.py``):

    named:     arguments valid under the function's parameters schema, then the call's and the
               section's end markers;
    required:  one of the declared functions' heads, the head's end marker, that function's
               arguments, then the end markers.

Arguments are compact JSON (no whitespace between tokens), as structured output's JSON is. The markers
are the tokenizer's special tokens, so they are referenced by id (``<[id]>``): the model must emit the
marker token itself, as the chat template renders it. One call per output: a forced choice ends after it.
"""

import json
from collections.abc import Callable, Mapping

from common.tool_calls.parser import ToolCallFormat

_COMPACT = {"whitespace_flexible": False}


def forced_call_grammar(
    fmt: ToolCallFormat,
    schemas: Mapping[str, dict],
    name: str | None,
    token_id: Callable[[str], int | None],
) -> str:
    """The Lark grammar of the rest of a forced call.

    Args:
        fmt: the family's tool-call format.
        schemas: each declared function's parameters schema (``{}``: any JSON object), by name.
        name: the function ``tool_choice`` names; None for ``required`` (any declared function).
        token_id: the tokenizer's id of a marker (None when it has none).

    Raises:
        ValueError: naming ``chat.tool_choice``, when the tokenizer lacks a marker or ``name`` is not
            declared.
    """

    def marker(text: str) -> str:
        token = token_id(text)
        if token is None:
            raise ValueError(f"chat.tool_choice: the tokenizer has no {text!r} token to force a call with")
        return f"<[{token}]>"

    end = f"{marker(fmt.call_end)} {marker(fmt.section_end)}"
    if name is not None:
        if name not in schemas:
            raise ValueError(f"chat.tool_choice: {name!r} is not a declared tool")
        return f"start: {_arguments(schemas[name])} {end}\n"
    head_end = marker(fmt.head_end)
    calls = [f"{json.dumps(fmt.call_head(n))} {head_end} {_arguments(s)}" for n, s in schemas.items()]
    return f"start: call {end}\ncall: " + "\n    | ".join(calls) + "\n"


def _arguments(schema: dict) -> str:
    """A ``%json`` rule for arguments under ``schema`` (an empty one: any JSON object)."""
    constrained = dict(schema) if schema else {"type": "object"}
    constrained["x-guidance"] = _COMPACT
    return "%json " + json.dumps(constrained, separators=(",", ":"))
