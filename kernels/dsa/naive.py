"""DeepSeek sparse attention (DSA) lightning indexer references.

The indexer scores every visible past token for each query with a few small heads::

    I[t, s] = sum_h  w[t, h] * ReLU(scale * q[t, h] . k[s])

and the MLA layer then attends only to the ``min(topk, visible)`` highest-scoring tokens. Ties are
broken by position (the lower position wins), so the selection is a pure function of the scores.
"""

import torch


def indexer_scores(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, scale: float) -> torch.Tensor:
    """Index scores in float32.

    Args:
        q: ``[B, T, Hi, Di]`` indexer queries.
        k: ``[B, S, Di]`` indexer keys (one per token, shared by the heads).
        weights: ``[B, T, Hi]`` per-query head weights.
        scale: dot-product scale (``Di ** -0.5``).

    Returns:
        ``[B, T, S]`` float32 scores (not masked).
    """
    per_head = torch.relu(torch.einsum("bthd,bsd->bths", q.float(), k.float()) * scale)
    return torch.einsum("bth,bths->bts", weights.float(), per_head)


def indexer_topk(scores: torch.Tensor, visible: torch.Tensor, topk: int) -> torch.Tensor:
    """Select, per query row, the ``min(topk, number visible)`` best visible keys.

    Args:
        scores: ``[B, T, S]`` float32.
        visible: ``[B, T, S]`` bool, True where the key may be selected (causal mask).
        topk: the indexer's budget (``index_topk``).

    Returns:
        ``[B, T, S]`` bool, True at the selected keys. Order: higher score first, then lower position.
    """
    masked = scores.masked_fill(~visible, float("-inf"))
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices[..., :topk]
    selected = torch.zeros_like(visible)
    selected.scatter_(-1, order, True)
    return selected & visible
