"""Varlen causal depthwise conv + SiLU in Triton, the tail state read and updated in its slot in place.

One program owns one sequence and one block of channels, and walks the sequence's tokens in blocks
of ``BT``; it reads the slot's old tail while computing the first ``W - 1`` outputs and writes the
new tail last, so no other program ever touches that (slot, channel block) and no copy of the
state is needed::

    combined = | old tail [W-1] | x[bos : eos] [T] |
    y[t]     = silu(sum_j w[:, j] * combined[t + j])            j = 0 .. W-1
    new tail = combined[T : T + W - 1]

Same signature and results as ``kernels.conv.naive.causal_conv1d_varlen``.
"""

import torch
import triton
import triton.language as tl

from kernels.triton_env import require_triton_device


@triton.jit
def _tail_after(
    x, stride_x, bos, end, p_tail, stride_pool_w, stateful, o_c, m_c, W: tl.constexpr, WP: tl.constexpr
):
    """The ``W - 1`` inputs ending with token ``end - 1`` (``combined[end : end + W - 1]``): rows of ``x``,
    or, for a short ``end``, the old tail at ``p_tail``. Returns ``([WP, BC] float32, row mask)``."""
    o_i = tl.arange(0, WP)
    m_i = o_i < W - 1
    src = end - (W - 1) + o_i
    m_x = (src >= 0) & m_i
    x_i = tl.load(
        x + (bos + tl.maximum(src, 0))[:, None] * stride_x + o_c[None, :],
        mask=m_x[:, None] & m_c[None, :],
        other=0.0,
    ).to(tl.float32)
    m_s = (src < 0) & m_i & stateful
    s_i = tl.load(
        p_tail[None, :] + tl.maximum(src + W - 1, 0)[:, None] * stride_pool_w,
        mask=m_s[:, None] & m_c[None, :],
        other=0.0,
    ).to(tl.float32)
    return x_i + s_i, m_i


@triton.jit
def _causal_conv1d_varlen_kernel(
    x,
    weight,
    pool,
    y,
    slots,
    has_state,
    cu_seqlens,
    token_slots,
    stride_x,
    stride_y,
    stride_pool_slot,
    stride_pool_c,
    stride_pool_w,
    stride_token_slots,
    C,
    W: tl.constexpr,
    WP: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    HAS_TOKEN_SLOTS: tl.constexpr,
):
    seq = tl.program_id(0)
    o_c = tl.program_id(1) * BC + tl.arange(0, BC)
    m_c = o_c < C
    bos = tl.load(cu_seqlens + seq).to(tl.int64)
    seq_len = tl.load(cu_seqlens + seq + 1).to(tl.int64) - bos
    slot = tl.load(slots + seq).to(tl.int64)
    stateful = tl.load(has_state + seq).to(tl.int1)
    p_tail = pool + slot * stride_pool_slot + o_c * stride_pool_c

    t0 = seq_len * 0  # a while loop: the interpreter cannot take a loaded scalar as a range bound
    while t0 < seq_len:
        o_t = t0 + tl.arange(0, BT)
        m_t = o_t < seq_len
        acc = tl.zeros([BT, BC], dtype=tl.float32)
        for j in tl.static_range(W):
            w_j = tl.load(weight + o_c * W + j, mask=m_c, other=0.0).to(tl.float32)
            src = o_t + j - (W - 1)  # < 0: the carried tail, -1 its newest entry
            m_x = (src >= 0) & m_t
            x_j = tl.load(
                x + (bos + tl.maximum(src, 0))[:, None] * stride_x + o_c[None, :],
                mask=m_x[:, None] & m_c[None, :],
                other=0.0,
            ).to(tl.float32)
            m_s = (src < 0) & m_t & stateful
            s_j = tl.load(
                p_tail[None, :] + tl.maximum(src + W - 1, 0)[:, None] * stride_pool_w,
                mask=m_s[:, None] & m_c[None, :],
                other=0.0,
            ).to(tl.float32)
            acc += (x_j + s_j) * w_j[None, :]
        out = acc * tl.sigmoid(acc)
        tl.store(
            y + (bos + o_t)[:, None] * stride_y + o_c[None, :],
            out.to(y.dtype.element_ty),
            mask=m_t[:, None] & m_c[None, :],
        )
        t0 += BT

    own_len = seq_len  # the own slot keeps the tail after this many tokens
    if HAS_TOKEN_SLOTS:
        # Tails after tokens whose column names another slot go there; the own slot (still holding the
        # old tail those may read) is written last, with the tail after its last column.
        own_len = seq_len * 0
        t = seq_len * 0
        while t < seq_len:
            target = tl.load(token_slots + seq * stride_token_slots + t).to(tl.int64)
            if target == slot:
                own_len = t + 1
            else:
                tail, m_i = _tail_after(
                    x, stride_x, bos, t + 1, p_tail, stride_pool_w, stateful, o_c, m_c, W, WP
                )
                p_target = pool + target * stride_pool_slot + o_c * stride_pool_c
                tl.store(
                    p_target[None, :] + tl.arange(0, WP)[:, None] * stride_pool_w,
                    tail.to(pool.dtype.element_ty),
                    mask=m_i[:, None] & m_c[None, :],
                )
            t += 1
    tail, m_i = _tail_after(x, stride_x, bos, own_len, p_tail, stride_pool_w, stateful, o_c, m_c, W, WP)
    tl.store(
        p_tail[None, :] + tl.arange(0, WP)[:, None] * stride_pool_w,
        tail.to(pool.dtype.element_ty),
        mask=m_i[:, None] & m_c[None, :],
    )


