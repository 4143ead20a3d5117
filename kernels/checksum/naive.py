"""The keyed row checksum, in torch integer ops: the reference (and the CPU path) of ``keyed_triton``.

Rows of a pool's ``[num_rows, row_bytes]`` uint8 storage, read as little-endian 32-bit words ``x_i``
(``i`` counting from an even ``start`` over the given rows in order, ``row_bytes / 4`` words each, rows
of whole 64-bit words), hash to::

    sum_i x_i * w_i  mod 2^64,     w_2j + 2^32 * w_2j+1 = splitmix64(j * golden + key)

so each 32-bit weight is one half of a splitmix64 output, one output per pair of words (``splitmix64``:
the finaliser ``z ^= z >> 30; z *= M1; z ^= z >> 27; z *= M2; z ^= z >> 31`` with logical shifts).
Weights of 32 bits keep every product below ``2^64``: a change to one word never cancels, and a change
to several cancels for at most one value of the weight of the word whose difference has the fewest
trailing zero bits (probability ``2^-32`` for weights the writer cannot predict). Integer arithmetic
only: any device and any summation order give the same value.
"""

import torch

GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
SLICE_WORDS = 1 << 18  # words hashed per pass (temporaries of about 20 bytes a word stay in cache)
_MASK64 = (1 << 64) - 1


def as_int64(value: int) -> int:
    """An unsigned 64-bit value as the int64 with its bits (torch's int64 arithmetic wraps)."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _weights(start: int, count: int, key: int, device: torch.device) -> torch.Tensor:
    """``w_i`` for ``i`` in ``[start, start + count)`` (both even) as int64, each the low or high half of
    one splitmix64 output (computed in place on one buffer: int64 wraps)."""
    z = torch.arange(start // 2, (start + count) // 2, dtype=torch.int64, device=device)
    z.mul_(as_int64(GOLDEN)).add_(as_int64(key))
    for shift, multiplier in ((30, MIX1), (27, MIX2), (31, None)):
        z.bitwise_xor_((z >> shift).bitwise_and_((1 << (64 - shift)) - 1))  # a logical shift
        if multiplier is not None:
            z.mul_(as_int64(multiplier))
    return z.view(torch.int32).to(torch.int64).bitwise_and_(0xFFFFFFFF)  # little-endian: low half first


def check_alignment(storage: torch.Tensor, start: int) -> None:
    """Rows of whole 64-bit words and an even first word: each splitmix64 output weighs one pair.

    Raises:
        ValueError: either does not hold.
    """
    if storage.shape[1] % 8:
        raise ValueError(f"storage: rows of {storage.shape[1]} bytes are not whole 64-bit words")
    if start % 2:
        raise ValueError(f"start: word {start} is odd; the words are weighed in pairs")


def keyed_rows_checksum(storage: torch.Tensor, rows: torch.Tensor, start: int, key: int) -> int:
    """The checksum of ``storage[rows]`` under ``key``, its words numbered from ``start``.

    Args:
        storage: ``[num_rows, row_bytes]`` uint8, ``row_bytes`` a multiple of 8.
        rows: ``[R]`` int64 row ids, hashed in this order.
        start: the index of the first word (even).
        key: the 64-bit key (any Python int; taken mod ``2^64``).

    Returns:
        The sum mod ``2^64``, as an unsigned Python int.

    Raises:
        ValueError: rows whose byte length is not a multiple of 8, or an odd ``start``.
    """
    check_alignment(storage, start)
    total, index = 0, start
    words_per_row = storage.shape[1] // 4
    rows_per_slice = max(1, SLICE_WORDS // max(1, words_per_row))
    for first in range(0, rows.numel(), rows_per_slice):
        part = storage.index_select(0, rows[first : first + rows_per_slice]).reshape(-1).view(torch.int32)
        weights = _weights(index, part.numel(), key, part.device)
        total += int(weights.mul_(part.to(torch.int64).bitwise_and_(0xFFFFFFFF)).sum())
        index += part.numel()
    return total & _MASK64
