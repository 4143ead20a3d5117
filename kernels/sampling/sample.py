"""Batched device sampling in Triton: filters, exponential race and logprobs, no host sync.

Each row is sorted once on the device (descending, stable: ties by lowest id). In sorted order
every filter keeps a prefix (top-k: values >= the k-th; top-p: mass before < top_p; min-p: p >=
min_p * p_max), so one program per row walks its sorted row in fixed blocks::

    pass 1 (all blocks):  sum exp(v - v_max)             -> raw log-sum-exp (logprobs)
                          Z = sum_{x >= kth} exp(x - x_max),  x = v / T
    pass 2 (until the kept prefix ends):
                          p = exp(x - x_max) / Z, mass before, keep, race p / q(seed, pos, id)
                          best = max race, ties to the lowest id

A row's result depends only on its own values and parameters (its program reduces in a fixed order
whatever the batch), and ``q`` only on (seed, position, token id) through Philox
(``kernels.sampling.naive``), so a row sampled alone equals the same row in any batch, bitwise.
Same signature and rules as ``kernels.sampling.naive.sample_batch``.
"""

import torch
import triton
import triton.language as tl

from kernels.sampling.naive import SERIES_BELOW
from kernels.triton_env import require_triton_device


@triton.jit
def _sample_rows_kernel(
    values,
    ids,
    temperature,
    top_k,
    top_p,
    min_p,
    seeds,
    positions,
    token_out,
    logprob_out,
    shift_out,
    log_sum_out,
    stride_values,
    stride_ids,
    V: tl.constexpr,
    BLOCK: tl.constexpr,
    SERIES: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    p_values = values + row * stride_values
    p_ids = ids + row * stride_ids
    temp = tl.load(temperature + row).to(tl.float32)
    k = tl.load(top_k + row).to(tl.int64)
    keep_mass = tl.load(top_p + row).to(tl.float32)
    min_ratio = tl.load(min_p + row).to(tl.float32)
    seed = tl.load(seeds + row)
    pos = tl.load(positions + row).to(tl.int64)
    pos_lo = (pos & 0xFFFFFFFF).to(tl.uint32)
    pos_hi = ((pos >> 32) & 0xFFFFFFFF).to(tl.uint32)

    greedy = temp == 0.0
    t = tl.where(greedy, 1.0, temp)
    v_max = tl.load(p_values)
    x_max = v_max / t
    use_k = (k > 0) & (k < V)
    kth = tl.where(use_k, tl.load(p_values + tl.where(use_k, k - 1, 0)) / t, float("-inf"))

    raw_sum = tl.zeros([BLOCK], dtype=tl.float32)
    z = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, V, BLOCK):
        o = start + tl.arange(0, BLOCK)
        v = tl.load(p_values + o, mask=o < V, other=float("-inf"))
        raw_sum += tl.exp(v - v_max)
        x = v / t
        z += tl.where(x >= kth, tl.exp(x - x_max), 0.0)
    raw_total = tl.sum(raw_sum, axis=0)
    z_total = tl.sum(z, axis=0)
    p_first = 1.0 / z_total
    mass_limit = tl.where(keep_mass >= 1.0, float("inf"), keep_mass)  # top-p off: no mass limit

    best = -2.0
    best_id = tl.load(p_ids).to(tl.int64)  # greedy: the first sorted entry, the lowest id among maxima
    best_v = v_max
    before = 0.0
    start = 0
    going = temp != 0.0
    while going:
        o = start + tl.arange(0, BLOCK)
        m = o < V
        v = tl.load(p_values + o, mask=m, other=float("-inf"))
        tid = tl.load(p_ids + o, mask=m, other=0).to(tl.int64)
        x = v / t
        p = tl.exp(x - x_max) / z_total
        mass_before = before + tl.cumsum(p, axis=0) - p
        keep = m & (x >= kth) & (p > 0.0)
        keep = keep & (mass_before < mass_limit) & (p >= min_ratio * p_first)
        zero = tid.to(tl.uint32) * 0
        word, _, _, _ = tl.philox(seed, tid.to(tl.uint32), zero + pos_lo, zero + pos_hi, zero)
        e = (word.to(tl.float32) + 0.5) * 2.3283064365386963e-10
        series = e * (1.0 + e * (0.5 + e * (0.3333333432674408 + e * 0.25)))
        q = tl.where(e < SERIES, series, -tl.log(1.0 - e))
        race = tl.where(keep, p / q, -1.0)
        block_best = tl.max(race, axis=0)
        block_id = tl.min(tl.where(race == block_best, tid, 1 << 62), axis=0)
        block_v = tl.max(tl.where((race == block_best) & (tid == block_id), v, float("-inf")), axis=0)
        better = (block_best > best) | ((block_best == best) & (block_id < best_id))
        best = tl.where(better, block_best, best)
        best_id = tl.where(better, block_id, best_id)
        best_v = tl.where(better, block_v, best_v)
        before += tl.sum(p, axis=0)
        start += BLOCK
        going = (start < V) & (tl.sum(keep.to(tl.int32), axis=0) == tl.sum(m.to(tl.int32), axis=0))

    log_sum = tl.log(raw_total)
    tl.store(token_out + row, best_id)
    tl.store(logprob_out + row, (best_v - v_max) - log_sum)
    tl.store(shift_out + row, v_max)
    tl.store(log_sum_out + row, log_sum)


def sample_batch(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    num_logprobs: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one token per row on the device (one sort + one Triton launch; see the module docstring).

    Args:
        logits: ``[B, V]`` any float dtype, computed on in float32.
        temperature: ``[B]`` float32, 0 = greedy. top_k: ``[B]`` int32, 0 = off.
        top_p: ``[B]`` float32, 1 = off. min_p: ``[B]`` float32, 0 = off.
        seeds: ``[B]`` int64 Philox keys (``kernels.sampling.naive.host_seeds``). positions: ``[B]`` int64.
        num_logprobs: n (host int, may be 0).

    Returns:
        ``(token_ids [B] int64, logprobs [B] float32, top_ids [B, n] int64, top_logprobs [B, n] float32)``,
        logprobs from the unmodified float32 logits.
    """
    require_triton_device("sample_batch", logits)
    batch, vocab = logits.shape
    values, ids = torch.sort(logits.to(torch.float32), dim=-1, descending=True, stable=True)
    device = logits.device
    token_ids = torch.empty(batch, dtype=torch.int64, device=device)
    logprobs = torch.empty(batch, dtype=torch.float32, device=device)
    shift = torch.empty(batch, dtype=torch.float32, device=device)
    log_sum = torch.empty(batch, dtype=torch.float32, device=device)
    block = min(2048, triton.next_power_of_2(vocab))
    _sample_rows_kernel[(batch,)](
        values, ids, temperature, top_k, top_p, min_p, seeds, positions,
        token_ids, logprobs, shift, log_sum, values.stride(0), ids.stride(0),
        V=vocab, BLOCK=block, SERIES=SERIES_BELOW, num_warps=8,
    )  # fmt: skip
    top_ids = ids[:, :num_logprobs]
    top_logprobs = (values[:, :num_logprobs] - shift[:, None]) - log_sum[:, None]
    return token_ids, logprobs, top_ids, top_logprobs
