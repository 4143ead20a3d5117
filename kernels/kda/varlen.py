"""KDA over a packed batch on fla-core's kernels, the recurrent state living in Baton's slots.

Steps whose sequences are all short (``max_query_len <= RECURRENT_MAX_QUERY_LEN``: decode steps,
speculative verify steps of ``1 + k`` tokens, the draft's short tails) run fla's
``fused_recurrent_kda`` kernel in place on the slots: it reads each sequence's state from its slot and
after every token writes the state back through ``ssm_state_indices``, ``[S]`` for one token each, or
``[S, max_query_len]`` with the sequence's slot in every column for more (the slot stride comes from
the pool view, so no copy). Its per-token arithmetic does not depend on how many tokens a step holds,
so a verify chunk's KDA outputs and state are those of decoding its tokens one step at a time, bit for
bit, and the step needs none of the chunk path's host-side index preparation. Sequences without a
state get their slot zeroed first by a small kernel of ours (fla's kernel has no "fresh" flag); the
caller says on the host whether any sequence is fresh (``any_fresh``), so a step of continuing
sequences (every decode step but a request's first) skips that launch.

Longer prefill / mixed steps run fla's ``chunk_kda`` over the whole packed batch. Its chunk path takes
a dense ``[S, H, K, V]`` initial state and returns a dense final state (no index input in
fla-core 0.6.0), so the batch's states are gathered from their slots once and scattered back once
(``2 * S * H * K * V * 4`` bytes copied, small next to a prefill chunk's work).

Conventions checked against ``kernels.kda.naive.kda_recurrent``: decay ``exp(g)`` applied to the
state before the read, ``beta`` multiplies the correction, ``o = scale * S^T q``, state ``[K, V]``
(fla's default, not V-first), ``q``/``k`` L2-normalised by the caller (fla's in-kernel option uses
the same ``x / sqrt(sum x^2 + 1e-6)``), ``g`` and ``beta`` already activated.

fla's chunk kernels take ``tl.dot``'s default input precision, TF32 for float32 inputs (about 1e-3
relative per product: enough to flip a DSA or expert top-k downstream); a float32 model's calls
compile with full float32 dots (``ieee``), as Baton's own kernels do for float32.

fla's kernels do not run under the Triton interpreter (its autotuner needs a driver and its
scalar loads trip the interpreter), so on CPU this module runs the float32 reference
``kernels.kda.naive.kda_varlen`` and says so once in the log.
"""

import contextlib
import functools
import logging

import torch
import triton
import triton.language as tl
from triton import knobs

from kernels.kda import naive
from kernels.triton_env import require_triton_device

logger = logging.getLogger(__name__)

# The longest sequence of a step that still runs the recurrent kernel (one token at a time, no chunk
# set-up); longer ones run the chunked kernel, whose matmul form pays off on long prompts.
RECURRENT_MAX_QUERY_LEN = 16


@triton.jit
def _zero_fresh_slots_kernel(pool, slots, has_state, stride_slot, size, BLOCK: tl.constexpr):
    seq = tl.program_id(0)
    if tl.load(has_state + seq).to(tl.int1):
        return
    slot = tl.load(slots + seq).to(tl.int64)
    offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    zeros = tl.zeros([BLOCK], dtype=pool.dtype.element_ty)
    tl.store(pool + slot * stride_slot + offsets, zeros, mask=offsets < size)


def zero_fresh_slots(state_pool: torch.Tensor, slots: torch.Tensor, has_state: torch.Tensor) -> None:
    """Zero ``state_pool[slots[s]]`` where ``has_state[s]`` is False, in place, without a host sync.

    Args:
        state_pool: ``[num_slots, *shape]``, each slot's ``shape`` contiguous (the slot stride is free).
        slots: ``[S]`` int32.
        has_state: ``[S]`` bool.
    """
    require_triton_device("zero_fresh_slots", state_pool)
    size = state_pool[0].numel()
    if not state_pool[0].is_contiguous():
        raise ValueError("state_pool: each slot's state must be contiguous")
    block = 1024
    grid = (slots.shape[0], triton.cdiv(size, block))
    _zero_fresh_slots_kernel[grid](state_pool, slots, has_state, state_pool.stride(0), size, BLOCK=block)


@functools.cache
def _say_reference_on_cpu() -> None:
    logger.info(
        "kda_varlen: fla-core's KDA kernels cannot run under the Triton interpreter; CPU runs the reference"
    )


