"""A token bitmask applied to a batch of logits rows on their device: the same contract as
``naive.py`` (bitwise: masking only selects, it computes nothing), in a few torch ops."""

import torch


def mask_batch(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """``logits [B, V]`` with each token whose bit in ``bitmask [B, W]`` (int32, 32 ids a word, least
    significant bit first) is clear set to -inf; ids beyond ``32 * W`` masked. Returns a new
    ``[B, V]`` float32 tensor on ``logits``' device; ``bitmask`` may still be on the host.
    """
    batch, vocab = logits.shape
    words = bitmask.to(logits.device, non_blocking=True)
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    bits = ((words.unsqueeze(-1) >> shifts) & 1).reshape(batch, -1).to(torch.bool)  # [B, 32 * W]
    allowed = torch.zeros(batch, vocab, dtype=torch.bool, device=logits.device)
    width = min(vocab, bits.shape[1])
    allowed[:, :width] = bits[:, :width]
    return logits.to(torch.float32).masked_fill(~allowed, float("-inf"))
