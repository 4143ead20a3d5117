"""``tile_dot``: a Triton tile product whose row results do not depend on the row's place in the tile.

On a GPU it is ``tl.dot`` (each output element one fixed sequence of MMA steps). Under the Triton
interpreter (CPU) ``tl.dot`` is a numpy product, and the BLAS behind it may round a row differently by
its position inside the tile (OpenBLAS on AMD EPYC does), so a kernel that promises batch invariance
would keep it only on some machines. There the products are upcast to float32 and summed over the
chunk's K in index order instead: the same for every row, whatever the BLAS.
"""

import triton
import triton.language as tl


@triton.jit
def tile_dot(a, b, acc, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
    """``acc + a @ b`` for tiles ``a [BM, BK]``, ``b [BK, BN]`` and a float32 ``acc [BM, BN]``."""
    if INTERPRETED:
        return acc + tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    else:
        return tl.dot(a, b, acc, input_precision=PRECISION)
