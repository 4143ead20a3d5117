"""An in-process ``Generation`` server whose answers each test scripts, for testing the SDK without
a cluster. Each RPC counts its calls, records its requests, then runs the test's handler."""

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent import futures

import grpc

from proto.baton.v1 import generation_pb2, generation_pb2_grpc

pb = generation_pb2


def chunk(token_ids, text="", logprobs=(), top=(), request_id="req-1") -> pb.GenerateResponse:
    """A middle message: new tokens, their text, logprobs and ``top`` [[(id, logprob), ...], ...]."""
    return pb.GenerateResponse(
        request_id=request_id,
        token_ids=token_ids,
        logprobs=logprobs,
        top_logprobs=[
            pb.TokenLogprobs(top=[pb.TopLogprob(token_id=i, logprob=p) for i, p in t]) for t in top
        ],
        text=text,
    )


def final(
    token_ids=(), text="", logprobs=(), reason=pb.FINISH_REASON_LENGTH, prompt=3, cached=1, cached_host=1
):
    """The last message: finish reason, usage (``cached_host`` of the ``cached`` tokens from a host tier;
    4 drafts verified, 3 accepted) and route (prefill ``p:1``, decode ``d:2``, nixl, 4096 B)."""
    message = chunk(token_ids, text, logprobs)
    message.finish_reason = reason
    usage = pb.Usage(
        prompt_tokens=prompt,
        completion_tokens=5,
        cached_tokens=cached,
        cached_tokens_host=cached_host,
        draft_tokens=4,
        accepted_draft_tokens=3,
    )
    message.usage.CopyFrom(usage)
    message.route.CopyFrom(
        pb.Route(prefill_worker="p:1", decode_worker="d:2", transfer_backend="nixl", transfer_bytes=4096)
    )
    return message


STORY = [  # five tokens over three messages, as the router streams them
    chunk([11, 12], "He", logprobs=[-0.5, -0.25], top=[[(11, -0.5), (7, -1.0)], [(12, -0.25), (8, -2.0)]]),
    chunk([13], "llo", logprobs=[-0.125], top=[[(13, -0.125), (9, -3.0)]]),
    final([14, 15], " you", logprobs=[-1.0, -2.0]),
]


def story(request, context, attempt):
    return STORY


def fail(code: grpc.StatusCode, details: str, times: int | None = None, then: Callable | None = None):
    """A handler failing with ``code`` on its first ``times`` calls (all when None), then ``then``."""

    def handler(request, context, attempt):
        if times is None or attempt <= times:
            context.abort(code, details)
        return then(request, context, attempt)

    return handler


def stream_then_fail(messages, code: grpc.StatusCode, details: str):
    """A handler streaming ``messages``, then failing with ``code`` (every call)."""

    def handler(request, context, attempt):
        yield from messages
        context.abort(code, details)

    return handler


class ScriptedGeneration(generation_pb2_grpc.GenerationServicer):
    """Set ``generate`` / ``tokenize`` / ``list_models`` to ``handler(request, context, attempt)``
    (attempt counts from 1); ``generate`` returns the messages to stream."""

    def __init__(self):
        self.calls = Counter()
        self.requests: dict[str, list] = {"Generate": [], "Tokenize": [], "ListModels": []}
        self.cancelled = threading.Event()  # set by ``stream_then_wait`` when the client went away
        self.generate = story
        self.tokenize = lambda request, context, attempt: pb.TokenizeResponse(token_ids=[1, 2, 3])
        self.list_models = lambda request, context, attempt: pb.ListModelsResponse(
            models=[pb.ModelInfo(id="k3-tiny", family="k3", max_model_len=4096)]
        )
        self._lock = threading.Lock()

    def _attempt(self, method: str, request) -> int:
        with self._lock:
            self.calls[method] += 1
            self.requests[method].append(request)
            return self.calls[method]

    def Generate(self, request, context):
        attempt = self._attempt("Generate", request)
        yield from self.generate(request, context, attempt)

    def Tokenize(self, request, context):
        return self.tokenize(request, context, self._attempt("Tokenize", request))

    def ListModels(self, request, context):
        return self.list_models(request, context, self._attempt("ListModels", request))

    def stream_then_wait(self, messages: Iterable[pb.GenerateResponse]):
        """A ``generate`` handler: stream ``messages``, then hold the call open until the client
        cancels it (sets ``cancelled``) or 10 s pass."""

        def handler(request, context, attempt):
            yield from messages
            deadline = time.monotonic() + 10
            while context.is_active() and time.monotonic() < deadline:
                time.sleep(0.01)
            if not context.is_active():
                self.cancelled.set()

        return handler


def wait_past_deadline(request, context, attempt):
    """A ``generate`` handler that sends nothing until the client's deadline has passed."""
    while context.is_active():
        time.sleep(0.01)
    return []


class ScriptedServer:
    """``grpc.server`` on a free port (``address``) serving a ``ScriptedGeneration`` (``script``)."""

    def __init__(self):
        self.script = ScriptedGeneration()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        generation_pb2_grpc.add_GenerationServicer_to_server(self.script, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self._server.start()

    def stop(self) -> None:
        self._server.stop(grace=None)
