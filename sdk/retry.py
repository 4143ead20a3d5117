"""When a failed call is retried, and how long to wait first.

The rule (both clients follow it through ``Attempts``):

- ``Tokenize`` and ``ListModels`` are idempotent: retried on any code in ``retry_codes``.
- ``Generate`` is retried on those codes ONLY if the failure came before any message of the
  stream was received. Once a message (and so possibly a token) has reached the caller, the error
  is raised as is: a retry would start a different generation and the caller would see tokens
  twice, or tokens from two different samples.
- Other codes (INVALID_ARGUMENT, DEADLINE_EXCEEDED, CANCELLED, ...) are never retried.
- At most ``max_attempts`` calls in all. The wait before retry ``k`` (1-based) is
  ``min(max_backoff_s, initial_backoff_s * multiplier ** (k - 1))`` shortened by up to ``jitter``
  of itself at random, so clients that failed together do not retry together.
- The whole call, retries and waits included, shares one deadline (``timeout_s``). A wait that
  would end at or after the deadline is not taken: the last error is raised at once.
"""

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from .errors import BatonError


@dataclass(frozen=True)
class RetryPolicy:
    """How many calls and how long between them; ``RetryPolicy(max_attempts=1)`` never retries."""

    max_attempts: int = 3
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0
    retry_codes: tuple[grpc.StatusCode, ...] = (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    jitter: float = 0.2

    def __post_init__(self):
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts: must be at least 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("initial_backoff_s, max_backoff_s: must not be negative")
        if self.multiplier < 1:
            raise ValueError(f"multiplier: must be at least 1, got {self.multiplier}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter: must be in [0, 1], got {self.jitter}")

    def backoff_s(self, retry: int, uniform: float) -> float:
        """The wait before retry number ``retry`` (1-based), given ``uniform`` drawn from [0, 1)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (retry - 1))
        return base * (1.0 - self.jitter * uniform)


DEFAULT_RETRY = RetryPolicy()


class Attempts:
    """One call's retry state: how many attempts were made and its deadline.

    Usage: ``timeout = attempts.start()`` before each attempt (the gRPC timeout it may use), then
    on failure ``delay = attempts.retry_delay_s(error, received=...)``: ``None`` means raise.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        timeout_s: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ):
        self.policy = policy
        self.made = 0
        self._clock = clock
        self._rng = rng
        self._deadline = None if timeout_s is None else clock() + timeout_s

    def start(self) -> float | None:
        """Count one attempt; returns the seconds left before the deadline (None: no deadline)."""
        self.made += 1
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._clock())

    def retry_delay_s(self, error: BatonError, *, received: bool) -> float | None:
        """Seconds to wait before the next attempt, or None when ``error`` must be raised.

        ``received``: whether any message of this attempt's stream reached the caller (always
        False for unary calls); a streamed call with ``received`` is never retried."""
        if received or error.code not in self.policy.retry_codes:
            return None
        if self.made >= self.policy.max_attempts:
            return None
        delay = self.policy.backoff_s(self.made, self._rng())
        if self._deadline is not None and self._clock() + delay >= self._deadline:
            return None
        return delay
