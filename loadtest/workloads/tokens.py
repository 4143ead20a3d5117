"""Deterministic token ids: a stream per key, a block per trace hash id, a prompt per hash-id list.

Every id comes from SHAKE-256 of a JSON key (an extendable-output hash: any number of bytes), so ids
are the same in every process, Python version and platform (Python's ``hash()`` of strings is salted
per process and is never used). Ids lie in ``[low, vocab)``: pass ``vocab`` as the count of ordinary
tokens (Baton's tokenizers put their special tokens at the top, from id ``vocab`` on) and ``low``
above any control ids at the bottom (Llama-style BOS/EOS/pad at 0..2), so no prompt holds an EOS.

A stream of ``n`` ids is the first ``n`` ids of the same key's longer streams, so a block cut short
(the last, partial block of a trace line) is a prefix of the full block.
"""

import hashlib
import json
from collections.abc import Sequence

import numpy as np

DEFAULT_LOW_ID = 16  # clears the control ids most vocabularies keep at the bottom

_MAX_VOCAB = 2**32  # one id per 4 bytes of hash output


def _check_range(vocab: int, low: int) -> None:
    if not 0 <= low < vocab <= _MAX_VOCAB:
        raise ValueError(f"vocab: need 0 <= low < vocab <= 2**32, got low={low}, vocab={vocab}")


def token_stream(key: object, n: int, vocab: int, low: int = DEFAULT_LOW_ID) -> tuple[int, ...]:
    """``n`` ids in ``[low, vocab)`` drawn from ``key``.

    Args:
        key: any JSON-serialisable value naming the stream (e.g. ``["synthetic", seed, 3]``); equal
            keys give equal streams, different keys independent ones.
        n: number of ids (>= 0).
        vocab, low: the id range.

    Returns:
        The ids; ``token_stream(key, m) == token_stream(key, n)[:m]`` for ``m <= n``.
    """
    _check_range(vocab, low)
    if n < 0:
        raise ValueError(f"n: must be >= 0, got {n}")
    if n == 0:
        return ()
    seed = json.dumps(key, separators=(",", ":"), sort_keys=True).encode()
    raw = np.frombuffer(hashlib.shake_256(seed).digest(4 * n), dtype="<u4").astype(np.int64)
    return tuple((low + raw % (vocab - low)).tolist())


def block_tokens(
    hash_id: int, size: int, vocab: int, salt: str = "", low: int = DEFAULT_LOW_ID
) -> tuple[int, ...]:
    """The ``size`` token ids standing for trace block ``hash_id``.

    Equal ``(salt, hash_id)`` give equal blocks (a shared prefix in the trace is a shared prefix at
    the server); different hash ids or salts give unrelated blocks. The salt keeps id spaces apart:
    two trace files whose ids are local to each file use different salts.
    """
    return token_stream(["block", salt, hash_id], size, vocab, low)


def tail_tokens(
    last_hash_id: int | None, size: int, vocab: int, salt: str = "", low: int = DEFAULT_LOW_ID
) -> tuple[int, ...]:
    """Filler after a prompt's last hash block (trace lengths that are not whole blocks).

    Derived from the last hash id, so two prompts ending in the same block end the same way.
    """
    return token_stream(["tail", salt, last_hash_id], size, vocab, low)


def prompt_from_hash_ids(
    hash_ids: Sequence[int],
    block_size: int,
    input_length: int,
    vocab: int,
    salt: str = "",
    low: int = DEFAULT_LOW_ID,
    cache: dict | None = None,
) -> tuple[int, ...]:
    """A prompt of exactly ``input_length`` ids built block by block from trace hash ids.

    ::

        hash_ids = [h0, h1, h2], block_size = b
        input_length >= 3b:  | block(h0) | block(h1) | block(h2) | tail(h2) ... |
        input_length <  3b:  | block(h0) | block(h1) | block(h2) cut |

    Args:
        hash_ids: one id per block, in prompt order.
        block_size: ids per block (already scaled, see ``scale.TokenScale``).
        input_length: the prompt length (already scaled).
        vocab, salt, low: as for ``block_tokens``.
        cache: optional dict reused across calls of one load, so a block shared by many prompts is
            built once and its ids are shared objects (a long trace holds far fewer distinct ints).
    """
    if block_size < 1:
        raise ValueError(f"block_size: must be >= 1, got {block_size}")
    if input_length < 0:
        raise ValueError(f"input_length: must be >= 0, got {input_length}")
    cache = {} if cache is None else cache
    parts: list[tuple[int, ...]] = []
    total = 0
    for hash_id in hash_ids:
        if total >= input_length:
            break
        key = (salt, hash_id, block_size, vocab, low)
        block = cache.get(key)
        if block is None:
            block = cache[key] = block_tokens(hash_id, block_size, vocab, salt, low)
        parts.append(block)
        total += block_size
    prompt = tuple(token for part in parts for token in part)
    if total >= input_length:
        return prompt[:input_length]
    last = hash_ids[-1] if len(hash_ids) else None
    return prompt + tail_tokens(last, input_length - total, vocab, salt, low)
