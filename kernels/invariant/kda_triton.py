"""KDA under the CF-BI contract in Triton: the fixed-chunk rows of ``kernels.kda.fixed_chunk``, one launch
for every sequence of a step, continuing each one's state slot in place.

One program per (sequence, head). For each block of ``BV`` value columns in turn it loads the slot's
state at the last aligned boundary (``S0 [K, BV]``) and the open chunk's rows (``k``, cumulative ``g``
``[C, K]``, ``delta [C, BV]``), then walks the sequence's tokens in order, each through the same row
code::

    token t, n open rows before it (n = 0 .. C-1, from the absolute position):
      G_t   = G_{t-1} + g_t   (g_t when n = 0)
      delta = beta (v - (k exp(G_t)) . S0 - sum_{s<n} a_ts delta_s)       a_ts = sum_c k k_s exp(G_t - G_s)
      o     = scale ((q exp(G_t)) . S0 + sum_{s<n} b_ts delta_s + (q . k) delta)
      row n <- (k, G_t, delta);  n + 1 == C:  S0 <- exp(G_t) S0 + (k_s exp(G_t - G_s))^T delta  (IEEE dot)

Value columns are independent in every step (the sums run over ``K`` or over open rows), so the blocks
can run one after the other. The key rows are written once, after the last block, and the open-row
count by the launcher after the kernel: no program reads what another wrote. Every reduction has a
fixed shape (``BK``, ``C`` or the fold's ``[BK, C] x [C, BV]`` dot), rows past ``n`` are masked to
zero, and the open rows reach a token either from registers (same call) or from the slot (a later
call) with the same float32 bits. So a token's output and the state it leaves depend only on its
inputs, its slot and its position in the chunk: not on how the tokens were split into calls (prefill =
chunked prefill = decode) or which other sequences share the launch. ``BK``, ``BV`` and the warp count
depend only on ``K`` and ``V``; the token count and offsets are read from ``cu_seqlens`` in the kernel,
so no launch argument that changes with the split can change the compiled code. Every token runs the one
copy of the row code (a plain while loop: no pipelined first iterations compiled apart), and the kernel
is compiled without FMA contraction (``enable_fp_fusion=False``), so the rounding of each product and
sum is the one written, whatever the compiler schedules around it.

Float32 references (same signatures): ``kernels.kda.fixed_chunk.kda_fixed_chunk`` for
``kda_fixed_chunk_triton`` and ``kda_fixed_chunk_varlen_reference`` for ``kda_fixed_chunk_varlen_triton``.
They agree to float32 rounding (``exp`` and summation order differ), not bitwise.
"""

import torch
import triton
import triton.language as tl

from kernels.kda.fixed_chunk import CHUNK, FixedChunkState, kda_fixed_chunk
from kernels.triton_env import require_triton_device

MAX_BLOCK_V = 32  # value columns per program: bounds the state tile [BK, BV] in registers


