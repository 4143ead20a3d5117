"""The flattened batch a forward runs on: several sequences' new tokens, back to back.

```
 rows:      | seq 0: 5 new tokens | seq 1: 1 token | seq 2: 3 new tokens |
 start:       0                     5                6
 positions:   past0 .. past0+4      past1            past2 .. past2+2
```
Token-local work (projections, norms, MoE) runs on all rows at once; attention and KDA run per
sequence against that sequence's cache (``ModelCache``).
"""

from dataclasses import dataclass
from typing import Protocol

import torch

from .state import KdaLayerState


@dataclass(frozen=True)
class SequenceSlice:
    """One sequence's new tokens: rows ``[start, start + length)``, positions from ``past``."""

    start: int
    length: int
    past: int

    @property
    def rows(self) -> slice:
        return slice(self.start, self.start + self.length)

    @property
    def total(self) -> int:
        """Tokens in the cache once these are written."""
        return self.past + self.length


@dataclass(frozen=True)
class ForwardBatch:
    """Token ids ``[N]``, their positions ``[N]`` and the sequences they belong to."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    sequences: tuple[SequenceSlice, ...]

    @staticmethod
    def build(
        new_tokens: list[list[int]], past: list[int], device: str | torch.device = "cpu"
    ) -> "ForwardBatch":
        """Flatten per-sequence new token ids, given how many tokens each sequence already cached."""
        slices, ids, positions, start = [], [], [], 0
        for tokens, cached in zip(new_tokens, past, strict=True):
            if not tokens:
                raise ValueError("every sequence in a forward batch needs at least one new token")
            slices.append(SequenceSlice(start=start, length=len(tokens), past=cached))
            ids.extend(tokens)
            positions.extend(range(cached, cached + len(tokens)))
            start += len(tokens)
        return ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.long, device=device),
            positions=torch.tensor(positions, dtype=torch.long, device=device),
            sequences=tuple(slices),
        )

    def last_rows(self) -> torch.Tensor:
        """Row index of each sequence's last new token (where its next-token logits come from)."""
        return torch.tensor([s.start + s.length - 1 for s in self.sequences], device=self.input_ids.device)


class ModelCache(Protocol):
    """Where layers keep per-sequence state; ``seq`` indexes ``ForwardBatch.sequences``.

    Implementations: ``ContiguousCache`` (plain tensors, the reference) and the engine's paged cache
    (packed blocks and KDA state slots).
    """

    def write_mla(
        self,
        layer: int,
        seq: int,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> None:
        """Store the new tokens' ``latent [T, Dc]``, ``k_rope [T, Dr]``, ``index_keys [T, Di]``."""

    def read_mla(self, layer: int, seq: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """All cached tokens of the sequence (new ones included): ``[S, Dc]``, ``[S, Dr]``, ``[S, Di]``."""

    def read_kda(self, layer: int, seq: int) -> KdaLayerState | None:
        """The KDA state after the sequence's past tokens, or None when it has none yet."""

    def write_kda(self, layer: int, seq: int, state: KdaLayerState) -> None:
        """The KDA state after the new tokens."""
