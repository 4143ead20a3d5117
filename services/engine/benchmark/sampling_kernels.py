"""Device sampling at the full vocabulary: ``baton bench kernels --ops sampling``.

``kernels.sampling.sample.sample_batch`` (one sort + one Triton launch: temperature 0.8, top-p 0.9,
5 logprobs) at batch 1 / 32 / 256 against the per-row sampler it replaced
(``services.engine.sampling.sampler.sample``; batch <= 32 only, it is that slow), and the sort alone
(what ``sample_batch`` spends outside its kernel). GB/s of the float32 logits read, against the copy
bandwidth.
"""

import torch

from common.sampling_params import SamplingParams
from kernels.sampling.sample import sample_batch
from services.engine.sampling.sampler import sample

from .kernel_bench import KernelBenchContext, KernelResult
from .timing import device_us

BATCHES = (1, 32, 256)
PER_ROW_MAX_BATCH = 32
POSITION = 100


def bench_sampling(context: KernelBenchContext) -> list[KernelResult]:
    """``sample_batch`` and the sort alone, per batch."""
    return [row for batch in BATCHES for row in _rows(batch, context)]


def _rows(batch: int, context: KernelBenchContext) -> list[KernelResult]:
    device, vocab = context.device, context.config.vocab_size
    logits = torch.randn(batch, vocab, device=device) * 3
    temperature = torch.full((batch,), 0.8, device=device)
    top_k = torch.zeros(batch, dtype=torch.int32, device=device)
    top_p = torch.full((batch,), 0.9, device=device)
    min_p = torch.zeros(batch, device=device)
    seeds = torch.arange(batch, dtype=torch.int64, device=device)
    positions = torch.full((batch,), POSITION, dtype=torch.int64, device=device)
    nbytes, copy = logits.numel() * logits.element_size(), context.copy_bytes_per_s / 1e9
    ours = device_us(lambda: sample_batch(logits, temperature, top_k, top_p, min_p, seeds, positions, 5))
    sort = device_us(lambda: torch.sort(logits, dim=-1, descending=True, stable=True))
    peer, peer_name = None, ""
    if batch <= PER_ROW_MAX_BATCH:
        params = [SamplingParams(temperature=0.8, top_p=0.9, seed=i, logprobs=5) for i in range(batch)]
        peer = nbytes / device_us(lambda: sample(logits, params, [POSITION] * batch)) / 1e3
        peer_name = "per-row sampler (old)"
    return [
        KernelResult(
            "sampling", f"B={batch} sample_batch (top-p 0.9, 5 logprobs)", nbytes / ours / 1e3, "GB/s",
            copy, "copy", peer, peer_name,
        ),
        KernelResult("sampling", f"B={batch} torch.sort alone", nbytes / sort / 1e3, "GB/s", copy, "copy"),
    ]  # fmt: skip