@triton.jit
def _token_row(
    t, n, g_last, state, rows_k, rows_g, rows_delta, q, k, v, g, beta, out, h, scale, o_k, m_k, o_v, m_v,
    H, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
):  # fmt: skip
    """Token ``t``'s row against the state and the ``n`` open rows; returns the updated carry."""
    o_c = tl.arange(0, C)
    p_hk = (t * H + h) * K + o_k
    q_t = tl.load(q + p_hk, mask=m_k, other=0.0).to(tl.float32)
    k_t = tl.load(k + p_hk, mask=m_k, other=0.0).to(tl.float32)
    g_t = tl.load(g + p_hk, mask=m_k, other=0.0).to(tl.float32)
    v_t = tl.load(v + (t * H + h) * V + o_v, mask=m_v, other=0.0).to(tl.float32)
    beta_t = tl.load(beta + t * H + h).to(tl.float32)
    g_cum = tl.where(n > 0, g_last + g_t, g_t)
    decay = tl.exp(g_cum)
    s0_read = tl.sum((k_t * decay)[:, None] * state, 0)  # [BV]
    s0_out = tl.sum((q_t * decay)[:, None] * state, 0)
    is_open = (o_c < n)[:, None]
    pair = tl.exp(g_cum[None, :] - rows_g)  # [C, BK]
    a = tl.sum(tl.where(is_open, k_t[None, :] * rows_k * pair, 0.0), 1)  # [C]
    correction = tl.sum(tl.where(is_open, a[:, None] * rows_delta, 0.0), 0)  # [BV]
    delta = beta_t * ((v_t - s0_read) - correction)
    b = tl.sum(tl.where(is_open, q_t[None, :] * rows_k * pair, 0.0), 1)
    own = tl.sum(q_t * k_t, 0)
    intra = tl.sum(tl.where(is_open, b[:, None] * rows_delta, 0.0), 0) + own * delta
    o_t = scale * (s0_out + intra)
    tl.store(out + (t * H + h) * V + o_v, o_t, mask=m_v)
    at = (o_c == n)[:, None]
    rows_k = tl.where(at, k_t[None, :], rows_k)
    rows_g = tl.where(at, g_cum[None, :], rows_g)
    rows_delta = tl.where(at, delta[None, :], rows_delta)
    n = n + 1
    if n == C:  # the chunk closes: fold its rows into S0 and clear them
        weighted = rows_k * tl.exp(g_cum[None, :] - rows_g)  # [C, BK]
        update = tl.dot(tl.trans(weighted), rows_delta, input_precision="ieee")  # [BK, BV]
        state = decay[:, None] * state + update
        rows_k = tl.zeros([C, BK], dtype=tl.float32)
        rows_g = tl.zeros([C, BK], dtype=tl.float32)
        rows_delta = tl.zeros([C, BV], dtype=tl.float32)
        n = n - C
    return n, g_cum, state, rows_k, rows_g, rows_delta


