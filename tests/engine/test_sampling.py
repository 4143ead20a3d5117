"""The sampler: greedy, filtered sampling against analytic distributions, batch independence, logprobs."""

from __future__ import annotations

import math
import random
import struct

import pytest
import torch

from common.sampling_params import SamplingParams
from services.engine.sampling import SampleOutput, sample
from services.engine.sampling.sampler import generator_seed, splitmix64

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def bits(value: float | None) -> bytes | None:
    """Bitwise identity of a float (``==`` would equate 0.0 and -0.0)."""
    return None if value is None else struct.pack("<d", value)


def row_result(out: SampleOutput, i: int) -> tuple:
    """Row i of `out` with every float replaced by its bits."""
    top = out.top_logprobs[i]
    return (
        out.token_ids[i],
        bits(out.logprobs[i]),
        None if top is None else [(t, bits(v)) for t, v in top],
    )


# ---------------------------------------------------------------------------------------------
# Greedy


def test_greedy_is_argmax():
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(0))
    out = sample(logits, [SamplingParams(temperature=0)] * 5, [0] * 5)
    assert out.token_ids == logits.argmax(dim=-1).tolist()
    assert out.logprobs == [None] * 5 and out.top_logprobs == [None] * 5


def test_greedy_ties_go_to_lowest_id():
    logits = torch.tensor(
        [
            [0.0, 3.0, 1.0, 3.0, 3.0],
            [5.0, 5.0, 5.0, 5.0, 5.0],
            [-math.inf, -math.inf, 2.0, -1.0, 2.0],
        ]
    )
    greedy = SamplingParams(temperature=0, top_k=1, top_p=0.1, seed=3)  # filters ignored when greedy
    assert sample(logits, [greedy] * 3, [0, 1, 2]).token_ids == [1, 0, 2]


# ---------------------------------------------------------------------------------------------
# Distribution correctness

LOGITS_6 = [1.0, 2.0, -1.5, 0.3, 1.5, -0.2]


def filtered_distribution(logits: list[float], params: SamplingParams) -> list[float]:
    """The distribution `sample` should draw from, computed independently in float64."""
    x = [v / params.temperature for v in logits]
    keep = set(range(len(x)))
    if params.top_k:
        kth = sorted(x, reverse=True)[params.top_k - 1]
        keep = {i for i in keep if x[i] >= kth}
    top = max(x[i] for i in keep)
    z = sum(math.exp(x[i] - top) for i in keep)
    prob = {i: math.exp(x[i] - top) / z for i in keep}
    if params.top_p < 1:
        mass, nucleus = 0.0, set()
        for i in sorted(keep, key=lambda i: (-prob[i], i)):
            if mass >= params.top_p:
                break
            nucleus.add(i)
            mass += prob[i]
        keep = nucleus
    if params.min_p:
        keep = {i for i in keep if prob[i] >= params.min_p * max(prob.values())}
    z = sum(prob[i] for i in keep)
    return [prob[i] / z if i in keep else 0.0 for i in range(len(x))]


FILTERS = {
    "plain": SamplingParams(seed=11),
    "temperature_0.7": SamplingParams(temperature=0.7, seed=11),
    "top_k_4": SamplingParams(top_k=4, seed=11),
    "top_p_0.9": SamplingParams(top_p=0.9, seed=11),
    "min_p_0.05": SamplingParams(min_p=0.05, seed=11),
    "combined": SamplingParams(temperature=0.7, top_k=4, top_p=0.9, min_p=0.05, seed=11),
    # Each filter removes a token the earlier ones kept: top_k drops 2, top_p 5, min_p 3.
    "each_filter_bites": SamplingParams(temperature=0.7, top_k=5, top_p=0.97, min_p=0.1, seed=11),
}


@pytest.mark.parametrize("params", list(FILTERS.values()), ids=list(FILTERS))
def test_sampled_frequencies_match_filtered_distribution(params):
    draws = 20_000
    want = filtered_distribution(LOGITS_6, params)
    logits = torch.tensor([LOGITS_6]).expand(draws, -1)
    out = sample(logits, [params] * draws, list(range(draws)))
    counts = [0] * len(LOGITS_6)
    for token in out.token_ids:
        counts[token] += 1
    for token, (count, p) in enumerate(zip(counts, want, strict=True)):
        if p == 0.0:
            assert count == 0, f"filtered-out token {token} was sampled {count} times"
        else:
            assert abs(count / draws - p) < 0.015, f"token {token}: {count / draws:.4f} vs {p:.4f}"


