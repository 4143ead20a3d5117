"""Every status code the router uses arrives as its typed error, details kept; other codes fall back
to ``InternalError`` with the real code."""

import pickle

import grpc
import pytest

from sdk import (
    BatonError,
    Cancelled,
    Client,
    DeadlineExceeded,
    InternalError,
    InvalidArgument,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    RetryPolicy,
    Unauthenticated,
    Unavailable,
)
from tests.sdk.scripted_server import fail

CODES = [
    (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhausted),
    (grpc.StatusCode.UNAVAILABLE, Unavailable),
    (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceeded),
    (grpc.StatusCode.NOT_FOUND, NotFound),
    (grpc.StatusCode.CANCELLED, Cancelled),
    (grpc.StatusCode.INTERNAL, InternalError),
    (grpc.StatusCode.UNIMPLEMENTED, InternalError),
    (grpc.StatusCode.DATA_LOSS, InternalError),
    (grpc.StatusCode.UNAUTHENTICATED, Unauthenticated),
    (grpc.StatusCode.PERMISSION_DENIED, PermissionDenied),
]
NO_RETRY = RetryPolicy(max_attempts=1)


@pytest.mark.parametrize("code, kind", CODES, ids=[code.name for code, _ in CODES])
@pytest.mark.parametrize("method", ["generate", "tokenize", "list_models"])
def test_status_code_maps_to_its_error_with_details(server, method, code, kind):
    details = f"{code.name.lower()}: something specific"
    handler = fail(code, details)
    setattr(server.script, method, handler)
    with Client(server.address, retry=NO_RETRY, timeout_s=10) as client:
        call = {
            "generate": lambda: client.generate(prompt_ids=[1, 2]),
            "tokenize": lambda: client.tokenize("hi"),
            "list_models": client.list_models,
        }[method]
        with pytest.raises(kind) as raised:
            call()
    error = raised.value
    assert type(error) is kind and isinstance(error, BatonError)
    assert error.code == code and error.details == details
    assert str(error) == f"{code.name}: {details}"


def test_errors_survive_pickling_with_their_code():
    error = pickle.loads(pickle.dumps(InternalError("boom", grpc.StatusCode.DATA_LOSS)))
    assert (
        type(error) is InternalError and error.code == grpc.StatusCode.DATA_LOSS and error.details == "boom"
    )


def test_client_side_invalid_request_is_both_invalid_argument_and_value_error():
    error = InvalidRequest("prompt_ids: bad")
    assert isinstance(error, InvalidArgument) and isinstance(error, ValueError)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
