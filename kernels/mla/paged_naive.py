"""Paged absorbed-MLA attention references: every query of a step against its sequence's blocks.

The plain float32 oracle of ``kernels.mla.paged_triton`` (same signatures). A step's queries are
rows ``t`` of a flat batch; ``query_seq[t]`` names the sequence (a row of ``block_tables``) and
``query_pos[t]`` the query's own position, so a chunk continuing a cached prefix is just queries at
positions ``past .. past + n - 1`` whose keys (prefix and chunk) are already written to the blocks.

For query ``t`` and head ``h`` over the attended positions ``s`` (dense: ``0 .. query_pos[t]``;
DSA sparse: the entries of ``topk_positions[t]`` that are not -1)::

    logit[s] = scale * (q_latent[t, h] . c[s] + q_rope[t, h] . k_rope[s])
    lse[t, h] = log sum_s exp(logit[s])                       (natural log; -inf when nothing is attended)
    out[t, h] = sum_s exp(logit[s] - lse[t, h]) * c[s]        (zeros when nothing is attended)

``q_latent`` is ``q_nope`` already multiplied by ``W_UK`` and the caller applies ``W_UV`` to ``out``
(``kernels.mla.naive.mla_attention_absorbed``). ``lse`` lets partial results over disjoint key sets
(context parallelism) merge: ``out = sum_r exp(lse_r - lse) out_r`` with ``lse = logsumexp_r lse_r``.

Rows come from the model-dtype views (``latent_cache [num_blocks, B, Dc]``, ``rope_cache
[num_blocks, B, Dr]``) or from the packed FP8 view (``latent_cache [num_blocks, B, Dc + 4G + 2Dr]``
uint8 with ``rope_cache`` None; ``kernels.fp8.naive`` defines the row), dequantised to float32.
"""

import torch

from kernels.fp8.naive import latent_fp8_bytes, unpack_latent_fp8
from kernels.paged import gather_rows


def check_mla_inputs(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    rope_cache: torch.Tensor | None,
    block_tables: torch.Tensor,
    query_seq: torch.Tensor,
    query_pos: torch.Tensor,
    topk_positions: torch.Tensor | None,
) -> bool:
    """Validate shapes and dtypes; return True when ``latent_cache`` holds packed FP8 rows.

    Raises:
        ValueError: naming the argument that does not fit.
    """
    if q_latent.dim() != 3 or q_rope.dim() != 3 or q_rope.shape[:2] != q_latent.shape[:2]:
        raise ValueError(
            f"q_latent [T, H, Dc] and q_rope [T, H, Dr] must agree, got {list(q_latent.shape)} "
            f"and {list(q_rope.shape)}"
        )
    tokens, latent_dim, rope_dim = q_latent.shape[0], q_latent.shape[2], q_rope.shape[2]
    fp8 = latent_cache.dtype == torch.uint8
    if latent_cache.dim() != 3:
        raise ValueError(f"latent_cache must be [num_blocks, B, dim], got {list(latent_cache.shape)}")
    if fp8:
        row = latent_fp8_bytes(latent_dim, rope_dim)
        if latent_cache.shape[2] != row:
            raise ValueError(
                f"latent_cache: FP8 rows of Dc={latent_dim}, Dr={rope_dim} have {row} bytes, "
                f"got {latent_cache.shape[2]}"
            )
        if rope_cache is not None:
            raise ValueError("rope_cache must be None with packed FP8 rows (the rope part is in the row)")
    else:
        if latent_cache.shape[2] != latent_dim:
            raise ValueError(f"latent_cache: last dim must be Dc={latent_dim}, got {latent_cache.shape[2]}")
        if rope_cache is None or rope_cache.shape != (*latent_cache.shape[:2], rope_dim):
            raise ValueError(
                f"rope_cache must be [{latent_cache.shape[0]}, {latent_cache.shape[1]}, {rope_dim}], "
                f"got {None if rope_cache is None else list(rope_cache.shape)}"
            )
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32:
        raise ValueError(
            f"block_tables must be [S, max_blocks] int32, got {block_tables.dtype} {list(block_tables.shape)}"
        )
    for name, t in (("query_seq", query_seq), ("query_pos", query_pos)):
        if t.shape != (tokens,) or t.dtype != torch.int32:
            raise ValueError(f"{name} must be [{tokens}] int32, got {t.dtype} {list(t.shape)}")
    if topk_positions is not None and (
        topk_positions.dim() != 2 or topk_positions.shape[0] != tokens or topk_positions.dtype != torch.int32
    ):
        raise ValueError(
            f"topk_positions must be [{tokens}, K] int32, got {topk_positions.dtype} "
            f"{list(topk_positions.shape)}"
        )
    return fp8