def test_masked_logits_never_sampled():
    logits = torch.zeros(400, 50)
    logits[:, ::2] = -math.inf
    params = [SamplingParams(seed=i) for i in range(400)]
    assert all(t % 2 == 1 for t in sample(logits, params, [0] * 400).token_ids)


# ---------------------------------------------------------------------------------------------
# Seeds and positions


def test_splitmix64_reference_value():
    # First output of the reference splitmix64 generator seeded with 0 (Vigna's splitmix64.c).
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert generator_seed(7, 3) != generator_seed(7, 4) != generator_seed(8, 3)


def draw(seed: int | None, positions: list[int], vocab: int = 1000) -> list[int]:
    """Tokens from a uniform distribution, one per position, each position its own row."""
    logits = torch.zeros(len(positions), vocab)
    return sample(logits, [SamplingParams(seed=seed)] * len(positions), positions).token_ids


def test_same_seed_and_position_same_token():
    positions = list(range(200))
    assert draw(5, positions) == draw(5, positions)
    # One at a time, in reverse order (as after preemption and recompute): same tokens.
    assert [draw(5, [p])[0] for p in reversed(positions)] == draw(5, positions)[::-1]


def test_different_positions_draw_differently():
    tokens = draw(5, list(range(200)))
    assert len(set(tokens)) > 150  # about 181 distinct expected from 200 uniform draws over 1000


def test_different_seeds_draw_differently():
    positions = list(range(200))
    a, b = draw(1, positions), draw(2, positions)
    assert sum(x == y for x, y in zip(a, b, strict=True)) < 10  # 0.2 matches expected


def test_unseeded_is_not_reproducible():
    positions = [0] * 200
    a, b = draw(None, positions), draw(None, positions)
    assert len(set(a)) > 150
    assert sum(x == y for x, y in zip(a, b, strict=True)) < 10


# ---------------------------------------------------------------------------------------------
# Batch independence (bitwise)

TARGETS = {
    "plain": SamplingParams(seed=123, logprobs=5),
    "temperature": SamplingParams(temperature=0.6, seed=123, logprobs=0),
    "top_k": SamplingParams(top_k=20, seed=123, logprobs=3),
    "top_p": SamplingParams(top_p=0.8, seed=123, logprobs=20),
    "min_p": SamplingParams(min_p=0.1, seed=123, logprobs=2),
    "combined": SamplingParams(temperature=1.3, top_k=50, top_p=0.95, min_p=0.02, seed=9, logprobs=4),
    "greedy": SamplingParams(temperature=0, logprobs=5),
}

NEIGHBOURS = [
    SamplingParams(temperature=0, logprobs=1),
    SamplingParams(),  # unseeded
    SamplingParams(top_p=0.5, logprobs=20),
    SamplingParams(seed=123, logprobs=5),  # same seed as most targets
    SamplingParams(temperature=0.3, top_k=3, min_p=0.2, seed=1),
    SamplingParams(temperature=2.0, seed=2**63 - 1, logprobs=0),
]


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("params", list(TARGETS.values()), ids=list(TARGETS))
def test_row_result_independent_of_batch(params, dtype):
    vocab, position = 1000, 37
    rng = torch.Generator().manual_seed(0)
    target = (torch.randn(vocab, generator=rng) * 3).to(dtype)
    alone = row_result(sample(target[None], [params], [position]), 0)

    picker = random.Random(1)
    for size in range(2, 10):
        index = (5 * size + 3) % size
        logits = (torch.randn(size, vocab, generator=rng) * 3).to(dtype)
        logits[index] = target
        batch_params = [picker.choice(NEIGHBOURS) for _ in range(size)]
        batch_params[index] = params
        positions = [picker.randrange(100) for _ in range(size)]
        positions[index] = position
        got = row_result(sample(logits, batch_params, positions), index)
        assert got == alone, f"batch of {size}, row {index}"


