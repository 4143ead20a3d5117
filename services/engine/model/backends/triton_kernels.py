"""The library kernels behind the ``triton`` backend, one field per batch-level signature.

Signatures (``T`` query rows, ``S`` sequences, ``N`` tokens; shapes in each kernel's docstring):

- ``paged_indexer_topk(q [T, Hi, Di], weights [T, Hi] f32, key_cache [nb, B, Di] | fp8 rows,
  block_tables [S, mb] i32, query_seq [T] i32, query_pos [T] i32, topk, scale, max_seq_len)
  -> [T, topk] i32`` positions, -1 padded.
- ``paged_mla_decode(q_latent [T, H, Dc], q_rope [T, H, Dr], latent_cache [nb, B, Dc] | fp8 rows,
  rope_cache [nb, B, Dr] | None (fp8), block_tables, query_seq, query_pos, topk_positions [T, K] i32
  | None, scale, max_seq_len) -> (out [T, H, Dc], lse [T, H] f32)``.
- ``kda_varlen(q, k, v [N, H, K], g [N, H, K] f32, beta [N, H], scale, state_pool [slots, H, K, V]
  f32 (in place), slots [S] i32, has_state [S] bool, cu_seqlens [S + 1] i32, max_query_len)
  -> o [N, H, V]``.
- ``causal_conv1d_varlen(x [N, C], weight [C, W], conv_pool [slots, C, W - 1] (in place), slots,
  has_state, cu_seqlens, max_query_len) -> y [N, C]``.
- ``moe_grouped(x [N, D], expert_ids [N, k], weights [N, k] f32, w_gate_up [E, 2I, D],
  w_down [E, D, I]) -> [N, D]``.
- ``sample_batch(logits [B, V], temperature [B], top_k [B] i32, top_p [B], min_p [B], seeds [B] i64,
  positions [B] i64, num_logprobs) -> (token_ids [B], logprobs [B], top_ids [B, n], top_logprobs [B, n])``.

A kernel not merged yet is listed in ``PENDING_KERNELS`` and its field is None: the ``triton``
backend then runs that op family's reference and says so once in the log. Wiring a kernel = import
it in ``library_kernels`` and drop its name from ``PENDING_KERNELS`` (a test holds the two in step).
"""

from collections.abc import Callable
from dataclasses import dataclass, fields

# Kernels whose Triton implementations land on other branches (issue 12 items 2-5).
PENDING_KERNELS = (
    "paged_indexer_topk",
    "paged_mla_decode",
    "kda_varlen",
    "causal_conv1d_varlen",
    "moe_grouped",
    "sample_batch",
)


@dataclass(frozen=True)
class TritonKernels:
    """The batch-level kernels (None: pending) and which of them run under the Triton interpreter."""

    paged_indexer_topk: Callable | None = None
    paged_mla_decode: Callable | None = None
    kda_varlen: Callable | None = None
    causal_conv1d_varlen: Callable | None = None
    moe_grouped: Callable | None = None
    sample_batch: Callable | None = None
    # Library kernels that cannot run under TRITON_INTERPRET (fla's, if so) are left out here.
    interpretable: frozenset[str] = frozenset()
    # Kernels that read FP8 rows; without this, ``--kv-format fp8`` cannot use them.
    reads_fp8: frozenset[str] = frozenset()

    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self) if f.name not in ("interpretable", "reads_fp8"))

    def missing(self) -> tuple[str, ...]:
        """Kernels with no implementation here."""
        return tuple(name for name in self.names() if getattr(self, name) is None)


def library_kernels() -> TritonKernels:
    """The kernels this build has (every one of them pending on this branch)."""
    return TritonKernels()
