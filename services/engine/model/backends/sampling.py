"""Sampling backends: ``reference`` is ``services.engine.sampling.sample`` (row by row, on the host
side of the device); ``triton`` runs ``sample_batch`` on the whole batch on the device (Philox with
(seed, position) as the counter, so a token still depends only on its row, seed and position).
The two draw from different random streams (torch generators, Philox), so a seeded request repeats
its tokens within a backend, not across them; greedy tokens agree.

The triton path is split so CUDA graphs can capture the device part: ``inputs`` packs the rows'
parameters into device tensors (one copy), ``sample_device`` runs the kernel, ``to_output`` reads
the result back once.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from common.sampling_params import SamplingParams
from kernels.sampling.naive import host_seeds
from services.engine.sampling import SampleOutput, sample


class SamplingBackend(ABC):
    """Picks one token per logits row; ``graph_safe`` when ``sample_device`` exists and syncs nothing."""

    kind: str  # the backend name this implementation belongs to
    graph_safe: bool

    @abstractmethod
    def sample(
        self, logits: torch.Tensor, params: list[SamplingParams], positions: list[int]
    ) -> SampleOutput:
        """``logits [B, V]``, one ``SamplingParams`` and generated-token count per row -> tokens, logprobs."""


class ReferenceSampling(SamplingBackend):
    kind = "reference"
    graph_safe = False

    def sample(self, logits, params, positions):
        return sample(logits, params, positions)


@dataclass(frozen=True)
class SamplingInputs:
    """Device tensors for ``sample_batch`` (``B`` rows): ``temperature [B]`` f32 (0 = greedy),
    ``top_k [B]`` i32 (0 = off), ``top_p [B]``, ``min_p [B]`` f32, ``seeds [B]``, ``positions [B]`` i64;
    ``num_logprobs`` (host) top entries to return per row; ``packed`` the device bytes they view
    (a CUDA graph refills it: ``inputs(..., out=packed)``)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    seeds: torch.Tensor
    positions: torch.Tensor
    num_logprobs: int
    packed: torch.Tensor


class TritonSampling(SamplingBackend):
    """``sample_batch`` (signature in ``triton_kernels``)."""

    kind = "triton"
    graph_safe = True

    def __init__(self, sample_batch: Callable):
        self.sample_batch = sample_batch

    def sample(self, logits, params, positions):
        inputs = self.inputs(params, positions, logits.device)
        return self.to_output(self.sample_device(logits, inputs), params)

    def inputs(
        self,
        params: list[SamplingParams],
        positions: list[int],
        device: torch.device,
        num_logprobs: int | None = None,
        out: torch.Tensor | None = None,
    ) -> SamplingInputs:
        """Pack the rows' parameters and copy them to ``device`` at once (into ``out`` when given: a
        CUDA graph's static buffer, which also fixes ``num_logprobs``)."""
        seeds = host_seeds([p.seed for p in params])  # unseeded rows: a fresh key from the OS each step
        host = torch.cat(
            [
                torch.tensor(seeds + list(positions), dtype=torch.int64).view(torch.uint8),
                torch.tensor(
                    [0.0 if p.greedy else p.temperature for p in params]
                    + [p.top_p for p in params]
                    + [p.min_p for p in params],
                    dtype=torch.float32,
                ).view(torch.uint8),
                torch.tensor([p.top_k for p in params], dtype=torch.int32).view(torch.uint8),
            ]
        )
        if out is None:
            out = torch.empty_like(host, device=device)
        out.copy_(host.pin_memory() if out.is_cuda else host, non_blocking=True)
        rows = len(params)
        wide, floats = out[: 16 * rows].view(torch.int64), out[16 * rows : 28 * rows].view(torch.float32)
        if num_logprobs is None:
            num_logprobs = max((p.logprobs or 0 for p in params), default=0)
        return SamplingInputs(
            temperature=floats[:rows],
            top_p=floats[rows : 2 * rows],
            min_p=floats[2 * rows :],
            top_k=out[28 * rows :].view(torch.int32),
            seeds=wide[:rows],
            positions=wide[rows:],
            num_logprobs=num_logprobs,
            packed=out,
        )

    def sample_device(self, logits: torch.Tensor, inputs: SamplingInputs) -> tuple[torch.Tensor, ...]:
        """``(token_ids [B], logprobs [B], top_ids [B, n], top_logprobs [B, n])`` on the device."""
        return self.sample_batch(
            logits,
            inputs.temperature,
            inputs.top_k,
            inputs.top_p,
            inputs.min_p,
            inputs.seeds,
            inputs.positions,
            inputs.num_logprobs,
        )

    @staticmethod
    def to_output(result: tuple[torch.Tensor, ...], params: list[SamplingParams]) -> SampleOutput:
        """Read ``sample_device``'s result back (the first ``len(params)`` rows) as a ``SampleOutput``."""
        rows = len(params)
        token_ids, logprobs, top_ids, top_logprobs = (t[:rows].cpu() for t in result)
        tokens, values = token_ids.tolist(), logprobs.tolist()
        ids, tops = top_ids.tolist(), top_logprobs.tolist()
        return SampleOutput(
            token_ids=tokens,
            logprobs=[None if p.logprobs is None else values[i] for i, p in enumerate(params)],
            top_logprobs=[
                list(zip(ids[i][: p.logprobs], tops[i][: p.logprobs], strict=True)) if p.logprobs else None
                for i, p in enumerate(params)
            ],
        )
