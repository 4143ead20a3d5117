"""KDA backends: the short convolution and the gated delta rule over the step's sequences, each
continuing its state slot in place.

``reference`` runs ``Numerics.causal_conv1d`` and ``Numerics.kda`` one sequence at a time (chunked
for prefill, recurrent for a decode token; CF-BI rows with their open chunk in batch-invariant
mode). ``triton`` runs ``causal_conv1d_varlen`` and ``kda_varlen`` on every row at once through
``cu_seqlens`` (``query_start_loc``) and the slot indices, with no gather or scatter of the state.

A verify step of ``--kda-rollback states`` (``meta.kda_token_slots``) also keeps the state after every
draft in its slot (``kernels/kda/token_slots.py``): the reference runs the tail, then each draft as a
one-token step from the state before it; the Triton kernels take the per-token slots directly.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from kernels.kda.fixed_chunk import FixedChunkState

from ..layer_cache import KdaLayerCache
from ..numerics import Numerics
from ..step_metadata import StepMetadata


class KdaBackend(ABC):
    """Short conv + KDA; ``graph_safe`` as for attention."""

    kind: str  # the backend name this implementation belongs to
    graph_safe: bool

    @abstractmethod
    def short_conv(
        self, x: torch.Tensor, weight: torch.Tensor, cache: KdaLayerCache, meta: StepMetadata
    ) -> torch.Tensor:
        """Causal depthwise conv + SiLU of each sequence's rows, continuing and updating ``cache.conv``.

        Args:
            x: ``[N, C]`` rows (``C = 3 * H * K``: q, k, v before the conv).
            weight: ``[C, W]`` taps.
            cache: the layer's slots.
            meta: the step (``kda_slots``, ``has_state``, ``query_start_loc``).

        Returns:
            ``[N, C]`` in ``x.dtype``.
        """

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        scale: float,
        cache: KdaLayerCache,
        meta: StepMetadata,
    ) -> torch.Tensor:
        """The gated delta rule over each sequence's rows, continuing and updating its slot.

        Args:
            q, k: ``[N, H, K]`` L2-normalised; v: ``[N, H, V]``; g: ``[N, H, K]`` float32 log decay;
            beta: ``[N, H]``; scale: query scale.
            cache: the layer's slots; meta: the step.

        Returns:
            ``o [N, H, V]`` in ``v.dtype``.
        """


class ReferenceKda(KdaBackend):
    kind = "reference"
    graph_safe = False

    def __init__(self, nx: Numerics):
        self.nx = nx

    def short_conv(self, x, weight, cache, meta):
        out = torch.empty_like(x)
        for rows, read, write, fresh in _segments(meta):
            state = None if fresh else cache.conv[read]
            out[rows], new_state = self.nx.causal_conv1d(x[rows], weight, state)
            cache.conv[write] = new_state.to(cache.conv.dtype)
        return out

    def forward(self, q, k, v, g, beta, scale, cache, meta):
        out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        for rows, read, write, fresh in _segments(meta):
            previous = None if fresh else self.read_state(cache, read)
            out[rows], state = self.nx.kda(q[rows], k[rows], v[rows], g[rows], beta[rows], scale, previous)
            self.write_state(cache, write, state)
        return out

    @staticmethod
    def read_state(cache: KdaLayerCache, slot: int) -> torch.Tensor | FixedChunkState:
        """The slot's state as ``Numerics.kda`` continues it (a copy of the CF-BI rows when kept)."""
        if not cache.has_open_rows:
            return cache.recurrent[slot]
        return FixedChunkState(
            s0=cache.recurrent[slot].clone(),
            open_k=cache.open_k[slot].clone(),
            open_g=cache.open_g[slot].clone(),
            open_delta=cache.open_delta[slot].clone(),
            count=int(cache.open_count[slot][0]),
        )

    @staticmethod
    def write_state(cache: KdaLayerCache, slot: int, state: torch.Tensor | FixedChunkState) -> None:
        """Store the state ``Numerics.kda`` returned into the slot."""
        if isinstance(state, FixedChunkState):
            cache.recurrent[slot] = state.s0
            cache.open_k[slot] = state.open_k
            cache.open_g[slot] = state.open_g
            cache.open_delta[slot] = state.open_delta
            cache.open_count[slot] = state.count
        else:
            cache.recurrent[slot] = state


def _segments(meta: StepMetadata) -> list[tuple[slice, int, int, bool]]:
    """The reference's runs over a step: ``(rows, slot read, slot written, fresh)``, one per sequence, or
    with per-token slots its own tokens, then each draft alone, reading the state the one before left."""
    token_slots = None if meta.kda_token_slots is None else meta.kda_token_slots.tolist()
    segments = []
    for seq in range(meta.num_seqs):
        rows, slot, fresh = meta.rows(seq), meta.kda_slots_host[seq], meta.past_lens_host[seq] == 0
        columns = [slot] * (rows.stop - rows.start) if token_slots is None else token_slots[seq]
        own = next((t for t in range(rows.stop - rows.start) if columns[t] != slot), rows.stop - rows.start)
        segments.append((slice(rows.start, rows.start + own), slot, slot, fresh))
        read = slot
        for t in range(own, rows.stop - rows.start):
            segments.append((slice(rows.start + t, rows.start + t + 1), read, columns[t], False))
            read = columns[t]
    return segments


class TritonKda(KdaBackend):
    """``causal_conv1d_varlen`` and ``kda_varlen`` (signatures in ``triton_kernels``)."""

    kind = "triton"
    graph_safe = True

    def __init__(self, causal_conv1d_varlen: Callable, kda_varlen: Callable):
        self.causal_conv1d_varlen = causal_conv1d_varlen
        self.kda_varlen = kda_varlen

    def short_conv(self, x, weight, cache, meta):
        return self.causal_conv1d_varlen(
            x,
            weight,
            cache.conv,
            meta.kda_slots,
            meta.has_state,
            meta.query_start_loc,
            meta.max_query_len,
            meta.kda_token_slots,
        )

    def forward(self, q, k, v, g, beta, scale, cache, meta):
        return self.kda_varlen(
            q,
            k,
            v,
            g,
            beta,
            scale,
            cache.recurrent,
            meta.kda_slots,
            meta.has_state,
            meta.query_start_loc,
            meta.max_query_len,
            meta.any_fresh,
            meta.kda_token_slots,
        )
