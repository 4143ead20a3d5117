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

``keyed_spans_checksum`` hashes byte spans by address instead (a parallel handoff's writes, keyed by
where they land): the byte at address ``a`` is its part ``b * 2^(8 (a mod 4))`` of word ``a div 4``,
weighed as that word. The sum is linear in the bytes, so any split of the same bytes into spans (two
senders each writing half of one word) gives one value, and whole-word spans give the row checksum's.
"""

import torch

from kernels.byte_runs.naive import byte_index

GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
SLICE_WORDS = 1 << 18  # words hashed per pass (temporaries of about 20 bytes a word stay in cache)
_MASK64 = (1 << 64) - 1


def as_int64(value: int) -> int:
    """An unsigned 64-bit value as the int64 with its bits (torch's int64 arithmetic wraps)."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _splitmix(pairs: torch.Tensor, key: int) -> torch.Tensor:
    """splitmix64 of ``pairs * golden + key`` for int64 ``pairs``, in place (int64 wraps)."""
    z = pairs.mul_(as_int64(GOLDEN)).add_(as_int64(key))
    for shift, multiplier in ((30, MIX1), (27, MIX2), (31, None)):
        z.bitwise_xor_((z >> shift).bitwise_and_((1 << (64 - shift)) - 1))  # a logical shift
        if multiplier is not None:
            z.mul_(as_int64(multiplier))
    return z


def _weights(start: int, count: int, key: int, device: torch.device) -> torch.Tensor:
    """``w_i`` for ``i`` in ``[start, start + count)`` (both even) as int64, each the low or high half of
    one splitmix64 output."""
    z = _splitmix(torch.arange(start // 2, (start + count) // 2, dtype=torch.int64, device=device), key)
    return z.view(torch.int32).to(torch.int64).bitwise_and_(0xFFFFFFFF)  # little-endian: low half first


def _word_weights(words: torch.Tensor, key: int) -> torch.Tensor:
    """``w_i`` for each of the int64 (non-negative) word indices ``words``."""
    z = _splitmix(words >> 1, key)
    high = (z >> 32).bitwise_and_(0xFFFFFFFF)
    return torch.where(words.bitwise_and(1).bool(), high, z.bitwise_and_(0xFFFFFFFF))


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


def keyed_spans_checksum(
    source: torch.Tensor, offsets: torch.Tensor, addresses: torch.Tensor, nbytes: torch.Tensor, key: int
) -> int:
    """The checksum of byte spans ``source[offsets[i] : offsets[i] + nbytes[i]]`` weighed as the bytes at
    addresses ``addresses[i] ..`` (the module docstring: each byte as its part of its 32-bit word).

    Args:
        source: ``[S]`` uint8, contiguous.
        offsets, addresses, nbytes: ``[N]`` int64 on the CPU (addresses non-negative, below ``2^63``);
            spans may be empty.
        key: the 64-bit key.

    Returns:
        The sum mod ``2^64``, as an unsigned Python int.
    """
    # Spans of whole words on both sides (nearly all of a handoff's) are read a word at a time.
    whole = (offsets | addresses | nbytes).bitwise_and(3) == 0
    if source.storage_offset() % 4:
        whole[:] = False
    total = 0
    if bool(whole.any()):
        words = source[: source.numel() // 4 * 4].view(torch.int32)
        for at, where, sizes in _span_slices(
            offsets[whole] >> 2, addresses[whole] >> 2, nbytes[whole] >> 2, SLICE_WORDS
        ):
            values = words[byte_index(at, sizes).to(source.device)].to(torch.int64).bitwise_and_(0xFFFFFFFF)
            total += int(values.mul_(_word_weights(byte_index(where, sizes).to(source.device), key)).sum())
    for at, where, sizes in _span_slices(offsets[~whole], addresses[~whole], nbytes[~whole], SLICE_WORDS * 4):
        where = byte_index(where, sizes).to(source.device)
        values = source[byte_index(at, sizes).to(source.device)].to(torch.int64)
        values.bitwise_left_shift_(where.bitwise_and(3).mul_(8))
        total += int(values.mul_(_word_weights(where >> 2, key)).sum())
    return total & _MASK64


def cut_spans(
    offsets: torch.Tensor, addresses: torch.Tensor, nbytes: torch.Tensor, limit: int, device=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The spans cut into pieces of at most ``limit`` bytes, in order (empty spans dropped):
    ``(offsets, addresses, nbytes)`` of the pieces, on ``device`` (default: the spans'). The spans
    travel there in one copy and the host computes only how many pieces there are, so a cut on a GPU
    needs no sync."""
    pieces = torch.div(nbytes + limit - 1, limit, rounding_mode="floor")
    total = int(pieces.sum())
    offsets, addresses, nbytes, pieces = torch.stack([offsets, addresses, nbytes, pieces]).to(
        device or nbytes.device
    )
    span = torch.repeat_interleave(torch.arange(len(pieces), device=pieces.device), pieces, output_size=total)
    step = (torch.arange(total, device=pieces.device) - (torch.cumsum(pieces, 0) - pieces)[span]) * limit
    return offsets[span] + step, addresses[span] + step, (nbytes[span] - step).clamp_(max=limit)


def _span_slices(offsets: torch.Tensor, addresses: torch.Tensor, nbytes: torch.Tensor, limit: int):
    """The spans' pieces (``cut_spans``) in groups of at most about ``limit`` bytes."""
    offsets, addresses, sizes = cut_spans(offsets, addresses, nbytes, limit)
    group = torch.div(torch.cumsum(sizes, 0) - sizes, limit, rounding_mode="floor")
    for first, count in zip(*_runs_of(group), strict=True):
        yield offsets[first : first + count], addresses[first : first + count], sizes[first : first + count]


def _runs_of(values: torch.Tensor) -> tuple[list[int], list[int]]:
    """``(starts, lengths)`` of the runs of equal consecutive ``values``."""
    if not len(values):
        return [], []
    _, counts = torch.unique_consecutive(values, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    return starts.tolist(), counts.tolist()
