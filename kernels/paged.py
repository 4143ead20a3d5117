"""Shared pieces of the paged-cache kernels: the row addressing rule.

A sequence's token at position ``p`` lives in block ``block_table[p // B]``, row ``p % B``, of a
strided per-field view ``[num_blocks, B, dim]`` (``BlockPool.view``)::

    block_tables [S, max_blocks] int32        view [num_blocks, B, dim]
    seq s: | b0 | b1 | b2 | ...                 p = 2B + r  ->  view[block_tables[s, 2], r]

The references gather rows with plain indexing; the Triton kernels compute the same addresses.
"""

import torch


def gather_rows(view: torch.Tensor, block_table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rows of one sequence at ``positions``.

    Args:
        view: ``[num_blocks, B, dim]`` one field of every block, any strides.
        block_table: ``[max_blocks]`` int32 the sequence's block ids.
        positions: ``[n]`` integer token positions (all valid: ``0 <= p < B * max_blocks``).

    Returns:
        ``[n, dim]`` copied rows, in ``view``'s dtype.
    """
    block_size = view.shape[1]
    positions = positions.to(device=view.device, dtype=torch.long)
    blocks = block_table.to(device=view.device, dtype=torch.long)[positions // block_size]
    return view[blocks, positions % block_size]
