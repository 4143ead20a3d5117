"""MLA attention backends: the step's queries against their sequences' cached latents.

The interface takes the per-head query parts and the latent up-projection ``w_kv_b`` and returns
per-head values, so each backend picks its form: ``reference`` runs today's per-sequence code
(expanded MLA for prefill, absorbed for decode); ``triton`` folds ``W_UK`` into the query, runs
``paged_mla_decode`` over the packed blocks for every row at once (one call for decode and chunked
prefill alike), and applies ``W_UV`` to the latent output.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from ..layer_cache import MlaLayerCache
from ..numerics import Numerics
from ..step_metadata import StepMetadata


class AttentionBackend(ABC):
    """MLA over the cache; ``graph_safe`` when it reads no host copy (CUDA graphs may capture it)."""

    kind: str  # the backend name this implementation belongs to
    graph_safe: bool

    @abstractmethod
    def forward(
        self,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        w_kv_b: torch.Tensor,
        cache: MlaLayerCache,
        meta: StepMetadata,
        topk_positions: torch.Tensor | None,
        scale: float,
    ) -> torch.Tensor:
        """Attend every new row to its sequence's cached tokens (this step's rows already written).

        Args:
            q_nope: ``[N, H, Dn]`` query part without position.
            q_rope: ``[N, H, Dr]`` rotated query part.
            w_kv_b: ``[H * (Dn + Dv), Dc]`` latent up-projection (``W_UK`` and ``W_UV`` per head).
            cache: the layer's cached latents.
            meta: the step.
            topk_positions: ``[N, K] int32`` DSA selection (positions, -1 padded), or None: causal.
            scale: softmax scale.

        Returns:
            ``[N, H, Dv]`` in ``q_nope.dtype``.
        """

    def write(
        self,
        cache: MlaLayerCache,
        meta: StepMetadata,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> None:
        """Store the step's new rows (``[N, Dc]``, ``[N, Dr]``, ``[N, Di]`` or None) where this backend
        reads them: every row at its ``meta.slot_mapping`` slot (a DCP backend keeps only its shard)."""
        cache.write(meta.slot_mapping, latent, k_rope, index_keys)


def split_kv_b(w_kv_b: torch.Tensor, heads: int, nope_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``w_kv_b [H * (Dn + Dv), Dc]`` -> ``(W_UK [H, Dn, Dc], W_UV [H, Dv, Dc])`` (views)."""
    per_head = w_kv_b.view(heads, -1, w_kv_b.shape[-1])
    return per_head[:, :nope_dim], per_head[:, nope_dim:]


def selection_mask(positions: torch.Tensor, total: int) -> torch.Tensor:
    """``[T, K]`` selected positions (-1 padded) -> ``[T, total]`` bool mask."""
    valid = positions >= 0
    mask = torch.zeros(positions.shape[0], total + 1, dtype=torch.bool, device=positions.device)
    # Padding goes to a spare last column, so it can never overwrite a selected position.
    mask.scatter_(1, torch.where(valid, positions, total).long(), True)
    return mask[:, :total]


class ReferenceAttention(AttentionBackend):
    """Per sequence, from the metadata's host copies: ``Numerics.mla_attention`` (expanded for
    prefill, absorbed for a decode token; the invariant numerics' own form in batch-invariant mode)."""

    kind = "reference"
    graph_safe = False

    def __init__(self, nx: Numerics):
        self.nx = nx

    def forward(self, q_nope, q_rope, w_kv_b, cache, meta, topk_positions, scale):
        heads, v_dim = q_nope.shape[1], w_kv_b.shape[0] // q_nope.shape[1] - q_nope.shape[2]
        out = q_nope.new_empty(q_nope.shape[0], heads, v_dim)
        for seq in range(meta.num_seqs):
            rows, past, total = meta.rows(seq), meta.past_lens_host[seq], meta.seq_len(seq)
            latent, k_rope, _ = cache.gather(meta.block_tables_host[seq], total)
            query_pos = torch.arange(past, total, device=q_nope.device)
            allowed = torch.arange(total, device=q_nope.device)[None, :] <= query_pos[:, None]
            if topk_positions is not None:
                allowed = selection_mask(topk_positions[rows], total)
            decoding = total - past == 1 and past > 0
            out[rows] = self.nx.mla_attention(
                q_nope[rows], q_rope[rows], latent, k_rope, w_kv_b, scale, allowed, decoding
            )
        return out


class TritonAttention(AttentionBackend):
    """Absorbed MLA through ``paged_mla_decode`` (signature in ``triton_kernels.TritonKernels``)."""

    kind = "triton"
    graph_safe = True

    def __init__(self, paged_mla_decode: Callable):
        self.paged_mla_decode = paged_mla_decode

    def forward(self, q_nope, q_rope, w_kv_b, cache, meta, topk_positions, scale):
        w_uk, w_uv = split_kv_b(w_kv_b, q_nope.shape[1], q_nope.shape[2])
        q_latent = torch.einsum("thd,hdc->thc", q_nope, w_uk)
        latent, rope = (cache.latent_fp8, None) if cache.is_fp8 else (cache.latent, cache.k_rope)
        out_latent, _lse = self.paged_mla_decode(
            q_latent,
            q_rope,
            latent,
            rope,
            meta.block_tables,
            meta.query_seq,
            meta.positions,
            topk_positions,
            scale,
            meta.max_seq_len,
        )
        return torch.einsum("thc,hdc->thd", out_latent.to(q_nope.dtype), w_uv)
