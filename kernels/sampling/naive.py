"""Batched sampling reference (float32, one row at a time) and the counter-based random numbers it uses.

Randomness: token j of a row drawn at ``position`` with 64-bit key ``seed`` uses one Philox4x32-10
word, ``philox(key = seed, counter = (j, position_lo, position_hi, 0))[0]`` (Triton's
``tl.philox``), turned into an Exp(1) draw ``q_j``; the row's token is ``argmax_j p_j / q_j`` over
the tokens its filters keep (the exponential race, distributed as p). So a token depends only on
the row's logits, parameters, seed and position, never on the batch, and a recomputed or
cache-restored request draws the same tokens. Same contract as
``services.engine.sampling.sampler`` (which uses torch generators); the streams differ.
"""

import random

import torch

MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1
# SystemRandom reads the OS entropy source; it has no state of its own to share or reseed.
_SYSTEM_RANDOM = random.SystemRandom()
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
SERIES_BELOW = 0.01  # below this uniform, -log(1 - e) by its series (1 - e would lose e's bits)


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of ``a * b`` for 32-bit ``a`` and ``b`` (int64 tensors, no overflow)."""
    low16, high16 = b & 0xFFFF, b >> 16
    t, u = a * low16, a * high16  # each < 2**48
    return (u + (t >> 16)) >> 16, (((u & 0xFFFF) << 16) + t) & MASK32


def philox_word(seed: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor) -> torch.Tensor:
    """First word of Philox4x32-10 with key ``seed`` (int64, low word first) and counter ``(c0, c1, c2, 0)``.

    Bitwise equal to ``tl.philox(seed, c0, c1, c2, 0)[0]`` with uint32 counters. Broadcasting int64
    tensors; returns int64 values in ``[0, 2**32)``.
    """
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    c0, c1, c2, c3 = c0 & MASK32, c1 & MASK32, c2 & MASK32, torch.zeros_like(c0)
    for _ in range(10):
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & MASK32, (k1 + _KEY_B) & MASK32
    return c0


def exponential_from_word(word: torch.Tensor) -> torch.Tensor:
    """Exp(1) draw from a uniform 32-bit word: ``e = (word + 0.5) / 2**32``, ``q = -log(1 - e)`` (float32)."""
    e = (word.to(torch.float32) + 0.5) * 2.0**-32
    series = e * (1.0 + e * (0.5 + e * (1.0 / 3.0 + e * 0.25)))
    return torch.where(e < SERIES_BELOW, series, -torch.log(1.0 - e))


def race_noise(seed: int, position: int, token_ids: torch.Tensor) -> torch.Tensor:
    """``q`` of the given token ids for one row: ``[V]`` float32 Exp(1) draws."""
    ids = token_ids.to(torch.int64)
    pos = torch.tensor(position, dtype=torch.int64, device=ids.device)
    seed_t = torch.tensor(seed, dtype=torch.int64, device=ids.device)
    word = philox_word(seed_t, ids, pos & MASK32, (pos >> 32) & MASK32)
    return exponential_from_word(word)


def host_seeds(seeds: list[int | None]) -> list[int]:
    """Philox keys for a batch's rows, on the host: a seeded row's key is its seed as a signed 64-bit
    int; an unseeded row gets a fresh key from the OS each step (this is no sync of the forward)."""
    keys = []
    for seed in seeds:
        key = _SYSTEM_RANDOM.getrandbits(64) if seed is None else seed & _MASK64
        keys.append(key - (1 << 64) if key >= 1 << 63 else key)
    return keys


def allowed_tokens(row: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float):
    """``(probs, keep)`` of one float32 ``[V]`` row after temperature, top-k, top-p and min-p.

    Same rules as ``services.engine.sampling.sampler``: top-k keeps values >= the k-th largest (ties
    kept), top-p keeps a token while the mass strictly before it (sorted, ties by id) is < top_p,
    min-p keeps ``p >= min_p * max p``; temperature 0 keeps only the first argmax.
    """
    vocab = row.shape[0]
    if temperature == 0.0:
        keep = torch.zeros(vocab, dtype=torch.bool, device=row.device)
        keep[torch.argmax(row)] = True
        return keep.to(torch.float32), keep
    x = row / temperature
    if 0 < top_k < vocab:
        kth = torch.topk(x, top_k, sorted=False).values.min()
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    keep = probs > 0
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True, stable=True)
        before = torch.zeros_like(sorted_probs)
        torch.cumsum(sorted_probs[:-1], dim=0, out=before[1:])
        keep[order[before >= top_p]] = False
    if min_p > 0.0:
        keep &= probs >= min_p * probs.max()
    return probs, keep


def sample_batch(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    num_logprobs: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one token per row (reference: a Python loop over rows in float32).

    Args:
        logits: ``[B, V]`` any float dtype, computed on in float32.
        temperature: ``[B]`` float32, 0 = greedy (first argmax).
        top_k: ``[B]`` int32, 0 (or >= V) = off.
        top_p: ``[B]`` float32 in ``(0, 1]``, 1 = off.
        min_p: ``[B]`` float32 in ``[0, 1]``, 0 = off.
        seeds: ``[B]`` int64 Philox keys (unseeded rows: a fresh key drawn on the host, ``host_seeds``).
        positions: ``[B]`` int64 index of the token being drawn in its request.
        num_logprobs: n, how many top raw logprobs to return per row (host int, may be 0).

    Returns:
        ``(token_ids [B] int64, logprobs [B] float32, top_ids [B, n] int64, top_logprobs [B, n] float32)``;
        logprobs are ``log_softmax`` of the unmodified float32 logits; the top n are sorted by value
        descending then id ascending.
    """
    batch, vocab = logits.shape
    device = logits.device
    token_ids = torch.empty(batch, dtype=torch.int64, device=device)
    logprobs = torch.empty(batch, dtype=torch.float32, device=device)
    top_ids = torch.empty(batch, num_logprobs, dtype=torch.int64, device=device)
    top_logprobs = torch.empty(batch, num_logprobs, dtype=torch.float32, device=device)
    ids = torch.arange(vocab, device=device)
    for i in range(batch):
        row = logits[i].to(torch.float32)
        params = (float(temperature[i]), int(top_k[i]), float(top_p[i]), float(min_p[i]))
        probs, keep = allowed_tokens(row, *params)
        if params[0] == 0.0:
            token = int(torch.argmax(row))
        else:
            q = race_noise(int(seeds[i]), int(positions[i]), ids)
            token = int(torch.argmax(torch.where(keep, probs / q, -1.0)))
        raw = torch.log_softmax(row, dim=-1)
        token_ids[i] = token
        logprobs[i] = raw[token]
        values, order = torch.sort(raw, descending=True, stable=True)
        top_ids[i], top_logprobs[i] = order[:num_logprobs], values[:num_logprobs]
    return token_ids, logprobs, top_ids, top_logprobs
