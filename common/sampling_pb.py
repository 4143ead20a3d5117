"""The public ``SamplingParameters`` message read into ``SamplingParams`` (the router validates a request
with it; the workers read the same message from the router)."""

from common.sampling_params import SamplingParams
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
        )
    except ValueError as error:
        raise ValueError(f"sampling.{error}") from None
