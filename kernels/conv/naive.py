"""Depthwise causal short convolution with SiLU, KDA's input mixer."""

import torch
import torch.nn.functional as F


def causal_conv1d(
    x: torch.Tensor, weight: torch.Tensor, initial_state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv over time followed by SiLU, carrying the last ``K - 1`` inputs.

    Args:
        x: ``[B, T, D]`` inputs.
        weight: ``[D, K]`` per-channel taps; tap ``K - 1`` multiplies the current input.
        initial_state: ``[B, D, K - 1]`` the previous ``K - 1`` inputs (oldest first), or None for zeros.

    Returns:
        ``(y [B, T, D], final_state [B, D, K - 1])`` where ``final_state`` holds the last ``K - 1``
        inputs of ``cat(initial_state, x)``; feeding it back continues the sequence exactly.
    """
    batch, seq_len, channels = x.shape
    kernel = weight.shape[-1]
    xt = x.transpose(1, 2).to(weight.dtype)
    if initial_state is None:
        initial_state = xt.new_zeros(batch, channels, kernel - 1)
    padded = torch.cat([initial_state.to(weight.dtype), xt], dim=-1)
    y = F.conv1d(padded, weight.unsqueeze(1), groups=channels)
    y = F.silu(y).transpose(1, 2).to(x.dtype)
    return y, padded[:, :, padded.shape[-1] - (kernel - 1) :].contiguous()
