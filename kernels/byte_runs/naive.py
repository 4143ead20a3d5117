"""Byte runs copied with plain torch indexing: the reference, and the CPU path of a handoff's gather."""

import torch


def copy_byte_runs(
    source: torch.Tensor,
    source_offsets: torch.Tensor,
    dest: torch.Tensor,
    dest_offsets: torch.Tensor,
    nbytes: torch.Tensor,
) -> None:
    """``dest[dest_offsets[i] : + nbytes[i]] = source[source_offsets[i] : + nbytes[i]]`` for every run.

    Args:
        source: ``[S]`` uint8, contiguous.
        source_offsets, dest_offsets, nbytes: ``[R]`` int64 on the CPU (a plan's run table); runs may be
            empty; the destination ranges must not overlap each other.
        dest: ``[D]`` uint8, contiguous, on ``source``'s device; written in place.
    """
    total = int(nbytes.sum())
    if total == 0:
        return
    dest[byte_index(dest_offsets, nbytes).to(dest.device)] = source[
        byte_index(source_offsets, nbytes).to(source.device)
    ]


def byte_index(offsets: torch.Tensor, nbytes: torch.Tensor) -> torch.Tensor:
    """``[sum(nbytes)]`` int64: the positions of runs ``offsets[i] .. offsets[i] + nbytes[i]``, in order."""
    starts = torch.cumsum(nbytes, 0) - nbytes
    return torch.repeat_interleave(offsets - starts, nbytes) + torch.arange(int(nbytes.sum()))
