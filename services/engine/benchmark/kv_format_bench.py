"""How FP8 KV storage changes the model: DSA indexer selections and logprobs, against model-dtype storage.

The same prompts run through the model on a paged cache twice, once per block format, in prefill
chunks (so later chunks attend to what earlier ones cached). Reported: the overlap of each DSA
top-k selection with the unquantised run's (|A ∩ B| / |A|, averaged over every query of every
indexed layer), and the absolute difference of next-token logprobs (taken at the unquantised run's
argmax, at the prompt's own next token, and over the whole vocabulary). On real text the prompt's own
next token is the log-prob a perplexity is made of (``baton eval``).
"""

import dataclasses
from dataclasses import dataclass

import torch

from kernels.kda.fixed_chunk import CHUNK as FIXED_CHUNK
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import block_layout, slot_layout
from services.engine.cache.paged_cache import PagedModelCache
from services.engine.cache.state_pool import StateSlotPool
from services.engine.model.backends.attention import selection_mask
from services.engine.model.backends.indexer import IndexerBackend
from services.engine.model.causal_lm import CausalLM
from services.engine.model.step_metadata import SequenceStep, build_step_metadata


@dataclass(frozen=True)
class KvFormatReport:
    """FP8 against model-dtype storage, over ``tokens`` positions."""

    tokens: int
    bytes_per_token_auto: int
    bytes_per_token_fp8: int
    indexer_overlap: float | None  # None: the model has no DSA indexer
    logprob_abs_diff_mean: float
    logprob_abs_diff_max: float
    next_token_logprob_abs_diff_mean: float  # at prompt[i + 1], over every position but each prompt's last
    next_token_logprob_abs_diff_max: float
    vocab_logprob_abs_diff_max: float
    argmax_agreement: float


class _Recording(IndexerBackend):
    """The model's indexer backend, keeping every selection as a ``[N, length]`` mask."""

    def __init__(self, inner: IndexerBackend, length: int):
        self.inner, self.length = inner, length
        self.kind, self.graph_safe = inner.kind, inner.graph_safe
        self.selections: list[torch.Tensor] = []

    def topk(self, q, weights, cache, meta, topk, scale):
        chosen = self.inner.topk(q, weights, cache, meta, topk, scale)
        self.selections.append(selection_mask(chosen, self.length))
        return chosen


def _run(model: CausalLM, kv_format: str, prompt: list[int], chunk: int, block: int):
    dtype, device = model.lm_head.weight.dtype, model.lm_head.weight.device
    layout = block_layout(model.config, block, dtype, kv_format)
    blocks = BlockPool(layout, block, -(-len(prompt) // block), device)
    open_rows = FIXED_CHUNK if model.numerics.batch_invariant else 0  # CF-BI KDA keeps its open chunk
    slots = StateSlotPool(slot_layout(model.config, dtype, open_rows), 1, device)
    table, slot = tuple(blocks.allocate(blocks.num_blocks)), slots.allocate()
    cache = PagedModelCache(blocks, slots, model.config, dtype)
    kernels = model.kernels
    recording = _Recording(kernels.indexer, len(prompt))
    model.kernels = dataclasses.replace(kernels, indexer=recording)
    try:
        pieces = []
        with torch.no_grad():
            for start in range(0, len(prompt), chunk):
                ids = tuple(prompt[start : start + chunk])
                meta = build_step_metadata(
                    [SequenceStep(ids, start, table, slot)],
                    block,
                    device,
                    logit_rows=list(range(len(ids))),
                    index_topk=model.index_topk,
                )
                pieces.append(model.forward_step(meta, cache))
    finally:
        model.kernels = kernels
    return torch.cat(pieces).float(), recording.selections, layout.nbytes // block


def measure_kv_format(
    model: CausalLM, prompts: list[list[int]], chunk: int = 64, block: int = 16
) -> KvFormatReport:
    """Compare FP8 and model-dtype block storage on ``prompts`` (see the module docstring).

    Raises:
        ValueError: a prompt shorter than two tokens (it has no next token of its own to score).
    """
    if any(len(prompt) < 2 for prompt in prompts):
        raise ValueError("prompts: each needs at least two tokens")
    overlaps, diffs, next_diffs, vocab_max, agree, tokens = [], [], [], 0.0, 0, 0
    for prompt in prompts:
        auto_logits, auto_sel, auto_bytes = _run(model, "auto", prompt, chunk, block)
        fp8_logits, fp8_sel, fp8_bytes = _run(model, "fp8", prompt, chunk, block)
        for a, b in zip(auto_sel, fp8_sel, strict=True):
            overlaps.append(((a & b).sum(-1).float() / a.sum(-1).clamp_min(1)).flatten())
        auto_lp, fp8_lp = torch.log_softmax(auto_logits, -1), torch.log_softmax(fp8_logits, -1)
        best = auto_lp.argmax(-1, keepdim=True)
        diffs.append((auto_lp.gather(-1, best) - fp8_lp.gather(-1, best)).abs().flatten())
        following = torch.tensor(prompt[1:], device=auto_lp.device)[:, None]
        next_diffs.append(
            (auto_lp[:-1].gather(-1, following) - fp8_lp[:-1].gather(-1, following)).abs().flatten()
        )
        vocab_max = max(vocab_max, float((auto_lp - fp8_lp).abs().max()))
        agree += int((fp8_lp.argmax(-1, keepdim=True) == best).sum())
        tokens += len(prompt)
    diff, next_diff = torch.cat(diffs), torch.cat(next_diffs)
    return KvFormatReport(
        tokens=tokens,
        bytes_per_token_auto=auto_bytes,
        bytes_per_token_fp8=fp8_bytes,
        indexer_overlap=float(torch.cat(overlaps).mean()) if overlaps else None,
        logprob_abs_diff_mean=float(diff.mean()),
        logprob_abs_diff_max=float(diff.max()),
        next_token_logprob_abs_diff_mean=float(next_diff.mean()),
        next_token_logprob_abs_diff_max=float(next_diff.max()),
        vocab_logprob_abs_diff_max=vocab_max,
        argmax_agreement=agree / tokens,
    )
