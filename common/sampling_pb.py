"""The public ``SamplingParameters`` message read into ``SamplingParams`` (the router validates a request
with it; the workers read the same message from the router)."""

from common.sampling_params import SamplingParams
from common.structured_output import StructuredOutput, check_compiles
from proto.baton.v1 import generation_pb2


def sampling_from_pb(message: generation_pb2.SamplingParameters) -> SamplingParams:
    """``SamplingParameters`` -> ``SamplingParams``; a bad value raises ValueError naming
    ``sampling.<field>``. Zero ``max_tokens``, ``top_p`` and ``repetition_penalty`` mean the defaults
    (16, 1 and 1)."""
    try:
        return SamplingParams(
            max_tokens=message.max_tokens or 16,
            temperature=message.temperature,
            top_p=message.top_p or 1.0,
            top_k=message.top_k,
            min_p=message.min_p,
            seed=message.seed if message.HasField("seed") else None,
            stop=tuple(message.stop),
            stop_token_ids=tuple(message.stop_token_ids),
            ignore_eos=message.ignore_eos,
            logprobs=message.logprobs if message.HasField("logprobs") else None,
            logit_bias=tuple(message.logit_bias.items()),
            presence_penalty=message.presence_penalty,
            frequency_penalty=message.frequency_penalty,
            repetition_penalty=message.repetition_penalty or 1.0,
            structured_output=structured_from_pb(message),
        )
    except ValueError as error:
        raise ValueError(f"sampling.{error}") from None


def structured_from_pb(message: generation_pb2.SamplingParameters) -> StructuredOutput | None:
    """The message's ``structured_output`` (None when unset), compiled once without a tokenizer
    (``check_compiles``: the router refuses what no worker could build); ValueError naming its field."""
    if not message.HasField("structured_output"):
        return None
    kind = message.structured_output.WhichOneof("kind")
    if kind is None:
        raise ValueError("structured_output: set, but none of json_schema, json_object, regex, grammar")
    if kind == "json_object":
        if not message.structured_output.json_object:
            raise ValueError("structured_output.json_object: must be true when set")
        return StructuredOutput("json_object")
    constraint = StructuredOutput(kind, getattr(message.structured_output, kind))
    check_compiles(constraint)
    return constraint


def structured_to_pb(constraint: StructuredOutput | None, message: generation_pb2.SamplingParameters) -> None:
    """Write ``constraint`` into ``message.structured_output`` (nothing for None)."""
    if constraint is None:
        return
    if constraint.kind == "json_object":
        message.structured_output.json_object = True
    else:
        setattr(message.structured_output, constraint.kind, constraint.spec)
