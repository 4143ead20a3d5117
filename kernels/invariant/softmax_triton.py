"""Batch-invariant softmax and log-softmax over rows in Triton (sampler log-probs, attention weights).

One program per row, the row read in fixed ``BLOCK``-wide chunks in order, twice::

    pass 1, per lane j (chunks in order):   m[j] = running max,  s[j] = s[j] * exp(m_old - m) + exp(x - m)
    close the row (one fixed tree):         M = max_j m[j],      S = sum_j s[j] * exp(m[j] - M)
    pass 2:                                 log-softmax x - M - log(S)   |   softmax exp(x - M) / S

``BLOCK`` and the warp count are constants (``VOCAB_BLOCK``, ``KEY_BLOCK``), so a row's bits depend
only on that row: never on the number of rows, the row's place, or the padded row length.

With a mask, masked positions are ignored (their scores may be anything, NaN included) and come out
as exactly ``+0.0`` (softmax) or ``-inf`` (log-softmax). A masked position leaves its lane's ``m`` and
``s`` bit for bit (``s * 1 + 0``), and a lane that only ever sees masked positions keeps
``s = +0.0`` and adds an exact zero in the closing sum: appending masked positions to a row (the
attention case, keys padded to the longest query of the batch) never changes the other bits.
A row with no valid position gives all zeros (softmax) or all ``-inf`` (log-softmax).

References (float32, same signatures): ``log_softmax_reference`` below and
``kernels.invariant.attention.invariant_softmax``.
"""

import torch
import triton
import triton.language as tl

from kernels.triton_env import require_triton_device


@triton.jit
def _load_chunk(p_x, p_mask, c0, S, BLOCK: tl.constexpr, HAS_MASK: tl.constexpr):
    """Chunk ``[c0, c0 + BLOCK)`` of a row: ``(float32 scores, -inf where not valid; valid)``."""
    o_c = c0 + tl.arange(0, BLOCK)
    valid = o_c < S
    if HAS_MASK:
        valid = valid & (tl.load(p_mask + o_c, mask=o_c < S, other=0) != 0)
    v = tl.load(p_x + o_c, mask=valid, other=0.0).to(tl.float32)
    return tl.where(valid, v, float("-inf")), valid


@triton.jit
def _accumulate(m, s, v, valid):
    """Per lane: fold a chunk into the running max ``m`` and the sum ``s`` of ``exp(x - m)``."""
    m_new = tl.maximum(m, v)
    seen = m_new > float("-inf")  # else both are -inf: keep s = +0.0, avoid exp(nan)
    shift = tl.where(seen, m_new, 0.0)
    # an unchanged max rescales by exactly 1 (not by a fast exp(0)): masked chunks leave s bit for bit
    rescale = tl.where(m_new == m, 1.0, tl.where(seen, tl.exp(m - shift), 0.0))
    s = s * rescale + tl.where(valid, tl.exp(v - shift), 0.0)
    return m_new, s


@triton.jit
def _write_chunk(p_o, c0, S, v, valid, row_max, total, log_total, BLOCK: tl.constexpr, LOG: tl.constexpr):
    o_c = c0 + tl.arange(0, BLOCK)
    if LOG:
        y = tl.where(valid, (v - row_max) - log_total, float("-inf"))
    else:
        # a row with no valid position has total = 0 but writes only the +0.0 of the masked ones
        y = tl.where(valid, tl.div_rn(tl.exp(v - row_max), total), 0.0)
    tl.store(p_o + o_c, y, mask=o_c < S)


