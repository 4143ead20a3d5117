"""One streamed ``Generate`` call, timed on the client as its messages arrive."""

import time
from dataclasses import dataclass

from proto.baton.v1 import generation_pb2, generation_pb2_grpc


@dataclass(frozen=True)
class RequestRecord:
    """A finished request: when it was sent and when each token-carrying message arrived.

    Times are ``time.perf_counter()`` seconds. ``arrivals[i]`` is when the i-th message carrying
    tokens arrived; a message may carry several tokens when the client falls behind the stream, so
    inter-token gaps are taken per message (as load generators usually do).
    """

    kind: str  # "decode" or "prefill"
    prompt_tokens: int
    sent: float
    arrivals: tuple[float, ...]
    completion_tokens: int
    prefill_worker: str  # empty: the decode worker prefilled the prompt itself
    decode_worker: str
    transfer_bytes: int

    @property
    def ttft(self) -> float:
        """Seconds from sending to the first token."""
        return self.arrivals[0] - self.sent

    @property
    def e2e(self) -> float:
        """Seconds from sending to the last token."""
        return self.arrivals[-1] - self.sent

    @property
    def tpot(self) -> float:
        """Mean seconds per output token after the first: ``(e2e - ttft) / (tokens - 1)``."""
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)

    @property
    def itls(self) -> list[float]:
        """Gaps between consecutive token-carrying messages (the first token excluded)."""
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]

    @property
    def handed_off(self) -> bool:
        """Whether a prefill worker prefilled the prompt and handed its state to the decode worker."""
        return bool(self.prefill_worker) and self.transfer_bytes > 0

    def overlap(self, start: float, end: float) -> float:
        """Seconds of this request's life (sent to last token) inside ``[start, end]``."""
        return max(0.0, min(end, self.arrivals[-1]) - max(start, self.sent))


def timed_generate(
    stub: generation_pb2_grpc.GenerationStub,
    kind: str,
    prompt: list[int],
    max_tokens: int,
    timeout_s: float,
    metadata: tuple[tuple[str, str], ...] = (),
) -> RequestRecord:
    """Send one greedy ``ignore_eos`` request of ``prompt`` token ids (with gRPC ``metadata``, e.g. a
    bearer token) and time its stream.

    Raises:
        grpc.RpcError: the call failed.
        RuntimeError: the stream ended without a final message, or with fewer tokens than asked.
    """
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=prompt),
        sampling=generation_pb2.SamplingParameters(max_tokens=max_tokens, ignore_eos=True),
    )
    arrivals, tokens, final = [], 0, None
    sent = time.perf_counter()
    for message in stub.Generate(request, metadata=metadata, timeout=timeout_s):
        now = time.perf_counter()
        if message.token_ids:
            arrivals.append(now)
            tokens += len(message.token_ids)
        if message.finish_reason:
            final = message
    if final is None or tokens != max_tokens:
        raise RuntimeError(f"{kind} request: stream ended with {tokens} of {max_tokens} tokens")
    return RequestRecord(
        kind=kind,
        prompt_tokens=len(prompt),
        sent=sent,
        arrivals=tuple(arrivals),
        completion_tokens=tokens,
        prefill_worker=final.route.prefill_worker,
        decode_worker=final.route.decode_worker,
        transfer_bytes=final.route.transfer_bytes,
    )
