"""Scaling trace token counts down by an integer factor while keeping the block structure.

Public traces carry contexts of tens or hundreds of thousands of tokens; a small model on a CPU
replays them with ``--scale K``. The rule (``TokenScale``) keeps every hash block, so the number of
blocks and which prompts share which blocks are exactly the trace's:

- block size ``b``            -> ``b' = max(1, b // K)`` ids per hash id
- input length ``in``         -> ``in' = max(1, ceil(in / K), full * b')``, where
  ``full = min(len(hash_ids), in // b)`` is the count of complete blocks in the trace request
- output length ``out``       -> ``max(1, ceil(out / K))``

The ``full * b'`` term only matters when ``K > b`` (``b' = 1`` then exceeds ``b / K``): it keeps one
id per complete block instead of merging blocks. Otherwise ``in'`` is just ``ceil(in / K)``.

::

    Mooncake, b = 512, in = 1300, 3 hash ids, K = 64 (b' = 8, in' = ceil(20.3) = 21):
        trace:  | h0: 512 | h1: 512 | h2: 276 of 512 |
        scaled: | h0: 8 | h1: 8 | h2: 5 of 8 |
    WEKA, b = 64, in = 200, 3 hash ids (whole blocks only), K = 64 (b' = 1, in' = 4):
        trace:  | h0: 64 | h1: 64 | h2: 64 | 8 more |
        scaled: | h0 | h1 | h2 | tail(h2) |

Two scaled prompts that share their first ``k`` complete trace blocks share exactly ``k * b'``
leading ids (the next blocks differ, up to a chance equal first id).
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenScale:
    """Divide trace token counts by ``factor`` (>= 1; 1 replays the trace as recorded)."""

    factor: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.factor, bool) or not isinstance(self.factor, int) or self.factor < 1:
            raise ValueError(f"scale: must be an integer >= 1, got {self.factor!r}")

    def block_size(self, block_size: int) -> int:
        """Ids per hash block after scaling."""
        return max(1, block_size // self.factor)

    def input_length(self, input_length: int, num_hash_ids: int, block_size: int) -> int:
        """Prompt length after scaling (``block_size`` is the trace's, unscaled)."""
        full = min(num_hash_ids, input_length // block_size)
        return max(1, math.ceil(input_length / self.factor), full * self.block_size(block_size))

    def output_length(self, output_length: int) -> int:
        """Tokens to generate after scaling (at least one)."""
        return max(1, math.ceil(output_length / self.factor))


def check_time_scale(time_scale: float) -> float:
    """Validate a time divisor (trace seconds are divided by it: 2.0 replays twice as fast)."""
    if isinstance(time_scale, bool) or not isinstance(time_scale, int | float) or not time_scale > 0:
        raise ValueError(f"time_scale: must be a number > 0, got {time_scale!r}")
    return float(time_scale)


def check_max_input_tokens(max_input_tokens: int | None) -> int | None:
    """Validate the prompt-length cap (None: no cap)."""
    if max_input_tokens is not None and (not isinstance(max_input_tokens, int) or max_input_tokens < 1):
        raise ValueError(f"max_input_tokens: must be an integer >= 1 or None, got {max_input_tokens!r}")
    return max_input_tokens