@triton.jit
def _kda_fixed_chunk_kernel(
    q, k, v, g, beta, out, cu_seqlens, slots, has_state, s0, open_k, open_g, open_delta, open_count, scale,
    H, stride_s0_slot, stride_s0_h, stride_s0_k, stride_ok_slot, stride_ok_c, stride_ok_h, stride_og_slot,
    stride_og_c, stride_og_h, stride_od_slot, stride_od_c, stride_od_h, stride_count,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    h = tl.program_id(1)
    bos = tl.load(cu_seqlens + seq).to(tl.int64)
    eos = tl.load(cu_seqlens + seq + 1).to(tl.int64)
    slot = tl.load(slots + seq).to(tl.int64)
    has = tl.load(has_state + seq) != 0
    n_start = tl.where(has, tl.load(open_count + slot * stride_count), 0).to(tl.int32)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_c = tl.arange(0, C)
    m_rows_k = (o_c < C)[:, None] & m_k[None, :]
    p_ok = open_k + slot * stride_ok_slot + o_c[:, None] * stride_ok_c + h * stride_ok_h + o_k[None, :]
    p_og = open_g + slot * stride_og_slot + o_c[:, None] * stride_og_c + h * stride_og_h + o_k[None, :]
    # G of the last open row, exactly as stored (unused when n = 0)
    p_last = open_g + slot * stride_og_slot + (n_start - 1) * stride_og_c + h * stride_og_h + o_k
    # rows this call writes: those after the open ones, or all of them once a chunk closed
    changed = ((o_c >= n_start) | (n_start + (eos - bos) >= C))[:, None]
    # Value blocks one after the other, each over every token: the key rows are read from the slot by
    # every pass and written after the last, so no program reads a row another has written.
    for block_v in tl.static_range(0, (V + BV - 1) // BV):
        o_v = block_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_rows_v = (o_c < C)[:, None] & m_v[None, :]
        p_s0 = s0 + slot * stride_s0_slot + h * stride_s0_h + o_k[:, None] * stride_s0_k + o_v[None, :]
        m_s0 = m_k[:, None] & m_v[None, :]
        p_od = (
            open_delta + slot * stride_od_slot + o_c[:, None] * stride_od_c + h * stride_od_h + o_v[None, :]
        )
        state = tl.load(p_s0, mask=m_s0 & has, other=0.0)
        rows_k = tl.load(p_ok, mask=m_rows_k & has, other=0.0)
        rows_g = tl.load(p_og, mask=m_rows_k & has, other=0.0)
        rows_delta = tl.load(p_od, mask=m_rows_v & has, other=0.0)
        g_last = tl.load(p_last, mask=m_k & (n_start > 0), other=0.0)
        n = n_start
        # A while loop, not tl.range: the interpreter cannot run a for loop over a loaded bound, and on the
        # GPU a pipelined tl.range peels its first iterations into separately compiled copies of the body.
        t = bos
        while t < eos:
            n, g_last, state, rows_k, rows_g, rows_delta = _token_row(
                t, n, g_last, state, rows_k, rows_g, rows_delta, q, k, v, g, beta, out, h, scale, o_k, m_k,
                o_v, m_v, H, K, V, BK, BV, C,
            )  # fmt: skip
            t += 1
        tl.store(p_s0, state, mask=m_s0)
        tl.store(p_od, rows_delta, mask=m_rows_v & changed)
    tl.store(p_ok, rows_k, mask=m_rows_k & changed)
    tl.store(p_og, rows_g, mask=m_rows_k & changed)


def kda_fixed_chunk_blocks(k_dim: int, v_dim: int) -> tuple[int, int]:
    """``(BK, BV)`` for heads of ``k_dim`` keys and ``v_dim`` values: a function of the shape alone."""
    return max(16, triton.next_power_of_2(k_dim)), min(MAX_BLOCK_V, max(16, triton.next_power_of_2(v_dim)))


def _check_slots(name: str, tensor: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if tuple(tensor.shape[1:]) != shape or tensor.dtype != dtype:
        raise ValueError(f"{name}: expected [slots, {', '.join(map(str, shape))}] {dtype}, got "
                         f"{list(tensor.shape)} {tensor.dtype}")  # fmt: skip
    if tensor.stride(-1) != 1:
        raise ValueError(f"{name}: the last dim must be contiguous (stride 1), got strides {tensor.stride()}")


def kda_fixed_chunk_varlen_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    cu_seqlens: torch.Tensor,
    slots: torch.Tensor,
    has_state: torch.Tensor,
    s0: torch.Tensor,
    open_k: torch.Tensor,
    open_g: torch.Tensor,
    open_delta: torch.Tensor,
    open_count: torch.Tensor,
) -> torch.Tensor:
    """CF-BI KDA over every sequence of a step, each continuing its slot in place, batch-invariant.

    Args:
        q, k: ``[N, H, K]`` L2-normalised rows of all sequences, back to back.
        v: ``[N, H, V]``.
        g: ``[N, H, K]`` log forget gate.
        beta: ``[N, H]``.
        scale: query scale.
        cu_seqlens: ``[S + 1]`` integer row offsets of the ``S`` sequences.
        slots: ``[S]`` integer slot of each sequence; distinct within a launch.
        has_state: ``[S]`` bool, whether the slot holds state to continue (else it starts from zeros).
        s0: ``[slots, H, K, V]`` float32, the state at each slot's last aligned boundary.
        open_k, open_g: ``[slots, C, H, K]`` float32, the open chunk's keys and cumulative log decays.
        open_delta: ``[slots, C, H, V]`` float32, the open chunk's deltas.
        open_count: ``[slots, 1]`` int32, open rows per slot.
        (The state tensors may be strided views, last dim contiguous: the slot pool's layout.)

    Returns:
        ``o [N, H, V]`` float32. The slots of ``slots`` hold the state after their sequence's rows.
    """
    require_triton_device(
        "kda_fixed_chunk_varlen_triton", q, k, v, g, beta, cu_seqlens, slots, has_state, s0, open_k, open_g,
        open_delta, open_count,
    )  # fmt: skip
    tokens, heads, k_dim = q.shape
    v_dim = v.shape[-1]
    for name, tensor, shape in (("k", k, q.shape), ("g", g, q.shape), ("v", v, (tokens, heads, v_dim)),
                                ("beta", beta, (tokens, heads))):  # fmt: skip
        if tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"{name}: expected {list(shape)}, got {list(tensor.shape)}")
    _check_slots("s0", s0, (heads, k_dim, v_dim), torch.float32)
    _check_slots("open_k", open_k, (CHUNK, heads, k_dim), torch.float32)
    _check_slots("open_g", open_g, (CHUNK, heads, k_dim), torch.float32)
    _check_slots("open_delta", open_delta, (CHUNK, heads, v_dim), torch.float32)
    _check_slots("open_count", open_count, (1,), torch.int32)
    num_seqs = slots.shape[0]
    if cu_seqlens.shape[0] != num_seqs + 1 or has_state.shape[0] != num_seqs:
        raise ValueError(f"cu_seqlens, has_state: expected [{num_seqs + 1}] and [{num_seqs}] for {num_seqs} "
                         f"slots, got {list(cu_seqlens.shape)} and {list(has_state.shape)}")  # fmt: skip
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    out = torch.empty(tokens, heads, v_dim, dtype=torch.float32, device=q.device)
    if num_seqs == 0 or heads == 0:
        return out
    block_k, block_v = kda_fixed_chunk_blocks(k_dim, v_dim)
    grid = (num_seqs, heads)
    _kda_fixed_chunk_kernel[grid](
        q, k, v, g, beta, out, cu_seqlens.contiguous(), slots.contiguous(), has_state.to(torch.int8),
        s0, open_k, open_g, open_delta, open_count, float(scale), heads,
        s0.stride(0), s0.stride(1), s0.stride(2), open_k.stride(0), open_k.stride(1), open_k.stride(2),
        open_g.stride(0), open_g.stride(1), open_g.stride(2), open_delta.stride(0), open_delta.stride(1),
        open_delta.stride(2), open_count.stride(0),
        K=k_dim, V=v_dim, BK=block_k, BV=block_v, C=CHUNK, num_warps=4, enable_fp_fusion=False,
    )  # fmt: skip
    # The count is shared by the sequence's head programs, so it moves after they have all read it.
    index = slots.long()
    before = torch.where(has_state.bool(), open_count[index, 0], 0)
    open_count[index, 0] = ((before + cu_seqlens[1:] - cu_seqlens[:-1]) % CHUNK).to(torch.int32)
    return out


def kda_fixed_chunk_varlen_reference(
    q, k, v, g, beta, scale, cu_seqlens, slots, has_state, s0, open_k, open_g, open_delta, open_count
) -> torch.Tensor:
    """``kda_fixed_chunk_varlen_triton``'s float32 reference: ``kda_fixed_chunk`` per sequence."""
    out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float32, device=q.device)
    bounds = cu_seqlens.tolist()
    for seq, slot in enumerate(slots.tolist()):
        rows = slice(bounds[seq], bounds[seq + 1])
        if has_state[seq]:
            count = int(open_count[slot, 0])
            state = FixedChunkState(s0[slot], open_k[slot], open_g[slot], open_delta[slot], count)
        else:
            state = FixedChunkState.zeros(q.shape[1], q.shape[2], v.shape[-1], q.device)
        out[rows], after = kda_fixed_chunk(q[rows], k[rows], v[rows], g[rows], beta[rows], scale, state)
        s0[slot], open_k[slot], open_g[slot], open_delta[slot] = (
            after.s0,
            after.open_k,
            after.open_g,
            after.open_delta,
        )
        open_count[slot] = after.count
    return out