def test_row_result_independent_of_thread_count():
    vocab = 100_000  # large enough for torch to split work across threads
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0)) * 4
    params = [SamplingParams(top_p=0.9, seed=4, logprobs=5), SamplingParams(seed=5, logprobs=0)] * 2
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = sample(logits, params[:3], [3, 4, 5])
        torch.set_num_threads(max(threads, 4))
        multi = sample(logits, params[:3], [3, 4, 5])
    finally:
        torch.set_num_threads(threads)
    assert [row_result(single, i) for i in range(3)] == [row_result(multi, i) for i in range(3)]


# ---------------------------------------------------------------------------------------------
# Logprobs


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_logprobs_are_raw_log_softmax(dtype):
    vocab = 64
    logits = (torch.randn(6, vocab, generator=torch.Generator().manual_seed(3)) * 2).to(dtype)
    logits[1, [4, 9, 17, 30]] = 8.0  # ties in the top-n: must come out in id order
    logits[2, 10:] = -math.inf
    logits[5, [40, 3, 50, 20, 60]] = 6.0  # a tie straddling the top-2 cut: ids 3 and 20 win
    params = [
        SamplingParams(seed=1, logprobs=0),
        SamplingParams(seed=2, logprobs=6),
        SamplingParams(temperature=0.5, top_k=3, seed=3, logprobs=20),  # only 10 finite logits
        SamplingParams(temperature=0, logprobs=20),
        SamplingParams(seed=5),
        SamplingParams(temperature=0.2, top_p=0.5, seed=6, logprobs=2),
    ]
    out = sample(logits, params, [0, 1, 2, 3, 4, 5])
    want = torch.log_softmax(logits.float(), dim=-1)  # batched: per-row results must match it

    for i, (p, token) in enumerate(zip(params, out.token_ids, strict=True)):
        if p.logprobs is None:
            assert out.logprobs[i] is None and out.top_logprobs[i] is None
            continue
        assert bits(out.logprobs[i]) == bits(want[i, token].item())
        assert struct.unpack("<f", struct.pack("<f", out.logprobs[i]))[0] == out.logprobs[i]  # float32 value
        if p.logprobs == 0:
            assert out.top_logprobs[i] is None
            continue
        row = want[i].tolist()
        expected = sorted(range(vocab), key=lambda t: (-row[t], t))[: p.logprobs]
        assert [t for t, _ in out.top_logprobs[i]] == expected
        assert [bits(v) for _, v in out.top_logprobs[i]] == [bits(row[t]) for t in expected]
    assert [t for t, _ in out.top_logprobs[1][:4]] == [4, 9, 17, 30]
    assert [t for t, _ in out.top_logprobs[5]] == [3, 20]
    assert len(out.top_logprobs[2]) == 20 and [t for t, _ in out.top_logprobs[2][10:]] == list(range(10, 20))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_logits_sample_as_their_float32_values(dtype):
    logits = (torch.randn(8, 500, generator=torch.Generator().manual_seed(4)) * 3).to(dtype)
    params = [SamplingParams(top_k=40, top_p=0.9, seed=i, logprobs=3) for i in range(8)]
    got, want = sample(logits, params, list(range(8))), sample(logits.float(), params, list(range(8)))
    assert [row_result(got, i) for i in range(8)] == [row_result(want, i) for i in range(8)]


# ---------------------------------------------------------------------------------------------
# Input checks

BAD_INPUTS = {
    "one_dim_logits": (torch.zeros(10), [SamplingParams()], [0], "logits:"),
    "integer_logits": (torch.zeros(1, 10, dtype=torch.int64), [SamplingParams()], [0], "logits:"),
    "too_few_params": (torch.zeros(2, 10), [SamplingParams()], [0, 0], "params, positions:"),
    "too_few_positions": (torch.zeros(2, 10), [SamplingParams()] * 2, [0], "params, positions:"),
    "negative_position": (torch.zeros(1, 10), [SamplingParams()], [-1], "positions:"),
}


@pytest.mark.parametrize(
    ("logits", "params", "positions", "message"), list(BAD_INPUTS.values()), ids=list(BAD_INPUTS)
)
def test_bad_inputs_raise(logits, params, positions, message):
    with pytest.raises(ValueError, match=message):
        sample(logits, params, positions)


def test_empty_batch():
    assert sample(torch.zeros(0, 10), [], []) == SampleOutput([], [], [])
