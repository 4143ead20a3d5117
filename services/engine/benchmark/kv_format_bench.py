"""How FP8 KV storage changes the model: DSA indexer selections and logprobs, against model-dtype storage.

The same prompts run through the model on a paged cache twice, once per block format, in prefill
chunks (so later chunks attend to what earlier ones cached). Reported: the overlap of each DSA
top-k selection with the unquantised run's (|A ∩ B| / |A|, averaged over every query of every
indexed layer), and the absolute difference of next-token logprobs (taken at the unquantised run's
argmax, and over the whole vocabulary).
"""

from dataclasses import dataclass

import torch

import services.engine.model.indexer as indexer_module
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import block_layout, slot_layout
from services.engine.cache.paged_cache import PagedModelCache, SequenceCacheRef
from services.engine.cache.state_pool import StateSlotPool
from services.engine.model.causal_lm import CausalLM
from services.engine.model.forward_batch import ForwardBatch


@dataclass(frozen=True)
class KvFormatReport:
    """FP8 against model-dtype storage, over ``tokens`` positions."""

    tokens: int
    bytes_per_token_auto: int
    bytes_per_token_fp8: int
    indexer_overlap: float | None  # None: the model has no DSA indexer
    logprob_abs_diff_mean: float
    logprob_abs_diff_max: float
    vocab_logprob_abs_diff_max: float
    argmax_agreement: float


def _run(model: CausalLM, kv_format: str, prompt: list[int], chunk: int, block: int):
    dtype = model.lm_head.weight.dtype
    layout = block_layout(model.config, block, dtype, kv_format)
    blocks = BlockPool(layout, block, -(-len(prompt) // block), model.lm_head.weight.device)
    slots = StateSlotPool(slot_layout(model.config, dtype), 1, model.lm_head.weight.device)
    table, slot = tuple(blocks.allocate(blocks.num_blocks)), slots.allocate()
    selections: list[torch.Tensor] = []
    original = indexer_module.indexer_topk

    def recording(scores, visible, topk):
        chosen = original(scores, visible, topk)
        selections.append(chosen)
        return chosen

    indexer_module.indexer_topk = recording
    try:
        pieces = []
        with torch.no_grad():
            for start in range(0, len(prompt), chunk):
                ids = prompt[start : start + chunk]
                cache = PagedModelCache(
                    blocks, slots, [SequenceCacheRef(table, slot, start)], model.config, dtype
                )
                pieces.append(
                    model.forward_batch(ForwardBatch.build([ids], [start], blocks.storage.device), cache)
                )
    finally:
        indexer_module.indexer_topk = original
    return torch.cat(pieces).float(), selections, layout.nbytes // block


def measure_kv_format(
    model: CausalLM, prompts: list[list[int]], chunk: int = 64, block: int = 16
) -> KvFormatReport:
    """Compare FP8 and model-dtype block storage on ``prompts`` (see the module docstring)."""
    overlaps, diffs, vocab_max, agree, tokens = [], [], 0.0, 0, 0
    for prompt in prompts:
        auto_logits, auto_sel, auto_bytes = _run(model, "auto", prompt, chunk, block)
        fp8_logits, fp8_sel, fp8_bytes = _run(model, "fp8", prompt, chunk, block)
        for a, b in zip(auto_sel, fp8_sel, strict=True):
            overlaps.append(((a & b).sum(-1).float() / a.sum(-1).clamp_min(1)).flatten())
        auto_lp, fp8_lp = torch.log_softmax(auto_logits, -1), torch.log_softmax(fp8_logits, -1)
        best = auto_lp.argmax(-1, keepdim=True)
        diffs.append((auto_lp.gather(-1, best) - fp8_lp.gather(-1, best)).abs().flatten())
        vocab_max = max(vocab_max, float((auto_lp - fp8_lp).abs().max()))
        agree += int((fp8_lp.argmax(-1, keepdim=True) == best).sum())
        tokens += len(prompt)
    diff = torch.cat(diffs)
    return KvFormatReport(
        tokens=tokens,
        bytes_per_token_auto=auto_bytes,
        bytes_per_token_fp8=fp8_bytes,
        indexer_overlap=float(torch.cat(overlaps).mean()) if overlaps else None,
        logprob_abs_diff_mean=float(diff.mean()),
        logprob_abs_diff_max=float(diff.max()),
        vocab_logprob_abs_diff_max=vocab_max,
        argmax_agreement=agree / tokens,
    )
