"""Next-token sampling: a batch-independent, seedable sampler (its parameters: ``common.sampling_params``)."""

from services.engine.sampling.sampler import SampleOutput, sample

__all__ = ["SampleOutput", "sample"]
