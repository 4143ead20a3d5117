"""KDA across PCP ranks: each rank runs its zigzag pieces; the state entering a piece comes from the
pieces before it, which other ranks hold.

Short conv: a piece's first outputs read the last ``W - 1`` inputs before it (the halo). Every rank
sends the last ``W - 1`` rows of each of its pieces (all-gather); the tail entering chunk ``i`` is
``tail_{i-1}`` shifted by chunk ``i - 1``'s rows, a copy, so it has the single-rank bits.

Recurrence, default numerics (a scan of chunk transitions). Within a piece the state update is
affine in the state entering it: ``S_out = A S_in + B``, ``A [H, K, K]``, ``B [H, K, V]`` (the gated
delta rule is linear in ``(S, v)`` jointly). One pass from ``[I | 0]`` with values ``[0 | v]`` gives
``[A | B]`` (columns of the state do not mix). The transitions are all-gathered and every rank scans
them in position order from the cached state (or zeros), which gives each piece its ``S_in``; a second
pass computes the piece's outputs from it. The final state is the scan's last value, the same bits on
every rank, and every rank writes it to the slot (each keeps a full cache, as for MLA).

Recurrence, batch-invariant numerics (a relay). CF-BI moves the state at each 16-row chunk end by
``exp(G) S0 + sum_s k_s delta_s^T`` with ``delta`` read from that same ``S0``; composing a chunk as
``A S0 + B`` is the same algebra but different float rounding, so a scan cannot give the bits of one
rank (or of decode). Instead the exact CF-BI state (``S0`` and the open rows) is handed from the
owner of each piece to the owner of the next, in position order (point-to-point, fixed order), and
each piece runs the same rows a single rank would: PCP 2 equals PCP 1 bitwise, the KDA recurrence
runs one rank at a time (the token-local work around it stays parallel). The final state is
broadcast from the last piece's owner and written on every rank.
"""

import torch
import torch.distributed as dist

from kernels.kda.fixed_chunk import FixedChunkState
from services.engine.model.backends.kda import KdaBackend, ReferenceKda
from services.engine.model.layer_cache import KdaLayerCache
from services.engine.model.numerics import Numerics

from .zigzag import ZigzagPlan


