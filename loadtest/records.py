"""What a load test measured: one record per request (the contract between drivers and reports)."""

from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    """Timings of one request, in seconds from the run's start (``time.monotonic()`` based).

    Attributes:
        session_id, turn: which session and which of its turns.
        start_s: the request was sent.
        token_times_s: arrival time of every output token (tokens that came in one streamed message
            share its arrival time); the first is the TTFT point.
        end_s: the stream ended (success or error); None while running.
        input_tokens: prompt tokens sent.
        output_tokens: tokens received.
        cached_tokens: prompt tokens the server reported as served from its prefix cache.
        cached_tokens_host: of ``cached_tokens``, those loaded from a worker's host tier (HiCache).
        error: None on success, else ``CODE: details``.
        concurrency: the sweep level (live sessions) or None; rate: the request rate or None.
        warmup: sent during warm-up: excluded from every metric.
    """

    session_id: str
    turn: int
    start_s: float
    input_tokens: int
    token_times_s: list[float] = field(default_factory=list)
    end_s: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    cached_tokens_host: int = 0
    error: str | None = None
    concurrency: int | None = None
    rate: float | None = None
    warmup: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and self.end_s is not None

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] - self.start_s if self.token_times_s else None

    @property
    def e2e_s(self) -> float | None:
        return self.end_s - self.start_s if self.end_s is not None else None