@triton.jit(do_not_specialize=["S"])  # attention rows change length every step: one compile
def _softmax_row_kernel(
    x,
    mask,
    out,
    stride_x,
    stride_mask,
    stride_o,
    S,
    BLOCK: tl.constexpr,
    LOG: tl.constexpr,
    HAS_MASK: tl.constexpr,
    LOOP_WHILE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    p_x = x + row * stride_x
    p_mask = mask + row * stride_mask
    p_o = out + row * stride_o
    m = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    # the interpreter cannot run a for loop over a runtime bound; the same chunks, in the same order
    if LOOP_WHILE:
        c0 = 0
        while c0 < S:
            v, valid = _load_chunk(p_x, p_mask, c0, S, BLOCK, HAS_MASK)
            m, s = _accumulate(m, s, v, valid)
            c0 += BLOCK
    else:
        for c0 in tl.range(0, S, BLOCK):
            v, valid = _load_chunk(p_x, p_mask, c0, S, BLOCK, HAS_MASK)
            m, s = _accumulate(m, s, v, valid)
    row_max = tl.max(m, axis=0)
    lane_seen = m > float("-inf")
    total = tl.sum(tl.where(lane_seen, s * tl.exp(m - tl.where(lane_seen, row_max, 0.0)), 0.0), axis=0)
    log_total = total
    if LOG:
        log_total = tl.log(total)
    if LOOP_WHILE:
        c0 = 0
        while c0 < S:
            v, valid = _load_chunk(p_x, p_mask, c0, S, BLOCK, HAS_MASK)
            _write_chunk(p_o, c0, S, v, valid, row_max, total, log_total, BLOCK, LOG)
            c0 += BLOCK
    else:
        for c0 in tl.range(0, S, BLOCK):
            v, valid = _load_chunk(p_x, p_mask, c0, S, BLOCK, HAS_MASK)
            _write_chunk(p_o, c0, S, v, valid, row_max, total, log_total, BLOCK, LOG)


# Fixed chunk widths (lanes), never derived from the row length: a key list padded with masked keys
# (its length set by the longest query of the batch) must keep every lane's sequence of values.
VOCAB_BLOCK = 4096  # log-softmax over the vocabulary: long rows, few of them
KEY_BLOCK = 256  # masked softmax over attention keys: short rows, many of them
_WARPS = {VOCAB_BLOCK: 8, KEY_BLOCK: 4}


def _launch_softmax(x: torch.Tensor, valid: torch.Tensor | None, log: bool) -> torch.Tensor:
    """Rows of ``x [..., S]`` (and ``valid``, broadcast to it) -> float32 ``[..., S]``."""
    s = x.shape[-1]
    rows = x.reshape(-1, s)
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    mask = rows
    if valid is not None:
        mask = valid.expand(x.shape).reshape(-1, s).to(torch.int8).contiguous()
    out = torch.empty(rows.shape[0], s, dtype=torch.float32, device=x.device)
    block = VOCAB_BLOCK if log else KEY_BLOCK
    if rows.numel() > 0:
        _softmax_row_kernel[(rows.shape[0],)](
            rows, mask, out, rows.stride(0), mask.stride(0), out.stride(0),
            S=s, BLOCK=block, LOG=log, HAS_MASK=valid is not None,
            LOOP_WHILE=x.device.type == "cpu", num_warps=_WARPS[block],
        )  # fmt: skip
    return out.reshape(x.shape)


def log_softmax_triton(logits: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the last dim (the sampler's log-probs over the vocabulary), batch-invariant.

    Args:
        logits: ``[..., V]`` float32, bfloat16 or float16.

    Returns:
        ``[..., V]`` float32 ``x - max - log(sum(exp(x - max)))``.
    """
    require_triton_device("log_softmax_triton", logits)
    return _launch_softmax(logits, None, log=True)


def masked_softmax_triton(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim restricted to ``valid`` (same contract as ``invariant_softmax``).

    Args:
        scores: ``[..., S]`` any float dtype; values at invalid positions are ignored.
        valid: ``[..., S]`` bool, broadcastable to ``scores``.

    Returns:
        ``[..., S]`` float32; exactly ``+0.0`` at invalid positions, all zeros for a row with none valid.
    """
    require_triton_device("masked_softmax_triton", scores, valid)
    return _launch_softmax(scores, valid, log=False)


def log_softmax_reference(logits: torch.Tensor) -> torch.Tensor:
    """Float32 reference of ``log_softmax_triton``: ``[..., V]`` -> ``[..., V]`` float32."""
    return torch.log_softmax(logits.to(torch.float32), dim=-1)
