"""Next-token sampling: per-request parameters and a batch-independent, seedable sampler."""

from services.engine.sampling.params import SamplingParams
from services.engine.sampling.sampler import SampleOutput, sample

__all__ = ["SampleOutput", "SamplingParams", "sample"]
