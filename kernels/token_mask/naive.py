"""A token bitmask applied to logits, the float32 reference: one row at a time, token by token.

The bitmask holds one bit per token id, 32 ids to an int32 word, least significant bit first::

    allowed(t) = (bitmask[w] >> b) & 1      with w = t // 32, b = t % 32

as llguidance and xgrammar write it. A row keeps its logit where the bit is set and is -inf where it is
not; ids beyond the bitmask's ``32 * W`` are masked. Rows are independent.
"""

import torch


def mask_row(row: torch.Tensor, bitmask: list[int]) -> torch.Tensor:
    """``row [V]`` as float32 with every token whose bit is clear set to -inf.

    Args:
        row: ``[V]`` logits, any float dtype.
        bitmask: ``W`` int32 words (Python ints, negative when the top bit is set).
    """
    out = row.to(torch.float32).clone()
    for token in range(out.shape[0]):
        word = token // 32
        if word >= len(bitmask) or not (bitmask[word] >> (token % 32)) & 1:
            out[token] = float("-inf")
    return out


def mask_rows(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """``logits [B, V]`` masked by ``bitmask [B, W]`` (int32), row by row: ``[B, V]`` float32."""
    return torch.stack([mask_row(logits[i], bitmask[i].tolist()) for i in range(logits.shape[0])])
