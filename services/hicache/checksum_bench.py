"""Page checksum throughput: the tier's ``page_checksum`` (XXH3-64) against zlib's CRC-32 and
CRC32C (``google-crc32c``, when installed) on pages of a given size.

    python -m services.hicache.checksum_bench [--page-mib 1] [--pages 64] [--repeats 5]

Prints GB/s per checksum (the best of ``repeats`` passes over ``pages`` distinct random pages, so the
pages are not all in cache) and each one's speed relative to CRC-32.
"""

import argparse
import time
import zlib
from collections.abc import Callable

import numpy as np

from .page_checksum import page_checksum


def candidates() -> dict[str, Callable[[np.ndarray], int]]:
    """Name -> checksum of a uint8 array; CRC32C only when ``google_crc32c`` is importable."""
    found = {"zlib.crc32": zlib.crc32, "xxh3_64 (page_checksum)": page_checksum}
    try:
        import google_crc32c

        found[f"crc32c ({google_crc32c.implementation})"] = google_crc32c.value
    except ImportError:
        pass
    return found


def throughput(checksum: Callable[[np.ndarray], int], pages: list[np.ndarray], repeats: int) -> float:
    """Bytes per second of ``checksum`` over ``pages``, the best of ``repeats`` passes."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for page in pages:
            checksum(page)
        best = min(best, time.perf_counter() - start)
    return sum(page.nbytes for page in pages) / best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page-mib", type=float, default=1.0, help="page size in MiB")
    parser.add_argument("--pages", type=int, default=64, help="distinct pages per pass")
    parser.add_argument("--repeats", type=int, default=5, help="passes; the best one counts")
    args = parser.parse_args(argv)
    if args.page_mib <= 0 or args.pages < 1 or args.repeats < 1:
        parser.error("--page-mib must be > 0, --pages and --repeats >= 1")
    rng = np.random.default_rng(0)
    size = int(args.page_mib * (1 << 20))
    pages = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(args.pages)]
    rates = {name: throughput(fn, pages, args.repeats) for name, fn in candidates().items()}
    base = rates["zlib.crc32"]
    print(f"{args.pages} pages of {args.page_mib:g} MiB, best of {args.repeats}")
    for name, rate in rates.items():
        print(f"{name:28s} {rate / 1e9:7.2f} GB/s  {rate / base:5.1f}x CRC-32")


if __name__ == "__main__":
    main()
