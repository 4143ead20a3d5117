"""How a prefill step's tokens are split across PCP ranks: the zigzag plan.

Each sequence's new tokens are cut into ``2 * pcp`` chunks of ``chunk`` tokens (a multiple of
``ZIGZAG_ALIGN``, the last chunks shorter or empty); PCP rank ``r`` takes chunks ``r`` and
``2 * pcp - 1 - r``, so under causal attention every rank gets about the same work::

    pcp = 2, 70 new tokens, chunk = 32:
        chunk      0 [0, 32)   1 [32, 64)   2 [64, 70)   3 [70, 70)
        rank       0           1            1            0
    rank 0 rows: chunk 0 then chunk 3;  rank 1 rows: chunk 1 then chunk 2

A rank's rows are its pieces in (sequence, chunk) order; every piece becomes a ``SequenceStep`` of its
own (``past`` = the piece's first position), so the model's causal attention over the cache needs no
change. ``global_rows[rank]`` maps each of that rank's rows to its row in the undivided step.
"""

from dataclasses import dataclass

from services.engine.model.step_metadata import SequenceStep

# Chunk sizes are multiples of the CF-BI chunk (``kernels.kda.fixed_chunk.CHUNK``), so a zigzag
# boundary is a KDA chunk boundary whenever the step starts at one.
ZIGZAG_ALIGN = 16


@dataclass(frozen=True)
class Piece:
    """One zigzag chunk of one sequence: rows ``[start, end)`` of the sequence's new tokens."""

    seq: int
    chunk: int
    start: int
    end: int
    rank: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ZigzagPlan:
    """The split of one step over ``pcp`` ranks.

    Attributes:
        steps: the undivided step's sequences.
        pcp: the degree.
        pieces: ``pieces[seq]`` the sequence's ``2 * pcp`` chunks in position order (empty ones too).
        global_rows: ``global_rows[rank]`` the undivided step's row of each of that rank's rows.
    """

    steps: tuple[SequenceStep, ...]
    pcp: int
    pieces: tuple[tuple[Piece, ...], ...]
    global_rows: tuple[tuple[int, ...], ...]

    def rank_pieces(self, rank: int) -> list[Piece]:
        """The non-empty pieces ``rank`` computes, in its row order."""
        return [p for seq in self.pieces for p in _rank_order(seq, rank) if p.length]

    def local_steps(self, rank: int) -> list[SequenceStep]:
        """``rank``'s pieces as steps of their own (empty when the rank holds no token)."""
        out = []
        for piece in self.rank_pieces(rank):
            step = self.steps[piece.seq]
            out.append(
                SequenceStep(
                    step.token_ids[piece.start : piece.end],
                    step.past + piece.start,
                    step.block_table,
                    step.slot,
                    step.adapter,
                )
            )
        return out

    def row_counts(self) -> list[int]:
        return [len(rows) for rows in self.global_rows]


def chunk_size(new_tokens: int, pcp: int) -> int:
    """Tokens per zigzag chunk: ``new_tokens / (2 * pcp)`` rounded up to a multiple of ``ZIGZAG_ALIGN``."""
    per_chunk = -(-new_tokens // (2 * pcp))
    return max(ZIGZAG_ALIGN, -(-per_chunk // ZIGZAG_ALIGN) * ZIGZAG_ALIGN)


def zigzag_plan(steps: list[SequenceStep], pcp: int) -> ZigzagPlan:
    """Split every sequence of ``steps`` into its zigzag chunks over ``pcp`` ranks.

    Raises:
        ValueError: ``pcp`` below 1 or no sequence.
    """
    if pcp < 1:
        raise ValueError(f"--pcp {pcp}: a parallel degree must be an integer >= 1")
    if not steps:
        raise ValueError("steps: a step needs at least one sequence")
    pieces = []
    for seq, step in enumerate(steps):
        total = len(step.token_ids)
        size = chunk_size(total, pcp)
        row = []
        for chunk in range(2 * pcp):
            start, end = min(chunk * size, total), min((chunk + 1) * size, total)
            rank = chunk if chunk < pcp else 2 * pcp - 1 - chunk
            row.append(Piece(seq, chunk, start, end, rank))
        pieces.append(tuple(row))
    offsets = [0]
    for step in steps:
        offsets.append(offsets[-1] + len(step.token_ids))
    global_rows = []
    for rank in range(pcp):
        rows = []
        for seq in pieces:
            for piece in _rank_order(seq, rank):
                first = offsets[piece.seq] + piece.start
                rows.extend(range(first, first + piece.length))
        global_rows.append(tuple(rows))
    return ZigzagPlan(tuple(steps), pcp, tuple(pieces), tuple(global_rows))


def _rank_order(pieces: tuple[Piece, ...], rank: int) -> list[Piece]:
    """``rank``'s two chunks of one sequence, in position order."""
    return [p for p in pieces if p.rank == rank]
