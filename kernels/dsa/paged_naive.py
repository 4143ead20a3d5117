"""Paged DSA lightning-indexer references: scores over cached index keys and the top-k positions.

The plain float32 oracle of ``kernels.dsa.paged_triton`` (same signatures). Query ``t`` belongs to
sequence ``query_seq[t]`` (a row of ``block_tables``) and sits at position ``query_pos[t]``; it scores
every key position ``s <= query_pos[t]`` of its sequence (``kernels.dsa.naive.indexer_scores``)::

    I[t, s] = sum_h weights[t, h] * relu(scale * q[t, h] . k[s])

and keeps the ``topk`` best, ordered by score descending, ties by lower position (the rule of
``kernels.dsa.naive.indexer_topk``), padded with -1 when fewer keys are visible. Keys come from the
model-dtype view ``[num_blocks, B, Di]`` or the packed FP8 view ``[num_blocks, B, Di + 4]`` uint8
(``kernels.fp8.naive``), dequantised to float32.
"""

import torch

from kernels.dsa.naive import indexer_scores
from kernels.fp8.naive import index_key_fp8_bytes, unpack_index_key_fp8
from kernels.paged import gather_rows


def check_indexer_inputs(
    q: torch.Tensor,
    weights: torch.Tensor,
    key_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_seq: torch.Tensor,
    query_pos: torch.Tensor,
) -> bool:
    """Validate shapes and dtypes; return True when ``key_cache`` holds packed FP8 rows.

    Raises:
        ValueError: naming the argument that does not fit.
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [T, Hi, Di], got {list(q.shape)}")
    tokens, heads, index_dim = q.shape
    if weights.shape != (tokens, heads):
        raise ValueError(f"weights must be [{tokens}, {heads}], got {list(weights.shape)}")
    fp8 = key_cache.dtype == torch.uint8
    width = index_key_fp8_bytes(index_dim) if fp8 else index_dim
    if key_cache.dim() != 3 or key_cache.shape[2] != width:
        raise ValueError(
            f"key_cache must be [num_blocks, B, {width}]{' uint8' if fp8 else ''}, "
            f"got {list(key_cache.shape)}"
        )
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32:
        raise ValueError(
            f"block_tables must be [S, max_blocks] int32, got {block_tables.dtype} {list(block_tables.shape)}"
        )
    for name, t in (("query_seq", query_seq), ("query_pos", query_pos)):
        if t.shape != (tokens,) or t.dtype != torch.int32:
            raise ValueError(f"{name} must be [{tokens}] int32, got {t.dtype} {list(t.shape)}")
    return fp8


def paged_indexer_scores(
    q: torch.Tensor,
    weights: torch.Tensor,
    key_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_seq: torch.Tensor,
    query_pos: torch.Tensor,
    scale: float,
    max_seq_len: int,
) -> torch.Tensor:
    """Index scores of every query against its sequence's cached keys.

    Args:
        q: ``[T, Hi, Di]`` indexer queries (rotated).
        weights: ``[T, Hi]`` float32 per-head weights (``weights_proj(x) * Hi ** -0.5``).
        key_cache: ``[num_blocks, B, Di]`` keys, or ``[num_blocks, B, Di + 4]`` uint8 FP8 rows.
        block_tables: ``[S, max_blocks]`` int32.
        query_seq: ``[T]`` int32 sequence of each query.
        query_pos: ``[T]`` int32 position of each query; keys ``0 .. query_pos`` must be cached.
        scale: dot-product scale (``Di ** -0.5``).
        max_seq_len: width of the result; bound on every ``query_pos + 1``.

    Returns:
        ``[T, max_seq_len]`` float32, ``-inf`` at positions after ``query_pos[t]``.
    """
    fp8 = check_indexer_inputs(q, weights, key_cache, block_tables, query_seq, query_pos)
    tokens, _, index_dim = q.shape
    out = torch.full((tokens, max_seq_len), float("-inf"), dtype=torch.float32, device=q.device)
    for t in range(tokens):
        positions = torch.arange(int(query_pos[t]) + 1, device=q.device)
        keys = gather_rows(key_cache, block_tables[int(query_seq[t])], positions)
        keys = unpack_index_key_fp8(keys, index_dim) if fp8 else keys.float()
        out[t, : positions.numel()] = indexer_scores(
            q[t][None, None], keys[None], weights[t][None, None], scale
        )[0, 0]
    return out


def topk_by_score(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """Positions of the ``topk`` best finite scores per row: score descending, then position ascending.

    Args:
        scores: ``[T, W]`` float32, ``-inf`` where a position may not be chosen.
        topk: how many to keep (may exceed ``W``).

    Returns:
        ``[T, topk]`` int32, -1 after the row's finite scores run out.
    """
    tokens, width = scores.shape
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :topk]
    chosen = torch.where(scores.gather(-1, order) > float("-inf"), order, -1).to(torch.int32)
    out = torch.full((tokens, topk), -1, dtype=torch.int32, device=scores.device)
    out[:, : min(topk, width)] = chosen
    return out


def paged_indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    key_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_seq: torch.Tensor,
    query_pos: torch.Tensor,
    topk: int,
    scale: float,
    max_seq_len: int,
) -> torch.Tensor:
    """The DSA selection of every query: ``[T, topk]`` int32 positions (arguments as in
    ``paged_indexer_scores``; order and padding as in ``topk_by_score``)."""
    scores = paged_indexer_scores(
        q, weights, key_cache, block_tables, query_seq, query_pos, scale, max_seq_len
    )
    return topk_by_score(scores, topk)
