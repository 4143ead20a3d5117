"""The engine shared by the prefill and decode services: model, cache, scheduler, sampling.

``from services.engine import LLM, SamplingParams`` is the in-process API.
"""

from common.sampling_params import SamplingParams
from kernels.invariant.reproducible_blas import request_strict_mkl

from .llm import LLM
from .request import RequestOutput

# Batch-invariant mode needs MKL's strict mode; MKL reads it at its first call (not at torch's import).
request_strict_mkl()

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
