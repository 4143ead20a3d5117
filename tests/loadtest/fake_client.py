"""A fake load-test client on a virtual clock: deterministic timing, no server, no real waiting."""

import asyncio
import selectors
from collections.abc import Coroutine

from loadtest.clients.base import Client, Stamper
from loadtest.records import RequestRecord

BAD_ID = -1  # a prompt holding this id fails with INVALID_ARGUMENT


class _Clock:
    now = 0.0


class _Selector(selectors.DefaultSelector):
    """Polls real file descriptors without blocking; a wait for a timer advances the virtual clock."""

    def __init__(self, clock: _Clock):
        super().__init__()
        self.clock = clock

    def select(self, timeout=None):
        events = super().select(0)
        if not events and timeout is not None:
            self.clock.now += timeout
        elif not events:
            raise RuntimeError("virtual loop: nothing scheduled and nothing to wait for (deadlock)")
        return events


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` only moves when every task is waiting for a timer."""

    def __init__(self):
        clock = _Clock()
        super().__init__(selector=_Selector(clock))
        self._virtual = clock

    def time(self) -> float:
        return self._virtual.now


def run_virtual(coroutine: Coroutine):
    """Run ``coroutine`` to completion on a fresh ``VirtualLoop``."""
    with asyncio.Runner(loop_factory=VirtualLoop) as runner:
        return runner.run(coroutine)


class FakeClient(Client):
    """Answers after ``ttft_s``, then one token every ``itl_s``; ``cached_tokens`` is the prompt
    length minus one for every turn after a session's first (as a prefix cache would).

    ``calls`` keeps ``(session_id, turn start, end)`` in loop time for every request that finished.
    """

    def __init__(self, ttft_s: float = 0.1, itl_s: float = 0.01):
        self.ttft_s, self.itl_s = ttft_s, itl_s
        self.calls: list[tuple[str, float, float]] = []
        self.cancelled = 0

    async def generate(self, prompt_ids, max_tokens, session_id, record: RequestRecord) -> None:
        stamp = Stamper(record)
        began = asyncio.get_running_loop().time()
        try:
            if BAD_ID in prompt_ids:
                record.error = "INVALID_ARGUMENT: prompt_ids: id -1 is outside the vocabulary"
            else:
                await asyncio.sleep(self.ttft_s)
                for index in range(max_tokens):
                    if index:
                        await asyncio.sleep(self.itl_s)
                    record.token_times_s.append(stamp.now())
                record.output_tokens = max_tokens
                record.cached_tokens = len(prompt_ids) - 1 if record.turn else 0
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        record.end_s = stamp.now()
        self.calls.append((session_id, began, asyncio.get_running_loop().time()))
