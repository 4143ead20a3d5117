"""OpenAI's ``response_format`` read into a ``StructuredOutput`` (both endpoints), refusals naming the
field as the client spelled it:

    {"type": "text"}                                  -> None (unconstrained)
    {"type": "json_object"}                           -> any JSON object
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": true}}
                                                      -> JSON valid under the schema

The schema is compiled here (llguidance, torch-free): one it cannot compile, an unknown ``type`` or an
unimplemented keyword (``not``, ``if`` / ``then``, ...) is a 400 naming
``response_format.json_schema.schema``, before any worker is involved. ``strict`` may be true or false:
Baton enforces the schema either way.
"""

import json
import re
from typing import Any

from common.structured_output import MAX_SPEC_BYTES, StructuredOutput, check_compiles

from . import fields
from .fields import RequestError

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name
_TYPES = ("text", "json_object", "json_schema")


def parse_response_format(value: Any) -> StructuredOutput | None:
    """``response_format`` (None or absent: text) -> a constraint, or None. Raises RequestError."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RequestError(
            "response_format", f"response_format: must be an object, got {fields.quote(value)}"
        )
    kind = value.get("type")
    if kind not in _TYPES:
        raise RequestError(
            "response_format.type",
            f"response_format.type: must be one of {', '.join(_TYPES)}, got {fields.quote(kind)}",
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    spec = value.get("json_schema")
    where = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise RequestError(
            where, f"{where}: must be an object with name and schema, got {fields.quote(spec)}"
        )
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RequestError(
            f"{where}.name", f"{where}.name: must match [a-zA-Z0-9_-]{{1,64}}, got {fields.quote(name)}"
        )
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise RequestError(
            f"{where}.strict", f"{where}.strict: must be a boolean, got {fields.quote(strict)}"
        )
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise RequestError(
            f"{where}.schema", f"{where}.schema: must be a JSON Schema object, got {fields.quote(schema)}"
        )
    text = json.dumps(schema, ensure_ascii=False)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise RequestError(
            f"{where}.schema", f"{where}.schema: more than the limit of {MAX_SPEC_BYTES} bytes"
        )
    constraint = StructuredOutput("json_schema", text)
    try:
        check_compiles(constraint)
    except ValueError as error:
        reason = str(error).removeprefix(f"{constraint.field}: ")
        raise RequestError(f"{where}.schema", f"{where}.schema: {reason}") from None
    return constraint
