"""``PrefetchGate``: whether a waiting request may be admitted while its prefix is prefetched from the
Redis L3 into the host tier (``docs/hicache.md``, "Prefetch").

A request's prefetch starts when the engine receives it (``CacheManager.prefetch``) and runs while it
queues. The scheduler asks ``ready(request_id)`` before admitting the request at the head of its queue;
the answer depends on the worker's policy (``--prefetch-policy``):

    best_effort   always: admit whenever the scheduler would, with what has arrived
    wait          once the prefetch is over (done, failed or skipped)
    timeout_ms    that, or ``timeout_ms`` after it started, whichever is first

A request without a prefetch (no L3, its prefix all on the device) is always ready. The first ``True``
ends the request's entry and records an outcome (``completed``, ``timed_out`` or ``not_waited``) with
the seconds it waited, which the worker's metrics take (``take_outcomes``). A request that is never
admitted (aborted while queued) is ``forget``-ed.

While the policy holds the request at the head of the queue, the engine loop sleeps instead of polling
``ready``: ``hold_s`` says for how long at most, and ``on_prefetch_done`` wakes it when a prefetch ends.
"""

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from services.hicache.port import PrefetchHandle

STARTED, COMPLETED, TIMED_OUT, NOT_WAITED = "started", "completed", "timed_out", "not_waited"
BEST_EFFORT, WAIT, TIMEOUT_MS = "best_effort", "wait", "timeout_ms"


@dataclass(frozen=True)
class PrefetchOutcome:
    """One event of a prefetch for the metrics: ``outcome`` (``started``, or how its wait ended) and
    ``wait_s`` (arrival to admission; None for ``started``) under ``policy``."""

    policy: str
    outcome: str
    wait_s: float | None


class PrefetchGate:
    """The prefetches of waiting requests, and the policy that gates their admission.

    Args:
        policy: ``best_effort``, ``wait`` or ``timeout_ms``.
        timeout_ms: the ``timeout_ms`` policy's longest wait.
        clock: monotonic seconds (tests step their own).
        outcomes_kept: outcomes kept for ``take_outcomes`` at most (the oldest dropped).
    """

    def __init__(
        self,
        policy: str,
        timeout_ms: int,
        clock: Callable[[], float] = time.monotonic,
        outcomes_kept: int = 4096,
    ):
        if policy not in (BEST_EFFORT, WAIT, TIMEOUT_MS):
            raise ValueError(f"prefetch_policy: {policy!r} is not one of {BEST_EFFORT}, {WAIT}, {TIMEOUT_MS}")
        self.policy = policy
        self.timeout_s = timeout_ms / 1000
        self._clock = clock
        self._pending: dict[str, tuple[PrefetchHandle, float]] = {}
        self._outcomes: deque[PrefetchOutcome] = deque(maxlen=outcomes_kept)
        self._listener: Callable[[], None] | None = None

    def on_prefetch_done(self, listener: Callable[[], None]) -> None:
        """From now on, call ``listener()`` whenever a prefetch the gate was given ends, on the thread that
        ends it (the engine loop's wake-up; it must not block)."""
        self._listener = listener

    def start(self, request_id: str, handle: PrefetchHandle) -> None:
        """``request_id``'s prefetch has started (``handle``)."""
        self._pending[request_id] = (handle, self._clock())
        self._outcomes.append(PrefetchOutcome(self.policy, STARTED, None))
        handle.add_done_callback(self._prefetch_over)

    def _prefetch_over(self) -> None:
        listener = self._listener
        if listener is not None:
            listener()

    def hold_s(self, request_id: str) -> float | None:
        """How long the policy still holds ``request_id`` at most, in seconds (``math.inf``: until its
        prefetch is over), or None when ``ready`` would let it in now. No side effect."""
        entry = self._pending.get(request_id)
        if entry is None or self.policy == BEST_EFFORT:
            return None
        handle, started = entry
        if handle.done():
            return None
        if self.policy == WAIT:
            return math.inf
        left = started + self.timeout_s - self._clock()
        return left if left > 0 else None

    def ready(self, request_id: str) -> bool:
        """Whether the policy lets ``request_id`` be admitted now (no side effect until it does)."""
        entry = self._pending.get(request_id)
        if entry is None:
            return True
        handle, started = entry
        waited = self._clock() - started
        if handle.done():
            outcome = COMPLETED
        elif self.policy == BEST_EFFORT:
            outcome = NOT_WAITED
        elif self.policy == TIMEOUT_MS and waited >= self.timeout_s:
            outcome = TIMED_OUT
        else:
            return False
        del self._pending[request_id]
        self._outcomes.append(PrefetchOutcome(self.policy, outcome, waited))
        return True

    def forget(self, request_id: str) -> None:
        """Drop ``request_id``'s prefetch (it left the queue without being admitted)."""
        self._pending.pop(request_id, None)

    @property
    def pending(self) -> int:
        """Requests whose prefetch the gate still tracks."""
        return len(self._pending)

    def take_outcomes(self) -> list[PrefetchOutcome]:
        """The outcomes recorded since the last call, oldest first."""
        taken = list(self._outcomes)
        self._outcomes.clear()
        return taken
