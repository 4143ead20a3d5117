"""The pieces of an exact top-k over index scores split across ranks (DSA under decode context parallelism).

Every rank holds the scores of its own keys. The order is the single-rank rule of
``kernels.dsa.naive.indexer_topk``: score descending, then position ascending (global positions, so
the order is total and the same on every rank). The exchange (``services.engine.parallel``) is:

1. each rank sends its best ``c`` candidates (``best_candidates``) and how many keys it holds;
2. every rank merges what all sent (``best_candidates`` over the union): the top-k of the union;
3. ``needs_refill``: a rank that held more keys than it sent, and whose last sent candidate is in
   that merged top-k, may hold an unsent key that belongs there; such rows are exchanged again with
   ``c = k`` (a rank's best ``k`` surely contain all of its keys in the global top-k).

Why step 3 is exact: a rank's unsent keys all rank after its last sent candidate ``l``. If ``l`` is
outside the merged top-k, ``k`` sent keys rank before ``l`` and so before every unsent key: none of
them can enter. Otherwise the row is refilled.
"""

import torch

NO_POSITION = -1


def best_candidates(
    scores: torch.Tensor, positions: torch.Tensor, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``count`` best of each row by (score descending, position ascending).

    One ``torch.topk`` over an int64 key that orders exactly so (as ``kernels.dsa.paged_triton``'s
    ``topk_by_score``): the score's float32 bits made monotone, then the position inverted, so equal
    scores rank by lower position and ``-0.0`` ties with ``+0.0`` as in a float comparison.

    Args:
        scores: ``[T, W]`` float32, ``-inf`` where an entry is not a candidate.
        positions: ``[T, W]`` integer global positions in ``[0, 2**31)`` (distinct within a row among
            the candidates; anything where the score is ``-inf``).
        count: how many to keep (may exceed ``W``).

    Returns:
        ``(scores [T, count] float32, positions [T, count] int32)`` best first; past a row's candidates
        the scores are ``-inf`` and the positions -1.
    """
    rows, width = scores.shape
    bits = (scores.to(torch.float32) + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    monotone = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(torch.int64)
    key = monotone * (1 << 32) + ((1 << 32) - 1 - positions.to(torch.int64).clamp_min(0))
    kept = min(count, width)
    order = torch.topk(key, kept, dim=-1, largest=True, sorted=True).indices
    best_scores = scores.gather(-1, order).to(torch.float32)
    best_positions = torch.where(best_scores > float("-inf"), positions.gather(-1, order), NO_POSITION)
    out_scores = torch.full((rows, count), float("-inf"), dtype=torch.float32, device=scores.device)
    out_positions = torch.full((rows, count), NO_POSITION, dtype=torch.int32, device=scores.device)
    out_scores[:, :kept] = best_scores
    out_positions[:, :kept] = best_positions.to(torch.int32)
    return out_scores, out_positions


def merge_candidates(
    scores: torch.Tensor, positions: torch.Tensor, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k of every rank's candidates together.

    Args:
        scores: ``[R, T, c]`` float32 candidates of each rank (``-inf`` padded).
        positions: ``[R, T, c]`` int32 their global positions (-1 padded).
        topk: the budget.

    Returns:
        ``(scores [T, topk], positions [T, topk] int32)`` as ``best_candidates``.
    """
    ranks, rows, sent = scores.shape
    flat_scores = scores.permute(1, 0, 2).reshape(rows, ranks * sent)
    flat_positions = positions.permute(1, 0, 2).reshape(rows, ranks * sent)
    return best_candidates(flat_scores, flat_positions, topk)


def needs_refill(
    sent_positions: torch.Tensor, held: torch.Tensor, merged_positions: torch.Tensor
) -> torch.Tensor:
    """Rows whose merged top-k might miss a key some rank did not send.

    Args:
        sent_positions: ``[R, T, c]`` int32 what each rank sent, best first.
        held: ``[R, T]`` how many candidate keys each rank holds for each row.
        merged_positions: ``[T, k]`` int32 the top-k of the union.

    Returns:
        ``[T]`` bool: some rank held more than ``c`` keys and its last sent one is in the merged top-k.
    """
    sent = sent_positions.shape[2]
    truncated = held > sent
    last = sent_positions[:, :, sent - 1]
    last_selected = (merged_positions[None] == last[..., None]).any(dim=-1)
    return (truncated & last_selected).any(dim=0)
