"""Stand-in kernels: plain PyTorch with the ``triton`` backend's batch-level signatures.

They exercise the backend's glue (absorbed MLA, the metadata tensors, slot indices, padded rows)
and CUDA-graph capture before the real Triton kernels are merged: every one reads only device
tensors (no host sync, fixed shapes for a fixed step shape), so a graph can capture it. They are
test doubles, not oracles: the ``reference`` backend is the oracle they are checked against.
``sample_batch`` here is greedy only.
"""

import torch
import torch.nn.functional as F

from services.engine.model.backends import TritonKernels
from services.engine.model.backends.attention import selection_mask


def _rows_of(cache: torch.Tensor, block_tables: torch.Tensor, query_seq: torch.Tensor) -> torch.Tensor:
    """``[T, max_blocks * B, dim]``: every block of each row's sequence, in position order."""
    tables = block_tables[query_seq.long()].long()
    return cache[tables].reshape(tables.shape[0], -1, cache.shape[-1])


def paged_indexer_topk(q, weights, key_cache, block_tables, query_seq, query_pos, topk, scale, max_seq_len):
    keys = _rows_of(key_cache, block_tables, query_seq).float()
    per_head = torch.relu(torch.einsum("thd,tsd->ths", q.float(), keys) * scale)
    scores = torch.einsum("th,ths->ts", weights.float(), per_head)
    positions = torch.arange(keys.shape[1], device=q.device)
    visible = positions[None, :] <= query_pos[:, None]
    order = torch.sort(scores.masked_fill(~visible, float("-inf")), dim=-1, descending=True, stable=True)
    picked = order.indices[:, :topk]
    picked = torch.where(visible.gather(1, picked), picked, -1).to(torch.int32)
    return F.pad(picked, (0, topk - picked.shape[1]), value=-1)


def paged_mla_decode(
    q_latent,
    q_rope,
    latent_cache,
    rope_cache,
    block_tables,
    query_seq,
    query_pos,
    topk_positions,
    scale,
    max_seq_len,
):
    latent = _rows_of(latent_cache, block_tables, query_seq).float()
    rope = _rows_of(rope_cache, block_tables, query_seq).float()
    scores = torch.einsum("thc,tsc->ths", q_latent.float(), latent)
    scores = (scores + torch.einsum("thd,tsd->ths", q_rope.float(), rope)) * scale
    positions = torch.arange(latent.shape[1], device=latent.device)
    allowed = positions[None, :] <= query_pos[:, None]
    if topk_positions is not None:
        allowed = selection_mask(topk_positions, latent.shape[1])
    scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("ths,tsc->thc", torch.exp(scores - lse[..., None]), latent)
    return out.to(q_latent.dtype), lse


def _row_sequences(cu_seqlens: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = torch.arange(num_rows, device=cu_seqlens.device)
    seq = torch.searchsorted(cu_seqlens[1:].long(), rows, right=True)
    return seq, rows - cu_seqlens[seq].long()


def causal_conv1d_varlen(x, weight, conv_pool, slots, has_state, cu_seqlens, max_query_len):
    num_rows, channels = x.shape
    taps = weight.shape[1]
    seq, local = _row_sequences(cu_seqlens, num_rows)
    previous = conv_pool[slots.long()].to(weight.dtype) * has_state[:, None, None]
    padded = torch.zeros(
        slots.shape[0], channels, taps - 1 + max_query_len, dtype=weight.dtype, device=x.device
    )
    padded[:, :, : taps - 1] = previous
    padded[seq, :, taps - 1 + local] = x.to(weight.dtype)
    y = F.silu(F.conv1d(padded, weight.unsqueeze(1), groups=channels))[seq, :, local]
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    tail = lengths[:, None] + torch.arange(taps - 1, device=x.device)[None, :]
    conv_pool[slots.long()] = padded.gather(2, tail[:, None, :].expand(-1, channels, -1)).to(conv_pool.dtype)
    return y.to(x.dtype)


def kda_varlen(q, k, v, g, beta, scale, state_pool, slots, has_state, cu_seqlens, max_query_len):
    num_rows = q.shape[0]
    starts, lengths = cu_seqlens[:-1].long(), (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    state = state_pool[slots.long()].float() * has_state[:, None, None, None]
    # One spare output row takes the writes of sequences shorter than the step's longest.
    out = torch.zeros(num_rows + 1, *v.shape[1:], dtype=torch.float32, device=v.device)
    for t in range(max_query_len):
        active = t < lengths
        rows = torch.where(active, starts + t, num_rows)
        index = rows.clamp(max=num_rows - 1)
        qt, kt, vt, gt, bt = (x[index].float() for x in (q, k, v, g, beta))
        new = state * gt.exp()[..., None]
        delta = (vt - (new * kt[..., None]).sum(-2)) * bt[..., None]
        new = new + kt[..., None] * delta[..., None, :]
        out[rows] = (new * (qt * scale)[..., None]).sum(-2)
        state = torch.where(active[:, None, None, None], new, state)
    state_pool[slots.long()] = state
    return out[:num_rows].to(v.dtype)


def moe_grouped(x, expert_ids, weights, w_gate_up, w_down):
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert in range(w_gate_up.shape[0]):
        weight = (weights * (expert_ids == expert)).sum(-1)
        gate, up = F.linear(x, w_gate_up[expert]).chunk(2, dim=-1)
        out += weight[:, None] * F.linear(F.silu(gate) * up, w_down[expert]).float()
    return out.to(x.dtype)


def sample_batch(logits, temperature, top_k, top_p, min_p, seeds, positions, num_logprobs):
    raw = torch.log_softmax(logits.float(), dim=-1)
    tokens = torch.argmax(logits.float(), dim=-1)
    top = torch.topk(raw, num_logprobs, dim=-1)
    return tokens, raw.gather(1, tokens[:, None])[:, 0], top.indices, top.values


STAND_INS = TritonKernels(
    paged_indexer_topk=paged_indexer_topk,
    paged_mla_decode=paged_mla_decode,
    kda_varlen=kda_varlen,
    causal_conv1d_varlen=causal_conv1d_varlen,
    moe_grouped=moe_grouped,
    sample_batch=sample_batch,
    interpretable=frozenset(TritonKernels().names()),
)
