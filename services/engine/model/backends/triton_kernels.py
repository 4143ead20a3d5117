"""The library kernels behind the ``triton`` backend, one field per batch-level signature.

Signatures (``T`` query rows, ``S`` sequences, ``N`` tokens; shapes in each kernel's docstring):

- ``paged_indexer_topk(q [T, Hi, Di], weights [T, Hi] f32, key_cache [nb, B, Di] | fp8 rows,
  block_tables [S, mb] i32, query_seq [T] i32, query_pos [T] i32, topk, scale, max_seq_len)
  -> [T, topk] i32`` positions, -1 padded.
- ``paged_mla_decode(q_latent [T, H, Dc], q_rope [T, H, Dr], latent_cache [nb, B, Dc] | fp8 rows,
  rope_cache [nb, B, Dr] | None (fp8), block_tables, query_seq, query_pos, topk_positions [T, K] i32
  | None, scale, max_seq_len) -> (out [T, H, Dc], lse [T, H] f32)``.
- ``kda_varlen(q, k, v [N, H, K], g [N, H, K] f32, beta [N, H], scale, state_pool [slots, H, K, V]
  f32 (in place), slots [S] i32, has_state [S] bool, cu_seqlens [S + 1] i32, max_query_len,
  any_fresh, token_slots [S, max_query_len] i32 | None) -> o [N, H, V]``.
- ``causal_conv1d_varlen(x [N, C], weight [C, W], conv_pool [slots, C, W - 1] (in place), slots,
  has_state, cu_seqlens, max_query_len, token_slots | None) -> y [N, C]`` (SiLU applied).
- ``moe_grouped(x [N, D], expert_ids [N, k], weights [N, k] f32, w_gate_up [E, 2I, D],
  w_down [E, D, I]) -> [N, D]``: the Triton grouped GEMM of ``kernels.moe.grouped`` (its peer on
  ``torch._grouped_mm`` needs sm90+ and bf16 on CUDA and has no interpreted form).
- ``sample_batch(logits [B, V], temperature [B], top_k [B] i32, top_p [B], min_p [B], seeds [B] i64,
  positions [B] i64, num_logprobs) -> (token_ids [B], logprobs [B], top_ids [B, n], top_logprobs [B, n])``.
"""

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TritonKernels:
    """The batch-level kernels, which of them run on the CPU under the Triton interpreter, and which
    read FP8 rows."""

    paged_indexer_topk: Callable
    paged_mla_decode: Callable
    kda_varlen: Callable
    causal_conv1d_varlen: Callable
    moe_grouped: Callable
    sample_batch: Callable
    # Kernels that run on CPU tensors under TRITON_INTERPRET; the others' families use their reference there.
    interpretable: frozenset[str] = frozenset()
    # Kernels that read FP8 rows; without this, ``--kv-format fp8`` runs the family's reference.
    reads_fp8: frozenset[str] = frozenset()


def library_kernels() -> TritonKernels:
    """This build's kernels. Imported here, not at module import: Triton decides at a kernel module's
    import whether it is interpreted, so ``TRITON_INTERPRET`` must be set first (``check_kernels``)."""
    from kernels.conv.varlen import causal_conv1d_varlen
    from kernels.dsa.paged_triton import paged_indexer_topk
    from kernels.kda.varlen import kda_varlen
    from kernels.mla.paged_triton import paged_mla_decode
    from kernels.moe.grouped import moe_grouped
    from kernels.sampling.sample import sample_batch

    return TritonKernels(
        paged_indexer_topk=paged_indexer_topk,
        paged_mla_decode=paged_mla_decode,
        kda_varlen=kda_varlen,
        causal_conv1d_varlen=causal_conv1d_varlen,
        moe_grouped=moe_grouped,
        sample_batch=sample_batch,
        # Every kernel takes CPU tensors under the interpreter; kda_varlen because on the CPU it runs
        # its float32 reference (fla-core's kernels cannot be interpreted) and logs that once.
        interpretable=frozenset(
            {
                "paged_indexer_topk",
                "paged_mla_decode",
                "kda_varlen",
                "causal_conv1d_varlen",
                "moe_grouped",
                "sample_batch",
            }
        ),
        reads_fp8=frozenset({"paged_indexer_topk", "paged_mla_decode"}),
    )