def _launch_causal_conv1d_varlen(
    x, weight, conv_pool, y, slots, has_state, cu_seqlens, max_query_len, token_slots
):
    num_seqs = slots.shape[0]
    channels, width = weight.shape
    block_t = min(32, triton.next_power_of_2(max(1, max_query_len)))
    block_c = 128 if channels >= 128 else triton.next_power_of_2(channels)
    grid = (num_seqs, triton.cdiv(channels, block_c))
    _causal_conv1d_varlen_kernel[grid](
        x,
        weight,
        conv_pool,
        y,
        slots,
        has_state,
        cu_seqlens,
        slots if token_slots is None else token_slots,
        x.stride(0),
        y.stride(0),
        conv_pool.stride(0),
        conv_pool.stride(1),
        conv_pool.stride(2),
        0 if token_slots is None else token_slots.stride(0),
        channels,
        W=width,
        WP=triton.next_power_of_2(max(1, width - 1)),
        BT=block_t,
        BC=block_c,
        HAS_TOKEN_SLOTS=token_slots is not None,
    )


def causal_conv1d_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_pool: torch.Tensor,
    slots: torch.Tensor,
    has_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_query_len: int,
    token_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal depthwise conv + SiLU over a packed batch, tails read from and written to their slots.

    Args:
        x: ``[N, C]`` packed new inputs (sequence s owns rows ``cu_seqlens[s] : cu_seqlens[s + 1]``),
            unit stride over channels.
        weight: ``[C, W]`` taps; tap ``W - 1`` multiplies the current input.
        conv_pool: ``[num_slots, C, W - 1]`` (any strides, e.g. ``StateSlotPool.view(layer, CONV)``);
            the slots' tails are read and overwritten in place.
        slots: ``[S]`` int32 distinct slots.
        has_state: ``[S]`` bool; False reads a zero tail.
        cu_seqlens: ``[S + 1]`` int32.
        max_query_len: an upper bound of the sequence lengths (host int; picks the time tile).
        token_slots: ``[S, >= max_query_len]`` int32, or None: where the tail after each token goes
            (speculative verification keeps the state after every draft, ``kernels/kda/token_slots.py``):
            each row starts with the sequence's own slot for its first tokens; the own slot ends with
            the tail after the last of those, every other column's slot gets the tail after its token.

    Returns:
        ``y [N, C]`` in ``x.dtype``, ``silu(conv)`` computed in float32.
    """
    require_triton_device("causal_conv1d_varlen", x)
    if x.stride(-1) != 1:
        x = x.contiguous()
    weight = weight.contiguous()
    y = torch.empty_like(x)
    _launch_causal_conv1d_varlen(
        x, weight, conv_pool, y, slots, has_state, cu_seqlens, max_query_len, token_slots
    )
    return y
