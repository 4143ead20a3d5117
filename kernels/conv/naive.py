"""Depthwise causal short convolution with SiLU, KDA's input mixer."""

import torch
import torch.nn.functional as F

from kernels.kda.token_slots import own_lengths


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
    """``causal_conv1d`` (with SiLU) over a packed batch; each tail is read from and written to its slot.

    Args:
        x: ``[N, C]`` the new inputs of S sequences, packed (sequence s owns rows
            ``cu_seqlens[s] : cu_seqlens[s + 1]``).
        weight: ``[C, W]`` per-channel taps; tap ``W - 1`` multiplies the current input.
        conv_pool: ``[num_slots, C, W - 1]`` every slot's last ``W - 1`` inputs (oldest first), in the
            model dtype; the rows of ``slots`` are read, then overwritten in place with the new tails.
        slots: ``[S]`` int32 slot of each sequence (distinct).
        has_state: ``[S]`` bool; False starts the sequence from a zero tail (the slot's bytes are ignored).
        cu_seqlens: ``[S + 1]`` int32 row offsets of the sequences in ``x``.
        max_query_len: the longest sequence (unused here; the fast kernel sizes its grid with it).
        token_slots: ``[S, T]`` int32 per-token slots (``kernels/kda/token_slots.py``), or None: the own
            slot ends with the tail after the last own column, each other column's slot gets the tail
            after its token.

    Returns:
        ``y [N, C]`` in ``x.dtype``. A sequence with no rows keeps its tail (zeroed when it had no state).
    """
    del max_query_len
    y = torch.empty_like(x)
    bounds = cu_seqlens.tolist()
    counts = cu_seqlens.diff().tolist()
    owned = counts if token_slots is None else own_lengths(token_slots, slots, cu_seqlens)
    width = weight.shape[-1] - 1
    for seq, slot in enumerate(slots.tolist()):
        start, end = bounds[seq], bounds[seq + 1]
        initial = conv_pool[slot][None] if bool(has_state[seq]) else None
        if end == start:  # no new rows: the tail stays (zero if the sequence had none)
            if initial is None:
                conv_pool[slot] = 0
            continue
        out, _ = causal_conv1d(x[None, start:end], weight, initial)
        y[start:end] = out[0]
        old = conv_pool[slot].to(weight.dtype) if initial is not None else weight.new_zeros(x.shape[1], width)
        combined = torch.cat([old, x[start:end].to(weight.dtype).T], dim=-1)  # [C, W - 1 + T]
        for t in range(owned[seq], counts[seq]):  # after token t: combined[:, t + 1 : t + W]
            conv_pool[int(token_slots[seq, t])] = combined[:, t + 1 : t + 1 + width].to(conv_pool.dtype)
        conv_pool[slot] = combined[:, owned[seq] : owned[seq] + width].to(conv_pool.dtype)
    return y
