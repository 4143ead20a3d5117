"""An OpenAI-compatible HTTP front (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``)
over the router's gRPC ``Generation`` API, served from the router process."""

from .front import OpenAIFront

__all__ = ["OpenAIFront"]
