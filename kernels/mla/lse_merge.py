"""Merging partial attention results over disjoint key sets by their log-sum-exp (context parallelism).

Rank ``r`` attends a query row to its own keys only and returns ``out_r`` (the softmax-weighted sum of
its values) and ``lse_r = log sum_s exp(logit_s)`` over those keys (``kernels.mla.paged_naive``). The
attention over the union of the key sets is::

    lse = log sum_r exp(lse_r)            out = sum_r exp(lse_r - lse) * out_r

A rank that holds no key for a row returns ``lse_r = -inf`` (its ``out_r`` is ignored, whatever it
holds); a row no rank holds a key for gets ``lse = -inf`` and ``out = 0``, as one rank would give.
The partials are added in rank order, one at a time, so every rank merging the same gathered
partials gets the same bits.
"""

import torch


def merge_by_lse(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge ``R`` partial attention results over disjoint key sets.

    Args:
        outs: ``[R, T, H, D]`` each part's normalised output (any float dtype).
        lses: ``[R, T, H]`` float32 each part's natural-log LSE, ``-inf`` where it attended nothing.

    Returns:
        ``(out [T, H, D] in outs' dtype, lse [T, H] float32)``, accumulated in float32.

    Raises:
        ValueError: shapes that do not agree.
    """
    if outs.dim() != 4 or lses.shape != outs.shape[:3]:
        raise ValueError(
            f"outs [R, T, H, D] and lses [R, T, H] must agree, got {list(outs.shape)} and {list(lses.shape)}"
        )
    lses = lses.to(torch.float32)
    peak = lses.max(dim=0).values
    # Rows nobody attended keep a finite shift, so exp(-inf - 0) = 0 below instead of NaN.
    shift = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    total = torch.zeros_like(peak)
    out = torch.zeros(outs.shape[1:], dtype=torch.float32, device=outs.device)
    for part in range(outs.shape[0]):
        weight = torch.exp(lses[part] - shift)
        total = total + weight
        # Where a part attended nothing its output may be anything (even NaN): it must add nothing.
        contribution = weight[..., None] * outs[part].to(torch.float32)
        out = out + torch.where(weight[..., None] > 0, contribution, torch.zeros_like(contribution))
    attended = total > 0
    out = torch.where(attended[..., None], out / torch.where(attended, total, 1.0)[..., None], 0.0)
    return out.to(outs.dtype), shift + torch.log(total)
