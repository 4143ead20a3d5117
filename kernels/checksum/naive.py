"""The keyed row checksum, in torch integer ops: the reference (and the CPU path) of ``keyed_triton``.

Rows of a pool's ``[num_rows, row_bytes]`` uint8 storage, read as little-endian 32-bit words ``x_i``
(``i`` counting from ``start`` over the given rows in order, ``row_bytes / 4`` words each), hash to::

    sum_i x_i * w_i  mod 2^64,     w_i = splitmix64(i * golden + key)

(``splitmix64``: the finaliser ``z ^= z >> 30; z *= M1; z ^= z >> 27; z *= M2; z ^= z >> 31`` with
logical shifts). Integer arithmetic only: any device and any summation order give the same value.
"""

import torch

GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
SLICE_WORDS = 1 << 20  # words hashed per pass (bounds the temporaries: about 24 bytes a word)
_MASK64 = (1 << 64) - 1


def as_int64(value: int) -> int:
    """An unsigned 64-bit value as the int64 with its bits (torch's int64 arithmetic wraps)."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _weights(start: int, count: int, key: int, device: torch.device) -> torch.Tensor:
    """``w_i`` for ``i`` in ``[start, start + count)``, in place on one buffer (int64 wraps)."""
    z = torch.arange(start, start + count, dtype=torch.int64, device=device)
    z.mul_(as_int64(GOLDEN)).add_(as_int64(key))
    for shift, multiplier in ((30, MIX1), (27, MIX2), (31, None)):
        z.bitwise_xor_((z >> shift).bitwise_and_((1 << (64 - shift)) - 1))  # a logical shift
        if multiplier is not None:
            z.mul_(as_int64(multiplier))
    return z


def keyed_rows_checksum(storage: torch.Tensor, rows: torch.Tensor, start: int, key: int) -> int:
    """The checksum of ``storage[rows]`` under ``key``, its words numbered from ``start``.

    Args:
        storage: ``[num_rows, row_bytes]`` uint8, ``row_bytes`` a multiple of 4.
        rows: ``[R]`` int64 row ids, hashed in this order.
        start: the index of the first word.
        key: the 64-bit key (any Python int; taken mod ``2^64``).

    Returns:
        The sum mod ``2^64``, as an unsigned Python int.

    Raises:
        ValueError: rows whose byte length is not a multiple of 4.
    """
    if storage.shape[1] % 4:
        raise ValueError(f"storage: rows of {storage.shape[1]} bytes are not whole 32-bit words")
    total, index = 0, start
    words_per_row = storage.shape[1] // 4
    rows_per_slice = max(1, SLICE_WORDS // max(1, words_per_row))
    for first in range(0, rows.numel(), rows_per_slice):
        part = storage.index_select(0, rows[first : first + rows_per_slice]).reshape(-1).view(torch.int32)
        weights = _weights(index, part.numel(), key, part.device)
        total += int(weights.mul_(part.to(torch.int64).bitwise_and_(0xFFFFFFFF)).sum())
        index += part.numel()
    return total & _MASK64
