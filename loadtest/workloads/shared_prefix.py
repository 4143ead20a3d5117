"""Groups of prompts sharing a system prefix (SGLang bench_serving's ``generated-shared-prefix``)."""

import random

from loadtest.workload import Session, Turn, Workload
from loadtest.workloads.synthetic import check_positive
from loadtest.workloads.tokens import DEFAULT_LOW_ID, token_stream


def shared_prefix(
    num_groups: int,
    prompts_per_group: int,
    prefix_len: int,
    suffix_len: int,
    output_len: int,
    vocab: int,
    seed: int = 0,
    *,
    ordered: bool = False,
    low: int = DEFAULT_LOW_ID,
) -> Workload:
    """``num_groups * prompts_per_group`` one-turn sessions; prompts of a group share a prefix.

    Each prompt is its group's ``prefix_len`` system ids followed by its own ``suffix_len`` question
    ids, so every prompt after a group's first can be served ``prefix_len`` ids from the prefix
    cache. Different groups' prefixes are unrelated.

    Args:
        ordered: keep group-major order; by default the sessions are shuffled with ``seed`` (as
            SGLang does), interleaving the groups.
        vocab, low, seed: as for ``synthetic``.

    Returns:
        Sessions ``shared-<group>-<index>``, no arrival times.
    """
    check_positive(
        num_groups=num_groups,
        prompts_per_group=prompts_per_group,
        prefix_len=prefix_len,
        suffix_len=suffix_len,
        output_len=output_len,
    )
    sessions = []
    for group in range(num_groups):
        prefix = token_stream(["shared_prefix", seed, "prefix", group], prefix_len, vocab, low)
        for index in range(prompts_per_group):
            suffix = token_stream(["shared_prefix", seed, "suffix", group, index], suffix_len, vocab, low)
            sessions.append(Session(f"shared-{group}-{index}", (Turn(prefix + suffix, output_len),)))
    if not ordered:
        random.Random(seed).shuffle(sessions)
    return Workload(
        name="shared_prefix",
        sessions=tuple(sessions),
        description=(
            f"{num_groups} groups x {prompts_per_group} prompts: {prefix_len} shared + {suffix_len} own "
            f"tokens, {output_len} out"
        ),
        meta={
            "kind": "shared_prefix",
            "num_groups": num_groups,
            "prompts_per_group": prompts_per_group,
            "prefix_len": prefix_len,
            "suffix_len": suffix_len,
            "output_len": output_len,
            "ordered": ordered,
            "vocab": vocab,
            "low": low,
            "seed": seed,
        },
    )