def _sequence_rows(latent_cache, rope_cache, table, positions, latent_dim, rope_dim):
    """``(latent [n, Dc], k_rope [n, Dr])`` float32 of one sequence at ``positions``."""
    if rope_cache is None:
        return unpack_latent_fp8(gather_rows(latent_cache, table, positions), latent_dim, rope_dim)
    return gather_rows(latent_cache, table, positions).float(), gather_rows(
        rope_cache, table, positions
    ).float()


def paged_mla_decode(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    rope_cache: torch.Tensor | None,
    block_tables: torch.Tensor,
    query_seq: torch.Tensor,
    query_pos: torch.Tensor,
    topk_positions: torch.Tensor | None,
    scale: float,
    max_seq_len: int,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA over paged latents for every query of a step (math in the module docstring).

    Args:
        q_latent: ``[T, H, Dc]`` queries in the latent space (``q_nope @ W_UK``).
        q_rope: ``[T, H, Dr]`` rotated query parts.
        latent_cache: ``[num_blocks, B, Dc]`` latents, or ``[num_blocks, B, Dc + 4G + 2Dr]`` uint8 FP8 rows.
        rope_cache: ``[num_blocks, B, Dr]`` rotary keys, or None with FP8 rows.
        block_tables: ``[S, max_blocks]`` int32.
        query_seq: ``[T]`` int32 sequence of each query.
        query_pos: ``[T]`` int32 position of each query (its own key is already cached).
        topk_positions: ``[T, K]`` int32 DSA selection (-1 entries skipped), or None for dense causal;
            entries are trusted to be cached positions (the indexer picks only ``s <= query_pos``).
        scale: softmax scale.
        max_seq_len: bound on every ``query_pos + 1`` (sizes the fast kernel's grid; unused here).
        num_splits: how the fast kernel splits keys (unused here: the result does not depend on it).

    Returns:
        ``(out [T, H, Dc] in q_latent's dtype, lse [T, H] float32)``.
    """
    del max_seq_len, num_splits
    check_mla_inputs(
        q_latent, q_rope, latent_cache, rope_cache, block_tables, query_seq, query_pos, topk_positions
    )
    tokens, heads, latent_dim = q_latent.shape
    rope_dim = q_rope.shape[2]
    out = torch.zeros(tokens, heads, latent_dim, dtype=torch.float32, device=q_latent.device)
    lse = torch.full((tokens, heads), float("-inf"), dtype=torch.float32, device=q_latent.device)
    for t in range(tokens):
        if topk_positions is None:
            positions = torch.arange(int(query_pos[t]) + 1, device=q_latent.device)
        else:
            positions = topk_positions[t][topk_positions[t] >= 0]
        if positions.numel() == 0:
            continue
        table = block_tables[int(query_seq[t])]
        latent, k_rope = _sequence_rows(latent_cache, rope_cache, table, positions, latent_dim, rope_dim)
        logits = scale * (q_latent[t].float() @ latent.T + q_rope[t].float() @ k_rope.T)  # [H, n]
        lse[t] = torch.logsumexp(logits, dim=-1)
        out[t] = torch.exp(logits - lse[t, :, None]) @ latent
    return out.to(q_latent.dtype), lse


def paged_mla_prefill(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    rope_cache: torch.Tensor | None,
    block_tables: torch.Tensor,
    query_seq: torch.Tensor,
    query_pos: torch.Tensor,
    topk_positions: torch.Tensor | None,
    scale: float,
    max_seq_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill chunks (causal inside a chunk, after its cached prefix): the same math as
    ``paged_mla_decode``, which handles multi-token queries; arguments and results as there."""
    return paged_mla_decode(
        q_latent,
        q_rope,
        latent_cache,
        rope_cache,
        block_tables,
        query_seq,
        query_pos,
        topk_positions,
        scale,
        max_seq_len,
    )
