"""A request's structured-output constraint (issue 20): what its output must match, and the grammar
text llguidance compiles from it. Torch-free: the router compiles every constraint once
(``check_compiles``) so a worker never receives one it could not build.

Kinds: ``json_schema`` (a JSON Schema as text), ``json_object`` (any JSON object), ``regex`` (the
whole output fullmatches it) and ``grammar`` (a Lark grammar in llguidance's dialect, ``start`` its
root). Enforcement is ``services/engine/sampling/grammar.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import llguidance

KINDS = ("json_schema", "json_object", "regex", "grammar")
MAX_SPEC_BYTES = 64 * 1024  # a schema, regex or grammar's UTF-8 text
# Compact JSON (no whitespace between tokens, as OpenAI's structured outputs): a random or weak model
# cannot spend its tokens on runs of spaces, and the output parses the same.
_JSON_OPTIONS = {"whitespace_flexible": False}
_ANY_OBJECT = '{"type": "object"}'


@dataclass(frozen=True)
class StructuredOutput:
    """What a request's output must be.

    Attributes:
        kind: one of ``KINDS``.
        spec: the schema (JSON text), regex or Lark grammar; empty for ``json_object``.

    Invalid values raise ValueError with a message that starts with the field's name
    (``structured_output.<kind>``); that the spec compiles is ``check_compiles``'s business.
    """

    kind: str
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"structured_output: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        field = self.field
        if not isinstance(self.spec, str):
            raise ValueError(f"{field}: must be a string, got {type(self.spec).__name__}")
        size = len(self.spec.encode("utf-8", "surrogatepass"))
        if size > MAX_SPEC_BYTES:
            raise ValueError(f"{field}: {size} bytes, more than the limit of {MAX_SPEC_BYTES} bytes")
        if self.kind == "json_object":
            if self.spec:
                raise ValueError(f"{field}: takes no spec, got {self.spec[:40]!r}")
        elif not self.spec:
            raise ValueError(f"{field}: must not be empty")
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.spec)
            except ValueError as error:
                raise ValueError(f"{field}: not JSON ({error})") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"{field}: a JSON Schema is an object, got {type(schema).__name__}")

    @property
    def field(self) -> str:
        return f"structured_output.{self.kind}"

    def grammar(self) -> str:
        """The llguidance grammar (its JSON form) this constraint compiles to."""
        matcher = llguidance.LLMatcher
        if self.kind == "json_schema":
            return matcher.grammar_from_json_schema(self.spec, defaults=_JSON_OPTIONS)
        if self.kind == "json_object":
            return matcher.grammar_from_json_schema(_ANY_OBJECT, defaults=_JSON_OPTIONS)
        if self.kind == "regex":
            return matcher.grammar_from_regex(self.spec)
        return matcher.grammar_from_lark(self.spec)


def check_compiles(constraint: StructuredOutput) -> None:
    """Compile ``constraint`` without a tokenizer (schema keywords, regex syntax, grammar rules).

    Raises:
        ValueError: naming ``constraint.field``, with llguidance's reason (an unknown type, an
            unimplemented keyword such as ``not``, a bad regex, an undefined rule).
    """
    try:
        error = llguidance.LLMatcher.validate_grammar(constraint.grammar())
    except ValueError as exc:  # the schema text is not a JSON object
        error = str(exc)
    if error:
        raise ValueError(f"{constraint.field}: cannot be compiled: {error.strip()}")