def _recurrent(
    q, k, v, g, beta, scale, state_pool, slots, has_state, cu_seqlens, any_fresh, max_query_len, token_slots
):
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    if any_fresh:
        zero_fresh_slots(state_pool, slots, has_state)
    # The kernel reads the state at indices[seq, 0] and writes token t's at indices[seq, t]: every column
    # the sequence's own slot, or the step's per-token slots (whose first column is the own slot).
    if token_slots is not None:
        indices = token_slots if token_slots.is_contiguous() else token_slots.contiguous()
    elif max_query_len == 1:
        indices = slots
    else:
        indices = slots[:, None].expand(-1, max_query_len).contiguous()
    # This entry of fla has no input guard: its kernel addresses rows as contiguous [N, H, K] (the
    # layer's v is a strided slice of the conv output).
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    out = torch.empty(v[None].shape, dtype=v.dtype, device=v.device)
    fused_recurrent_kda_fwd(
        q=q[None],
        k=k[None],
        v=v[None],
        g=g[None],
        beta=beta[None],
        scale=scale,
        initial_state=state_pool,
        inplace_final_state=True,
        cu_seqlens=cu_seqlens,
        ssm_state_indices=indices,
        out=out,
    )
    return out[0]


def _prefill(q, k, v, g, beta, scale, state_pool, slots, has_state, cu_seqlens, any_fresh):
    from fla.ops.kda import chunk_kda

    index = slots.long()
    initial = state_pool.index_select(0, index)
    if any_fresh:
        initial = torch.where(has_state.view(-1, 1, 1, 1), initial, 0.0)
    out, final = chunk_kda(
        q[None],
        k[None],
        v[None],
        g[None],
        beta[None],
        scale=scale,
        initial_state=initial,
        output_final_state=True,
        cu_seqlens=cu_seqlens.long(),
    )
    state_pool.index_copy_(0, index, final)
    return out[0]


def kda_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    has_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_query_len: int,
    any_fresh: bool = True,
    token_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """KDA over a packed batch on fla-core, reading and writing each sequence's state in its slot.

    Same arguments and result as ``kernels.kda.naive.kda_varlen``:

    Args:
        q, k: ``[N, H, K]`` L2-normalised.
        v: ``[N, H, V]``.
        g: ``[N, H, K]`` float32 log forget gate.
        beta: ``[N, H]``.
        scale: query scale.
        state_pool: ``[num_slots, H, K, V]`` float32 view (slot stride free, each state contiguous).
        slots: ``[S]`` int32 distinct slots.
        has_state: ``[S]`` bool; False starts from zeros.
        cu_seqlens: ``[S + 1]`` int32.
        max_query_len: the longest sequence (host int): up to ``RECURRENT_MAX_QUERY_LEN`` runs the
            in-place recurrent kernel, more the chunked one.
        any_fresh: whether some ``has_state`` entry is False (host bool); False skips zeroing the
            fresh slots (one launch per decode step). Must agree with ``has_state``.
        token_slots: ``[S, >= max_query_len]`` int32 per-token slots (``kernels/kda/token_slots.py``), or
            None; given, the step runs the recurrent kernel whatever its length (the chunked one keeps
            no per-token state).

    Returns:
        ``o [N, H, V]`` in ``v.dtype``.
    """
    if q.device.type == "cpu":
        _say_reference_on_cpu()
        args = (q, k, v, g, beta, scale, state_pool, slots, has_state, cu_seqlens)
        return naive.kda_varlen(*args, max_query_len, any_fresh, token_slots)
    if state_pool.dtype != torch.float32 or not state_pool[0].is_contiguous():
        raise ValueError("state_pool: expected float32 slots, each [H, K, V] contiguous")
    # fla's kernels multiply q, k, v and beta in one dtype (a bf16 model's layer normalises q and k
    # in float32): everything but the float32 gate goes to v's dtype.
    q, k, beta = q.to(v.dtype), k.to(v.dtype), beta.to(v.dtype)
    args = (q, k, v, g, beta, scale, state_pool, slots, has_state, cu_seqlens, any_fresh)
    with _float32_dots(v.dtype):
        if max_query_len <= RECURRENT_MAX_QUERY_LEN or token_slots is not None:
            return _recurrent(*args, max_query_len, token_slots)
        return _prefill(*args)


@contextlib.contextmanager
def _float32_dots(dtype: torch.dtype):
    """Compile the kernels launched inside with ``ieee`` float32 dots when ``dtype`` is float32."""
    if dtype != torch.float32:
        yield
        return
    with knobs.language.scope():
        knobs.language.fp32_default = "ieee"
        yield
