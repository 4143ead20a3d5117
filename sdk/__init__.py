"""Baton's Python client SDK: ``Client`` / ``AsyncClient`` over the public ``baton.v1.Generation``
gRPC API, with typed results and errors. Needs only grpcio and protobuf.

    from sdk import Client

    with Client("127.0.0.1:50051", timeout_s=60) as client:
        print(client.generate("Hello", max_tokens=16).text)
"""

from .async_client import AsyncClient
from .client import Client
from .errors import (
    BatonError,
    Cancelled,
    DeadlineExceeded,
    InternalError,
    InvalidArgument,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
)
from .request import generate_request, tokenize_request
from .retry import RetryPolicy
from .types import (
    Completion,
    GenerationChunk,
    ModelInfo,
    PromptLogprobs,
    Route,
    ToolCall,
    ToolCallDelta,
    Usage,
)

__all__ = [
    "AsyncClient",
    "BatonError",
    "Cancelled",
    "Client",
    "Completion",
    "DeadlineExceeded",
    "GenerationChunk",
    "InternalError",
    "InvalidArgument",
    "InvalidRequest",
    "ModelInfo",
    "PromptLogprobs",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "RetryPolicy",
    "Route",
    "ToolCall",
    "ToolCallDelta",
    "Unauthenticated",
    "Unavailable",
    "Usage",
    "from_rpc_error",
    "generate_request",
    "tokenize_request",
]
