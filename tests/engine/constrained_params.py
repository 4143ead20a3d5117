"""Sampling parameters of a constrained request, shared by the engine tests and the GPU tests (no
dependency beyond the engine's own: the device machine has no ``jsonschema``)."""

from common.sampling_params import SamplingParams
from common.structured_output import StructuredOutput

REGEX = r"[a-z]{3,6}-[0-9]{2}(\.[A-Z]{1,3})?"


def constrained(kind: str, spec: str = "", **fields) -> SamplingParams:
    """A request whose output ``StructuredOutput(kind, spec)`` constrains (temperature 1, 120 tokens)."""
    fields = {"temperature": 1.0, "max_tokens": 120, "logprobs": 0, **fields}
    return SamplingParams(structured_output=StructuredOutput(kind, spec), **fields)
