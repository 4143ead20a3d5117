"""Pretraining data: documents tokenized into one stream, cut into fixed windows, read in a seeded order.

::

    stream   doc0 tokens EOS doc1 tokens EOS doc2 ...          (int32, encoded once, cached on disk)
    windows  [0 .. L) [L .. 2L) [2L .. 3L) ...                   (the last partial window is dropped)
    order    epoch e visits the windows in randperm(n, seed + e); batch k takes order positions
             k*B .. k*B+B-1 of the epochs laid end to end

A run's data position is one integer (windows consumed so far), so a resumed run reads exactly the
windows the uninterrupted run would have.
"""

import hashlib
from collections.abc import Iterable
from pathlib import Path

import torch

from common.tokenizer import Tokenizer


def encode_documents(documents: Iterable[str], tokenizer: Tokenizer) -> torch.Tensor:
    """``[N] int32``: every non-empty document's tokens followed by the tokenizer's first EOS id.

    Raises:
        ValueError: the tokenizer has no EOS token.
    """
    if not tokenizer.eos_token_ids:
        raise ValueError("--tokenizer: the tokenizer names no eos_token; documents are separated by it")
    eos = tokenizer.eos_token_ids[0]
    pieces = [torch.tensor([*tokenizer.encode(text), eos], dtype=torch.int32) for text in documents if text]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int32)


def cached_stream(path: Path, documents: Iterable[str], tokenizer_dir: Path) -> torch.Tensor:
    """``encode_documents`` of ``documents``, kept in ``path`` and reused while the tokenizer is the same.

    The cache is keyed by the SHA-256 of ``tokenizer.json``; a different tokenizer re-encodes.
    """
    key = hashlib.sha256((tokenizer_dir / "tokenizer.json").read_bytes()).hexdigest()
    if path.is_file():
        cached = torch.load(path, weights_only=True)
        if cached["tokenizer_sha256"] == key:
            return cached["tokens"]
    tokens = encode_documents(documents, Tokenizer.from_pretrained(tokenizer_dir))
    partial = path.with_suffix(".partial")
    torch.save({"tokenizer_sha256": key, "tokens": tokens}, partial)
    partial.replace(path)
    return tokens


class TokenWindows:
    """Fixed windows of a token stream, visited epoch by epoch in a seeded permutation.

    Args:
        tokens: ``[N]`` the stream.
        length: tokens per window.
        seed: the order's seed (epoch ``e`` uses ``seed + e``).
        flag: the flag naming the stream, for errors.

    Raises:
        ValueError: the stream holds no whole window.
    """

    def __init__(self, tokens: torch.Tensor, length: int, seed: int, flag: str):
        self.count = tokens.numel() // length
        if self.count == 0:
            raise ValueError(
                f"{flag}: {tokens.numel()} tokens hold no window of --seq-len {length}; give more text "
                "or a shorter --seq-len"
            )
        self.windows = tokens[: self.count * length].reshape(self.count, length).long()
        self.seed = seed
        self._orders: dict[int, torch.Tensor] = {}

    def batch(self, position: int, size: int) -> torch.Tensor:
        """``[size, length]`` the windows at order positions ``position .. position + size - 1``."""
        picks = []
        for index in range(position, position + size):
            epoch, offset = divmod(index, self.count)
            picks.append(int(self._order(epoch)[offset]))
        return self.windows[picks]

    def first(self, size: int) -> torch.Tensor:
        """``[min(size, count), length]`` the first windows in stream order (the fixed held-out set)."""
        return self.windows[:size]

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._orders = {epoch: torch.randperm(self.count, generator=generator)}
        return self._orders[epoch]
