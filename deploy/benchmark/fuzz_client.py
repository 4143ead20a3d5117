"""Sends fuzz cases to a running router and judges each answer.

A case passes when the router answers in time with a status a client's mistake may get: an HTTP
status below 500 (or 504 after the ``timeout`` the body asked for) whose error body names a field,
or a gRPC status other than INTERNAL / UNKNOWN / UNAVAILABLE whose INVALID_ARGUMENT message names
a field. Everything else is a finding: ``5xx``, ``INTERNAL``, ``hang`` (no answer by the deadline),
``crash`` (no answer at all: connection refused or dropped), ``unnamed`` (a refusal that does not
say which field is wrong), ``stream-error`` (an internal error inside an SSE stream).
"""

import http.client
import json
import re
import time
from dataclasses import dataclass

import grpc

from proto.baton.v1 import generation_pb2, generation_pb2_grpc

from .fuzz_cases import COMPLETIONS, GENERATE, FuzzCase

# "<field>: <problem>", the field as the client spelled it: max_tokens, messages[2].content,
# sampling.stop[0], Content-Type.
NAMES_A_FIELD = re.compile(r"^[A-Za-z_][\w.\[\]-]*: \S")
_BAD_GRPC = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE}


@dataclass(frozen=True)
class Outcome:
    """How one case went: ``status`` (``http 400``, ``grpc INVALID_ARGUMENT``, ``grpc OK``),
    ``refused`` (a 4xx or a gRPC error), ``seconds``, and ``finding`` (None when it passed)."""

    surface: str
    status: str
    refused: bool
    seconds: float
    finding: str | None = None
    detail: str = ""


class FuzzClient:
    """Sends cases to a router: gRPC at ``grpc_target``, HTTP at ``http_target`` (``host:port``;
    None skips that surface's cases). Each call gets ``deadline_s``."""

    def __init__(self, grpc_target: str | None, http_target: str | None, deadline_s: float = 30.0):
        self.http_target = http_target
        self.deadline_s = deadline_s
        self.channel = grpc.insecure_channel(grpc_target) if grpc_target else None

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()

    def serves(self, case: FuzzCase) -> bool:
        return (self.http_target if case.surface == "http" else self.channel) is not None

    def run(self, case: FuzzCase) -> Outcome:
        """Send ``case`` and judge the answer; never raises for anything the server does."""
        started = time.monotonic()
        outcome = self._http(case) if case.surface == "http" else self._grpc(case)
        seconds = time.monotonic() - started
        finding, detail = outcome[2], outcome[3]
        if seconds > self.deadline_s and finding is None:
            finding, detail = "hang", f"answered after {seconds:.1f} s"
        return Outcome(case.surface, outcome[0], outcome[1], seconds, finding, detail)

    def _http(self, case: FuzzCase) -> tuple[str, bool, str | None, str]:
        host, port = self.http_target.rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=self.deadline_s)
        headers = {} if case.content_type is None else {"Content-Type": case.content_type}
        try:
            connection.request("POST", case.method, case.payload, headers)
            response = connection.getresponse()
            raw = response.read()
        except TimeoutError:
            return "http timeout", False, "hang", f"no answer within {self.deadline_s} s"
        except (ConnectionError, http.client.HTTPException) as error:
            return "http dropped", False, "crash", repr(error)
        finally:
            connection.close()
        status = f"http {response.status}"
        if response.status >= 500:
            if response.status == 504 and case.client_timeout is not None:
                return status, True, None, ""
            return status, False, "5xx", raw[:300].decode(errors="replace")
        if response.status >= 400:
            return status, True, *_unnamed(_http_message(raw))
        if response.getheader("Content-Type", "").startswith("text/event-stream"):
            return status, False, *_stream_errors(raw)
        return status, False, None, ""

    def _grpc(self, case: FuzzCase) -> tuple[str, bool, str | None, str]:
        try:  # no serializers: the payload goes as it is, and answers come back as bytes
            if case.method == GENERATE:
                for _ in self.channel.unary_stream(case.method)(case.payload, timeout=self.deadline_s):
                    pass
            else:
                self.channel.unary_unary(case.method)(case.payload, timeout=self.deadline_s)
        except grpc.RpcError as error:
            code, details = error.code(), error.details() or ""
            status = f"grpc {code.name}"
            if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                return status, False, "hang", f"no answer within {self.deadline_s} s"
            if code in _BAD_GRPC:
                return status, False, code.name, details[:300]
            if code is grpc.StatusCode.INVALID_ARGUMENT:
                return status, True, *_unnamed(details)
            return status, True, None, ""
        return "grpc OK", False, None, ""

    def check_serving(self) -> list[str]:
        """A normal request on each surface; the failures, or [] when the router still serves."""
        failures = []
        if self.channel is not None:
            stub = generation_pb2_grpc.GenerationStub(self.channel)
            request = generation_pb2.GenerateRequest(
                text="hello", sampling={"max_tokens": 2, "ignore_eos": True}
            )
            try:
                tokens = sum(len(m.token_ids) for m in stub.Generate(request, timeout=self.deadline_s))
                if tokens != 2:
                    failures.append(f"gRPC Generate: {tokens} tokens instead of 2")
            except grpc.RpcError as error:
                failures.append(f"gRPC Generate: {error.code().name} {error.details()}")
        if self.http_target is not None:
            body = json.dumps({"prompt": "hello", "max_tokens": 2, "ignore_eos": True}).encode()
            host, port = self.http_target.rsplit(":", 1)
            connection = http.client.HTTPConnection(host, int(port), timeout=self.deadline_s)
            try:
                connection.request("POST", COMPLETIONS, body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                reply = json.loads(response.read())
                if response.status != 200 or reply["usage"]["completion_tokens"] != 2:
                    failures.append(f"HTTP /v1/completions: {response.status} {str(reply)[:200]}")
            except (OSError, http.client.HTTPException, ValueError, KeyError) as error:
                failures.append(f"HTTP /v1/completions: {error!r}")
            finally:
                connection.close()
        return failures


def _http_message(raw: bytes) -> str:
    try:
        return json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return raw[:300].decode(errors="replace")


def _unnamed(message: str) -> tuple[str | None, str]:
    """A refusal's finding: None when its message names the field, else ``unnamed``."""
    if NAMES_A_FIELD.match(message) or "queue full" in message:  # 429: a full queue, no field at fault
        return None, ""
    return "unnamed", message[:300]


def _stream_errors(raw: bytes) -> tuple[str | None, str]:
    """An SSE body's finding: an ``error`` event of an internal type."""
    for event in raw.split(b"\n\n"):
        payload = event.removeprefix(b"data: ")
        if payload.startswith(b'{"error"'):
            error = json.loads(payload)["error"]
            if error.get("type") == "internal_error":
                return "stream-error", error.get("message", "")[:300]
    return None, ""
