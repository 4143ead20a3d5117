"""``merge_by_lse`` in one Triton launch: the DCP merge of every rank's ``(out, lse)``.

The reference (``kernels.mla.lse_merge``) is a Python loop over the ``R`` parts, about eight torch
launches each: at DCP 8 some seventy launches per MLA layer and step, 100-240 µs on the H200 for a few
megabytes (docs/performance.md, "Eight-GPU layouts"). Here one program merges one ``(token, head)`` row's
``BLOCK_D`` columns over all parts, in float32 and in part order, as the reference does: the shift is
the largest finite LSE (0 where every part is ``-inf``), a part that attended nothing adds nothing (its
output may be anything, even NaN), and a row nobody attended gets zeros and ``-inf``. Every rank of a
group runs it on the same gathered bytes, so they agree bitwise; against the reference it is equal up
to the exponential's and the fused multiply-add's rounding.
"""

import torch
import triton
import triton.language as tl

from kernels.triton_env import require_triton_device

BLOCK_D = 128


@triton.jit
def _merge_kernel(
    outs_ptr, lses_ptr, out_ptr, lse_ptr,
    rows, dim,
    PARTS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    block = tl.program_id(1)
    columns = block * BLOCK_D + tl.arange(0, BLOCK_D)
    inside = columns < dim
    peak = tl.full((), float("-inf"), tl.float32)
    for part in tl.static_range(PARTS):
        peak = tl.maximum(peak, tl.load(lses_ptr + part * rows + row))
    shift = tl.where(peak > float("-inf"), peak, 0.0)
    total = tl.zeros((), tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for part in tl.static_range(PARTS):
        weight = tl.exp(tl.load(lses_ptr + part * rows + row) - shift)
        total += weight
        values = tl.load(outs_ptr + (part * rows + row) * dim + columns, mask=inside, other=0.0)
        acc += tl.where(weight > 0, weight * values.to(tl.float32), 0.0)
    acc = tl.where(total > 0, acc / tl.where(total > 0, total, 1.0), 0.0)
    tl.store(out_ptr + row * dim + columns, acc.to(out_ptr.dtype.element_ty), mask=inside)
    if block == 0:
        attended = total > 0  # the log of a row nobody attended is -inf, not log(0)
        tl.store(
            lse_ptr + row, tl.where(attended, shift + tl.log(tl.where(attended, total, 1.0)), float("-inf"))
        )


def merge_by_lse(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge ``R`` partial attention results over disjoint key sets (``kernels.mla.lse_merge``'s contract).

    Args:
        outs: ``[R, T, H, D]`` each part's normalised output (fp32 / bf16 / fp16).
        lses: ``[R, T, H]`` float32 each part's natural-log LSE, ``-inf`` where it attended nothing.

    Returns:
        ``(out [T, H, D] in outs' dtype, lse [T, H] float32)``.

    Raises:
        ValueError: shapes that do not agree.
    """
    if outs.dim() != 4 or lses.shape != outs.shape[:3]:
        raise ValueError(
            f"outs [R, T, H, D] and lses [R, T, H] must agree, got {list(outs.shape)} and {list(lses.shape)}"
        )
    require_triton_device("merge_by_lse", outs, lses)
    parts, tokens, heads, dim = outs.shape
    outs, lses = outs.contiguous(), lses.to(torch.float32).contiguous()
    out = torch.empty((tokens, heads, dim), dtype=outs.dtype, device=outs.device)
    lse = torch.empty((tokens, heads), dtype=torch.float32, device=outs.device)
    rows = tokens * heads
    if rows:
        _merge_kernel[(rows, triton.cdiv(dim, BLOCK_D))](
            outs, lses, out, lse, rows, dim, PARTS=parts, BLOCK_D=BLOCK_D
        )
    return out, lse
