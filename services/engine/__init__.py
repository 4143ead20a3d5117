"""The engine shared by the prefill and decode services: model, cache, scheduler, sampling.

``from services.engine import LLM, SamplingParams`` is the in-process API.
"""

from .llm import LLM
from .request import RequestOutput
from .sampling import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
