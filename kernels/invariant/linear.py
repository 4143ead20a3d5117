"""Batch-invariant matrix products: a fixed-tile BLAS call and a tree-ordered reference.

``F.linear`` on CPU (MKL sgemm) picks its kernel by shape: a row gets different bits when the batch
has 1, 2, 3 or 7 rows than inside a 64-row batch. Measured on torch 2.13 / MKL 2024.2 (AVX-512,
1 and 2 threads), any row count that is a multiple of ``TILE_ROWS`` gives a row the same bits
whatever the count (16 ... 4096 rows tried) and whatever the row's position, for K, M from 8 to
7168. ``fixed_linear`` therefore pads the rows to that multiple; its invariance is empirical and
is what ``tests/kernels/test_invariant_ops.py`` checks. Across thread counts it holds only in MKL's
strict reproducible mode (``reproducible_blas``): outside it, MKL on some x86 CPUs picks other
kernels for 1 and 2 threads. ``tree_linear`` is invariant by
construction (``tree_sum`` over products) and slow: the reference for ``fixed_linear``.

One call over all the padded rows is not enough elsewhere: cuBLAS picks kernels (split-K among them)
by the row count, and another CPU's BLAS (the H200 host's, torch 2.11) gave a row different bits at
K = 1024 for different multiples of 16. So ``fixed_linear`` issues one call per ``TILE_ROWS``-row
tile, every call the same shape, on every device.

Columns too: tensor parallelism gives a rank a slice of a weight's output rows, and the slice's
columns must keep the bits they have in the full product. MKL gave other bits for widths below 16
and for 17 ... 23 (2026-12-01, K from 4 to 7168); with the weight padded to a multiple of
``TILE_ROWS`` rows every width and offset tried (1 ... 300) gave a column the bits it has in the full
product, which ``fixed_linear_is_invariant`` also probes. (A Triton kernel with a fixed tiling is
the fast way on GPU; this is the correct one.)
"""

import torch
import torch.nn.functional as F

from kernels.invariant.reduce import tree_sum

TILE_ROWS = 16
# Bound on the [rows, cols, K] product tensor ``tree_linear`` materialises at once (16 MiB float32).
_TREE_CHUNK_ELEMENTS = 1 << 22


def fixed_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` in float32 with the row count padded to a multiple of ``TILE_ROWS``.

    Args:
        x: ``[N, K]`` (or ``[..., K]``), any float dtype, any strides.
        weight: ``[M, K]``.

    Returns:
        ``[N, M]`` (``[..., M]``) float32.

    Invariant (empirical, see module docstring): an output's bits depend only on its row of ``x`` and
    its row of ``weight``, not on N, M, its position, or the other rows. The weight is padded with
    zero rows to a multiple of ``TILE_ROWS``. The rows are copied into a fresh zeroed
    contiguous ``[ceil(N / TILE_ROWS) * TILE_ROWS, K]`` buffer so strides and alignment never vary,
    and every GEMM call has exactly ``TILE_ROWS`` rows (see the module docstring for why one call over
    all rows is not enough). The same bits were measured with 1 and 2 threads; bits may differ between
    machines or BLAS builds, so on a new machine rerun the tests before trusting it.
    """
    k = x.shape[-1]
    rows = x.reshape(-1, k)
    n = rows.shape[0]
    padded = torch.zeros(-(-n // TILE_ROWS) * TILE_ROWS, k, dtype=torch.float32, device=x.device)
    padded[:n] = rows
    m = weight.shape[0]
    w = weight.to(torch.float32).contiguous()
    if m % TILE_ROWS:
        w = torch.cat([w, w.new_zeros(TILE_ROWS - m % TILE_ROWS, k)])
    out = torch.cat([F.linear(tile, w) for tile in padded.split(TILE_ROWS)])
    return out[:n, :m].reshape(*x.shape[:-1], m)


def tree_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` as ``tree_sum(x[:, None, :] * weight[None], -1)``, in float32.

    Args:
        x: ``[N, K]`` (or ``[..., K]``).
        weight: ``[M, K]``.

    Returns:
        ``[N, M]`` (``[..., M]``) float32.

    Invariant by construction: each output is one correctly rounded product per k followed by a
    ``tree_sum`` over K, so it depends only on its row of ``x`` and its row of ``weight``. Chunking
    over rows and columns (to bound memory) cannot change a result.
    """
    k = x.shape[-1]
    rows = x.reshape(-1, k).to(torch.float32)
    w = weight.to(torch.float32)
    n, m = rows.shape[0], w.shape[0]
    col_chunk = max(1, min(m, _TREE_CHUNK_ELEMENTS // max(k, 1)))
    row_chunk = max(1, _TREE_CHUNK_ELEMENTS // max(k * col_chunk, 1))
    out = torch.zeros(n, m, dtype=torch.float32, device=x.device)
    for r in range(0, n, row_chunk):
        for c in range(0, m, col_chunk):
            prod = rows[r : r + row_chunk, None, :] * w[None, c : c + col_chunk, :]
            out[r : r + row_chunk, c : c + col_chunk] = tree_sum(prod, -1)
    return out.reshape(*x.shape[:-1], m)


def fixed_linear_is_invariant(weight: torch.Tensor, probe_rows: int = 37) -> bool:
    """Check, in this process, that ``fixed_linear`` with this weight gives rows batch-invariant bits.

    ``fixed_linear``'s invariance is measured, not guaranteed (module docstring): this probe runs
    random rows alone and inside batches of several sizes, in shuffled order, and compares bits; and
    halves and quarters of the weight's rows (a tensor-parallel rank's slice) against the full product.
    Callers fall back to ``tree_linear`` where it fails.
    """
    generator = torch.Generator().manual_seed(1234)
    rows = torch.randn(probe_rows, weight.shape[-1], generator=generator).to(weight.device)
    alone = torch.cat([fixed_linear(rows[i : i + 1], weight) for i in range(probe_rows)])
    order = torch.randperm(probe_rows, generator=generator).to(weight.device)
    for count in (2, 7, 16, 17, probe_rows):
        picked = order[:count]
        if not torch.equal(
            fixed_linear(rows[picked], weight).view(torch.int32), alone[picked].view(torch.int32)
        ):
            return False
    whole = fixed_linear(rows, weight).view(torch.int32)
    for parts in (2, 4):
        start = 0
        for piece in weight.tensor_split(parts):
            columns = whole[:, start : start + piece.shape[0]]
            if not torch.equal(fixed_linear(rows, piece).view(torch.int32), columns):
                return False
            start += piece.shape[0]
    return True