def kda_fixed_chunk_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    state: FixedChunkState,
) -> tuple[torch.Tensor, FixedChunkState]:
    """One sequence by T tokens on the Triton kernel (the invariant numerics' ``kda``).

    Args and returns as ``kernels.kda.fixed_chunk.kda_fixed_chunk``: ``q, k, g [T, H, K]``,
    ``v [T, H, V]``, ``beta [T, H]``; ``state`` is not modified; ``(o [T, H, V] float32, state after)``.
    """
    device = q.device
    s0, open_k, open_g, open_delta = (
        t.to(device=device, dtype=torch.float32)[None].clone()
        for t in (state.s0, state.open_k, state.open_g, state.open_delta)
    )
    open_count = torch.full((1, 1), state.count, dtype=torch.int32, device=device)
    cu_seqlens = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=device)
    slot = torch.zeros(1, dtype=torch.int32, device=device)
    has_state = torch.ones(1, dtype=torch.bool, device=device)
    o = kda_fixed_chunk_varlen_triton(
        q, k, v, g, beta, scale, cu_seqlens, slot, has_state, s0, open_k, open_g, open_delta, open_count
    )
    after = FixedChunkState(s0[0], open_k[0], open_g[0], open_delta[0], (state.count + q.shape[0]) % CHUNK)
    return o, after