class PcpKda(KdaBackend):
    """The KDA backend of one PCP rank for one step (the ``meta`` arguments are this rank's pieces,
    the plan says where every piece sits; a rank holding no row still joins every exchange)."""

    kind = "pcp"
    graph_safe = False

    def __init__(self, nx: Numerics, plan: ZigzagPlan, rank: int, group: dist.ProcessGroup):
        self.nx, self.plan, self.rank, self.group = nx, plan, rank, group
        self.peers = dist.get_process_group_ranks(group)  # global rank of each PCP rank
        self.local = {}  # (seq, chunk) -> this rank's rows of that piece
        offset = 0
        for piece in plan.rank_pieces(rank):
            self.local[(piece.seq, piece.chunk)] = slice(offset, offset + piece.length)
            offset += piece.length

    def _piece_index(self, chunk: int) -> int:
        """Which of a rank's two pieces of a sequence ``chunk`` is (0: first, 1: second)."""
        return 0 if chunk < self.plan.pcp else 1

    def short_conv(self, x, weight, cache: KdaLayerCache, meta):
        halo = weight.shape[-1] - 1
        seqs = len(self.plan.steps)
        tails = x.new_zeros(seqs, 2, halo, x.shape[-1])
        for (seq, chunk), rows in self.local.items():
            tail = x[rows][-halo:]
            tails[seq, self._piece_index(chunk), halo - tail.shape[0] :] = tail
        parts = [torch.empty_like(tails) for _ in self.peers]
        dist.all_gather(parts, tails, group=self.group)
        out = torch.empty_like(x)
        for seq, pieces in enumerate(self.plan.pieces):
            step = self.plan.steps[seq]
            state = cache.conv[step.slot].clone()
            if step.past == 0:
                state.zero_()
            for piece in pieces:
                if piece.length == 0:
                    continue
                if piece.rank == self.rank:
                    rows = self.local[(seq, piece.chunk)]
                    out[rows], _ = self.nx.causal_conv1d(x[rows], weight, state)
                kept = min(halo, piece.length)
                tail = parts[piece.rank][seq, self._piece_index(piece.chunk), halo - kept :]
                state = torch.cat([state, tail.transpose(0, 1).to(state.dtype)], -1)[:, -halo:]
            cache.conv[step.slot] = state
        return out

    def forward(self, q, k, v, g, beta, scale, cache: KdaLayerCache, meta):
        out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        if self.nx.batch_invariant:
            self._relay(q, k, v, g, beta, scale, cache, out)
        else:
            self._scan(q, k, v, g, beta, scale, cache, out)
        return out

    def _scan(self, q, k, v, g, beta, scale, cache, out) -> None:
        heads, k_dim, v_dim = k.shape[1], k.shape[2], v.shape[2]
        seqs = len(self.plan.steps)
        transitions = torch.zeros(seqs, 2, heads, k_dim, k_dim + v_dim, dtype=torch.float32, device=v.device)
        identity = torch.eye(k_dim, dtype=torch.float32, device=v.device).expand(heads, k_dim, k_dim)
        start = torch.cat([identity, identity.new_zeros(heads, k_dim, v_dim)], -1)  # [I | 0]
        for (seq, chunk), rows in self.local.items():
            values = torch.cat([v.new_zeros(v[rows].shape[0], heads, k_dim), v[rows]], -1)  # [0 | v]
            _, transitions[seq, self._piece_index(chunk)] = self.nx.kda(
                q[rows], k[rows], values, g[rows], beta[rows], scale, start
            )
        parts = [torch.empty_like(transitions) for _ in self.peers]
        dist.all_gather(parts, transitions, group=self.group)
        for seq, pieces in enumerate(self.plan.pieces):
            step = self.plan.steps[seq]
            state = cache.recurrent[step.slot].clone() if step.past > 0 else None
            for piece in pieces:
                if piece.length == 0:
                    continue
                if piece.rank == self.rank:
                    rows = self.local[(seq, piece.chunk)]
                    out[rows], _ = self.nx.kda(q[rows], k[rows], v[rows], g[rows], beta[rows], scale, state)
                pair = parts[piece.rank][seq, self._piece_index(piece.chunk)]
                moved = pair[..., :k_dim] @ state if state is not None else 0.0
                state = moved + pair[..., k_dim:]
            cache.recurrent[step.slot] = state

    def _relay(self, q, k, v, g, beta, scale, cache, out) -> None:
        for seq, pieces in enumerate(self.plan.pieces):
            step = self.plan.steps[seq]
            held = [p for p in pieces if p.length]
            state = ReferenceKda.read_state(cache, step.slot) if step.past > 0 else None
            for index, piece in enumerate(held):
                if piece.rank != self.rank:
                    continue
                if index > 0 and held[index - 1].rank != self.rank:
                    state = self._receive(cache, held[index - 1].rank)
                rows = self.local[(seq, piece.chunk)]
                out[rows], state = self.nx.kda(q[rows], k[rows], v[rows], g[rows], beta[rows], scale, state)
                if index + 1 < len(held) and held[index + 1].rank != self.rank:
                    self._send(state, held[index + 1].rank)
            last = held[-1].rank
            travelling = _state_tensors(state if last == self.rank else self._empty_state(cache))
            for tensor in travelling:
                dist.broadcast(tensor, self.peers[last], group=self.group)
            ReferenceKda.write_state(cache, step.slot, _state_from(travelling))

    @staticmethod
    def _empty_state(cache: KdaLayerCache) -> FixedChunkState:
        heads, k_dim, v_dim = cache.recurrent.shape[1:]
        return FixedChunkState.zeros(heads, k_dim, v_dim, cache.recurrent.device)

    def _send(self, state: FixedChunkState, to: int) -> None:
        for tensor in _state_tensors(state):
            dist.send(tensor, self.peers[to], group=self.group)

    def _receive(self, cache: KdaLayerCache, source: int) -> FixedChunkState:
        travelling = _state_tensors(self._empty_state(cache))
        for tensor in travelling:
            dist.recv(tensor, self.peers[source], group=self.group)
        return _state_from(travelling)


def _state_tensors(state: FixedChunkState) -> list[torch.Tensor]:
    """A CF-BI state as the tensors it travels as (the open-row count as a one-element tensor)."""
    parts = [state.s0, state.open_k, state.open_g, state.open_delta]
    count = torch.tensor([state.count], dtype=torch.int64, device=state.s0.device)
    return [part.contiguous().clone() for part in parts] + [count]


def _state_from(tensors: list[torch.Tensor]) -> FixedChunkState:
    s0, open_k, open_g, open_delta, count = tensors
    return FixedChunkState(s0, open_k, open_g, open_delta, int(count[0]))
