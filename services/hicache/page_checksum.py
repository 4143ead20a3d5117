"""The checksum every host-tier and L3 page carries: XXH3-64 of its bytes (``xxhash``).

A page is checksummed when its put commits and verified on every read, so the hash runs over every
byte the tier moves: XXH3-64 does about 30 GB/s per core where zlib's CRC-32 did about 1
(``python -m services.hicache.checksum_bench``; ``docs/performance.md``, "HiCache page checksums").
It detects corruption (flipped bits, torn writes), not tampering.
"""

import xxhash

CHECKSUM_BYTES = 8  # a checksum stored beside a page's bytes (the L3's header), little-endian


def page_checksum(page) -> int:
    """XXH3-64 of ``page``'s bytes, an int in ``[0, 2**64)``.

    Args:
        page: a contiguous buffer: ``bytes``, a ``memoryview``, a numpy array, or a contiguous CPU
            ``torch.Tensor`` (read through ``.numpy()``, no copy).
    """
    if hasattr(page, "numpy"):
        page = page.numpy()
    return xxhash.xxh3_64_intdigest(page)
