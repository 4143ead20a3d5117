"""Random prompts, one request per session (vLLM ``bench serve --dataset-name random``)."""

import math
import random

from loadtest.workload import Session, Turn, Workload
from loadtest.workloads.tokens import DEFAULT_LOW_ID, token_stream


def random_length(rng: random.Random, length: int, range_ratio: float) -> int:
    """A length uniform over ``[floor(length * (1 - r)), ceil(length * (1 + r))]``, at least 1.

    The same bounds as vLLM's ``--random-range-ratio`` (both ends included).
    """
    low = max(1, math.floor(length * (1 - range_ratio)))
    high = max(low, math.ceil(length * (1 + range_ratio)))
    return rng.randint(low, high)


def check_positive(**values: int) -> None:
    """Raise ValueError naming the first argument that is not an integer >= 1."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")


def synthetic(
    num_requests: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    vocab: int,
    seed: int = 0,
    *,
    low: int = DEFAULT_LOW_ID,
) -> Workload:
    """``num_requests`` independent requests of random ids.

    Args:
        num_requests: sessions, each one turn.
        input_len, output_len: mean prompt and output lengths.
        range_ratio: ``r`` in ``[0, 1)``: each length is uniform in ``[len*(1-r), len*(1+r)]``.
        vocab, low: ids lie in ``[low, vocab)``.
        seed: same seed, same workload (lengths and ids), in any process.

    Returns:
        Sessions ``synthetic-<i>`` with no arrival times (drivers pace them).
    """
    check_positive(num_requests=num_requests, input_len=input_len, output_len=output_len)
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range_ratio: must be in [0, 1), got {range_ratio!r}")
    rng = random.Random(seed)
    sessions = []
    for index in range(num_requests):
        prompt_len = random_length(rng, input_len, range_ratio)
        max_tokens = random_length(rng, output_len, range_ratio)
        prompt = token_stream(["synthetic", seed, index], prompt_len, vocab, low)
        sessions.append(Session(f"synthetic-{index}", (Turn(prompt, max_tokens),)))
    return Workload(
        name="synthetic",
        sessions=tuple(sessions),
        description=f"{num_requests} random prompts of ~{input_len} tokens, ~{output_len} out",
        meta={
            "kind": "synthetic",
            "num_requests": num_requests,
            "input_len": input_len,
            "output_len": output_len,
            "range_ratio": range_ratio,
            "vocab": vocab,
            "low": low,
            "seed": seed,
        },
    )
