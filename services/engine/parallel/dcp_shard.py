"""Which cached tokens a decode-context-parallel (DCP) rank holds, and its local view of a step.

With ``D`` DCP ranks, token ``p`` of every sequence lives on rank ``p % D`` at local position ``p // D``.
Block tables are shared by the ranks: the step metadata is built with the *virtual* block size
``D * B`` (``B``: tokens per block of a rank's pool), so one block id covers ``D * B`` positions, of
which each rank stores its ``B`` in its own pool's block of that id::

    positions      0  1  2  3  4  5  6  7 | 8  9 ...      (D = 2, B = 4: virtual block 8)
    owner rank     0  1  0  1  0  1  0  1 | 0  1
    local position 0  0  1  1  2  2  3  3 | 4  4
    block          table[0]               | table[1]      (the same id on both ranks)

    virtual slot v = table[p // (D B)] * D B + p % (D B)
    owner  = v % D               local slot = (v // (D B)) * B + (v % (D B)) // D

A rank's sequence of ``L`` tokens holds ``ceil((L - rank) / D)`` of them, in position order, so its
local positions ``0 .. n - 1`` look to the paged kernels like an ordinary sequence of ``n`` tokens:
the query at global position ``q`` attends (causally) local positions ``0 .. (q - rank) // D``
(``-1``: none yet). Everything here is elementwise on device tensors; nothing is read back.
"""

from dataclasses import dataclass

import torch


def check_dcp_numerics(dcp: int, batch_invariant: bool) -> None:
    """Refuse DCP in batch-invariant mode: the LSE merge adds each rank's keys on its own, a different
    reduction order over the keys than one rank's, so DCP 2 would not give DCP 1's bits
    (docs/performance.md, "Parallel layouts", says what making it bitwise would take).

    Raises:
        ValueError: ``dcp > 1`` with ``batch_invariant``, naming both flags.
    """
    if dcp > 1 and batch_invariant:
        raise ValueError(
            f"--dcp {dcp} with --batch-invariant: the LSE merge of per-rank attention changes the "
            "reduction order over keys, so DCP is not bitwise equal to one rank; run batch-invariant "
            "serving with --dcp 1"
        )


@dataclass(frozen=True)
class DcpShard:
    """Rank ``rank`` of a DCP group of ``size`` ranks.

    Raises:
        ValueError: a size below 1 or a rank outside ``[0, size)``.
    """

    rank: int
    size: int

    def __post_init__(self):
        if self.size < 1:
            raise ValueError(f"dcp: the decode context parallel degree must be at least 1, got {self.size}")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"dcp rank: {self.rank} is outside [0, {self.size})")

    def local_block_size(self, virtual_block_size: int) -> int:
        """Tokens per block of a rank's pool, from the step's (virtual) block size.

        Raises:
            ValueError: a virtual block size that the degree does not divide.
        """
        if virtual_block_size % self.size:
            raise ValueError(
                f"block size: the step's block size {virtual_block_size} must be a multiple of dcp "
                f"{self.size} (build the step with dcp * the pool's block size)"
            )
        return virtual_block_size // self.size

    def owned(self, positions: torch.Tensor) -> torch.Tensor:
        """``[N]`` bool: which of these (non-negative) global positions this rank holds."""
        return positions % self.size == self.rank

    def local_slots(
        self, slot_mapping: torch.Tensor, virtual_block_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Where the step's new rows go in this rank's pool.

        Args:
            slot_mapping: ``[N] int64`` virtual slots (``StepMetadata.slot_mapping`` built with
                ``virtual_block_size``).
            virtual_block_size: the step's block size (``D * B``).

        Returns:
            ``(owned [N] bool, local [N] int64)``: the rows this rank writes and their slots in its pool
            (``local`` is meaningless where ``owned`` is False).
        """
        block = self.local_block_size(virtual_block_size)
        offset = slot_mapping % virtual_block_size
        local = (slot_mapping // virtual_block_size) * block + offset // self.size
        return offset % self.size == self.rank, local

    def last_local_position(self, positions: torch.Tensor) -> torch.Tensor:
        """``[N] int32``: this rank's last local position at or before each global position (-1: none)."""
        return torch.div(positions - self.rank, self.size, rounding_mode="floor").to(torch.int32)

    def local_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """``[S] int32``: how many of each sequence's first ``lengths`` tokens this rank holds."""
        return (
            torch.div(lengths - self.rank + self.size - 1, self.size, rounding_mode="floor")
            .clamp_min(0)
            .to(torch.int32)
        )

    def local_bound(self, max_seq_len: int) -> int:
        """A bound on every rank's local length for sequences of at most ``max_seq_len`` tokens."""
        return -(-max_seq_len // self.size)

    def local_selection(self, positions: torch.Tensor) -> torch.Tensor:
        """``[T, K]`` global positions (-1 padded) -> this rank's local positions of the ones it holds,
        -1 elsewhere (the paged kernels skip -1), int32."""
        mine = (positions >= 0) & self.owned(positions)
        return torch.where(mine, torch.div(positions, self.size, rounding_mode="floor"), -1).to(torch.int32)

    def global_positions(self, local: torch.Tensor) -> torch.Tensor:
        """Local positions -> the global positions they hold (int64)."""
        return local.to(torch.int64) * self.size + self.rank
